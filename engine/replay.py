"""The replay engine: one trace under policies on Spark (SPEC §4); the batch mode, and what stream mode shares.

The job only routes, groups and writes; every rule of SPEC §3 lives in `replay/` (the kernels):

1. read the trace and run the trace gate (SPEC §2.3, §7): fatal rules stop with exit 2 before any table is
   written; quarantined rows leave the replay;
2. plan: policies whose routing is identical form one *route class* (`replay/families.routing_key`); the small
   fault timeline (no replication progress, no produce) is collected once for liveness-aware routing;
3. route produce events per class and fan broker events out to the units (Kafka partitions, RocketMQ broker
   groups) whose replicas they concern, in one `mapInArrow` (no shuffle) that packs each (class, unit)'s events
   of an input batch into one row (`engine.groups.bundle_batches`);
4. ONE shuffle of those few rows: every (class, unit)'s events to one task, sorted there by time in the SPEC
   §2.2 order and replayed in chunks by one chunked kernel per policy (`engine.groups.run_groups`);
5. split the kernels' output into message_outcomes, partition_states and unavailability, then hand them to
   `engine.publish` (windows, summary, output gate, Delta writes, run protocol) and MLflow.

Several `--policy` arguments share steps 1-4: one read, one gate, one shuffle (SPEC §10 "one pass").
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from engine.plan import (
    OutcomeFrames,
    PolicyRun,
    ReplayReport,
    ReplayRequest,
    place_groups,
    policy_runs,
    route_classes,
    run_infos,
    run_records,
)
from storage.session import local_frame, uncompressed_cache
from storage.trace_loader import ProduceStats, TraceDigest, locate, rows_before_start

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from engine.tracking import ReplayTracker
    from replay.events import PartitionEvents
    from storage.lakehouse import HeldTables, Lakehouse


log = logging.getLogger(__name__)


@dataclass
class ReplayFrames:
    """The batch replay's results for every policy of one invocation, with what they were computed from."""

    runs: list[PolicyRun]
    outcomes: OutcomeFrames
    control: PartitionEvents | None = None  # the fault timeline the plan routed with
    raw: DataFrame | None = None  # the persisted kernel output the frames read (`unpacked`)

    def release(self) -> None:
        if self.raw is not None:
            self.raw.unpersist()


def control_timeline(events_df, digest: TraceDigest | None = None):
    """The fault timeline (crash … heal, no replicate, no produce) on the driver: small by nature. Read off
    `digest` (the trace gate's, when it held the trace) if given, else by one Spark job over `events_df`."""
    from pyspark.sql import functions as F

    from replay.events import PartitionEvents
    from schemas.trace import CONTROL_KINDS, kind_codes
    from storage.trace_loader import CONTROL_COLUMNS

    if digest is not None:
        rows = digest.control
    else:
        rows = (events_df.where(F.col("kind").isin(*[k.label for k in CONTROL_KINDS])).select(*CONTROL_COLUMNS)
                .toArrow())
    ts = rows.column("ts_us").to_numpy(zero_copy_only=False).astype(np.int64)
    kind = kind_codes(rows.column("kind"))
    broker = rows.column("broker").to_numpy(zero_copy_only=False).astype(np.int64)
    z = np.zeros(0, dtype=np.int64)
    return PartitionEvents(z, z, z, ts, kind, broker, np.zeros(len(ts), dtype=np.int64)).sorted()


def _kind_code():
    """SPEC §2.2's same-instant order as a sortable code (schemas.trace.Kind values)."""
    from pyspark.sql import functions as F

    from schemas.trace import KIND_LABELS

    return (F.array_position(F.array(*[F.lit(k) for k in KIND_LABELS]), F.col("kind")) - 1).cast("tinyint")


#: Message outcomes (messages × policies) a replay task holds at least before a replay uses more tasks than
#: spark.sql.shuffle.partitions. With few tasks the last one runs alone while the other cores idle; a task of its
#: own costs under a CPU-second, small against replaying this many outcomes. The groups are placed by expected
#: work (`place_groups`): hashed, they left some tasks empty and gave others two heavy groups.
TASK_OUTCOMES = 4_000_000


def replay_tasks(groups: int, outcomes: int, shuffle_partitions: int) -> int:
    """How many tasks replay the (class, unit) groups: spark.sql.shuffle.partitions, more for a large replay (one
    per TASK_OUTCOMES outcomes), never more than the groups."""
    return max(1, min(groups, max(shuffle_partitions, outcomes // TASK_OUTCOMES)))


def task_of(placed: dict[tuple[int, int], int]):
    """A column: each BUNDLE_SCHEMA row's replay task from `engine.plan.place_groups`."""
    from pyspark.sql import functions as F

    key = F.col("class_id").cast("long") * (1 << 32) + F.col("unit").cast("long")
    pairs = [x for (class_id, unit), task in sorted(placed.items())
             for x in (F.lit((class_id << 32) + unit).cast("long"), F.lit(task))]
    return F.element_at(F.create_map(*pairs), key).cast("int")


def produce_counts(produce_df) -> ProduceStats:
    """The produce rows' msg_id range and count: one Spark job (`TraceDigest.produce` where the driver has it)."""
    from pyspark.sql import functions as F

    row = produce_df.agg(F.min("msg_id").alias("lo"), F.max("msg_id").alias("hi"),
                         F.count(F.lit(1)).alias("n")).first()
    return ProduceStats(row["lo"], row["hi"], int(row["n"]))


def with_msg_rank(produce_df, stats: ProduceStats | None = None):
    """Each message's index in msg_id order over the whole trace (SPEC §3.2 rule 1, §3.3 rule 2).

    Generated traces number messages densely (1..n), and msg_id is unique (trace gate), so the rank is
    msg_id − min when max − min + 1 = count: no sort. Otherwise one range-partitioned sort numbers them.
    `stats`: `produce_counts(produce_df)` if the caller has it.
    """
    from pyspark.sql import functions as F

    stats = stats or produce_counts(produce_df)
    if stats.dense:
        return produce_df.withColumn("msg_rank", F.col("msg_id") - F.lit(int(stats.lo or 0)))
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
def replay_frames(spark, manifest, events_df, runs: Sequence[PolicyRun], window_ms: int = 1000,
                  digest: TraceDigest | None = None) -> ReplayFrames:
    """Steps 2-5 of the module docstring for clean events (SPEC §2.1 columns); nothing is written. `digest`: the
    trace gate's digest of these very events, if it has one (`GateResult.digest`)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from engine.groups import (
        BUNDLE_DDL,
        PERSISTED_OUTPUT_DDL,
        ROUTE_INPUT_COLUMNS,
        ReplayPlan,
        bundle_batches,
        run_groups,
    )
    from schemas.trace import Kind

    classes = route_classes(runs)
    plan = ReplayPlan(manifest, classes, control_timeline(events_df, digest), window_us=window_ms * 1000,
                      feed_rows=int(spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")))

    events = events_df.withColumn("kind_code", _kind_code())
    is_produce = F.col("kind_code") == int(Kind.PRODUCE)
    produce_events = events.where(is_produce).select("ts_us", "msg_id", "key", "size_bytes", "producer_id")
    counts = digest.produce if digest is not None else produce_counts(produce_events)
    # The route stage's rows (ROUTE_INPUT_COLUMNS): produce rows with their rank, broker rows with none.
    produce_fill = {"kind_code": F.lit(int(Kind.PRODUCE)).cast("tinyint"), "broker": F.lit(None).cast("int"),
                    "upto_us": F.lit(None).cast("long")}
    produce = with_msg_rank(produce_events, counts).select(
        *[produce_fill[c].alias(c) if c in produce_fill else c for c in ROUTE_INPUT_COLUMNS])
    brokers = events.where(~is_produce).select(
        *[F.lit(None).cast("long").alias(c) if c == "msg_rank" else c for c in ROUTE_INPUT_COLUMNS])
    bundles = produce.unionByName(brokers).mapInArrow(bundle_batches(plan), BUNDLE_DDL)

    groups = max(1, sum(len(rc.units) for rc in classes))
    parts = replay_tasks(groups, counts.n * len(runs), int(spark.conf.get("spark.sql.shuffle.partitions")))
    grouped = (bundles.repartitionById(parts, task_of(place_groups(classes, parts)))
               .sortWithinPartitions("class_id", "unit"))
    # On disk, not in memory: the kernels' output (a row per message per policy) outgrows the heap at 10 M events
    # and 7 policies (MEMORY_AND_DISK ran out of a 4 GB heap there); read back from the page cache, the four
    # frames derived from it were as fast at 1 M events and the driver JVM's peak RSS 1 GB lower. Uncompressed:
    # the columnar cache's dictionary statistics took a fifth of the JVM's CPU in the 7 Kafka presets' replay at
    # 1 M events; uncompressed it takes 640 MB on disk instead of 579 (frames 14.3 -> 10.8 s). `frames_from_raw`
    # fills it.
    with uncompressed_cache(spark):
        raw = grouped.mapInArrow(run_groups(plan), PERSISTED_OUTPUT_DDL).persist(StorageLevel.DISK_ONLY)
        frames = frames_from_raw(spark, runs, unpacked(raw))
    return ReplayFrames(list(runs), frames, plan.control, raw)


def unpacked(raw):
    """The kernels' output rows persisted in `engine.groups.PERSISTED_OUTPUT_SCHEMA`, read as OUTPUT_SCHEMA: a
    projection (a query of message columns reads only those from the cache)."""
    from engine.groups import MESSAGE_COLUMNS

    return raw.select(*MESSAGE_COLUMNS, "detail.*")


def frames_from_raw(spark, runs: Sequence[PolicyRun], raw) -> OutcomeFrames:
    """The frames of the kernels' output rows (`engine.groups.OUTPUT_DDL`); the batch and the stream replay share
    it."""
    from pyspark.sql import functions as F

    from engine.groups import HISTOGRAM_ROW_TYPES, MESSAGE, STATE, UNAVAILABLE, UNIT, WINDOW
    from engine.metrics import HISTOGRAM_METRICS, WINDOW_COUNTS, WINDOW_TIMES
    from schemas.outcomes import ERROR_LABELS, FATE_LABELS, STATUS_LABELS
    from storage.lakehouse import as_table

    run_ids = F.element_at(F.array(*[F.lit(r.run_id) for r in runs]), F.col("policy_idx") + 1)

    def label(col: str, labels: list[str | None]):
        return F.element_at(F.array(*[F.lit(v).cast("string") for v in labels]), F.col(col).cast("int") + 1)

    messages = raw.where(F.col("rtype") == MESSAGE).select(
        run_ids.alias("run_id"), "msg_id", "key", "producer_id", "partition", "produce_us",
        label("status", STATUS_LABELS).alias("status"), label("error", ERROR_LABELS).alias("error"), "ack_us",
        (F.col("ack_us") - F.col("produce_us")).alias("latency_us"), label("fate", FATE_LABELS).alias("fate"),
        "readable_at_end", "offset", "visible_us")

    # Timelines and intervals are per unit; a RocketMQ group's apply to each of its queues.
    unit_parts = local_frame(
        spark, [(r.index, u, p) for r in runs for u, ps in r.unit_partitions.items() for p in ps],
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

    # Unrouted messages (partition -1) of a run may come from several units; their windows add up (no latency or
    # lag there: `engine.groups._window_batch`). Every other (run, partition, window) has one row already.
    windows = None  # a stream checkpoint written by an older replab has no window rows: Spark aggregates instead
    if "window_start_us" in raw.columns:
        windows = (raw.where(F.col("rtype") == WINDOW)
                   .groupBy(run_ids.alias("run_id"), "partition", "window_start_us")
                   .agg(*[F.sum(c).cast("long").alias(c) for c in WINDOW_COUNTS],
                        *[F.max(c).alias(c) for c in WINDOW_TIMES]))
    histograms = None  # nor histogram rows: run_summary aggregates the outcomes
    if "frequency" in raw.columns:
        metric = F.lit(None).cast("string")
        for rtype, name in zip(HISTOGRAM_ROW_TYPES, HISTOGRAM_METRICS, strict=True):
            metric = F.when(F.col("rtype") == rtype, F.lit(name)).otherwise(metric)
        histograms = raw.where(F.col("rtype").isin(*HISTOGRAM_ROW_TYPES)).select(
            run_ids.alias("run_id"), metric.alias("metric"), "value", "frequency")

    return OutcomeFrames(as_table(messages, "message_outcomes"), as_table(states, "partition_states"),
                         as_table(intervals, "unavailability"), windows, histograms, totals)


# ------------------------------------------------------------------------------------------------ shared by modes
def check_request(request: ReplayRequest) -> None:
    """What both modes refuse before reading anything: bad arguments (exit 2), an MLflow store that cannot be
    used (exit 2 for a file store, 1 for a server that does not answer)."""
    from schemas.errors import BadInput

    if request.window_ms <= 0:
        raise BadInput(f"--window-ms must be > 0, got {request.window_ms}", rule="argument")
    if request.mlflow:
        from engine.tracking import check_tracking_uri

        check_tracking_uri(request.tracking_uri)


def start_tracker(request: ReplayRequest, manifest, runs: Sequence[PolicyRun], mode: str) -> ReplayTracker | None:
    """The MLflow runs of the replay (None with --no-mlflow), created before any Delta write."""
    if not request.mlflow:
        return None
    from engine import tracking

    return tracking.ReplayTracker.start(request.tracking_uri, request.experiment or manifest.trace_id, manifest,
                                        runs, mode=mode, figures=request.figures, labels=request.labels)


def finish_tracker(tracker: ReplayTracker | None, report: ReplayReport, lakehouse: Lakehouse | HeldTables,
                   request: ReplayRequest, trace_dir: str | Path, gate_reports: Sequence[str | Path | None],
                   step: Callable[[str], None]) -> None:
    """Log the results to the MLflow runs, end them FINISHED and note them in the report. `lakehouse`: where the
    runs' tables are read (`HeldTables` while the replay still holds them)."""
    if tracker is None:
        return
    step("MLflow")
    tracker.finish(report, lakehouse, window_ms=request.window_ms, trace_dir=trace_dir,
                   gate_reports=[p for p in gate_reports if p])
    report.mlflow, report.experiment, report.views = tracker.run_ids, tracker.experiment_name, tracker.views


def write_summary_json(request: ReplayRequest, report: ReplayReport) -> None:
    """--summary-json (SPEC §6.1)."""
    if request.summary_json:
        out = Path(request.summary_json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report.summary_json(), indent=1) + "\n")


#: A replay of at most this many message outcomes (produced messages x policies) is small (`small_replay`): it
#: runs on Spark's interpreted expressions (`storage.session.interpreted_expressions`), and `replab replay` starts
#: its JVM with HotSpot's C1 compiler only (`storage.session.get_spark(short_lived=True)`). In a fresh JVM,
#: compiling the ~380 classes Spark generates for a replay costs more than interpreting the rows of a small one,
#: and C1 alone starts sooner than the tiered compilers; a large replay (the demo) is faster compiled (the
#: benchmarks in bench/ give the figures).
SMALL_REPLAY_OUTCOMES = 300_000


def small_replay(messages: int | None, policies: int) -> bool:
    """Whether a replay of `messages` produced messages (or any upper bound of them; None: not known) under
    `policies` policies is small (SMALL_REPLAY_OUTCOMES)."""
    return messages is not None and messages * policies <= SMALL_REPLAY_OUTCOMES


def replay_expressions(spark, digest: TraceDigest | None, policies: int):
    """The block runs on interpreted expressions for a small replay (`small_replay`), as it is otherwise.
    `digest`: the trace gate's (None for a trace gated by Spark, which is never small)."""
    from contextlib import nullcontext

    from storage.session import interpreted_expressions

    small = small_replay(digest.produce.n if digest is not None else None, policies)
    return interpreted_expressions(spark) if small else nullcontext()


def short_lived_jvm(request: ReplayRequest) -> bool:
    """Whether the process that runs `request` alone (`replab replay`) may start its JVM on C1 only: a batch
    replay whose trace's events (an upper bound of its produced messages, counted before Spark starts:
    `storage.trace_loader.rows_before_start`) make it small. A trace that cannot be read is not: the trace gate
    reports it (file, row, rule), as before. A stream replay is not: its trace may still be growing (`replab
    generate --live`), so its size at the start says nothing about the run."""
    if request.mode != "batch":
        return False
    return small_replay(rows_before_start(request.trace), len(request.policies))


def run_replay(spark, request: ReplayRequest, *, progress=None) -> ReplayReport:
    """The whole replay of one trace under every policy of the request (batch mode)."""
    from engine.publish import ReplayResults, publishing
    from expectations import invariants
    from expectations.trace_gate import run_trace_gate
    from storage.lakehouse import Lakehouse

    check_request(request)
    step = progress or (lambda text: log.info(text))
    tf = locate(request.trace)
    manifest = tf.manifest
    runs = policy_runs(request.policies, manifest)
    run_ids = [r.run_id for r in runs]
    lakehouse = Lakehouse(request.lakehouse, spark, create=False)
    lakehouse.check_writable()

    step("trace gate")
    # The gate's `validations` row is written with the output gate's (one commit instead of two).
    events, gate = run_trace_gate(spark, tf, lakehouse, run_ids=run_ids, defer_validations=True)
    events = events.persist()
    tracker = None
    try:
        with replay_expressions(spark, gate.digest, len(runs)):
            if request.mlflow:
                step("MLflow runs")
            tracker = start_tracker(request, manifest, runs, request.mode)
            step(f"replay {len(runs)} polic{'y' if len(runs) == 1 else 'ies'}")
            frames = replay_frames(spark, manifest, events, runs, request.window_ms, gate.digest)
            try:
                results = ReplayResults(
                    run_records(runs, manifest.trace_id, request.mode, tracker.run_ids if tracker else None),
                    run_infos(runs, manifest, frames.outcomes.replication_bytes), frames.outcomes, events)
                step("windows and summary")
                checks = invariants.checks(spark, runs, frames.outcomes.message_outcomes,
                                           frames.outcomes.partition_states, frames.control)
                with publishing(spark, lakehouse, results, trace_id=manifest.trace_id, window_ms=request.window_ms,
                                extra_checks=checks, progress=step) as published:
                    report = ReplayReport(manifest.trace_id, runs, published.summaries, str(lakehouse.root),
                                          gate.quarantined,
                                          trace_gate_report=str(gate.report_html) if gate.report_html else None)
                    finish_tracker(tracker, report, published.tables, request, tf.root,
                                   [gate.report_html, gate.report_json], step)
            finally:
                frames.release()
    except BaseException as exc:
        if tracker is not None:
            tracker.fail(exc)  # no MLflow run stays RUNNING after a failed replay
        raise
    finally:
        lakehouse.flush_validations()  # the trace gate's row, if the output gate never wrote it
        events.unpersist()
        if gate.report is not None:
            gate.report.release()
    write_summary_json(request, report)
    return report
