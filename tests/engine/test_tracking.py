"""MLflow tracking of a replay (SPEC §6.4), checked through MlflowClient and the MLflow server's REST API.

The golden scenario k2-acks1-leader-crash is replayed once (tests/conftest.py) through `run_replay`
with a SQLite store in a temporary folder; expected figures come from its expected.json (hand-derived from
SPEC §3.2), never from replab's own output. Real Spark, Delta and MLflow; no mocks.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pandas as pd
import pytest
from mlflow import MlflowClient
from mlflow.entities import ViewType

from engine import tracking
from schemas.tables import SUMMARY_FIELDS
from schemas.version import __version__

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
WINDOW_MS = 1000  # ReplayRequest's default, used by the fixture
#: Policy runs only: test_compare.py adds a `comparison` run to the same experiment.
POLICY = "tags.`replab.kind` = 'policy'"


def _client(replay) -> MlflowClient:
    return MlflowClient(tracking_uri=replay.tracking_uri)


def _policy_runs(replay, client=None):
    client = client or _client(replay)
    exp = client.get_experiment_by_name(replay.experiment)
    return client.search_runs([exp.experiment_id], filter_string=f"{POLICY} and attributes.status = 'FINISHED'")


def _by_name(replay):
    return {r.info.run_name: r for r in _policy_runs(replay)}


def test_one_experiment_per_trace_one_run_per_policy(k2_mlflow_replay):
    replay = k2_mlflow_replay
    client = _client(replay)
    assert replay.experiment == "k2-acks1-leader-crash"  # default experiment = the trace id
    exp = client.get_experiment_by_name(replay.experiment)
    # Artifacts beside the SQLite store, never in the working directory of whoever ran the test.
    assert exp.artifact_location == (replay.store / "mlruns" / "k2-acks1-leader-crash").as_uri()
    runs = client.search_runs([exp.experiment_id], POLICY, run_view_type=ViewType.ALL)
    names = sorted(r.info.run_name for r in runs)
    assert names == sorted(replay.canonical(case) for case in replay.expected)
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert set(replay.report.mlflow.values()) == {r.info.run_id for r in runs}


def test_params_are_the_policy_parameters_and_trace_id(k2_mlflow_replay):
    replay = k2_mlflow_replay
    runs = _by_name(replay)
    for policy in replay.policies:
        run = runs[policy.canonical()]
        # k2's manifest has no generator: no scenario.* params.
        assert run.data.params == {**policy.params(), "trace_id": "k2-acks1-leader-crash"}


def test_summary_metrics_match_the_golden_expectations(k2_mlflow_replay):
    replay = k2_mlflow_replay
    runs = _by_name(replay)
    for case in replay.expected:
        metrics = runs[replay.canonical(case)].data.metrics
        for name, value in case["summary"].items():
            assert metrics[name] == pytest.approx(value, abs=1e-9), (case["policy"], name)
    # The headline of the scenario, spelled out: acks=1 loses the message B1 never replicated.
    assert runs["kafka:partitions=1,acks=1"].data.metrics["acked_lost"] == 1
    assert runs["kafka:partitions=1"].data.metrics["acked_lost"] == 0


def test_every_summary_field_is_logged_as_in_the_lakehouse(k2_mlflow_replay, spark):
    from storage.lakehouse import Lakehouse

    replay = k2_mlflow_replay
    runs = _by_name(replay)
    rows = {r["run_id"]: r.asDict() for r in Lakehouse(replay.lakehouse, spark, create=False)
            .read("run_summary").collect()}
    for run in runs.values():
        summary = rows[run.data.tags["replab.run_id"]]
        logged = {k: v for k, v in run.data.metrics.items() if not k.startswith("window/")}
        assert logged == pytest.approx({k: float(summary[k]) for k in SUMMARY_FIELDS if summary[k] is not None})


def test_per_window_series(k2_mlflow_replay):
    replay = k2_mlflow_replay
    client = _client(replay)
    duration_us = json.loads((replay.trace / "manifest.json").read_text())["duration_us"]
    window_us = WINDOW_MS * 1000
    # Windows cover [0, duration_us] closed (SPEC §4.1 judges outcomes at duration_us): k = 0 … duration // w.
    steps = list(range(duration_us // window_us + 1))
    events = pd.read_csv(replay.trace / "events.csv")
    produce_windows = sorted(set(events.loc[events["kind"] == "produce", "ts_us"] // window_us))
    runs = _by_name(replay)
    for case in replay.expected:
        run = runs[replay.canonical(case)]
        lost = client.get_metric_history(run.info.run_id, tracking.SERIES_ACKED_LOST)
        unavailable = client.get_metric_history(run.info.run_id, tracking.SERIES_UNAVAILABLE)
        p99 = client.get_metric_history(run.info.run_id, tracking.SERIES_P99)
        assert sorted(m.step for m in lost) == steps
        assert sorted(m.step for m in unavailable) == steps
        assert sum(m.value for m in lost) == case["summary"]["acked_lost"]
        assert sum(m.value for m in unavailable) == pytest.approx(case["summary"]["unavailable_partition_seconds"])
        # Every message of k2 is acknowledged (expected.json): a p99 in each window holding a produce.
        assert sorted(m.step for m in p99) == produce_windows
    # acks=1: unavailable from the crash at 27 ms until 9.127 s (expected.json "why"): full windows 1 … 8.
    kraft = {m.step: m.value for m in client.get_metric_history(
        runs["kafka:partitions=1,acks=1"].info.run_id, tracking.SERIES_UNAVAILABLE)}
    assert kraft[0] == pytest.approx(0.973) and kraft[9] == pytest.approx(0.127) and kraft[10] == 0
    assert all(kraft[k] == pytest.approx(1.0) for k in range(1, 9))


def test_tags(k2_mlflow_replay):
    replay = k2_mlflow_replay
    runs = _by_name(replay)
    for policy in replay.policies:
        tags = runs[policy.canonical()].data.tags
        run_id = tags["replab.run_id"]
        assert replay.report.mlflow[run_id] == runs[policy.canonical()].info.run_id
        assert tags["replab.family"] == "kafka" and tags["replab.mode"] == "batch"
        assert tags["replab.version"] == __version__
        assert tags["replab.trace_id"] == "k2-acks1-leader-crash" and tags["replab.kind"] == "policy"
        assert tags["replab.lakehouse"] == str(replay.lakehouse.resolve())
        sha = tags["replab.git_sha"]
        # Others commit to this repository while tests run: check it names a commit, not that it is HEAD now.
        assert re.fullmatch(r"[0-9a-f]{40}", sha), sha
        assert subprocess.run(["git", "cat-file", "-e", f"{sha}^{{commit}}"], cwd=REPO).returncode == 0


def _artifact_paths(client, run_id, path=None):
    out = []
    for f in client.list_artifacts(run_id, path):
        out.extend(_artifact_paths(client, run_id, f.path) if f.is_dir else [f.path])
    return out


def test_artifacts(k2_mlflow_replay, tmp_path):
    replay = k2_mlflow_replay
    client = _client(replay)
    for case in replay.expected:
        run = _by_name(replay)[replay.canonical(case)]
        paths = set(_artifact_paths(client, run.info.run_id))
        assert {"summary.json", "gate_reports/trace_gate/report.html", "gate_reports/trace_gate/result.json",
                "gate_reports/output_gate/report.html", "gate_reports/output_gate/result.json",
                "plots/latency_cdf.png", "plots/loss_timeline.png", "plots/partition_timeline.png"} <= paths
        local = Path(client.download_artifacts(run.info.run_id, "", str(tmp_path / run.info.run_id)))
        summary = json.loads((local / "summary.json").read_text())
        assert summary["policy"] == replay.canonical(case)
        assert summary["run_id"] == run.data.tags["replab.run_id"]
        assert set(SUMMARY_FIELDS) <= set(summary)
        for name, value in case["summary"].items():
            assert summary[name] == pytest.approx(value), name
        for png in (local / "plots").glob("*.png"):
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_runs_table_links_to_mlflow(k2_mlflow_replay, spark):
    from storage.lakehouse import Lakehouse

    replay = k2_mlflow_replay
    rows = Lakehouse(replay.lakehouse, spark, create=False).read("runs").collect()
    runs = _by_name(replay)
    assert {r["policy"]: r["mlflow_run_id"] for r in rows} == {name: run.info.run_id for name, run in runs.items()}
    assert {r["status"] for r in rows} == {"succeeded"}


def test_every_runs_partition_timeline_comes_from_one_query(k2_mlflow_replay, spark):
    """The plots' partition timelines (report.figures.run_figures) of all runs at once equal each run's
    partition_states, thinned to the last state per time bin (computed here in pandas)."""
    from storage import report_data
    from storage.lakehouse import Lakehouse

    replay = k2_mlflow_replay
    lh = Lakehouse(replay.lakehouse, spark, create=False)
    ids = [r.run_id for r in replay.report.runs]
    busiest = report_data.busiest_partitions_of(lh, ids)
    assert busiest == {rid: [0] for rid in ids}  # k2 has one partition
    assert report_data.busiest_partitions(lh, ids[0]) == [0]
    duration_us = json.loads((replay.trace / "manifest.json").read_text())["duration_us"]
    got = report_data.partition_histories(lh, busiest, duration_us, max_points=50)
    states = lh.read("partition_states").toPandas()
    states["isr_size"] = states["isr"].map(len)
    states["_bin"] = states["ts_us"] // max(1, duration_us // 50)
    last = (states.sort_values(["ts_us", "leader_epoch", "high_watermark", "leader", "isr_size"])
            .groupby(["run_id", "partition", "_bin"]).tail(1))
    columns = ["run_id", *report_data.HISTORY_COLUMNS]
    want = last[columns].sort_values(["run_id", "partition", "ts_us"]).reset_index(drop=True)
    assert set(got["run_id"]) == set(ids)
    assert len(got) > len(ids)  # leadership moves in k2: more than one state per run

    def records(frame):  # a leaderless state's NaN would not equal itself
        return frame.astype({"leader": "float64"}).fillna(-1).to_dict("records")

    assert records(got) == records(want)
    one = report_data.partition_history(lh, ids[0], [0], duration_us, max_points=50)
    assert records(one) == records(got[got["run_id"] == ids[0]][report_data.HISTORY_COLUMNS])


# ------------------------------------------------------------------------------------------------ pure parts
def test_scenario_params_are_flattened_under_scenario():
    generator = {"scenario": "rolling-restart", "seed": 7, "scale": 0.5,
                 "parameters": {"name": "rolling-restart", "workload": {"rate_per_s": 4000.0, "keys": {"count": 10}},
                                "faults": {"scheduled": [{"at_ms": 1.0, "kind": "shutdown"}]}, "flag": True,
                                "notes": "x" * 7000}}
    params = tracking.scenario_params(generator, seed=7)
    assert params == {
        "scenario.name": "rolling-restart", "scenario.seed": "7", "scenario.scale": "0.5",
        "scenario.workload.rate_per_s": "4000.0", "scenario.workload.keys.count": "10",
        "scenario.faults.scheduled": '[{"at_ms": 1.0, "kind": "shutdown"}]', "scenario.flag": "true",
        "scenario.notes": "x" * 6000,  # MLflow's limit for a param value
    }
    assert tracking.scenario_params(None, None) == {}


def test_default_store_is_sqlite_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = tracking.resolve_tracking_uri(None)
    assert uri == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    expected = (tmp_path.resolve() / "mlruns" / "k2_acks_1").as_uri()
    assert tracking.default_artifact_location(uri, "k2/acks 1") == expected
    assert tracking.default_artifact_location("http://127.0.0.1:5000", "k2") is None


# ------------------------------------------------------------------------------------------------ MLflow UI
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http_json(url: str, body: dict | None = None, timeout: float = 10.0):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def test_mlflow_server_lists_one_run_per_policy(k2_mlflow_replay, tmp_path):
    replay = k2_mlflow_replay
    port = _free_port()
    env = {**os.environ, "MLFLOW_ENABLE_TELEMETRY": "false",
           # No background job runner (huey consumers): nothing to outlive the server.
           "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    log_file = (tmp_path / "server.log").open("w")
    # Own process group, so that the server and every worker it forks are stopped together (stack.md §5).
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", replay.tracking_uri,
         "--default-artifact-root", (replay.store / "mlruns").as_uri(), "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1"],
        stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "MLflow server did not answer /health within 180 s"
            time.sleep(1)
        name = urllib.parse.quote(replay.experiment)
        exp = _http_json(f"{base}/api/2.0/mlflow/experiments/get-by-name?experiment_name={name}")["experiment"]
        found = _http_json(f"{base}/api/2.0/mlflow/runs/search", {
            "experiment_ids": [exp["experiment_id"]],
            "filter": "tags.`replab.kind` = 'policy' and attributes.status = 'FINISHED'", "max_results": 100})
        runs = {r["info"]["run_name"]: r for r in found["runs"]}
        assert sorted(runs) == sorted(replay.canonical(case) for case in replay.expected)
        for case, policy in zip(replay.expected, replay.policies, strict=True):
            data = runs[replay.canonical(case)]["data"]
            params = {p["key"]: p["value"] for p in data["params"]}
            assert params == {**policy.params(), "trace_id": "k2-acks1-leader-crash"}
            metrics = {m["key"]: m["value"] for m in data["metrics"]}
            for field, value in case["summary"].items():
                assert metrics[field] == pytest.approx(value), (case["policy"], field)
    finally:
        try:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)
        except ProcessLookupError:
            pass
        log_file.close()


# ------------------------------------------------------------------------------------------------ re-runs
# Last in this module on purpose: these re-log the runs through the tracker (a full re-replay would take
# minutes), so the Delta `runs` table's mlflow_run_id no longer matches afterwards. They leave the store with
# one FINISHED run per policy, which is all the other tests of the session need.
def test_rerun_leaves_one_finished_run_per_replab_run(k2_mlflow_replay, spark):
    from engine.plan import policy_runs
    from schemas.trace import Manifest
    from storage.lakehouse import Lakehouse

    replay = k2_mlflow_replay
    client = _client(replay)
    manifest = Manifest.read(replay.trace)
    runs = policy_runs(replay.policies, manifest)
    before = {r.data.tags["replab.run_id"]: r.info.run_id for r in _policy_runs(replay)}

    # A re-run that fails (e.g. the output gate): the previous FINISHED runs stay, next to the FAILED ones.
    failed = tracking.ReplayTracker.start(replay.tracking_uri, None, manifest, runs)
    failed.fail(RuntimeError("output gate failed"))
    exp = client.get_experiment_by_name(replay.experiment)
    active = client.search_runs([exp.experiment_id], POLICY)
    assert sorted(r.info.status for r in active) == ["FAILED"] * 3 + ["FINISHED"] * 3
    assert {r.info.run_id for r in active if r.info.status == "FINISHED"} == set(before.values())

    # A re-run that succeeds: exactly one active run per replab run id, the new one; the others are deleted.
    lakehouse = Lakehouse(replay.lakehouse, spark, create=False)
    again = tracking.ReplayTracker.start(replay.tracking_uri, None, manifest, runs)
    again.finish(replay.report, lakehouse, window_ms=WINDOW_MS, trace_dir=replay.trace)
    active = client.search_runs([exp.experiment_id], POLICY)
    assert len(active) == 3 and {r.info.status for r in active} == {"FINISHED"}
    assert {r.data.tags["replab.run_id"]: r.info.run_id for r in active} == again.run_ids
    assert not set(again.run_ids.values()) & set(before.values())
    deleted = client.search_runs([exp.experiment_id], POLICY, run_view_type=ViewType.DELETED_ONLY)
    assert {r.info.run_id for r in deleted} == set(before.values()) | set(failed.run_ids.values())
    metrics = {r.info.run_name: r.data.metrics for r in active}
    for case in replay.expected:
        assert metrics[replay.canonical(case)]["acked_lost"] == case["summary"]["acked_lost"]
