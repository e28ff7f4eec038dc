"""`replab replay --mode stream`: the batch replay's kernels driven by Spark Structured Streaming (SPEC §4.3, §11).

The query
---------
```
trace events/ ──(engine/stream/source.py: files in name order, ≤ N per micro-batch, then an end marker; each file routed
and fanned out by groups.Router as it is read: one packed row per group and source batch)──►
withWatermark(max event time, allowed lateness) ──► groupBy(class_id, unit).transformWithStateInPandas(
ReplayProcessor, RocksDB, event time) ──► foreachBatch(StreamSink)
```
- Groups are the batch job's (class, unit) replay groups; a class whose routing reads the fault timeline (the
  RocketMQ families) is one group per class that routes in state once every fault routing may read for a message
  has arrived, so routing uses "the fault timeline seen so far" and is still exact (`replay/stream.py`).
- Each group buffers its events in the state store until the event-time watermark passes them, then feeds them
  in SPEC §2.2 order to the chunked kernels, whose carried state is kept in the same store as a snapshot plus a
  log of the micro-batches since (`groups.GroupReplay`, `ReplayProcessor`). Rows behind the watermark in
  force when they arrive are late: counted in `watermarks.rows_late` and quarantined (rule `behind-watermark`),
  never fed and never silently dropped.
- A message's fate is known only when the trace ends (SPEC §4.1), so the final tables are produced when the
  watermark passes duration_us: the source's end marker moves it there, every group's end-of-trace event-time
  timer fires in that micro-batch, and each group's task writes its kernels' final rows into the checkpoint. The
  driver then derives message_outcomes, partition_states, unavailability, committed_offsets, loss_metrics and
  run_summary with the batch job's own `engine.publish` (same windows, same output gate, replaceWhere per
  run_id): they equal batch mode row for row.
- Before the end, each micro-batch appends one `watermarks` row per run (batch id, event-time watermark in force,
  max event time seen, rows in, rows late) and quarantines its late rows. There are no provisional windows: every
  loss figure of a window (acked_lost, failed_committed, stranded) depends on fates that the end of the trace
  decides, and a window published early would have to be rewritten.

Exactly once
------------
Spark's checkpoint (offsets, commits, RocksDB state) lives in `<checkpoint>/query`. Per-batch appends carry Delta's
`txnAppId`/`txnVersion` (app id: this checkpoint's uid and the table; version: the batch id), so a batch that runs
again after a crash writes nothing twice. In the final micro-batch each group replaces its file of
`<checkpoint>/final` (the kernels' last rows), and the sink records `final_written` in `<checkpoint>/stream.json`;
publishing replaces the runs' rows (idempotent), logs the MLflow runs and then records `published`. A restart
resumes the query, or publishes, or only reports, by those two marks. The kernels and the processor are
deterministic, so a micro-batch recomputed from the checkpointed state gives the same rows.

Assumptions (where a stream cannot know what the batch job reads from the whole trace)
-------------------------------------------------------------------------------------
- Order: the trace's event files, in name order, are in time order (the generator's contract); a row older than
  the watermark is late, whatever its file.
- Completeness: `events/_COMPLETE` names the file count (generators write it last, live or not); a trace without it
  whose manifest has no generator is hand-written and complete as it is; otherwise the replay waits for it (live).
- msg_rank (round robin in msg_id order, SPEC §3.2 rule 1, §3.3 rule 2): a complete trace is read once for the
  msg_id range (dense ids: msg_id − min; otherwise the sorted ids); a live trace's ids are dense from 1, as
  generators write them.
- Trace gate: a complete trace is gated before the stream starts, exactly as in batch mode, and the source skips
  the quarantined rows. A live trace is gated when it completes (before the final tables); its quarantined rows
  have already been fed to the kernels, so it equals batch mode when it has none (generated traces have none).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.plan import ReplayReport, ReplayRequest, policy_runs, route_classes, run_infos, run_records
from engine.replay import (
    check_request,
    control_timeline,
    finish_tracker,
    frames_from_raw,
    produce_counts,
    start_tracker,
    write_summary_json,
)
from storage.session import local_frame

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from engine.plan import PolicyRun
    from schemas.trace import TraceFiles
    from storage.lakehouse import HeldTables, Lakehouse

log = logging.getLogger(__name__)

#: Files per micro-batch (the generator writes ~1 M events per file, one second of trace per file when live).
DEFAULT_FILES_PER_TRIGGER = 1
#: Processing-time trigger of a live trace (a finite one runs micro-batches back to back).
LIVE_TRIGGER_SECONDS = 2
LATE_RULE = "behind-watermark"
STATE_FILE = "stream.json"


# ------------------------------------------------------------------------------------------------ checkpoint
@dataclass
class StreamCheckpoint:
    """`<checkpoint>/stream.json`: what a restart must find again, next to Spark's own checkpoint (`query/`)."""

    root: Path
    uid: str
    fingerprint: dict[str, Any]
    started: bool = False
    gated: bool = False
    quarantined: int = 0
    gate_report: str | None = None
    live: bool | None = None
    complete_as_is: bool = False
    rank_base: int | None = None
    final_written: bool = False
    published: bool = False

    @property
    def query_dir(self) -> Path:
        return self.root / "query"

    @property
    def final_dir(self) -> Path:
        return self.root / "final"

    @property
    def exclude_file(self) -> Path:
        return self.root / "exclude.json"

    @property
    def msg_ids_file(self) -> Path:
        return self.root / "msg_ids.npy"

    @classmethod
    def open(cls, root: Path, fingerprint: dict[str, Any]) -> StreamCheckpoint:
        from schemas.errors import BadInput

        path = root / STATE_FILE
        if path.is_file():
            raw = json.loads(path.read_text())
            if raw["fingerprint"] != fingerprint:
                raise BadInput(f"checkpoint {root} belongs to another stream replay ({raw['fingerprint']}); use a new "
                               "--checkpoint", rule="argument")
            return cls(root=root, **{k: v for k, v in raw.items() if k != "root"})
        if root.exists() and any(root.iterdir()):
            raise BadInput(f"checkpoint {root} is not empty and holds no {STATE_FILE}", rule="argument")
        ck = cls(root, uuid.uuid4().hex, fingerprint)
        ck.save()
        return ck

    def save(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        body = {k: v for k, v in self.__dict__.items() if k != "root"}
        tmp = self.root / f".{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(body, indent=1) + "\n")
        os.replace(tmp, self.root / STATE_FILE)  # a kill leaves the old or the new file, never half of one


def _fingerprint(manifest, runs, request: ReplayRequest) -> dict[str, Any]:
    return {"trace_id": manifest.trace_id, "duration_us": manifest.duration_us,
            "run_ids": [r.run_id for r in runs], "window_ms": request.window_ms,
            "allowed_lateness_ms": request.allowed_lateness_ms}


def default_checkpoint(lakehouse_root: Path, fingerprint: dict[str, Any]) -> Path:
    """One checkpoint per (trace, policies, window, lateness) under the lakehouse: re-running the command resumes."""
    digest = hashlib.sha1(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]
    return lakehouse_root / "_checkpoints" / f"stream-{digest}"


# ------------------------------------------------------------------------------------------------ trace facts
def is_complete(tf) -> tuple[bool, bool]:
    """(the trace is complete, it is complete as it is: hand-written, no `_COMPLETE` marker)."""
    from engine.stream.source import complete_file_count, event_files

    count = complete_file_count(tf.events_path)
    if count is not None:
        return len(event_files(tf.events_path)) >= count, False
    if tf.manifest.generator is None:
        return True, True
    return False, False


def replayed_events(spark, tf, exclude: dict[str, list[int]]):
    """The trace's events minus rows the replay did not use (SPEC §2.1 columns): `exclude` maps a file name of
    events/ to its 1-based rows (the trace gate's quarantined rows, the late rows)."""
    from pyspark.sql import functions as F

    from schemas.trace import EVENT_COLUMNS
    from storage.trace_loader import read_events_spark

    _, events = read_events_spark(spark, tf, with_location=True)
    pairs = [(str(Path(tf.events_path) / name), int(r)) for name, rows in exclude.items() for r in rows]
    if pairs:
        drop = local_frame(spark, pairs, "_file STRING, _row BIGINT")
        events = events.join(F.broadcast(drop), ["_file", "_row"], "left_anti")
    return events.select(*[n for n, _ in EVENT_COLUMNS])


def late_rows(lakehouse, run_ids: list[str]) -> dict[str, list[int]]:
    """The rows this replay found behind the watermark (quarantined per micro-batch), by file name."""
    from pyspark.sql import functions as F

    from storage.lakehouse import in_predicate

    out: dict[str, list[int]] = {}
    if lakehouse.version("quarantine") is None:
        return out
    rows = (lakehouse.read("quarantine").where(in_predicate("run_id", run_ids)).where(F.col("rule") == LATE_RULE)
            .select("file", "row").distinct().collect())
    for r in rows:
        out.setdefault(Path(r["file"]).name, []).append(int(r["row"]))
    return out


def _gate_complete_trace(spark, tf, lakehouse, runs, ck: StreamCheckpoint) -> None:
    """The trace gate before the stream (as in batch mode); quarantined rows and msg_id ranks go to the checkpoint.
    Its validations row is kept in `lakehouse` for the caller's next commit, which also records `gated`."""
    from pyspark.sql import functions as F

    from expectations.trace_gate import run_trace_gate

    events, gate = run_trace_gate(spark, tf, lakehouse, run_ids=[r.run_id for r in runs], defer_validations=True)
    try:
        exclude: dict[str, list[int]] = {}
        if gate.quarantined:
            for r in gate.report.violations.where(F.col("_quarantined")).select("_file", "_row").collect():
                exclude.setdefault(Path(r["_file"]).name, []).append(int(r["_row"]))
        ck.exclude_file.write_text(json.dumps(exclude))
        ids = events.where(F.col("kind") == "produce").select("msg_id")
        stats = gate.digest.produce if gate.digest is not None else produce_counts(ids)
        if stats.dense:
            ck.rank_base = int(stats.lo or 0)
        else:  # ids with gaps: the rank is the position in the sorted ids
            sorted_ids = np.sort(ids.toArrow().column("msg_id").to_numpy(zero_copy_only=False).astype(np.int64))
            np.save(ck.msg_ids_file, sorted_ids)
            ck.rank_base = None
        ck.quarantined = gate.quarantined
        ck.gate_report = str(gate.report_html) if gate.report_html else None
    finally:
        if gate.report is not None:
            gate.report.release()


# ------------------------------------------------------------------------------------------------ the sink
@dataclass
class StreamSink:
    """foreachBatch: watermarks and late rows per micro-batch (idempotent), the final tables at the end."""

    spark: SparkSession
    lakehouse: Lakehouse
    tf: TraceFiles
    runs: list[PolicyRun]
    request: ReplayRequest
    ck: StreamCheckpoint
    live: bool
    progress: Callable[[str], None]
    max_event_us: int | None = None
    done: bool = False
    error: BaseException | None = None

    @property
    def run_ids(self) -> list[str]:
        return [r.run_id for r in self.runs]

    def resume(self) -> None:
        """After a restart: the largest event time recorded so far (watermarks rows are cumulative)."""
        from pyspark.sql import functions as F

        from storage.lakehouse import in_predicate

        if self.lakehouse.version("watermarks") is None:
            return
        row = (self.lakehouse.read("watermarks").where(in_predicate("run_id", self.run_ids))
               .agg(F.max("max_event_us").alias("m")).first())
        self.max_event_us = row["m"] if row is not None else None

    def __call__(self, df, batch_id: int) -> None:
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        from engine.stream.groups import END, LATE, STATS

        try:
            started = time.monotonic()
            df = df.persist(StorageLevel.MEMORY_AND_DISK)
            try:
                # This action runs the micro-batch: source, routing, state store, kernels.
                per_type = {r["rtype"]: r for r in df.groupBy("rtype").agg(
                    F.count(F.lit(1)).alias("n"), F.sum("rows_in").alias("rows_in"),
                    F.sum("rows_late").alias("rows_late"), F.max("max_event_us").alias("max_event_us"),
                    F.max("watermark_us").alias("watermark_us")).collect()}
                replayed = time.monotonic()
                stats = per_type.get(STATS)
                if stats is not None:
                    self._watermarks(batch_id, stats)
                if LATE in per_type:
                    self._quarantine(df.where(F.col("rtype") == LATE), batch_id)
                if END in per_type:
                    self._record_final_written()
                written = time.monotonic()
                if stats is not None:
                    self._report(batch_id, stats, replayed - started, written - replayed)
                if END in per_type:
                    self.progress("the watermark passed the end of the trace: every group finished")
                    self.done = True
            finally:
                df.unpersist()
        except BaseException as exc:
            self.error = exc
            raise

    # ------------------------------------------------------------------------------ per micro-batch
    def _append_once(self, table: str, df, batch_id: int) -> None:
        """Append a micro-batch's rows exactly once (app id: this checkpoint's uid and the table)."""
        self.lakehouse.append_once(table, df, app_id=f"replab-stream-{self.ck.uid}-{table}", version=batch_id)

    def _watermarks(self, batch_id: int, stats) -> None:
        from schemas.tables import TABLES

        if stats["max_event_us"] is not None:
            self.max_event_us = max(self.max_event_us or 0, int(stats["max_event_us"]))
        rows = [(run_id, batch_id, int(stats["watermark_us"]), self.max_event_us, int(stats["rows_in"] or 0),
                 int(stats["rows_late"] or 0)) for run_id in self.run_ids]
        self._append_once("watermarks", self.spark.createDataFrame(rows, TABLES["watermarks"].spark_schema()),
                          batch_id)

    def _report(self, batch_id: int, stats, replay_s: float, write_s: float) -> None:
        """One line per micro-batch, with where its time went: computing it (source, routing, state store,
        kernels; at the end of the trace also the final rows each group's task writes) and writing it (the
        watermarks append, late rows)."""
        self.progress(f"micro-batch {batch_id}: watermark {int(stats['watermark_us']) / 1e6:.3f} s, "
                      f"max event {(self.max_event_us or 0) / 1e6:.3f} s, {int(stats['rows_in'] or 0):,} rows in, "
                      f"{int(stats['rows_late'] or 0):,} late; replayed in {replay_s:.2f} s, written in "
                      f"{write_s:.2f} s")

    def _late_rows(self, late):
        """Quarantine rows (SPEC §5) for late rows: the raw row as the trace gate writes it, per run."""
        from pyspark.sql import functions as F

        from engine.stream.groups import NULL_BITS
        from engine.stream.source import event_files
        from schemas.trace import KIND_LABELS

        spark = late.sparkSession  # foreachBatch's session: DataFrames of one query share it
        files = local_frame(
            spark, [(i, str(Path(self.tf.events_path) / n)) for i, n in enumerate(event_files(self.tf.events_path))],
            "file_idx INT, file STRING")

        def value(name: str):
            return F.when((F.col("null_mask").bitwiseAND(F.lit(NULL_BITS[name]))) == 0, F.col(name))

        kind = F.element_at(F.array(*[F.lit(k) for k in KIND_LABELS]), F.col("kind_code").cast("int") + 1)
        raw = F.struct(F.col("ts_us"), kind.alias("kind"), value("broker").alias("broker"),
                       value("msg_id").alias("msg_id"), F.col("key"), value("size_bytes").alias("size_bytes"),
                       value("producer_id").alias("producer_id"), value("upto_us").alias("upto_us"))
        runs = local_frame(spark, [(r,) for r in self.run_ids], "run_id STRING")
        return (late.join(F.broadcast(files), "file_idx", "left").crossJoin(F.broadcast(runs))
                .select("run_id", F.lit(self.tf.manifest.trace_id).alias("trace_id"), "file", "row",
                        F.to_json(raw, {"ignoreNullFields": "false"}).alias("raw"), F.lit(LATE_RULE).alias("rule"),
                        F.lit("quarantine").alias("severity")))

    def _quarantine(self, late, batch_id: int) -> None:
        self._append_once("quarantine", self._late_rows(late), batch_id)

    # ------------------------------------------------------------------------------ the end of the trace
    def _record_final_written(self) -> None:
        """The micro-batch's tasks wrote the kernels' final rows into the checkpoint (`groups.write_final`), kept
        there until published. They are published from the driver's own session afterwards: foreachBatch hands in
        a cloned session, whose temporary views (the output gate's) the driver's session cannot see."""
        self.ck.final_written = True
        self.ck.save()


# ------------------------------------------------------------------------------------------------ publishing
@dataclass
class Published:
    summaries: list[dict[str, Any]]
    quarantined: int
    gate_report: str | None
    #: The run tables just written, still persisted (engine.publish.publishing): MLflow's views read them.
    tables: HeldTables


@contextmanager
def publish_final(spark, lakehouse, tf, runs, request: ReplayRequest, ck: StreamCheckpoint, live: bool,
                  tracker=None, progress: Callable[[str], None] | None = None) -> Iterator[Published]:
    """The final tables from the kernels' rows of the last micro-batch, with the batch job's `publishing` (windows,
    summary, output gate, replaceWhere per run) and the stream's own watermarks rows. The caller's block logs the
    MLflow runs from the tables still held; the checkpoint says `published` once the block is done (a crash in it
    publishes and logs again on the next run, both idempotent)."""
    from engine.publish import ReplayResults, publishing
    from expectations import invariants
    from schemas.tables import TABLES
    from storage.lakehouse import in_predicate

    manifest = tf.manifest
    run_ids = [r.run_id for r in runs]
    if progress is not None:
        progress("windows, output gate, Delta tables")
    # The events the kernels read: the message coverage check and the fault timeline of the invariants see
    # exactly those (a late produce has no outcome). A live trace's quarantined rows were read (module docstring).
    exclude = late_rows(lakehouse, run_ids)
    if live:
        quarantined, gate_report = _gate_live_trace(spark, lakehouse, tf, run_ids)
    else:
        for name, rows in json.loads(ck.exclude_file.read_text()).items():
            exclude.setdefault(name, []).extend(rows)
        quarantined, gate_report = ck.quarantined, ck.gate_report
    events = replayed_events(spark, tf, exclude)
    raw = read_final(spark, ck.final_dir)
    frames = frames_from_raw(spark, runs, raw)
    msgs, states, intervals = frames.message_outcomes, frames.partition_states, frames.unavailability
    events = events.persist()
    try:
        wm_rows = (lakehouse.read("watermarks").where(in_predicate("run_id", run_ids))
                   .dropDuplicates(["run_id", "batch"]).collect())
        watermarks = spark.createDataFrame([r.asDict() for r in wm_rows], TABLES["watermarks"].spark_schema())
        records = run_records(runs, manifest.trace_id, "stream", tracker.run_ids if tracker is not None else None)
        results = ReplayResults(records, run_infos(runs, manifest, frames.replication_bytes), msgs, states,
                                intervals, events, watermarks=watermarks, windows=frames.windows,
                                histograms=frames.histograms)
        checks = invariants.checks(spark, runs, msgs, states, control_timeline(events))
        with publishing(spark, lakehouse, results, trace_id=manifest.trace_id, window_ms=request.window_ms,
                        extra_checks=checks, progress=progress) as publication:
            yield Published(publication.summaries, quarantined, gate_report, publication.tables)
    finally:
        events.unpersist()
    ck.published = True
    ck.save()


def _gate_live_trace(spark, lakehouse, tf, run_ids: list[str]):
    """A live trace is gated once complete. The gate replaces the trace's quarantine rows, so this replay's late
    rows are put back after it."""
    from expectations.trace_gate import run_trace_gate
    from schemas.tables import TABLES
    from storage.lakehouse import in_predicate

    late = []
    if lakehouse.version("quarantine") is not None:
        late = [r.asDict() for r in lakehouse.read("quarantine").where(in_predicate("run_id", run_ids)).collect()]
    _, gate = run_trace_gate(spark, tf, lakehouse, run_ids=run_ids)
    if gate.report is not None:
        gate.report.release()
    if late:
        lakehouse.replace_rows("quarantine", "run_id", run_ids,
                               spark.createDataFrame(late, TABLES["quarantine"].spark_schema()))
    if gate.quarantined:
        log.warning("live trace %s: the trace gate quarantined %d rows that the replay had already read",
                    tf.manifest.trace_id, gate.quarantined)
    return gate.quarantined, (str(gate.report_html) if gate.report_html else None)


# ------------------------------------------------------------------------------------------------ the job
def run_stream_replay(spark, request: ReplayRequest, *, progress=None,
                      files_per_trigger: int = DEFAULT_FILES_PER_TRIGGER,
                      live_trigger_seconds: float = LIVE_TRIGGER_SECONDS) -> ReplayReport:
    """The whole replay of one trace under every policy of the request, as a stream (see the module docstring)."""

    from schemas.errors import BadInput
    from storage.lakehouse import Lakehouse, in_threads
    from storage.trace_loader import locate

    check_request(request)
    if request.allowed_lateness_ms < 0:
        raise BadInput(f"--allowed-lateness-ms must be >= 0, got {request.allowed_lateness_ms}", rule="argument")
    if files_per_trigger < 1:
        raise BadInput(f"files per trigger must be >= 1, got {files_per_trigger}", rule="argument")
    step = progress or (lambda text: log.info(text))
    tf = locate(request.trace)
    if tf.is_csv:
        raise BadInput("stream mode reads an events/ Parquet folder (SPEC §2), this trace has events.csv",
                       file=str(tf.events_path), rule="trace-layout")
    manifest = tf.manifest
    runs = policy_runs(request.policies, manifest)
    run_ids = [r.run_id for r in runs]
    lakehouse = Lakehouse(request.lakehouse, spark, create=False)
    lakehouse.check_writable()
    fingerprint = _fingerprint(manifest, runs, request)
    ck_root = Path(request.checkpoint) if request.checkpoint else default_checkpoint(lakehouse.root, fingerprint)
    ck = StreamCheckpoint.open(ck_root.resolve(), fingerprint)
    if ck.published:
        step(f"stream replay already complete (checkpoint {ck.root})")
        report = _report(lakehouse, manifest, runs, ck)
        write_summary_json(request, report)
        return report

    if ck.live is None:  # decided once: a live trace stays live for its restarts (gate at the end, ids from 1)
        complete, ck.complete_as_is = is_complete(tf)
        ck.live = not complete
        ck.save()
    live = ck.live
    if not live and not ck.gated:
        step("trace gate")
        _gate_complete_trace(spark, tf, lakehouse, runs, ck)
    resumed = ck.started

    def start_runs() -> None:
        # A fresh replay: its runs are `running` (mode stream) and earlier watermarks/late rows of them go away.
        lakehouse.ensure_tables(["runs", "watermarks"])
        lakehouse.begin_runs(run_records(runs, manifest.trace_id, "stream"))
        lakehouse.delete_rows("watermarks", "run_id", run_ids)
        if live and lakehouse.version("quarantine") is not None:
            lakehouse.delete_rows("quarantine", "run_id", run_ids)

    # The gate's validations row (if it just ran) and the runs marked running are independent commits: written
    # concurrently, then recorded. A crash before that runs both again (each replaces its own rows).
    in_threads([lakehouse.flush_validations, *([] if resumed else [start_runs])])
    ck.gated = ck.gated or not live
    ck.started = True
    ck.save()

    sorted_ids = np.load(ck.msg_ids_file) if (ck.gated and ck.rank_base is None) else None
    # A live trace's msg_ids are dense from 1 (generators number them so); a gated one's range was read.
    plan = stream_plan(manifest, runs, request.window_ms, request.allowed_lateness_ms,
                       rank_base=ck.rank_base if ck.gated else 1, sorted_msg_ids=sorted_ids)

    tracker = start_tracker(request, manifest, runs, "stream")
    if not ck.final_written:
        _run_query(spark, tf, plan, ck, request, step, live, files_per_trigger, live_trigger_seconds, runs,
                   lakehouse, tracker, resumed)
    try:
        with publish_final(spark, lakehouse, tf, runs, request, ck, live, tracker, step) as done:
            report = ReplayReport(manifest.trace_id, runs, done.summaries, str(lakehouse.root), done.quarantined,
                                  trace_gate_report=done.gate_report)
            finish_tracker(tracker, report, done.tables, request, tf.root, [done.gate_report], step)
    except Exception as exc:
        if tracker is not None:
            tracker.fail(exc)  # a no-op after finish's own failure has failed the runs
        raise
    write_summary_json(request, report)
    return report


def replay_stream(spark, events_dir: str, plan, plan_file: Path, final_dir: Path, *,
                  files_per_trigger: int = DEFAULT_FILES_PER_TRIGGER, complete_as_is: bool = False,
                  exclude_file: Path | None = None):
    """The streaming DataFrame of the replay (module docstring, "The query"): per micro-batch, its STATS and LATE
    rows, and at the end of the trace the END row, in the schema of `groups.STREAM_OUTPUT_DDL`. The groups'
    final rows go to `final_dir` (`groups.write_final`; read them with `read_final`). `plan` (a
    `groups.StreamPlan`) is written to `plan_file`, where the source's readers find it."""
    import pickle

    from pyspark.sql import functions as F

    from engine.stream.groups import GROUP_KEY, STREAM_OUTPUT_DDL, ReplayProcessor
    from engine.stream.source import SOURCE_NAME, TraceEventsSource

    plan_file.parent.mkdir(parents=True, exist_ok=True)
    plan_file.write_bytes(pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL))
    spark.dataSource.register(TraceEventsSource)
    source = (spark.readStream.format(SOURCE_NAME).option("path", events_dir).option("plan", str(plan_file))
              .option("max_files", str(files_per_trigger)).option("end_us", str(plan.end_marker_us))
              .option("complete_as_is", "true" if complete_as_is else "false")
              .option("exclude", str(exclude_file) if exclude_file is not None else "").load())
    # Each source row packs one group's events of a source batch, with their max event time: the watermark (max
    # event time seen minus the allowed lateness) is the same as over the events themselves.
    watermarked = (source.withColumn("_event_time", F.timestamp_micros("max_ts_us"))
                   .withWatermark("_event_time", f"{plan.allowed_lateness_ms} milliseconds")
                   # The processor sees the rows behind the watermark (to count and quarantine them): without
                   # the event-time column, Spark's own late-row filter has nothing to apply to.
                   .drop("_event_time", "max_ts_us"))
    return (watermarked.groupBy(*GROUP_KEY)
            .transformWithStateInPandas(ReplayProcessor(plan, str(final_dir)), STREAM_OUTPUT_DDL, "Append",
                                        "EventTime"))


def read_final(spark, final_dir: Path):
    """The groups' final rows (`engine.groups.OUTPUT_DDL`) that the end-of-trace micro-batch wrote."""
    return spark.read.parquet(str(final_dir))


def stream_plan(manifest, runs, window_ms: int, allowed_lateness_ms: int, *, rank_base: int | None = 1,
                sorted_msg_ids: np.ndarray | None = None):
    """The `groups.StreamPlan` of a replay: the batch job's route classes and the stream's settings."""
    from engine.groups import ReplayPlan
    from engine.stream.groups import StreamPlan, fanout
    from replay.events import PartitionEvents

    classes = route_classes(runs)
    return StreamPlan(ReplayPlan(manifest, classes, PartitionEvents.empty(), window_ms * 1000), allowed_lateness_ms,
                      rank_base=rank_base if rank_base is not None else 0, sorted_msg_ids=sorted_msg_ids,
                      fanout=fanout(classes, manifest.broker_ids))


def _run_query(spark, tf, plan, ck: StreamCheckpoint, request: ReplayRequest, step, live: bool,
               files_per_trigger: int, live_trigger_seconds: float, runs, lakehouse, tracker,
               resumed: bool) -> None:
    """Run the streaming query until the micro-batch in which every group finished has been saved."""
    from schemas.errors import ReplabError

    sink = StreamSink(spark, lakehouse, tf, runs, request, ck, live, step)
    if resumed:  # a fresh replay has just deleted its runs' watermarks rows: nothing to read back
        sink.resume()

    replayed = replay_stream(spark, str(tf.events_path), plan, ck.root / "plan.pkl", ck.final_dir,
                             files_per_trigger=files_per_trigger,
                             complete_as_is=bool(ck.complete_as_is),
                             exclude_file=ck.exclude_file if ck.exclude_file.is_file() else None)
    trigger = {"processingTime": f"{live_trigger_seconds} seconds" if live else "0 seconds"}
    step(f"stream replay of {len(runs)} polic{'y' if len(runs) == 1 else 'ies'} "
         f"({'live' if live else 'complete'} trace, checkpoint {ck.root})")
    query = (replayed.writeStream.foreachBatch(sink).option("checkpointLocation", str(ck.query_dir))
             .outputMode("append").trigger(**trigger).start())
    try:
        while not sink.done and query.isActive:
            query.awaitTermination(0.5)
    except Exception as exc:
        if tracker is not None:
            tracker.fail(sink.error or exc)
        if sink.error is not None:
            raise sink.error from exc
        raise ReplabError(f"stream replay failed: {exc}") from exc
    finally:
        if query.isActive:
            query.stop()
    if sink.error is not None:
        raise sink.error
    if not ck.final_written:
        raise ReplabError("the stream replay stopped before the end of the trace")


def _report(lakehouse, manifest, runs, ck: StreamCheckpoint) -> ReplayReport:
    from storage.lakehouse import in_predicate

    rows = {r["run_id"]: r.asDict() for r in lakehouse.read("run_summary")
            .where(in_predicate("run_id", [r.run_id for r in runs])).collect()}
    return ReplayReport(manifest.trace_id, runs, [rows.get(r.run_id, {}) for r in runs], str(lakehouse.root),
                        ck.quarantined, trace_gate_report=ck.gate_report)

