"""Plot-sized views of runs' Delta tables, for MLflow and the comparison report (SPEC §6.4).

The run tables can hold millions of rows (one per message, one per state change), so every view here is an
aggregation in Spark that returns a small pandas frame: one row per (run, window), ~200 latency quantiles per
run, a few thousand timeline points. Nothing per message reaches the driver.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

#: Latency CDF quantiles: a uniform grid plus a finer tail (p99 … p99.999 is where policies differ).
CDF_QUANTILES: tuple[float, ...] = tuple(sorted(
    set(np.round(np.linspace(0.0, 1.0, 161), 6)) | set(np.round(1.0 - np.logspace(-2, -5, 40), 8))))
#: percentile_approx's accuracy: a rank error of at most 1/10000 of the run's acked messages.
PERCENTILE_ACCURACY = 10_000

WINDOW_COLUMNS = ["run_id", "window", "window_start_us", "produced", "acked", "acked_lost", "unavailable_us",
                  "ack_latency_p99_ms"]


@dataclass(frozen=True)
class RunViews:
    """`window_series` and `latency_quantiles` of some runs of one lakehouse, as the replay that wrote those runs
    computed them for its MLflow runs. The comparison report that follows in the same process (`make demo`) takes
    them instead of querying the same tables again (two Spark queries over every outcome)."""

    lakehouse: Path  # resolved
    run_ids: tuple[str, ...]
    window_us: int
    series: pd.DataFrame
    quantiles: pd.DataFrame

    def covers(self, lakehouse: str | Path, run_ids: Sequence[str], window_us: int | None) -> bool:
        return (Path(lakehouse).resolve() == self.lakehouse and window_us == self.window_us
                and set(run_ids) <= set(self.run_ids))

    def series_of(self, run_ids: Sequence[str]) -> pd.DataFrame:
        return self.series[self.series["run_id"].isin(list(run_ids))].reset_index(drop=True)

    def quantiles_of(self, run_ids: Sequence[str]) -> pd.DataFrame:
        return self.quantiles[self.quantiles["run_id"].isin(list(run_ids))].reset_index(drop=True)


def window_us_of(lakehouse, run_ids: Sequence[str]) -> int | None:
    """The window length the runs' loss_metrics were computed with (None: no rows)."""
    from pyspark.sql import functions as F

    row = (lakehouse.read("loss_metrics").where(F.col("run_id").isin(list(run_ids)))
           .select((F.col("window_end_us") - F.col("window_start_us")).alias("w")).limit(1).collect())
    return int(row[0]["w"]) if row else None


def window_series(lakehouse, run_ids: Sequence[str], window_us: int | None = None) -> pd.DataFrame:
    """Per run and window (summed over partitions): produced, acked, acked_lost, unavailable_us, ack p99.

    Counts come from `loss_metrics` (so they add up to the run summary, SPEC §7). The p99 is over every
    acknowledged message produced in the window, across partitions: it cannot be derived from the
    per-partition p99s, so it is computed from `message_outcomes` with the same exact percentile as the
    summary (windows hold few messages each). `window` is the window index, `window_start_us // window_us`.
    """
    from pyspark.sql import functions as F

    ids = list(run_ids)
    if not ids:
        return pd.DataFrame(columns=WINDOW_COLUMNS)
    window_us = window_us or window_us_of(lakehouse, ids)
    if window_us is None:
        return pd.DataFrame(columns=WINDOW_COLUMNS)
    counts = (lakehouse.read("loss_metrics").where(F.col("run_id").isin(ids))
              .groupBy("run_id", "window_start_us")
              .agg(F.sum("produced").alias("produced"), F.sum("acked").alias("acked"),
                   F.sum("acked_lost").alias("acked_lost"), F.sum("unavailable_us").alias("unavailable_us"))
              .toPandas())
    p99 = (lakehouse.read("message_outcomes")
           .where(F.col("run_id").isin(ids) & (F.col("status") == "acked") & F.col("latency_us").isNotNull())
           .groupBy("run_id", F.floor(F.col("produce_us") / window_us).alias("window"))
           .agg((F.percentile(F.col("latency_us"), F.lit(0.99)) / 1000.0).alias("ack_latency_p99_ms"))
           .toPandas())
    counts["window"] = (counts["window_start_us"] // window_us).astype("int64")
    for col in ("produced", "acked", "acked_lost", "unavailable_us"):
        counts[col] = counts[col].fillna(0).astype("int64")
    p99["window"] = p99["window"].astype("int64")
    out = counts.merge(p99, on=["run_id", "window"], how="left")
    return out[WINDOW_COLUMNS].sort_values(["run_id", "window"]).reset_index(drop=True)


def latency_quantiles(lakehouse, run_ids: Sequence[str],
                      quantiles: Sequence[float] = CDF_QUANTILES) -> pd.DataFrame:
    """(run_id, quantile, latency_ms) of acknowledged messages' ack latency: the CDF, ~200 points per run."""
    from pyspark.sql import functions as F

    ids = list(run_ids)
    qs = [float(q) for q in quantiles]
    rows = (lakehouse.read("message_outcomes")
            .where(F.col("run_id").isin(ids) & (F.col("status") == "acked") & F.col("latency_us").isNotNull())
            .groupBy("run_id")
            .agg(F.percentile_approx("latency_us", F.array(*[F.lit(q) for q in qs]), PERCENTILE_ACCURACY)
                 .alias("lat"))
            .collect()) if ids else []
    records = [(r["run_id"], q, v / 1000.0) for r in rows for q, v in zip(qs, r["lat"], strict=True)]
    return pd.DataFrame(records, columns=["run_id", "quantile", "latency_ms"])


def busiest_partitions(lakehouse, run_id: str, limit: int = 4) -> list[int]:
    """The partitions whose leadership changed most (ties: lowest id): the ones worth drawing."""
    return busiest_partitions_of(lakehouse, [run_id], limit).get(run_id, [])


def busiest_partitions_of(lakehouse, run_ids: Sequence[str], limit: int = 4) -> dict[str, list[int]]:
    """`busiest_partitions` of several runs in one query (run_id -> partitions; a run without rows is absent)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    ids = list(run_ids)
    if not ids:
        return {}
    rank = F.row_number().over(Window.partitionBy("run_id").orderBy(F.desc("epochs"), F.desc("rows"), "partition"))
    rows = (lakehouse.read("partition_states").where(F.col("run_id").isin(ids))
            .groupBy("run_id", "partition").agg(F.countDistinct("leader_epoch").alias("epochs"),
                                                F.count(F.lit(1)).alias("rows"))
            .withColumn("_rank", rank).where(F.col("_rank") <= limit).collect())
    out: dict[str, list[int]] = {}
    for r in sorted(rows, key=lambda r: (r["run_id"], r["_rank"])):
        out.setdefault(r["run_id"], []).append(int(r["partition"]))
    return out


HISTORY_COLUMNS = ["partition", "ts_us", "leader", "isr_size", "high_watermark"]


def partition_history(lakehouse, run_id: str, partitions: Sequence[int], duration_us: int,
                      max_points: int = 2000) -> pd.DataFrame:
    """(partition, ts_us, leader, isr_size, high_watermark) of one run, at most ~max_points rows per partition.

    The table has a row at every leader/ISR change and per window for offsets (SPEC §4.2); for long traces
    it is thinned to the last state of each of `max_points` time bins, which is what a step plot of that
    width can show anyway.
    """
    rows = partition_histories(lakehouse, {run_id: partitions}, duration_us, max_points)
    return rows[HISTORY_COLUMNS].reset_index(drop=True)


def partition_histories(lakehouse, partitions: Mapping[str, Sequence[int]], duration_us: int,
                        max_points: int = 2000) -> pd.DataFrame:
    """`partition_history` of several runs (run_id -> partitions) in one query, with a `run_id` column."""
    from pyspark.sql import functions as F

    columns = ["run_id", *HISTORY_COLUMNS]
    wanted = F.lit(False)
    for run_id, parts in partitions.items():
        if parts:
            wanted = wanted | ((F.col("run_id") == run_id) & F.col("partition").isin([int(p) for p in parts]))
    if not any(partitions.values()):
        return pd.DataFrame(columns=columns)
    bin_us = max(1, int(duration_us) // max_points)
    state = F.struct("ts_us", "leader_epoch", "high_watermark", "leader", F.size("isr").alias("isr_size"))
    rows = (lakehouse.read("partition_states")
            .where(F.col("run_id").isin(list(partitions)) & wanted)
            .groupBy("run_id", "partition", F.floor(F.col("ts_us") / bin_us).alias("_bin"))
            .agg(F.max(state).alias("s"))
            .select("run_id", "partition", "s.ts_us", "s.leader", "s.isr_size", "s.high_watermark")
            .toPandas())
    return rows[columns].sort_values(["run_id", "partition", "ts_us"]).reset_index(drop=True)


def report_paths(lakehouse, trace_id: str, run_ids: Sequence[str]) -> dict[str, list[tuple[str, str]]]:
    """run_id -> [(suite, report path)] from the `validations` table (the gates' HTML reports, SPEC §7)."""
    from pyspark.sql import functions as F

    rows = (lakehouse.read("validations")
            .where((F.col("trace_id") == trace_id) & F.col("run_id").isin(list(run_ids))
                   & F.col("report_path").isNotNull())
            .select("run_id", "suite", "report_path").collect())
    out: dict[str, list[tuple[str, str]]] = {r: [] for r in run_ids}
    for r in rows:
        out[r["run_id"]].append((r["suite"], r["report_path"]))
    return out
