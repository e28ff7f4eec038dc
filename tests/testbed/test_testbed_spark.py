"""The whole testbed path with Spark (slow: a real cluster, then the replay, Delta tables and MLflow)."""

from __future__ import annotations

import json

import pytest

from pipelines.cli import main
from testbed.compare import COMPARED, summary_local

pytestmark = [pytest.mark.slow, pytest.mark.testbed]

POLICIES = ["kafka-acks1", "kafka:acks=all,min_insync_replicas=2"]


def test_testbed_run_writes_delta_tables_mlflow_runs_and_the_report(tmp_path, capsys):
    import mlflow
    import pandas as pd
    from deltalake import DeltaTable

    out, lake, uri = tmp_path / "out", tmp_path / "lake", f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = ["testbed", "run", "--scenario", "testbed-leader-crash", "--out", str(out), "--lakehouse", str(lake),
            "--tracking-uri", uri, "--spark-replay"]
    for p in POLICIES:
        args += ["--policy", p]
    assert main(args) == 0
    data = json.loads((out / "comparison.json").read_text())
    produced = data[0]["observed"]["produced"]

    # Any Delta reader reads the tables (SPEC §5): one row per message and policy, one per (scenario, policy).
    outcomes = DeltaTable(str(lake / "testbed_outcomes")).to_pandas()
    assert len(outcomes) == 2 * produced and set(outcomes["policy"]) == set(POLICIES)
    assert outcomes["predicted_status"].notna().all()
    comparisons = DeltaTable(str(lake / "testbed_comparisons")).to_pandas().set_index("policy")
    for d in data:
        row = comparisons.loc[d["policy"]]
        assert row["observed_acked_lost"] == d["observed"]["acked_lost"]
        assert row["predicted_acked"] == d["predicted"]["acked"]
        assert row["loss_agrees"] == ((d["predicted"]["acked_lost"] > 0) == (d["observed"]["acked_lost"] > 0))

    # The pandas summary of the fast path gives run_summary's numbers (Spark) on the same outcomes.
    for i, d in enumerate(data):
        pred = pd.read_parquet(out / "outcomes" / f"policy{i}-predicted.parquet")
        mine = summary_local(pred, pd.DataFrame(columns=["partition", "start_us", "end_us"]), 10**15)
        for k in COMPARED:
            if k != "unavailable_partition_seconds":
                assert mine[k] == pytest.approx(d["predicted"][k]), k

    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("testbed")
    runs = client.search_runs([exp.experiment_id], "tags.source = 'testbed'")
    assert len(runs) == 2
    for r in runs:
        assert {"predicted.acked_lost", "observed.acked_lost", "agreement.status"} <= set(r.data.metrics)

    capsys.readouterr()
    assert main(["testbed", "report", "--lakehouse", str(lake)]) == 0
    printed = capsys.readouterr().out
    assert "testbed-leader-crash" in printed and "kafka-acks1" in printed
