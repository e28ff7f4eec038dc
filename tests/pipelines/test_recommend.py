"""`replab recommend` on the demo scenario: an SLO some policies meet and others miss; the chosen policy checked
against the sweep's own Delta table (read with delta-rs, intervals recomputed with scipy); reuse of a stored
sweep; the MLflow parent/child runs and experiment tag read back from a real sqlite store; bad SLOs exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from deltalake import DeltaTable

from pipelines.cli import main
from report.interactive import chart_count

SLO = "mean_acked_lost<=0.5,availability>=0.99"
RF2 = "kafka:replication_factor=2,acks=all,min_insync_replicas=1"
POLICIES = ("kafka-acks0", "kafka-acks1", "kafka-durable", RF2)
SEEDS = 6


def _args(root: Path) -> list[str]:
    args = ["recommend", "--scenario", "demo", "--seeds", str(SEEDS), "--scale", "0.05", "--slo", SLO,
            "--lakehouse", str(root / "lh"), "--out", str(root / "out"),
            "--tracking-uri", f"sqlite:///{root / 'mlflow.db'}"]
    for p in POLICIES:
        args += ["--policy", p]
    return args


@pytest.fixture(scope="module")
def recommended(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("recommend")
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(_args(root))
    return root, code, out.getvalue()


def _table(root: Path, name: str) -> list[dict]:
    return DeltaTable(str(root / "lh" / name)).to_pyarrow_table().to_pylist()


@pytest.mark.spark
def test_chosen_policy_is_the_cheapest_meeting_the_slo_in_the_sweep_table(recommended):
    from scipy.stats import sem, t

    root, code, printed = recommended
    assert code == 0, printed
    rec = json.loads((root / "out" / "recommendation.json").read_text())
    rows = _table(root, "sweep_results")
    assert len(rows) == SEEDS * len(POLICIES) and {r["sweep_id"] for r in rows} == {rec["sweep_id"]}
    assert {r["status"] for r in rows} == {"ok"}

    meets, cost = {}, {}
    for label in POLICIES:
        mine = [r for r in rows if r["label"] == label]
        assert sorted(r["seed"] for r in mine) == list(range(SEEDS))
        lost = np.array([r["acked_lost"] for r in mine], float)
        avail = np.array([r["availability"] for r in mine], float)
        # The same 95 % t intervals, from the table, with scipy directly (no spread: the value itself).
        lost_hi = lost.mean() if sem(lost) == 0 else t.interval(0.95, SEEDS - 1, lost.mean(), sem(lost))[1]
        avail_lo = avail.mean() if sem(avail) == 0 else t.interval(0.95, SEEDS - 1, avail.mean(), sem(avail))[0]
        meets[label] = lost_hi <= 0.5 and max(0.0, avail_lo) >= 0.99
        cost[label] = (mine[0]["brokers_used"], mine[0]["replicas_per_message"],
                       float(np.mean([r["replication_bytes"] for r in mine])))
    assert not all(meets.values()) and any(meets.values()), meets  # some meet, some miss
    assert not meets["kafka-acks0"]
    cheapest = min((label for label in POLICIES if meets[label]), key=lambda label: cost[label])
    assert rec["chosen_label"] == cheapest == RF2
    assert {p["label"] for p in rec["policies"] if p["meets"]} == {k for k, v in meets.items() if v}
    assert f"recommended: {RF2}" in printed
    # The same as an HTML section: one interactive chart, plotly.js inline once, the choice named.
    page = (root / "out" / "recommendation.html").read_text()
    assert chart_count(page) == 1 and page.count("<script") == 2 and "<script src" not in page
    assert f"Recommended: <code>{RF2}" in page and '"legendgroup":"kafka"' in page


@pytest.mark.spark
def test_sweeps_row_and_one_commit_per_table(recommended):
    root, _, _ = recommended
    (sweep,) = _table(root, "sweeps")
    assert sweep["status"] == "succeeded" and sweep["seeds"] == SEEDS and sweep["first_seed"] == 0
    assert sweep["scenario"] == "demo" and sweep["scale"] == 0.05 and sweep["fatal_seeds"] == 0
    assert sweep["labels"] == list(POLICIES) and len(sweep["policies"]) == len(POLICIES)
    for name in ("sweeps", "sweep_results"):
        writes = [h for h in DeltaTable(str(root / "lh" / name)).history() if h["operation"] == "WRITE"]
        assert len(writes) == 1, (name, writes)


@pytest.mark.spark
def test_a_second_recommend_reuses_the_stored_sweep(recommended):
    import contextlib
    import io

    root, _, _ = recommended
    before = {n: DeltaTable(str(root / "lh" / n)).version() for n in ("sweeps", "sweep_results")}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(_args(root)) == 0
    assert "(reused from the lakehouse)" in out.getvalue() and f"recommended: {RF2}" in out.getvalue()
    assert {n: DeltaTable(str(root / "lh" / n)).version() for n in before} == before


@pytest.mark.spark
def test_mlflow_parent_and_child_runs(recommended):
    from mlflow import MlflowClient

    root, _, _ = recommended
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("sweep-demo-x0.05-seeds0-5")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == len(POLICIES)  # the reused run replaced the first logging
    parent = parents[0]
    assert parent.data.tags["replab.recommended"] == RF2 and parent.data.tags["replab.slo"] == SLO
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    assert sorted(c.info.run_name for c in children) == sorted(POLICIES)  # named as typed
    assert all({"p_loss", "availability", "ack_p99_ms"} <= set(c.data.metrics) for c in children)
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert {"recommendation.json", "recommendation.html"} <= {f.path for f in client.list_artifacts(parent.info.run_id)}


@pytest.mark.parametrize(("slo", "text"), [
    ("p_lost<=0.1", "--slo term 'p_lost<=0.1': unknown metric 'p_lost'"),
    ("p_loss<0.1", "--slo term 'p_loss<0.1': expected METRIC<=NUMBER or METRIC>=NUMBER"),
    ("availability>=high", "--slo term 'availability>=high': 'high' is not a number"),
    ("p_loss<=0.1,", "empty term"),
])
def test_bad_slo_exits_2_naming_the_term_and_the_metrics(slo, text, capsys, tmp_path):
    assert main(["recommend", "--scenario", "demo", "--seeds", "2", "--slo", slo,
                 "--lakehouse", str(tmp_path / "lh")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and text in err, err
    assert "valid metrics: p_loss, p_loss_day, mean_acked_lost, availability, ack_p99_ms, unavailable_s" in err
    assert not (tmp_path / "lh").exists()


def test_space_of_families_presets_and_grids():
    from engine.recommend import expand_space
    from replay.policies import all_presets

    kafka = [p.name for p, pol in all_presets() if pol.family == "kafka"]
    assert expand_space(["kafka"]).labels == kafka
    grid = expand_space(["kafka-acks1", "kafka:replication_factor=2|3,acks=1|all"])
    # kafka:replication_factor=3,acks=1 is kafka-acks1 (RF 3 is the default): kept once, under the typed name.
    assert grid.labels == ["kafka-acks1", "kafka:replication_factor=2,acks=1", "kafka:replication_factor=2",
                           "kafka"]
    assert len({p.canonical() for p in grid.policies}) == 4
    assert expand_space(["kafka:acks=all,min_insync_replicas=2"], split=False).labels == [
        "kafka:acks=all,min_insync_replicas=2"]
