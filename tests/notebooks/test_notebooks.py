"""The notebooks (SPEC §6.3) run as plain scripts, on small traces, and produce what they say.

Each notebook runs with `runpy` in the test process, so it finds the session's SparkSession through
`storage.session.get_spark` exactly as a local script run would (no `spark` is injected); parameters come from
`REPLAB_NB_*` environment variables, as in a local run. Work is shared: 02 (drill-down) reads the lakehouse 01
wrote, and all four write under one module-scoped folder.

Exact expectations come from golden inputs: 01 and 02 replay tests/scenarios/k2-acks1-leader-crash (figures in its
expected.json, derived by hand from SPEC §3.2), 03 checks the election and fencing gaps SPEC §3.2 rule 8 and §3.4
rule 3 give on the dledger5 scenario. 04 (sweep) has no golden answer: it is checked against the lakehouse rows
its replays wrote and against the definitions of its estimates.
"""

from __future__ import annotations

import json
import os
import runpy
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from schemas.units import S

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
K2 = REPO / "tests" / "scenarios" / "k2-acks1-leader-crash"
GOLDEN = json.loads((K2 / "expected.json").read_text())


@contextmanager
def notebook_params(params: dict[str, str]) -> Iterator[None]:
    names = {f"REPLAB_NB_{k.upper()}": v for k, v in params.items()}
    saved = {k: os.environ.get(k) for k in names}
    os.environ.update(names)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_notebook(name: str, **params: str) -> dict[str, Any]:
    with notebook_params(params):
        return runpy.run_path(str(NOTEBOOKS / f"{name}.py"), run_name="__main__")


def assert_png(path: Path) -> None:
    assert path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000, path


def test_notebooks_are_databricks_source_files():
    names = sorted(p.name for p in NOTEBOOKS.glob("*.py"))
    assert names == ["01_overview.py", "02_run_drilldown.py", "03_dledger_vs_kafka.py", "04_sweep.py"]
    for name in names:
        text = (NOTEBOOKS / name).read_text()
        assert text.startswith("# Databricks notebook source\n# MAGIC %md\n"), name
        cells = text.split("\n# COMMAND ----------\n")
        assert len(cells) >= 5, name
        for cell in cells:
            lines = [line for line in cell.strip().splitlines() if line]
            # A markdown cell is all MAGIC lines; a code cell has none (Databricks would run them as magics).
            magic = [line.startswith("# MAGIC") for line in lines if line != "# Databricks notebook source"]
            assert all(magic) or not any(magic), (name, lines[:2])
        compile(text, name, "exec")
        # Widgets on Databricks, environment variables locally: never input() or argv.
        assert "input(" not in text and "sys.argv" not in text


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("notebooks")


@pytest.fixture(scope="module")
def overview(spark, workdir) -> dict[str, Any]:
    # The golden policies only: every policy costs a share of the replay's fixed work, and the default ("all",
    # every preset that fits the cluster: pipelines.demo_job.fitting_presets) is what `replab demo` runs.
    policies = ";".join(case["policy"] for case in GOLDEN)
    return run_notebook("01_overview", trace=str(K2), policies=policies, workdir=str(workdir), mlflow="false")


def test_overview_matches_the_golden_figures(overview, workdir):
    from replay.policies import parse_policy

    comparison = overview["comparison"].set_index("policy")
    assert sorted(comparison.index) == sorted(parse_policy(case["policy"]).canonical() for case in GOLDEN)
    for case in GOLDEN:
        row = comparison.loc[parse_policy(case["policy"]).canonical()]
        for field, value in case["summary"].items():
            assert row[field] == pytest.approx(value, abs=1e-9), (case["policy"], field)
    out = workdir / "01_overview"
    csv_rows = (out / "comparison.csv").read_text().splitlines()
    assert len(csv_rows) == 1 + len(comparison)
    for name in ("pareto", "latency_cdf", "loss_timeline"):
        assert_png(out / f"{name}.png")


def test_drilldown_opens_the_acks1_run_from_the_lakehouse(overview, workdir):
    from replay.policies import parse_policy

    case = GOLDEN[0]  # kafka:partitions=1,acks=1: m3 acknowledged, then truncated
    ns = run_notebook("02_run_drilldown", workdir=str(workdir), policy=case["policy"], trace_id=K2.name)
    expected_run = next(r.run_id for r in overview["report"].runs
                        if r.canonical == parse_policy(case["policy"]).canonical())
    assert ns["run_id"] == expected_run
    lost_ids = sorted(int(m) for m, e in case["messages"].items() if e["status"] == "acked" and e["fate"] == "lost")
    assert ns["lost"]["msg_id"].tolist() == lost_ids == [3]
    assert ns["lost"]["ack_s"].tolist() == [case["messages"]["3"]["ack_us"] / S]
    assert ns["lost_by_partition"]["acked_lost"].sum() == case["summary"]["acked_lost"]
    # One window: from the crash (27 ms) until clients reach the new leader (fenced at 9.027 s, + 100 ms).
    unavailable = ns["unavailable"]
    assert len(unavailable) == 1
    assert unavailable["start_s"].iloc[0] == pytest.approx(0.027)
    assert unavailable["seconds"].sum() == pytest.approx(case["summary"]["unavailable_partition_seconds"])
    for name in ("partition_timeline", "unavailability"):
        assert_png(workdir / "02_run_drilldown" / f"{name}.png")


def test_dledger_vs_kafka_on_one_broker_failure(spark, workdir):
    from studies.dledger_vs_kafka import POLICIES

    ns = run_notebook("03_dledger_vs_kafka", workdir=str(workdir), scenarios="dledger5-single-failure",
                      scale="0.2", seed="1", mlflow="false")
    figures = ns["figures"].set_index("policy")
    assert len(figures) == len(POLICIES)
    from replay.policies import parse_policy

    dledger = figures.loc[parse_policy(POLICIES[0]).canonical()]
    rf5 = figures.loc[parse_policy("kafka:partitions=50,replication_factor=5,min_insync_replicas=3").canonical()]
    # SPEC §3.4 rule 3 with §3.7: the crash at 60 s × 0.2 = 12 s is noticed 6 s after the last heartbeat
    # (10 s), a first vote fails (2.5 s, R-7) and the next elects 0.65 s later (19.15 s), and producers learn the new
    # leader at their next route poll, 30 s:
    # the whole topic (one group, 50 queues) is down 18 s, and nothing acknowledged is lost.
    assert dledger["acked_lost"] == 0 and dledger["topic_outage_s"] == pytest.approx(18.0)
    # SPEC §3.2 rules 6, 8: only the 10 partitions broker 0 led stop, each for 9 s + 0.1 s; RF 5, min ISR 3 loses
    # nothing and refuses nothing with one broker down.
    assert rf5["acked_lost"] == 0 and rf5["failed"] == 0 and rf5["topic_outage_s"] == pytest.approx(10 * 9.1 / 50)
    verdicts = ns["verdicts"]
    assert len(verdicts) == len(POLICIES) - 1 and set(verdicts["scenario"]) == {"dledger5-single-failure"}
    assert verdicts.set_index("kafka").loc[rf5.name, "consistency"]
    out = workdir / "03_dledger_vs_kafka"
    assert (out / "dledger_vs_kafka.csv").is_file() and (out / "verdicts.csv").is_file()
    assert_png(out / "outage_vs_latency.png")


def test_sweep_estimates_match_the_results_it_wrote(spark, workdir):
    from pyspark.sql import functions as F

    from engine import tracking
    from storage.lakehouse import Lakehouse

    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    ns = run_notebook("04_sweep", workdir=str(workdir), scenario="k2-acks1-leader-crash", seeds="2",
                      first_seed="3", scale="0.05", policies="kafka:partitions=1,acks=1;kafka-durable",
                      mlflow="true", tracking_uri=uri, slo="mean_acked_lost<=1000000,availability>=0")
    sweep = ns["sweep"]
    assert sweep.seeds == [3, 4] and len(sweep.estimates) == 2
    saved = json.loads((workdir / "04_sweep" / "sweep.json").read_text())
    assert [p["policy"] for p in saved["policies"]] == [e.policy for e in sweep.estimates]
    stored = (Lakehouse(workdir / "lakehouse", spark, create=False).read("sweep_results")
              .where(F.col("sweep_id") == sweep.sweep_id).collect())
    client = tracking.client_for(uri)
    experiment = client.get_experiment_by_name(sweep.experiment)
    for e, row in zip(sweep.estimates, saved["policies"], strict=True):
        mine = sorted((r for r in stored if r["policy"] == e.policy), key=lambda r: r["seed"])
        assert [r["seed"] for r in mine] == [3, 4] and {r["status"] for r in mine} == {"ok"}
        lost_any = sum(r["acked_lost"] >= 1 for r in mine)  # the estimates are the stored per-seed figures'
        assert row["seeds_with_loss"] == lost_any and row["p_loss"] == lost_any / 2
        assert row["p_loss_low"] <= row["p_loss"] <= row["p_loss_high"]
        mean_lost = sum(r["acked_lost"] for r in mine) / 2
        assert row["mean_acked_lost"] == pytest.approx(mean_lost)
        assert row["mean_acked_lost_low"] <= mean_lost <= row["mean_acked_lost_high"]
        assert row["availability"] == pytest.approx(sum(r["availability"] for r in mine) / 2)
        run = client.get_run(row["mlflow_run_id"])
        assert run.info.experiment_id == experiment.experiment_id and run.info.status == "FINISHED"
        assert run.data.metrics["p_loss"] == pytest.approx(row["p_loss"])
        assert run.data.params["scenario.name"] == "k2-acks1-leader-crash"
    # Every policy meets this loose SLO: the cheapest one (1 partition: 3 brokers used, not 6) is recommended.
    rec = ns["recommendation"]
    assert len(rec.ranked) == 2 and rec.chosen.estimate.label == "kafka:partitions=1,acks=1"
    assert (workdir / "04_sweep" / "sweep.csv").read_text().startswith(
        "policy,label,seeds,fatal_seeds,seeds_with_loss,p_loss")
    assert_png(workdir / "04_sweep" / "sweep.png")


@pytest.mark.slow  # a second Spark process; the fast suite runs the same notebook in-process (above)
def test_dledger_vs_kafka_notebook_runs_from_the_dist_zip(tmp_path):
    """Notebook 03 imports its study (`studies.dledger_vs_kafka`) from the installed package: run from a copy
    outside the checkout with only `make dist`'s zip on the path (no repo, no editable install), it finds the
    study and every layer below it there, and writes its tables."""
    import csv
    import subprocess
    import sys

    from pipelines.dist import build_zip
    from studies.dledger_vs_kafka import POLICIES

    dist_zip, _ = build_zip(tmp_path / "dist")
    notebook = tmp_path / "nb" / "03_dledger_vs_kafka.py"
    notebook.parent.mkdir()
    notebook.write_text((NOTEBOOKS / "03_dledger_vs_kafka.py").read_text())
    probe = f"""
import runpy, sys
sys.path = [p for p in sys.path if p not in ("", {str(REPO)!r})]
sys.meta_path = [f for f in sys.meta_path if "editable" not in getattr(f, "__module__", "").lower()
                 and "editable" not in type(f).__name__.lower() and "editable" not in str(f).lower()]
sys.path.insert(0, {str(dist_zip)!r})
runpy.run_path({str(notebook)!r}, run_name="__main__")
for name in ("studies.dledger_vs_kafka", "engine.replay", "storage.lakehouse", "pipelines.notebook_env"):
    assert sys.modules[name].__file__.startswith({str(dist_zip)!r}), sys.modules[name].__file__
print("from-zip ok")
"""
    env = {**os.environ, "REPLAB_NB_WORKDIR": str(tmp_path / "work"), "REPLAB_NB_SCENARIOS": "dledger5-single-failure",
           "REPLAB_NB_SCALE": "0.05", "REPLAB_NB_SEED": "1", "REPLAB_NB_MLFLOW": "false",
           "REPLAB_SPARK_MASTER": "local[2]", "REPLAB_WAREHOUSE_DIR": str(tmp_path / "warehouse"),
           "REPLAB_DRIVER_MEMORY": "1g"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=1800, cwd=tmp_path,
                         env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "from-zip ok" in out.stdout
    with (tmp_path / "work" / "03_dledger_vs_kafka" / "dledger_vs_kafka.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(POLICIES)
