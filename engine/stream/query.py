"""`replab replay --mode stream`: the batch replay's kernels driven by Spark Structured Streaming (SPEC §4.3, §11).

The query
---------
```
trace events/ ──(engine/stream/source.py: files in name order, ≤ N per micro-batch, then an end marker; each file routed
and fanned out by routing.Router as it is read: one packed row per group and source batch)──►
withWatermark(max event time, allowed lateness) ──► groupBy(class_id, unit).transformWithStateInPandas(
ReplayProcessor, RocksDB, event time) ──► foreachBatch(StreamSink)
```
- Groups are the batch job's (class, unit) replay groups; a class whose routing reads the fault timeline (the
  RocketMQ families) is one group per class that routes in state once every fault routing may read for a message
  has arrived, so routing uses "the fault timeline seen so far" and is still exact (`replay/stream.py`).
- Each group buffers its events in the state store until the event-time watermark passes them, then feeds them
  in SPEC §2.2 order to the chunked kernels, whose carried state is kept in the same store as a snapshot plus a
  log of the micro-batches since (`state.GroupReplay`, `groups.ReplayProcessor`). Rows behind the watermark in
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

import logging
from pathlib import Path

import numpy as np

from engine.plan import ReplayReport, ReplayRequest, policy_runs, route_classes, run_records
from engine.replay import check_request, finish_tracker, start_tracker, write_summary_json
from engine.stream.checkpoint import StreamCheckpoint, default_checkpoint, fingerprint_of
from engine.stream.final import publish_final
from engine.stream.sink import StreamSink
from engine.stream.trace import gate_complete_trace, is_complete

log = logging.getLogger(__name__)


#: Files per micro-batch (the generator writes ~1 M events per file, one second of trace per file when live).
DEFAULT_FILES_PER_TRIGGER = 1
#: Processing-time trigger of a live trace (a finite one runs micro-batches back to back).
LIVE_TRIGGER_SECONDS = 2


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
    fingerprint = fingerprint_of(manifest, runs, request)
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
        gate_complete_trace(spark, tf, lakehouse, runs, ck)
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
    rows, and at the end of the trace the END row, in the schema of `plan.STREAM_OUTPUT_DDL`. The groups'
    final rows go to `final_dir` (`groups.write_final`; read them with `read_final`). `plan` (a
    `plan.StreamPlan`) is written to `plan_file`, where the source's readers find it."""
    import pickle

    from pyspark.sql import functions as F

    from engine.stream.groups import ReplayProcessor
    from engine.stream.plan import GROUP_KEY, STREAM_OUTPUT_DDL
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


def stream_plan(manifest, runs, window_ms: int, allowed_lateness_ms: int, *, rank_base: int | None = 1,
                sorted_msg_ids: np.ndarray | None = None):
    """The `plan.StreamPlan` of a replay: the batch job's route classes and the stream's settings."""
    from engine.groups import ReplayPlan
    from engine.stream.plan import StreamPlan, fanout
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


