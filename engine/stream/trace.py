"""What the stream replay knows of its trace: complete or live, the trace gate before the stream (complete) or at
its end (live), and the events the kernels read."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from engine.replay import produce_counts
from engine.stream.checkpoint import StreamCheckpoint
from storage.session import local_frame

log = logging.getLogger(__name__)


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


def gate_complete_trace(spark, tf, lakehouse, runs, ck: StreamCheckpoint) -> None:
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


def gate_live_trace(spark, lakehouse, tf, run_ids: list[str]):
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
