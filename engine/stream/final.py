"""The end of a stream replay: the kernels' final rows the last micro-batch wrote into the checkpoint, published
as the run tables by the batch job's own `engine.publish`."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.plan import ReplayRequest, run_infos, run_records
from engine.replay import control_timeline, frames_from_raw
from engine.stream.checkpoint import StreamCheckpoint
from engine.stream.sink import late_rows
from engine.stream.trace import gate_live_trace, replayed_events

if TYPE_CHECKING:
    from storage.lakehouse import HeldTables


def read_final(spark, final_dir: Path):
    """The groups' final rows (`engine.groups.OUTPUT_DDL`) that the end-of-trace micro-batch wrote."""
    return spark.read.parquet(str(final_dir))


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
        quarantined, gate_report = gate_live_trace(spark, lakehouse, tf, run_ids)
    else:
        for name, rows in json.loads(ck.exclude_file.read_text()).items():
            exclude.setdefault(name, []).extend(rows)
        quarantined, gate_report = ck.quarantined, ck.gate_report
    events = replayed_events(spark, tf, exclude)
    raw = read_final(spark, ck.final_dir)
    frames = frames_from_raw(spark, runs, raw)
    msgs, states = frames.message_outcomes, frames.partition_states
    events = events.persist()
    try:
        wm_rows = (lakehouse.read("watermarks").where(in_predicate("run_id", run_ids))
                   .dropDuplicates(["run_id", "batch"]).collect())
        watermarks = spark.createDataFrame([r.asDict() for r in wm_rows], TABLES["watermarks"].spark_schema())
        records = run_records(runs, manifest.trace_id, "stream", tracker.run_ids if tracker is not None else None)
        results = ReplayResults(records, run_infos(runs, manifest, frames.replication_bytes), frames, events,
                                watermarks=watermarks)
        checks = invariants.checks(spark, runs, msgs, states, control_timeline(events))
        with publishing(spark, lakehouse, results, trace_id=manifest.trace_id, window_ms=request.window_ms,
                        extra_checks=checks, progress=progress) as publication:
            yield Published(publication.summaries, quarantined, gate_report, publication.tables)
    finally:
        events.unpersist()
    ck.published = True
    ck.save()
