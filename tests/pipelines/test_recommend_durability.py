"""`replab recommend --slo` with per-year terms, from a durability run's durability.json (no Spark): the
chosen policy is the cheapest whose conservative interval end meets every term, recomputed from the file; a
policy without a sampled loss is checked by its proven bound; bad per-year SLOs and missing runs exit 2 naming
the clause."""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import pytest

from engine.durability.job import DurabilityReport, durability_id_for, write_json
from engine.durability.judge import TraceShape
from engine.durability.run import DurabilitySpec, estimate_local, sensitivity
from generators.library import resolve_scenario
from generators.rates import load_rates
from pipelines.cli import main
from replay.policies import parse_policy

LABELS = ["kafka-acks1", "kafka-durable", "rocketmq-async", "dledger-5"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A small real durability run (in-process: the same episodes and figures a Spark run gives)."""
    spec = DurabilitySpec(resolve_scenario("demo"), load_rates(), tuple(parse_policy(p) for p in LABELS),
                          shape=TraceShape(trace_rate_per_s=20.0, max_gap_s=60.0), seed=5)
    est = estimate_local(spec, episodes=10, batch=10)
    out = tmp_path_factory.mktemp("durability")
    report = DurabilityReport(durability_id_for(spec), est, LABELS, est.figures(), sensitivity(est), 0.0,
                              "max episodes", json_path=out / "durability.json")
    write_json(report)
    return out


def _recommend(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["recommend", *args])
    return code, out.getvalue()


def _expected(doc: dict, nines_min: float, unavail_max: float) -> str | None:
    """The cheapest (brokers, copies; file order on ties) policy whose nines' lower end and unavailable minutes'
    upper end meet the SLO."""
    ok = []
    for i, p in enumerate(doc["policies"]):
        low = p["nines"]["low"]
        high = p["unavailable_min_per_year"]["high"]
        if low is not None and low >= nines_min and high <= unavail_max:
            ok.append(((p["brokers_used"], p["replicas_per_message"], i), p["policy"]))
    return min(ok)[1] if ok else None


def test_costs_are_recorded_per_policy(run_dir):
    doc = json.loads((run_dir / "durability.json").read_text())
    cost = {p["label"]: (p["brokers_used"], p["replicas_per_message"]) for p in doc["policies"]}
    assert cost == {"kafka-acks1": (6, 3.0), "kafka-durable": (6, 3.0), "rocketmq-async": (6, 2.0),
                    "dledger-5": (5, 5.0)}


def test_the_slo_nobody_can_miss_picks_the_cheapest_policy(run_dir):
    code, text = _recommend("--slo", "nines_per_year>=0,unavailable_min_per_year<=1e12", "--durability",
                            str(run_dir))
    assert code == 0
    rec = json.loads((run_dir / "recommendation.json").read_text())
    assert rec["chosen_label"] == "dledger-5"  # fewest brokers
    assert rec["ranked"] == [parse_policy(p).canonical() for p in ("dledger-5", "rocketmq-async", "kafka-acks1",
                                                                    "kafka-durable")]
    assert "recommended: dledger-5" in text
    assert (run_dir / "recommendation.html").is_file()


def test_a_threshold_between_policies_keeps_only_those_whose_conservative_end_meets_it(run_dir, tmp_path):
    doc = json.loads((run_dir / "durability.json").read_text())
    lows = sorted({p["nines"]["low"] for p in doc["policies"] if p["nines"]["low"] is not None})
    assert len(lows) >= 2, lows  # the run separates the policies
    threshold = (lows[-2] + lows[-1]) / 2  # only the policies with the best lower end meet it
    unavail = max(p["unavailable_min_per_year"]["high"] for p in doc["policies"]) * 2
    code, _ = _recommend("--slo", f"nines_per_year>={threshold!r},unavailable_min_per_year<={unavail!r}",
                         "--durability", str(run_dir / "durability.json"), "--out", str(tmp_path))
    assert code == 0
    rec = json.loads((tmp_path / "recommendation.json").read_text())
    assert rec["chosen"] == _expected(doc, threshold, unavail)
    met = {p["policy"]: p["meets"] for p in rec["policies"]}
    for p in doc["policies"]:
        assert met[p["policy"]] == (p["nines"]["low"] is not None and p["nines"]["low"] >= threshold)
        # the deciding bound is the interval's conservative end, never the estimate
        (term,) = [t for t in next(q for q in rec["policies"] if q["policy"] == p["policy"])["terms"]
                   if t["term"].startswith("nines")]
        assert math.isclose(term["bound"], p["nines"]["low"])
    # the same SLO over a space without the winners: nothing meets it
    losers = [p["label"] for p in doc["policies"] if not met[p["policy"]]]
    args = [a for lab in losers for a in ("--policy", lab)]
    code, text = _recommend("--slo", f"nines_per_year>={threshold!r}", "--durability", str(run_dir), "--out",
                            str(tmp_path), *args)
    assert code == 0 and json.loads((tmp_path / "recommendation.json").read_text())["chosen"] is None
    assert "no policy of the run meets" in text


@pytest.mark.parametrize(("argv", "text"), [
    (["--slo", "nines_per_year>=9,unavailable_min_per_year<30"],
     "--slo term 'unavailable_min_per_year<30': expected METRIC<=NUMBER or METRIC>=NUMBER"),
    (["--slo", "nines_per_yr>=9"], "--slo term 'nines_per_yr>=9': unknown metric 'nines_per_yr'"),
    (["--slo", "nines_per_year>=inf"], "--slo term 'nines_per_year>=inf': 'inf' is not a finite number"),
    (["--slo", "nines_per_year>=9,p_loss<=0.1"], "--slo term 'p_loss<=0.1': a per-trace metric cannot share"),
    (["--slo", "nines_per_year>=9"], "--slo term 'nines_per_year>=9' is per year: give --durability DIR"),
    (["--slo", "p_loss<=0.1", "--durability", "x"], "--durability gives per-year figures"),
    (["--slo", "p_loss<=0.1"], "--scenario is required for per-trace SLO terms"),
])
def test_bad_per_year_slo_exits_2_naming_the_clause(argv, text, capsys):
    assert main(["recommend", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and text in err, err


def test_missing_run_or_policy_exits_2(run_dir, tmp_path, capsys):
    assert main(["recommend", "--slo", "nines_per_year>=9", "--durability", str(tmp_path)]) == 2
    assert "no durability.json there" in capsys.readouterr().err
    assert main(["recommend", "--slo", "nines_per_year>=9", "--durability", str(run_dir), "--policy",
                 "kafka-elr"]) == 2
    assert "holds no estimate for kafka-elr" in capsys.readouterr().err
