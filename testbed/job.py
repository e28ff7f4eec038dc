"""The testbed run (SPEC §12); `replab testbed run|report` (pipelines/testbed_job.py) drives it.

run: record a real Kafka cluster through the scenario (`testbed.record`), write DIR/trace/, replay it with replab
under every policy (the ordinary replay path: trace gate, kernels, output gate, Delta tables), compare
(`testbed.compare`), write DIR/comparison.json, the Delta tables `testbed_outcomes` and `testbed_comparisons`,
and one MLflow run per (scenario, policy) tagged source=testbed.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas.trace import Manifest
from testbed.compare import Case
from testbed.observe import Recording

#: The whole recording of a run, beside its trace (`recompare_testbed`).
RECORDING = "recording.pkl"
#: The recording run's wall times.
WALL = "wall.json"


@dataclass
class TestbedResult:
    out: Path
    trace: Path
    cases: list[Case]
    recording: Any
    wall_s: dict[str, float] = field(default_factory=dict)


def run_testbed(spark_factory, scenario: str, policies: list, labels: list[str], out: str | Path, *,
                lakehouse: str | Path = "lakehouse", tracking_uri: str | None = None, mlflow: bool = True,
                spark_replay: bool = False, publish: bool = True, client_debug: str | None = None,
                progress=print) -> TestbedResult:
    """The whole `replab testbed run`.

    The prediction runs the replay kernels through `replay/local.py` (seconds), or with `spark_replay` the whole
    `replab replay` path (trace gate, Spark, output gate, the replay's own Delta tables; minutes on a busy
    2-core machine). `publish`: write the testbed's Delta tables and MLflow runs (through the lakehouse and
    tracking code); without it no Spark starts at all (the fast test). `client_debug`: librdkafka debug contexts
    of the Kafka producers, logged beside the brokers' logs.
    """
    from testbed.schedule import schedule_from_scenario

    if client_debug and rocketmq(policies):
        from schemas.errors import BadInput

        raise BadInput("--client-debug: librdkafka's debug contexts are for the Kafka testbed's producers",
                       rule="testbed-policy")
    t_start = time.monotonic()
    out = Path(out)
    schedule = schedule_from_scenario(scenario)
    out.mkdir(parents=True, exist_ok=True)
    tag = f"{os.getpid() % 100000:05d}"
    trace = out / "trace"
    if rocketmq(policies):
        from testbed.rocketmq import record as rmq

        with terminate_as_interrupt():
            rec = rmq.run_cluster(schedule, policies, out / "cluster", tag, progress=progress)
        rmq.fill_samples(rec, len(policies))
    else:
        from testbed.record import run_cluster

        with terminate_as_interrupt():
            rec = run_cluster(schedule, policies, out / "cluster", tag, client_debug=client_debug,
                              progress=progress)
    manifest = trace_from_recording(rec, trace)
    for node in [*(out / "cluster").glob("*/data"), *(out / "cluster").glob("*/store")]:
        shutil.rmtree(node, ignore_errors=True)  # the logs stay for a post-mortem, the data does not
    # The whole recording, so that `recompare_testbed` can judge it again under a later model without a cluster.
    with open(out / RECORDING, "wb") as f:
        pickle.dump(rec, f, protocol=pickle.HIGHEST_PROTOCOL)
    t_recorded = time.monotonic()
    cases = _compare_and_publish(spark_factory, rec, manifest, out, policies, labels, lakehouse=lakehouse,
                                 tracking_uri=tracking_uri, mlflow=mlflow, spark_replay=spark_replay,
                                 publish=publish, progress=progress)
    wall = {"cluster_start_s": rec.wall_s.get("cluster_start", 0.0), "trace_s": rec.wall_s.get("trace", 0.0),
            "record_s": t_recorded - t_start, "compare_s": time.monotonic() - t_recorded,
            "total_s": time.monotonic() - t_start}
    (out / WALL).write_text(json.dumps(wall) + "\n")
    return TestbedResult(out, trace, cases, rec, wall)


def trace_from_recording(rec: Recording, trace: Path) -> Manifest:
    """DIR/trace/ (SPEC §2) from a recording, by the family's recorder: RocketMQ's replication progress comes
    from its ledger ends or slave offsets, Kafka's from the followers' sampled log ends."""
    from testbed.rocketmq import record as rmq
    from testbed.trace_writer import write_trace

    shutil.rmtree(trace, ignore_errors=True)
    if isinstance(rec, rmq.RocketMQRecording):
        return write_trace(rec, trace, rmq.replicate_events(rec), rec.route_poll_phase_us)
    return write_trace(rec, trace)


def recorded_wall_s(out: Path) -> float:
    """The recording run's wall time (`run_testbed`'s total), 0 when it is not known."""
    path = Path(out) / WALL
    return float(json.loads(path.read_text())["total_s"]) if path.is_file() else 0.0


def recompare_testbed(spark_factory, policies: list, labels: list[str], out: str | Path, *,
                      lakehouse: str | Path = "lakehouse", tracking_uri: str | None = None, mlflow: bool = True,
                      spark_replay: bool = False, publish: bool = True, progress=print) -> TestbedResult:
    """A recorded run judged again by the current model, without a cluster: DIR/recording.pkl as `run_testbed`
    left it; the trace, comparison.json, outcomes/ and (with `publish`) the testbed's tables and MLflow runs are
    rewritten. The policies must be the run's own (the recording holds one producer per policy)."""
    t_start = time.monotonic()
    out = Path(out)
    if not (out / RECORDING).is_file():
        from schemas.errors import BadInput

        raise BadInput(f"{out}: no {RECORDING} (a run recorded by `replab testbed run`)", rule="testbed-recompare")
    with open(out / RECORDING, "rb") as f:
        rec = pickle.load(f)  # a file run_testbed wrote, not user input
    if len(rec.deliveries) != len(policies):
        from schemas.errors import BadInput

        raise BadInput(f"{out}: recorded with {len(rec.deliveries)} policies, asked to judge {len(policies)}",
                       rule="testbed-recompare")
    # The trace is written again from the recording, so a recompared run is judged on what the current recorder
    # derives from it (instants, replication progress, the measured round trip), as a fresh run would be.
    manifest = trace_from_recording(rec, out / "trace")
    cases = _compare_and_publish(spark_factory, rec, manifest, out, policies, labels, lakehouse=lakehouse,
                                 tracking_uri=tracking_uri, mlflow=mlflow, spark_replay=spark_replay,
                                 publish=publish, progress=progress)
    return TestbedResult(out, out / "trace", cases, rec, {"compare_s": time.monotonic() - t_start,
                                                          "total_s": time.monotonic() - t_start})


def _compare_and_publish(spark_factory, rec, manifest, out: Path, policies: list, labels: list[str], *, lakehouse,
                         tracking_uri, mlflow: bool, spark_replay: bool, publish: bool, progress) -> list[Case]:
    from testbed.instruments import case_instruments, series

    trace = out / "trace"
    if spark_replay:
        cases = compare_run(spark_factory(), rec, manifest, trace, policies, labels, lakehouse=lakehouse,
                            progress=progress)
    else:
        cases = compare_local(rec, manifest, trace, policies, labels)
    # Beside SPEC §12's fields, every fault's raw instants (signal, leadership gone, exit, RUNNING): the evidence
    # for the instants the trace records (testbed.observe.Transition).
    faults = rec.fault_instants()
    extra = _family_evidence(rec)
    kafka_instruments = not rocketmq(policies)  # the brokers' request metrics and librdkafka's statistics
    if kafka_instruments:
        for i, c in enumerate(cases):
            c.instruments = case_instruments(rec, i)
    (out / "comparison.json").write_text(json.dumps([{**c.as_json(), "faults": faults, **extra} for c in cases],
                                                    indent=1) + "\n")
    if kafka_instruments:
        (out / "instruments.json").write_text(json.dumps(series(rec)) + "\n")
    # Both sides per message, for a post-mortem of any disagreement (the Delta table holds them too).
    (out / "outcomes").mkdir(exist_ok=True)
    for i, c in enumerate(cases):
        _deliveries(rec, i).to_parquet(out / "outcomes" / f"policy{i}-deliveries.parquet")
        c._observed_rows.to_parquet(out / "outcomes" / f"policy{i}-observed.parquet")  # type: ignore[attr-defined]
        c._predicted_rows.to_parquet(out / "outcomes" / f"policy{i}-predicted.parquet")  # type: ignore[attr-defined]
    if publish or spark_replay:
        from storage.lakehouse import Lakehouse
        from testbed.publish import log_mlflow, write_tables

        if mlflow:
            progress("MLflow: one run per (scenario, policy), tagged source=testbed")
            log_mlflow(cases, rec, manifest, policies, tracking_uri)
        progress("Delta: testbed_outcomes, testbed_comparisons")
        spark = spark_factory()
        # create=False: only the two testbed tables are made (on their first write), not the whole lakehouse.
        write_tables(spark, Lakehouse(lakehouse, spark, create=False), cases, manifest)
    return cases


@contextlib.contextmanager
def terminate_as_interrupt():
    """While a cluster runs, SIGTERM (a CI timeout, `kill`) raises KeyboardInterrupt as Ctrl-C does, so that the
    cluster's teardown stops every process group it started and deletes its namespaces instead of leaving them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(_sig, _frame):
        raise KeyboardInterrupt("SIGTERM")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def rocketmq(policies: list) -> bool:
    """Whether the run is RocketMQ's (every policy of a run is of one kind: one cluster serves them all)."""
    from replay.policies import KafkaPolicy

    kinds = {isinstance(p, KafkaPolicy) for p in policies}
    if len(kinds) > 1:
        from schemas.errors import BadInput

        raise BadInput("one testbed run starts one cluster: give Kafka and RocketMQ policies in separate runs",
                       rule="testbed-policy")
    return kinds == {False}


def _family_evidence(rec) -> dict[str, Any]:
    """RocketMQ: the client's route poll phase and requests, each election seen in the NameServer's route, and the
    client's warm-up (how long the cluster took to answer steadily before the run started)."""
    if not hasattr(rec, "route_requests"):
        return {}
    return {"route_poll_phase_us": rec.route_poll_phase_us, "route_refresh_ms": rec.route_refresh_ms,
            "client_start_us": rec.client_start_us, "warm_up": rec.warm, "elections": rec.elections,
            "route_requests": rec.route_requests, "client_routes": rec.client_routes}


def _deliveries(rec, i: int):
    """Every delivery report as the producer saw it, with the broker's append time (LogAppendTime, µs from the
    run's start): which leader took a message, before or after a fault, is read from here in a post-mortem."""
    import pandas as pd

    rows = [(mid, rec.partition[i][mid], d.report_us, d.error, d.offset,
             None if d.append_ms is None else d.append_ms * 1000 - rec.t0_us)
            for mid, d in rec.deliveries[i].items()]
    return pd.DataFrame(rows, columns=["msg_id", "partition", "report_us", "error", "offset", "append_us"])


def _case(rec, i: int, run_id: str, canonical: str, label: str, pred_rows, pred_summary, obs_rows, obs_summary):
    from testbed import compare

    case = Case(rec.schedule.scenario, label, canonical, run_id, pred_summary, obs_summary,
                compare.agreement(pred_rows, obs_rows),
                {"predicted": compare.failover_ms(rec, i, pred_rows),
                 "observed": compare.failover_ms(rec, i, obs_rows)})
    case._observed_rows = obs_rows  # type: ignore[attr-defined]
    case._predicted_rows = pred_rows  # type: ignore[attr-defined]
    return case


def compare_local(rec, manifest, trace: Path, policies: list, labels: list[str]) -> list[Case]:
    from replay.policies import run_id
    from schemas.version import __version__
    from storage.trace_loader import read_events_arrow
    from testbed import compare

    _, table = read_events_arrow(trace)
    cases = []
    for i, policy in enumerate(policies):
        rid = run_id(manifest.trace_id, policy, __version__)
        pred, replay_un = compare.predict_local(policy, manifest, table)
        obs = compare.observed_outcomes(rec, i, rid, manifest.duration_us)
        dur = manifest.duration_us
        predicted = compare.summary_local(pred, compare.outcome_unavailability(pred, dur), dur)
        predicted["replay_unavailable_partition_seconds"] = compare.unavailable_seconds(replay_un, dur)
        observed = compare.summary_local(
            obs, compare.outcome_unavailability(compare.in_replay_units(obs, pred), dur), dur)
        cases.append(_case(rec, i, rid, policy.canonical(), labels[i], pred, predicted, obs, observed))
    return cases


def compare_run(spark, rec, manifest, trace: Path, policies: list, labels: list[str], *, lakehouse,
                progress=print) -> list[Case]:
    from pyspark.sql import functions as F

    from engine.metrics import RunInfo
    from engine.plan import ReplayRequest
    from engine.replay import run_replay
    from storage.lakehouse import Lakehouse
    from testbed import compare

    progress(f"replaying the recorded trace under {len(policies)} polic{'y' if len(policies) == 1 else 'ies'}")
    report = run_replay(spark, ReplayRequest(trace=str(trace), policies=policies, lakehouse=str(lakehouse),
                                             mlflow=False))
    lake = Lakehouse(lakehouse, spark)
    ids = [r.run_id for r in report.runs]
    predicted_all = (lake.read("message_outcomes").where(F.col("run_id").isin(ids))
                     .select("run_id", "msg_id", "partition", "produce_us", "status", "error", "ack_us", "fate")
                     .toPandas())
    cases = []
    for i, (run, summary) in enumerate(zip(report.runs, report.summaries, strict=True)):
        predicted = predicted_all[predicted_all["run_id"] == run.run_id].drop(columns="run_id")
        observed = compare.observed_outcomes(rec, i, run.run_id, manifest.duration_us)
        unavailable = compare.outcome_unavailability(compare.in_replay_units(observed, predicted),
                                                     manifest.duration_us)
        info = RunInfo(run.run_id, manifest.duration_us, run.partitions, run.min_insync_replicas,
                       run.layout.brokers_used, run.layout.replicas_per_message, None)
        pred = {k: summary.get(k) for k in summary if k != "run_id"}
        pred["replay_unavailable_partition_seconds"] = pred["unavailable_partition_seconds"]
        pred["unavailable_partition_seconds"] = compare.unavailable_seconds(
            compare.outcome_unavailability(predicted, manifest.duration_us), manifest.duration_us)
        cases.append(_case(rec, i, run.run_id, run.canonical, labels[i], predicted, pred, observed,
                           compare.summarize(spark, observed, unavailable, info)))
    return cases
