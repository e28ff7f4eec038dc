"""The stream query's foreachBatch sink: one `watermarks` row per run and micro-batch and the late rows
quarantined, each appended exactly once; the end of the trace recorded in the checkpoint."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine.plan import ReplayRequest
from engine.stream.checkpoint import StreamCheckpoint
from storage.session import local_frame

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from engine.plan import PolicyRun
    from schemas.trace import TraceFiles
    from storage.lakehouse import Lakehouse


LATE_RULE = "behind-watermark"


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

        from engine.stream.plan import END, LATE, STATS

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

        from engine.stream.plan import NULL_BITS
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
