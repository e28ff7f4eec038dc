"""`replab replay` and `spark-submit pipelines/replay_job.py`: replay a trace under policies on Spark (SPEC §4).

The job only routes, groups and writes; every rule of SPEC §3 lives in `replay/` (the kernels):

1. read the trace and run the trace gate (SPEC §2.3, §7): fatal rules stop with exit 2 before any table is
   written; quarantined rows leave the replay;
2. plan: policies whose routing is identical form one *route class* (`replay/families.routing_key`); the small
   fault timeline (no replication progress, no produce) is collected once for liveness-aware routing;
3. route produce events per class (`mapInArrow`, no shuffle) and fan broker events out to the units (Kafka
   partitions, RocketMQ broker groups) whose replicas they concern (broadcast join, no shuffle);
4. ONE shuffle: every (class, unit)'s events to one task, sorted by time in the SPEC §2.2 order, replayed there
   in time chunks by one chunked kernel per policy (`pipelines/replay_groups.py`);
5. split the kernels' output into message_outcomes, partition_states and unavailability, then hand them to
   `pipelines.publish` (windows, summary, output gate, Delta writes, run protocol) and MLflow.

Several `--policy` arguments share steps 1-4: one read, one gate, one shuffle (SPEC §10 "one pass").
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __name__ == "__main__" and __package__ in (None, ""):
    # spark-submit pipelines/replay_job.py without --py-files: the repo root holds the packages.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

log = logging.getLogger(__name__)


@dataclass
class PolicyRun:
    """One policy of an invocation, with everything the outputs need to know about it."""

    index: int
    policy: Any  # replay.policies.Policy
    run_id: str
    layout: Any  # replay.families.Layout
    partitions: int
    #: unit -> the partitions (Kafka) or queues (RocketMQ) its timeline and unavailability apply to
    unit_partitions: dict[int, tuple[int, ...]]
    min_insync_replicas: int | None

    @property
    def canonical(self) -> str:
        return self.policy.canonical()


@dataclass
class ReplayFrames:
    """The replay's raw results for every policy of one invocation (Spark DataFrames in the table schemas)."""

    runs: list[PolicyRun]
    message_outcomes: Any
    partition_states: Any
    unavailability: Any
    replication_bytes: dict[str, int]
    control: Any = None  # replay.events.PartitionEvents: the fault timeline the plan routed with
    raw: Any = None  # the persisted kernel output the three frames read

    def release(self) -> None:
        if self.raw is not None:
            self.raw.unpersist()


@dataclass
class ReplayReport:
    """What `run_replay` returns: one summary per policy, in --policy order, and where things went."""

    trace_id: str
    runs: list[PolicyRun]
    summaries: list[dict[str, Any]]
    lakehouse: str | None
    quarantined: int = 0
    mlflow: dict[str, str] = field(default_factory=dict)
    experiment: str | None = None
    trace_gate_report: str | None = None
    output_gate_report: str | None = None
    #: How to name each policy in tables (default: its canonical string)
    labels: list[str] | None = None

    def summary_json(self) -> list[dict[str, Any]]:
        """SPEC §6.1: one object per policy in --policy order: policy, run_id and every run_summary field."""
        from schemas.tables import SUMMARY_FIELDS

        return [{"policy": r.canonical, "run_id": r.run_id, **{k: s.get(k) for k in SUMMARY_FIELDS}}
                for r, s in zip(self.runs, self.summaries)]


# ------------------------------------------------------------------------------------------------ planning
def policy_runs(policies: Sequence[Any], manifest) -> list[PolicyRun]:
    """Layouts, run ids and partition maps of the policies; the same policy twice is bad input."""
    from pipelines import __version__
    from replay.families import family_of
    from replay.policies import run_id
    from schemas.errors import BadInput

    seen: dict[str, int] = {}
    out = []
    for i, policy in enumerate(policies):
        canonical = policy.canonical()
        if canonical in seen:
            raise BadInput(f"--policy #{i + 1} ({canonical}) is the same policy as --policy #{seen[canonical] + 1}",
                           rule="policy-duplicate")
        seen[canonical] = i
        fam = family_of(policy)
        layout = fam.layout(policy, manifest)
        unit_parts = {u: tuple(fam.partitions_of(policy, layout, u)) for u in layout.units}
        out.append(PolicyRun(i, policy, run_id(manifest.trace_id, policy, __version__), layout,
                             fam.partition_count(policy, layout), unit_parts, fam.min_insync_replicas(policy)))
    return out


def route_classes(runs: Sequence[PolicyRun]):
    """Group policies that route every message identically (`Family.routing_key`): one shuffle group each."""
    from pipelines.replay_groups import RouteClass
    from replay.families import family_of

    classes: dict[Any, RouteClass] = {}
    for r in runs:
        key = family_of(r.policy).routing_key(r.policy)
        if key not in classes:
            classes[key] = RouteClass(len(classes), [])
        classes[key].members.append((r.index, r.policy, r.layout))
    return list(classes.values())


def control_timeline(events_df):
    """The fault timeline (crash … heal, no replicate, no produce) on the driver: small by nature."""
    from pyspark.sql import functions as F

    from replay.events import PartitionEvents
    from schemas.trace import Kind

    control_kinds = [k.label for k in Kind if k not in (Kind.REPLICATE, Kind.PRODUCE)]
    rows = (events_df.where(F.col("kind").isin(*control_kinds)).select("ts_us", "kind", "broker")
            .toArrow())
    ts = rows.column("ts_us").to_numpy(zero_copy_only=False).astype(np.int64)
    kind = np.array([Kind.from_label(k).value for k in rows.column("kind").to_pylist()], dtype=np.int8)
    broker = rows.column("broker").to_numpy(zero_copy_only=False).astype(np.int64)
    z = np.zeros(0, dtype=np.int64)
    return PartitionEvents(z, z, z, ts, kind, broker, np.zeros(len(ts), dtype=np.int64)).sorted()


def _kind_code():
    """SPEC §2.2's same-instant order as a sortable code (schemas.trace.Kind values)."""
    from pyspark.sql import functions as F

    from schemas.trace import KIND_LABELS

    return (F.array_position(F.array(*[F.lit(k) for k in KIND_LABELS]), F.col("kind")) - 1).cast("tinyint")


def with_msg_rank(produce_df):
    """Each message's index in msg_id order over the whole trace (SPEC §3.2 rule 1, §3.3 rule 2).

    Generated traces number messages densely (1..n), and msg_id is unique (trace gate), so the rank is
    msg_id − min when max − min + 1 = count: no sort. Otherwise one range-partitioned sort numbers them.
    """
    from pyspark.sql import functions as F

    stats = produce_df.agg(F.min("msg_id").alias("lo"), F.max("msg_id").alias("hi"),
                           F.count(F.lit(1)).alias("n")).first()
    if stats["n"] == 0:
        return produce_df.withColumn("msg_rank", F.lit(0).cast("long"))
    if stats["hi"] - stats["lo"] + 1 == stats["n"]:
        return produce_df.withColumn("msg_rank", F.col("msg_id") - F.lit(int(stats["lo"])))
    spark = produce_df.sparkSession
    parts = max(1, int(spark.conf.get("spark.sql.shuffle.partitions")))
    ordered = (produce_df.repartitionByRange(parts, "msg_id").sortWithinPartitions("msg_id")
               .withColumn("_p", F.spark_partition_id()).withColumn("_m", F.monotonically_increasing_id())
               .persist())
    counts = sorted((r["_p"], r["count"]) for r in ordered.groupBy("_p").count().collect())
    offsets, total = {}, 0
    for p, c in counts:
        offsets[p] = total
        total += c
    offset = F.element_at(F.create_map(*[x for p, o in offsets.items() for x in (F.lit(p), F.lit(o))]), F.col("_p"))
    local = F.col("_m") - F.shiftleft(F.col("_p").cast("long"), 33)  # monotonically_increasing_id's layout
    return ordered.withColumn("msg_rank", (offset + local).cast("long")).drop("_p", "_m")


# ------------------------------------------------------------------------------------------------ the replay
def replay_frames(spark, manifest, events_df, runs: Sequence[PolicyRun], window_ms: int = 1000) -> ReplayFrames:
    """Steps 2-5 of the module docstring for clean events (SPEC §2.1 columns); nothing is written."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from pipelines.replay_groups import (
        OUTPUT_DDL,
        ROUTED_DDL,
        ReplayPlan,
        route_batches,
        run_groups,
    )
    from schemas.trace import Kind

    classes = route_classes(runs)
    plan = ReplayPlan(manifest, classes, control_timeline(events_df), window_us=window_ms * 1000)

    events = events_df.withColumn("kind_code", _kind_code())
    produce = with_msg_rank(events.where(F.col("kind_code") == int(Kind.PRODUCE))
                            .select("ts_us", "msg_id", "key", "size_bytes", "producer_id"))
    routed = produce.mapInArrow(route_batches(plan), ROUTED_DDL)

    # Broker events go to every unit that hosts the broker, in every class (a kernel ignores other brokers).
    fanout = spark.createDataFrame(
        [(rc.index, u, b) for rc in classes for u in rc.units for b in rc.router[1].replicas[u]],
        "cls INT, unit INT, broker INT").dropDuplicates()
    brokers = events.where(F.col("kind_code") != int(Kind.PRODUCE)).join(F.broadcast(fanout), "broker")
    broker_rows = brokers.select(
        "cls", "unit", "ts_us", "kind_code", "broker", "upto_us", F.lit(None).cast("long").alias("msg_id"),
        F.lit(None).cast("int").alias("size_bytes"), F.lit(None).cast("string").alias("key"),
        F.lit(None).cast("int").alias("producer_id"), F.lit(None).cast("int").alias("partition"),
        F.lit(None).cast("long").alias("delay_us"))

    groups = max(1, sum(len(rc.units) for rc in classes))
    parts = min(groups, max(1, int(spark.conf.get("spark.sql.shuffle.partitions"))))
    grouped = (routed.unionByName(broker_rows)
               .repartition(parts, "cls", "unit")
               .sortWithinPartitions("cls", "unit", "ts_us", "kind_code", "msg_id", "broker"))
    raw = grouped.mapInArrow(run_groups(plan), OUTPUT_DDL).persist(StorageLevel.MEMORY_AND_DISK)

    messages, states, intervals, totals = frames_from_raw(spark, runs, raw)
    return ReplayFrames(list(runs), messages, states, intervals, totals, plan.control, raw)


def frames_from_raw(spark, runs: Sequence[PolicyRun], raw):
    """message_outcomes, partition_states and unavailability (their table schemas) and replication bytes per
    run, from the kernels' output rows (`replay_groups.OUTPUT_DDL`); the batch and the stream replay share it."""
    from pyspark.sql import functions as F

    from pipelines.replay_groups import MESSAGE, STATE, UNAVAILABLE, UNIT
    from schemas.outcomes import ERROR_LABELS, FATE_LABELS, STATUS_LABELS
    from schemas.tables import TABLES

    run_ids = F.element_at(F.array(*[F.lit(r.run_id) for r in runs]), F.col("policy_idx") + 1)

    def label(col: str, labels: list[str | None]):
        return F.element_at(F.array(*[F.lit(v).cast("string") for v in labels]), F.col(col).cast("int") + 1)

    messages = raw.where(F.col("rtype") == MESSAGE).select(
        run_ids.alias("run_id"), "msg_id", "key", "producer_id", "partition", "produce_us",
        label("status", STATUS_LABELS).alias("status"), label("error", ERROR_LABELS).alias("error"), "ack_us",
        (F.col("ack_us") - F.col("produce_us")).alias("latency_us"), label("fate", FATE_LABELS).alias("fate"),
        "readable_at_end", "offset", "visible_us")

    # Timelines and intervals are per unit; a RocketMQ group's apply to each of its queues.
    unit_parts = spark.createDataFrame(
        [(r.index, u, p) for r in runs for u, ps in r.unit_partitions.items() for p in ps],
        "policy_idx INT, unit INT, part INT")
    per_partition = raw.join(F.broadcast(unit_parts), ["policy_idx", "unit"])
    states = per_partition.where(F.col("rtype") == STATE).select(
        run_ids.alias("run_id"), F.col("part").alias("partition"), "ts_us", "leader", "leader_epoch", "isr",
        "log_end_offset", "high_watermark")
    intervals = per_partition.where(F.col("rtype") == UNAVAILABLE).select(
        run_ids.alias("run_id"), F.col("part").alias("partition"), "start_us", "end_us")

    totals = dict.fromkeys((r.run_id for r in runs), 0)
    for row in (raw.where(F.col("rtype") == UNIT).groupBy("policy_idx")
                .agg(F.sum("replication_bytes").alias("b")).collect()):
        totals[runs[row["policy_idx"]].run_id] = int(row["b"] or 0)

    def conform(name: str, df):
        schema = TABLES[name].spark_schema()
        return df.select(*[F.col(f.name).cast(f.dataType).alias(f.name) for f in schema.fields])

    return (conform("message_outcomes", messages), conform("partition_states", states),
            conform("unavailability", intervals), totals)


def run_infos(runs: Sequence[PolicyRun], manifest, replication_bytes: dict[str, int]):
    from pipelines.metrics import RunInfo

    return [RunInfo(r.run_id, manifest.duration_us, r.partitions, r.min_insync_replicas, r.layout.brokers_used,
                    r.layout.replicas_per_message, replication_bytes.get(r.run_id, 0)) for r in runs]


def run_records(runs: Sequence[PolicyRun], trace_id: str, mode: str, mlflow_ids: dict[str, str] | None = None):
    from pipelines.lakehouse import RunRecord

    ids = mlflow_ids or {}
    return [RunRecord(r.run_id, trace_id, r.canonical, r.policy.family, r.policy.params(), mode,
                      mlflow_run_id=ids.get(r.run_id)) for r in runs]


# ------------------------------------------------------------------------------------------------ the job
@dataclass
class ReplayRequest:
    trace: str
    policies: list[Any]
    lakehouse: str = "lakehouse"
    window_ms: int = 1000
    mode: str = "batch"
    tracking_uri: str | None = None
    experiment: str | None = None
    mlflow: bool = True
    summary_json: str | None = None
    checkpoint: str | None = None
    allowed_lateness_ms: int = 0
    #: The policies as typed (MLflow run names: a preset name rather than the canonical string)
    labels: list[str] | None = None


def run_replay(spark, request: ReplayRequest, *, progress=None) -> ReplayReport:
    """The whole replay of one trace under every policy of the request (batch mode)."""
    from expectations import invariants
    from expectations.trace_gate import run_trace_gate
    from pipelines.lakehouse import Lakehouse
    from pipelines.publish import ReplayResults, publish
    from pipelines.trace_loader import locate
    from schemas.errors import BadInput

    if request.window_ms <= 0:
        raise BadInput(f"--window-ms must be > 0, got {request.window_ms}", rule="argument")
    step = progress or (lambda text: log.info(text))
    tf = locate(request.trace)
    manifest = tf.manifest
    runs = policy_runs(request.policies, manifest)
    run_ids = [r.run_id for r in runs]
    lakehouse = Lakehouse(request.lakehouse, spark, create=False)

    step("trace gate")
    # The gate's `validations` row is written with the output gate's (one commit instead of two).
    events, gate = run_trace_gate(spark, tf, lakehouse, run_ids=run_ids, defer_validations=True)
    events = events.persist()
    tracker = None
    try:
        if request.mlflow:
            from pipelines import tracking

            tracker = tracking.ReplayTracker.start(request.tracking_uri, request.experiment or manifest.trace_id,
                                                   manifest, runs, mode=request.mode, labels=request.labels)
        step(f"replay {len(runs)} polic{'y' if len(runs) == 1 else 'ies'}")
        frames = replay_frames(spark, manifest, events, runs, request.window_ms)
        try:
            results = ReplayResults(
                run_records(runs, manifest.trace_id, request.mode, tracker.run_ids if tracker else None),
                run_infos(runs, manifest, frames.replication_bytes), frames.message_outcomes,
                frames.partition_states, frames.unavailability, events)
            step("windows, output gate, Delta tables")
            checks = invariants.checks(spark, runs, frames.message_outcomes, frames.partition_states,
                                       frames.control)
            summaries = publish(spark, lakehouse, results, trace_id=manifest.trace_id,
                                window_ms=request.window_ms, extra_checks=checks)
        finally:
            frames.release()
        report = ReplayReport(manifest.trace_id, runs, summaries, str(lakehouse.root), gate.quarantined,
                              trace_gate_report=str(gate.report_html) if gate.report_html else None)
        if tracker is not None:
            step("MLflow")
            tracker.finish(report, lakehouse, window_ms=request.window_ms, trace_dir=tf.root,
                           gate_reports=[p for p in (gate.report_html, gate.report_json) if p])
            report.mlflow, report.experiment = tracker.run_ids, tracker.experiment_name
    except BaseException as exc:
        if tracker is not None:
            tracker.fail(exc)  # no MLflow run stays RUNNING after a failed replay
        raise
    finally:
        lakehouse.flush_validations()  # the trace gate's row, if the output gate never wrote it
        events.unpersist()
        if gate.report is not None:
            gate.report.release()
    if request.summary_json:
        out = Path(request.summary_json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report.summary_json(), indent=1) + "\n")
    return report


# ------------------------------------------------------------------------------------------------ output
COMPARISON_COLUMNS: tuple[tuple[str, str, str], ...] = (
    # (summary field, header, format)
    ("produced", "produced", "{:,}"),
    ("acked", "acked", "{:,}"),
    ("acked_lost", "acked lost", "{:,}"),
    ("failed_committed", "failed but committed", "{:,}"),
    ("stranded", "stranded", "{:,}"),
    ("availability", "availability", "{:.4%}"),
    ("unavailable_partition_seconds", "unavailable partition-s", "{:,.1f}"),
    ("ack_latency_p50_ms", "ack p50 ms", "{:,.1f}"),
    ("ack_latency_p99_ms", "ack p99 ms", "{:,.1f}"),
    ("visibility_lag_p99_ms", "visible p99 ms", "{:,.1f}"),
    ("brokers_used", "brokers", "{}"),
)


def comparison_rows(report: ReplayReport) -> list[dict[str, str]]:
    rows = []
    labels = report.labels or [r.canonical for r in report.runs]
    for label, s in zip(labels, report.summaries):
        row = {"policy": label}
        for name, header, fmt in COMPARISON_COLUMNS:
            value = s.get(name)
            row[header] = "–" if value is None else fmt.format(value)
        rows.append(row)
    return rows


def print_comparison(report: ReplayReport, console=None) -> None:
    from rich.table import Table

    from pipelines.terminal import console as terminal

    console = console or terminal()
    table = Table(title=f"trace {report.trace_id}: {len(report.runs)} policies", title_justify="left")
    table.add_column("policy", overflow="fold")
    for _, header, _ in COMPARISON_COLUMNS:
        table.add_column(header, justify="right")
    for row in comparison_rows(report):
        table.add_row(*row.values())
    console.print(table)


def cli(args: argparse.Namespace) -> int:
    from pipelines.session import get_spark
    from pipelines.terminal import console as terminal

    console = terminal()
    request = ReplayRequest(
        trace=args.trace, policies=args.policies, lakehouse=args.lakehouse, window_ms=args.window_ms,
        mode=args.mode, tracking_uri=args.tracking_uri, experiment=args.experiment,
        mlflow=not args.no_mlflow, summary_json=args.summary_json, checkpoint=args.checkpoint,
        allowed_lateness_ms=args.allowed_lateness_ms, labels=list(args.policy))
    spark = get_spark("replab-replay")
    if request.mode == "stream":
        from pipelines.stream_job import run_stream_replay

        report = run_stream_replay(spark, request, progress=lambda t: console.log(t))
    else:
        report = run_replay(spark, request, progress=lambda t: console.log(t))
    report.labels = list(args.policy)  # as the user wrote them (preset names read better than canonical forms)
    print_comparison(report, console)
    console.print(f"lakehouse: {report.lakehouse}")
    if report.experiment:
        console.print(f"MLflow experiment: {report.experiment} ({len(report.mlflow)} runs)")
    if request.summary_json:
        console.print(f"summary JSON: {request.summary_json}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """spark-submit entry point: the same arguments as `replab replay`."""
    from pipelines.cli import main as cli_main

    return cli_main(["replay", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
