"""The tail of a replay: windows and summary, the output gate, then the lakehouse (SPEC §4.3-§5, §7).

`publish(...)` is what a replay job calls once its core has produced, for all policies of one invocation,
the message outcomes, the partition timelines and the unavailability intervals (`publishing(...)` keeps the
tables persisted for the caller's MLflow logging):

1. derive committed_offsets, loss_metrics, watermarks and run_summary (engine.metrics) and persist every
   run table but message_outcomes (the gate and the writes read them; uncompressed:
   `storage.session.uncompressed_cache`);
2. mark the runs `running`, run the output gate on the DataFrames (validate before write), write every run
   table (one Delta commit per table for all runs), mark the runs `succeeded` (Lakehouse.publish_runs).

A gate failure raises GateFailed (exit 3) with every run table at its previous version.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine import metrics
from engine.metrics import RunInfo
from engine.plan import OutcomeFrames
from expectations.output_gate import NamedCheck, RunOutputs, run_output_gate
from storage.lakehouse import HeldTables, Lakehouse, RunRecord
from storage.session import uncompressed_cache

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass
class ReplayResults:
    """A replay invocation's results, all runs together, in the schemas of `schemas/tables.py`."""

    records: Sequence[RunRecord]
    infos: Sequence[RunInfo]
    outcomes: OutcomeFrames
    #: The clean trace events the replay read (SPEC §2.1 columns): watermarks and the message coverage check.
    events: DataFrame
    #: Stream mode: the run's own `watermarks` rows, one per micro-batch; None derives batch mode's one row.
    watermarks: DataFrame | None = None


def derive_tables(spark, results: ReplayResults, window_ms: int = 1000) -> dict[str, Any]:
    """Every run table of the invocation, persisted but message_outcomes.

    message_outcomes is read where it is made (the replay's persisted kernel output, or a stream's Parquet): it
    has four readers (run_summary, the output gate's screen and one invariant, the Delta write), each a scan of
    that input and a projection, where caching it built a columnar copy of every outcome row first, which took
    longer than the four scans together."""
    info = metrics.run_info_df(spark, list(results.infos))
    tables = {
        "message_outcomes": results.outcomes.message_outcomes,
        "partition_states": results.outcomes.partition_states.persist(),
        "unavailability": results.outcomes.unavailability.persist(),
    }
    windows = results.outcomes.windows.persist() if results.outcomes.windows is not None else None
    tables["committed_offsets"] = metrics.committed_offsets(tables["partition_states"], tables["message_outcomes"],
                                                            info, window_ms, windows=windows).persist()
    tables["loss_metrics"] = metrics.loss_metrics(tables["message_outcomes"], tables["unavailability"], info,
                                                  window_ms, windows=windows).persist()
    watermarks = results.watermarks if results.watermarks is not None else metrics.watermarks(results.events, info)
    tables["watermarks"] = watermarks.persist()
    tables["run_summary"] = metrics.run_summary(tables["message_outcomes"], tables["unavailability"], info,
                                                windows=windows, histograms=results.outcomes.histograms).persist()
    return tables


@dataclass
class Publication:
    """What `publishing` hands its caller's block."""

    #: The run_summary rows (dicts, in `records` order).
    summaries: list[dict[str, Any]]
    #: The run tables just written, still persisted, readable as the lakehouse (MLflow's views of the runs).
    tables: HeldTables


def publish(spark, lakehouse: Lakehouse, results: ReplayResults, *, trace_id: str, window_ms: int = 1000,
            extra_checks: Sequence[NamedCheck] = (),
            progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Gate and write one replay invocation; returns the run_summary rows (dicts, in `records` order).
    `progress` hears "output gate" and "Delta tables" as they start."""
    with publishing(spark, lakehouse, results, trace_id=trace_id, window_ms=window_ms, extra_checks=extra_checks,
                    progress=progress) as published:
        return published.summaries


@contextmanager
def publishing(spark, lakehouse: Lakehouse, results: ReplayResults, *, trace_id: str, window_ms: int = 1000,
               extra_checks: Sequence[NamedCheck] = (),
               progress: Callable[[str], None] | None = None) -> Iterator[Publication]:
    """`publish`, then the run tables stay persisted for the caller's block: the MLflow runs' series, quantiles
    and plots read them there, not from the Delta tables just written (those reads were 12 of a three-message
    replay's 102 Spark jobs)."""
    from pyspark.sql import functions as F

    with uncompressed_cache(spark):
        tables = derive_tables(spark, results, window_ms)
        run_ids = [r.run_id for r in results.records]
        produced = results.events.where(F.col("kind") == "produce").select("msg_id")
        outputs = RunOutputs(tables["message_outcomes"], tables["partition_states"], tables["loss_metrics"],
                             tables["run_summary"])
        try:
            step = progress or (lambda text: None)

            def gate() -> None:
                step("output gate")
                run_output_gate(spark, outputs, trace_id=trace_id, run_ids=run_ids, lakehouse=lakehouse,
                                produced_msg_ids=produced, extra_checks=extra_checks)
                step("Delta tables")

            lakehouse.publish_runs(results.records, tables, gate=gate)
            summaries = {r.run_id: r.asDict() for r in tables["run_summary"].collect()}
            yield Publication([summaries[run_id] for run_id in run_ids], HeldTables(lakehouse, tables))
        finally:
            windows = results.outcomes.windows
            for df in [*tables.values(), *([windows] if windows is not None else [])]:
                df.unpersist()
