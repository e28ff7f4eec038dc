"""`replab durability` end to end on Spark (small budget): the rounds run as Spark tasks and give exactly the
in-process estimate of the same episodes; the gate passes; the Delta tables, durability.json and MLflow runs
hold one row per policy and metric, one run row, a parent and one child per policy."""

from __future__ import annotations

import json

import pytest
from deltalake import DeltaTable

from engine.durability.job import METRICS, DurabilityRequest, run_durability
from engine.durability.judge import TraceShape
from engine.durability.run import DurabilitySpec, estimate_local
from generators.library import resolve_scenario
from generators.rates import load_rates
from replay.policies import parse_policy

pytestmark = pytest.mark.spark

LABELS = ["kafka-acks1", "kafka-durable"]


def test_durability_job_matches_in_process_and_writes_every_output(spark, tmp_path):
    spec = DurabilitySpec(resolve_scenario("demo"), load_rates(), tuple(parse_policy(p) for p in LABELS),
                          shape=TraceShape(trace_rate_per_s=20.0, max_gap_s=60.0), seed=3)
    request = DurabilityRequest(spec, LABELS, max_episodes=7, batch=7, out=str(tmp_path / "out"),
                                lakehouse=str(tmp_path / "lh"), tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    report = run_durability(spark, request)

    local = estimate_local(spec, episodes=7, batch=7)
    strip = ("cpu_seconds",)
    assert [{k: v for k, v in r.items() if k not in strip} for r in sorted(report.estimate.rows, key=_key)] == \
           [{k: v for k, v in r.items() if k not in strip} for r in sorted(local.rows, key=_key)]
    assert report.figures == local.figures()

    estimates = DeltaTable(str(tmp_path / "lh" / "durability_estimates")).to_pyarrow_table().to_pylist()
    assert sorted((r["policy"], r["metric"]) for r in estimates) == sorted(
        (p.canonical(), m) for p in spec.policies for m in METRICS)
    runs = DeltaTable(str(tmp_path / "lh" / "durability_runs")).to_pyarrow_table().to_pylist()
    assert len(runs) == 1 and runs[0]["episodes"] == 7 and runs[0]["status"] == "succeeded"
    validations = DeltaTable(str(tmp_path / "lh" / "validations")).to_pyarrow_table().to_pylist()
    assert any(v["suite"] == "durability_gate" and v["success"] for v in validations)

    doc = json.loads((tmp_path / "out" / "durability.json").read_text())
    assert [p["label"] for p in doc["policies"]] == LABELS
    assert all(p["mlflow_run_id"] for p in doc["policies"]) and doc["mlflow_parent_run_id"]
    assert doc["episodes"] == 7 and doc["sensitivity"]
    from report.durability import write_html

    page = write_html(doc, tmp_path / "out" / "durability.html").read_text()
    assert page.count('id="sens-') == len({r["process"] for r in doc["sensitivity"]}) and 'id="nines"' in page
    assert all(label in page for label in LABELS)

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    children = client.search_runs([client.get_run(doc["mlflow_parent_run_id"]).info.experiment_id],
                                  f"tags.`mlflow.parentRunId` = '{doc['mlflow_parent_run_id']}'")
    assert len(children) == 2 and all("nines_low" in c.data.metrics or "nines" in c.data.metrics for c in children)


def _key(r):
    return r["stratum"], r["episode"]
