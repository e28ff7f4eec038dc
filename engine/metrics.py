"""Windowed metrics and the run summary (SPEC §4.3, §4.4), in Spark only (no Python per row).

Windows are tumbling event-time windows of `window_ms` per run and partition, made with Spark's `window()`
over the event time (produce_us for messages). Window k covers [k·w, (k+1)·w) µs; every run gets windows
k = 0 … duration_us // w for every partition 0 … partitions−1, so [0, duration_us] is covered even where a
partition has no traffic (it may still be unavailable). Messages whose partition is null (never routed, e.g.
RocketMQ `no_route`) are counted under partition −1 in `loss_metrics`, so that window sums always equal the
summary.

Definitions:
- `committed_offsets`: high_watermark, log_end_offset, leader, isr_size at the window end = the last
  `partition_states` row with ts_us < window_end_us, carried forward through windows without a change (null
  before the first row); under_min_isr = isr_size < the run's effective min ISR (null for families without
  one); visibility_lag_p99_us over messages produced in the window (lag = visible_us − produce_us).
- `loss_metrics`: per window of produce_us: produced, acked, failed, acked_lost (acked, fate ≠ committed),
  failed_committed (failed, fate committed), stranded (acked, committed, not readable_at_end), unavailable_us
  (overlap of the run's unavailability intervals, clipped to [0, duration_us], with the window), ack latency
  p50/p99/max of acked messages.
- `run_summary`: exactly `schemas.tables.SUMMARY_FIELDS`. acked_lost_rate = acked_lost / acked (0 when
  nothing was acked); availability = acked / produced (null when nothing was produced);
  unavailable_partition_seconds = summed (clipped) interval lengths / 1e6; latencies in ms.
- Percentiles are exact: Spark's `percentile` (linear interpolation between the two closest ranks, like
  numpy's default), never the approximate one. Window columns are BIGINT µs, rounded half up.
- `watermarks` (batch mode): one row per run, batch 0, watermark = max event time (nothing is late).

In stream mode the same aggregations run on each micro-batch's DataFrame (foreachBatch); `withWatermark` is
applied where a DataFrame is streaming.

In a replay, the per-window message figures (loss_metrics' counts and latencies, committed_offsets' visibility
lag) are derived by the replay tasks as each unit finishes (`message_windows`, numpy, Spark's exact percentile
formula and rounding), not by aggregating every message outcome again in Spark: at 3.7 M outcomes (16 runs) the
two percentile aggregations took 13 s of the tail. So is run_summary: its counts are the sums of those windows,
its percentiles read off how often each ack latency and visibility lag occurs in a unit (`message_values`, a row
per distinct value). The Spark aggregations below remain the definition: the tests hold both equal row for row on
a chaos trace under every preset, and the output gate compares every replay's summary counts with its outcomes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from schemas.outcomes import NULL_US, OUTCOME_COUNTS, Fate, Status, outcome_flags
from schemas.tables import SUMMARY_FIELDS, TABLES
from storage.session import local_frame

UNROUTED_PARTITION = -1


@dataclass(frozen=True)
class RunInfo:
    """What the metrics need to know about a run besides its outputs."""

    run_id: str
    duration_us: int
    #: Partitions (Kafka) or queues (RocketMQ families) of the policy: ids 0 … partitions−1.
    partitions: int
    #: The run's effective min ISR (kafka, rocketmq-controller); None for families without one.
    min_insync_replicas: int | None = None
    brokers_used: int | None = None
    replicas_per_message: float | None = None
    replication_bytes: int | None = None


_RUN_INFO_DDL = ("run_id STRING NOT NULL, duration_us BIGINT NOT NULL, partitions INT NOT NULL, "
                 "min_insync_replicas INT, brokers_used INT, replicas_per_message DOUBLE, replication_bytes BIGINT")


def run_info_df(spark, infos: Sequence[RunInfo]):
    rows = [(i.run_id, int(i.duration_us), int(i.partitions), i.min_insync_replicas, i.brokers_used,
             None if i.replicas_per_message is None else float(i.replicas_per_message), i.replication_bytes)
            for i in infos]
    return local_frame(spark, rows, _RUN_INFO_DDL)


# ------------------------------------------------------------------ per-window message figures, in the replay tasks
#: What `message_windows` derives per (partition, window) of one run: loss_metrics' message figures and
#: committed_offsets' visibility_lag_p99_us (nullable: NULL_US when the window has no such message).
WINDOW_COUNTS = ("produced", "acked", "failed", "acked_lost", "failed_committed", "stranded")
WINDOW_TIMES = ("ack_latency_p50_us", "ack_latency_p99_us", "ack_latency_max_us", "visibility_lag_p99_us")
#: The values run_summary's percentiles are of, in `message_values` order (the `metric` of a histogram row).
HISTOGRAM_METRICS = ACK_LATENCY_US, VISIBILITY_LAG_US = ("ack_latency_us", "visibility_lag_us")


def spark_percentile(sorted_values: np.ndarray, starts: np.ndarray, counts: np.ndarray, p: float) -> np.ndarray:
    """Spark's exact `percentile(col, p)` of each group of `sorted_values` (group g: `counts[g]` values from
    `starts[g]`, ascending, counts > 0), bit for bit: position (n − 1)·p, the value there when the position is
    whole or both neighbours are equal, else (higher − position)·lower + (position − lower)·higher
    (`org.apache.spark.sql.catalyst.expressions.aggregate.Percentile.getPercentile`)."""
    position = (counts - 1).astype(np.float64) * p
    lower, higher = np.floor(position), np.ceil(position)
    lo = sorted_values[starts + lower.astype(np.int64)].astype(np.float64)
    hi = sorted_values[starts + higher.astype(np.int64)].astype(np.float64)
    blended = (higher - position) * lo + (position - lower) * hi
    return np.where((higher == lower) | (lo == hi), lo, blended)


def round_half_up(values: np.ndarray) -> np.ndarray:
    """`round(x)` of Spark SQL on a double (HALF_UP on its exact decimal value: halves away from zero), as int64;
    |x| − floor(|x|) is exact."""
    magnitude = np.abs(values)
    whole = np.floor(magnitude)
    return (np.sign(values) * (whole + (magnitude - whole >= 0.5))).astype(np.int64)


def _group_percentiles(group: np.ndarray, n_groups: int, values: np.ndarray, selected: np.ndarray,
                       ps: Sequence[float]) -> list[np.ndarray]:
    """Per group 0 … n_groups−1: the rounded Spark percentiles of its selected values, NULL_US where it has none."""
    g, v = group[selected].astype(np.int64), values[selected]
    if len(v) and v.min() >= 0 and v.max() < 1 << 40 and n_groups < 1 << 23:
        packed = np.sort(g << 40 | v)  # one sort by (group, value) in a single int64
        g, v = packed >> 40, packed & ((1 << 40) - 1)
    else:
        order = np.lexsort((v, g))
        g, v = g[order], v[order]
    present, starts, counts = np.unique(g, return_index=True, return_counts=True)
    outs = []
    for p in ps:
        col = np.full(n_groups, NULL_US, dtype=np.int64)
        if len(present):
            col[present] = round_half_up(spark_percentile(v, starts, counts, p))
        outs.append(col)
    return outs


def message_windows(partition: np.ndarray, produce_us: np.ndarray, status: np.ndarray, fate: np.ndarray,
                    readable_at_end: np.ndarray, ack_us: np.ndarray, visible_us: np.ndarray,
                    window_us: int) -> dict[str, np.ndarray]:
    """One run's messages (of one replay unit, or all) → per (partition, window) with a message: `partition`,
    `window_start_us`, WINDOW_COUNTS and WINDOW_TIMES, by the definitions of the module docstring, as
    `loss_metrics` and `committed_offsets` compute them in Spark from message_outcomes (the replay tasks derive
    them as each unit finishes, so that the tail does not aggregate every outcome again; tests hold the two equal).
    `partition` is UNROUTED_PARTITION for a message without one; times are NULL_US when absent."""
    partition = partition.astype(np.int64)
    window = produce_us // window_us  # Spark's tumbling window() from 0: floor, also below 0
    span = window - window.min() if len(window) else window
    if not len(span) or span.max() < 1 << 32:
        # one int64 key per (partition, window), in (partition, window) order: a unit's windows fit in 32 bits
        # unless its trace spans 2^32 of them (49 days of 1 ms windows)
        keys, first, inverse = np.unique((partition + 1) << 32 | span, return_index=True, return_inverse=True)
        key_partition = (keys >> 32) - 1
    else:
        pairs, first, inverse = np.unique(np.stack([partition, window], axis=1), axis=0, return_index=True,
                                          return_inverse=True)
        keys, key_partition, inverse = pairs[:, 0], pairs[:, 0], inverse.reshape(-1)
    acked = status == Status.ACKED
    committed = fate == Fate.COMMITTED
    flags = {"acked": acked, "failed": status == Status.FAILED, "acked_lost": acked & ~committed,
             "failed_committed": (status == Status.FAILED) & committed,
             "stranded": acked & committed & ~readable_at_end.astype(bool)}
    out: dict[str, np.ndarray] = {
        "partition": key_partition,
        "window_start_us": window[first] * window_us,
        "produced": np.bincount(inverse, minlength=len(keys)).astype(np.int64),
    }
    for name, flag in flags.items():
        out[name] = np.bincount(inverse, weights=flag, minlength=len(keys)).astype(np.int64)
    latency = ack_us - produce_us
    out["ack_latency_p50_us"], out["ack_latency_p99_us"] = _group_percentiles(inverse, len(keys), latency, acked,
                                                                              (0.5, 0.99))
    lat_max = np.full(len(keys), np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(lat_max, inverse[acked], latency[acked])
    out["ack_latency_max_us"] = np.where(lat_max == np.iinfo(np.int64).min, NULL_US, lat_max)
    visible = visible_us != NULL_US
    (out["visibility_lag_p99_us"],) = _group_percentiles(inverse, len(keys), visible_us - produce_us, visible, (0.99,))
    return out


def message_values(status: np.ndarray, produce_us: np.ndarray, ack_us: np.ndarray,
                   visible_us: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ack latencies of the acknowledged messages and the visibility lags of the visible ones, as
    `_message_columns` defines them (`_ack_latency_us`, `_visibility_lag_us`): what run_summary's percentiles are
    of. The replay tasks count them per value (`engine.groups._histogram_batches`)."""
    acked = status == Status.ACKED
    visible = visible_us != NULL_US
    return ack_us[acked] - produce_us[acked], visible_us[visible] - produce_us[visible]


def _as_run_info(spark, run_info):
    if isinstance(run_info, RunInfo):
        run_info = [run_info]
    if isinstance(run_info, list | tuple):
        return run_info_df(spark, run_info)
    return run_info


def window_us_of(window_ms: int) -> int:
    if window_ms <= 0:
        raise ValueError("window_ms must be > 0")
    return int(window_ms) * 1000


def window_grid(run_info, window_ms: int):
    """(run_id, partition, window_start_us, window_end_us) for every window of every partition of every run."""
    from pyspark.sql import functions as F

    w = window_us_of(window_ms)
    k = F.explode(F.sequence(F.lit(0).cast("long"), F.floor(F.col("duration_us") / w).cast("long")))
    parts = F.explode(F.sequence(F.lit(0), F.col("partitions") - 1))
    return (run_info.where(F.col("partitions") > 0)
            .select("run_id", parts.alias("partition"), "duration_us")
            .select("run_id", "partition", k.alias("_k"))
            .select("run_id", F.col("partition").cast("int").alias("partition"),
                    (F.col("_k") * w).alias("window_start_us"), ((F.col("_k") + 1) * w).alias("window_end_us")))


def _event_windows(df, time_col: str, window_ms: int):
    """Spark's tumbling event-time window over a µs column, as (window_start_us, window_end_us)."""
    from pyspark.sql import functions as F

    df = df.withColumn("_event_time", F.timestamp_micros(F.col(time_col)))
    if df.isStreaming:
        df = df.withWatermark("_event_time", "0 seconds")
    win = F.window("_event_time", f"{window_us_of(window_ms)} microseconds")
    return df, win


def _round_us(col):
    from pyspark.sql import functions as F

    return F.round(col).cast("long")


def _clipped_intervals(unavailability, run_info):
    from pyspark.sql import functions as F

    iv = unavailability.join(run_info.select("run_id", "duration_us"), "run_id")
    start = F.greatest(F.col("start_us"), F.lit(0))
    end = F.least(F.col("end_us"), F.col("duration_us"))
    return iv.select("run_id", "partition", start.alias("start_us"), end.alias("end_us")).where(
        F.col("end_us") > F.col("start_us"))


def _message_columns(outcomes):
    from pyspark.sql import functions as F

    flags = outcome_flags()
    return outcomes.select(
        "run_id", F.coalesce(F.col("partition"), F.lit(UNROUTED_PARTITION)).alias("partition"), "produce_us",
        *[flags[name].alias(f"_{name}") for name in OUTCOME_COUNTS],
        F.when(flags["acked"], F.col("latency_us")).alias("_ack_latency_us"),
        (F.col("visible_us") - F.col("produce_us")).alias("_visibility_lag_us"),
    )


def _count(flag: str):
    from pyspark.sql import functions as F

    return F.sum(F.col(flag).cast("long"))


def loss_metrics(outcomes, unavailability, run_info, window_ms: int = 1000, *, spark=None, windows=None):
    """The `loss_metrics` table (SPEC §4.3) for every run in `outcomes`. `windows`: the message figures per run,
    partition and window as the replay tasks derived them (`message_windows`), used instead of aggregating
    `outcomes` (which must hold the same messages)."""
    from pyspark.sql import functions as F

    spark = spark or outcomes.sparkSession
    run_info = _as_run_info(spark, run_info)
    w = window_us_of(window_ms)
    per_window = (windows.select("run_id", "partition", "window_start_us", *WINDOW_COUNTS, *WINDOW_TIMES[:3])
                  if windows is not None else _loss_windows(outcomes, window_ms))
    unavailable = _unavailable_windows(unavailability, run_info, w)
    keys = ["run_id", "partition", "window_start_us"]
    grid = window_grid(run_info, window_ms).drop("window_end_us")
    out = (grid.join(per_window, keys, "full_outer").join(unavailable, keys, "full_outer")
           .withColumn("window_end_us", F.col("window_start_us") + w))
    zeros = ["produced", "acked", "failed", "acked_lost", "failed_committed", "stranded", "unavailable_us"]
    out = out.fillna(0, subset=zeros)
    return out.select(*TABLES["loss_metrics"].columns)


def _loss_windows(outcomes, window_ms: int):
    """loss_metrics' message figures per run, partition and window, aggregated from message outcomes."""
    from pyspark.sql import functions as F

    msgs, win = _event_windows(_message_columns(outcomes), "produce_us", window_ms)
    lat = F.percentile(F.col("_ack_latency_us"), F.array(F.lit(0.5), F.lit(0.99)))
    return (msgs.groupBy("run_id", "partition", win.alias("_w")).agg(
        F.count(F.lit(1)).alias("produced"), _count("_acked").alias("acked"), _count("_failed").alias("failed"),
        _count("_acked_lost").alias("acked_lost"), _count("_failed_committed").alias("failed_committed"),
        _count("_stranded").alias("stranded"), lat.alias("_lat"), F.max("_ack_latency_us").alias("_lat_max"))
        .select("run_id", "partition", F.unix_micros("_w.start").alias("window_start_us"), "produced", "acked",
                "failed", "acked_lost", "failed_committed", "stranded",
                _round_us(F.col("_lat")[0]).alias("ack_latency_p50_us"),
                _round_us(F.col("_lat")[1]).alias("ack_latency_p99_us"),
                F.col("_lat_max").alias("ack_latency_max_us")))


def _unavailable_windows(unavailability, run_info, w: int):
    from pyspark.sql import functions as F

    iv = _clipped_intervals(unavailability, run_info)
    k = F.explode(F.sequence(F.floor(F.col("start_us") / w), F.floor((F.col("end_us") - 1) / w))).alias("_k")
    overlap = (F.least(F.col("end_us"), (F.col("_k") + 1) * w) - F.greatest(F.col("start_us"), F.col("_k") * w))
    return (iv.select("run_id", "partition", "start_us", "end_us", k)
            .groupBy("run_id", "partition", (F.col("_k") * w).alias("window_start_us"))
            .agg(F.sum(overlap).alias("unavailable_us")))


def committed_offsets(partition_states, outcomes, run_info, window_ms: int = 1000, *, spark=None, windows=None):
    """The `committed_offsets` table (SPEC §4.3): the partition state as of each window end. `windows`: as for
    `loss_metrics`, its visibility_lag_p99_us instead of aggregating `outcomes`."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    spark = spark or partition_states.sparkSession
    run_info = _as_run_info(spark, run_info)
    w = window_us_of(window_ms)
    # The state as of a window end is the last row with ts_us < window_end, i.e. the last row of the window
    # holding it or of an earlier one. One instant holds one row (SPEC §4.2); the struct order breaks ties.
    state = F.struct("ts_us", "leader_epoch", "log_end_offset", "high_watermark", "leader", "isr")
    last_in_window = (partition_states
                      .select("run_id", "partition", (F.floor(F.col("ts_us") / w) * w).alias("window_start_us"),
                              state.alias("_state"))
                      .groupBy("run_id", "partition", "window_start_us").agg(F.max("_state").alias("_state")))

    if windows is not None:
        lag = windows.where(F.col("visibility_lag_p99_us").isNotNull()).select(
            "run_id", "partition", "window_start_us", "visibility_lag_p99_us")
    else:
        msgs, win = _event_windows(outcomes.where(F.col("visible_us").isNotNull()).select(
            "run_id", "partition", "produce_us", (F.col("visible_us") - F.col("produce_us")).alias("_lag")),
            "produce_us", window_ms)
        lag = (msgs.groupBy("run_id", "partition", win.alias("_w"))
               .agg(F.percentile("_lag", F.lit(0.99)).alias("_lag_p99"))
               .select("run_id", "partition", F.unix_micros("_w.start").alias("window_start_us"),
                       _round_us(F.col("_lag_p99")).alias("visibility_lag_p99_us")))

    keys = ["run_id", "partition", "window_start_us"]
    carry = (Window.partitionBy("run_id", "partition").orderBy("window_start_us")
             .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    out = (window_grid(run_info, window_ms)
           .join(last_in_window, keys, "left")
           .withColumn("_state", F.last("_state", ignorenulls=True).over(carry))
           .join(lag, keys, "left")
           .join(run_info.select("run_id", "min_insync_replicas"), "run_id"))
    isr_size = F.size(F.col("_state.isr"))
    isr_size = F.when(F.col("_state.isr").isNotNull(), isr_size)
    return out.select(
        "window_start_us", "window_end_us", "run_id", "partition",
        F.col("_state.high_watermark").alias("high_watermark"), F.col("_state.log_end_offset").alias("log_end_offset"),
        F.col("_state.leader").alias("leader"), isr_size.cast("int").alias("isr_size"),
        (isr_size < F.col("min_insync_replicas")).alias("under_min_isr"), "visibility_lag_p99_us",
    ).select(*TABLES["committed_offsets"].columns)


def watermarks(events, run_info, *, spark=None):
    """The `watermarks` table in batch mode: one row per run, batch 0, nothing late."""
    from pyspark.sql import functions as F

    spark = spark or events.sparkSession
    run_info = _as_run_info(spark, run_info)
    stats = events.agg(F.max("ts_us").alias("max_event_us"), F.count(F.lit(1)).alias("rows_in"))
    return (run_info.select("run_id").crossJoin(stats)
            .select("run_id", F.lit(0).cast("long").alias("batch"), F.col("max_event_us").alias("watermark_us"),
                    "max_event_us", "rows_in", F.lit(0).cast("long").alias("rows_late")))


def run_summary(outcomes, unavailability, run_info, *, spark=None, windows=None, histograms=None):
    """The `run_summary` table (SPEC §4.4): one row per run of `run_info`, exactly SUMMARY_FIELDS.

    Given the replay tasks' figures (`windows`: per run, partition and window, as for `loss_metrics`;
    `histograms`: (run_id, metric, value, frequency) rows, metric one of HISTOGRAM_METRICS,
    `engine.groups._histogram_batches`), the counts are the sums of the windows and the percentiles Spark's
    `percentile(value, p, frequency)` over the counted values, not aggregations of every outcome: at 1 M events x 16
    presets 2.4 M such rows against 13.8 M outcomes, 6.1-6.7 s against 9.2-9.7 s warm. Both give the same rows
    (tests), and the output gate compares the summary's counts with message_outcomes on every replay
    (`expectations.output_gate.message_screen`)."""
    from pyspark.sql import functions as F

    spark = spark or outcomes.sparkSession
    run_info = _as_run_info(spark, run_info)
    quantiles = F.array(F.lit(0.5), F.lit(0.99), F.lit(0.999))
    if windows is not None and histograms is not None:
        counts = windows.groupBy("run_id").agg(*[F.sum(c).cast("long").alias(c) for c in WINDOW_COUNTS])
        counts = counts.withColumn("pending", F.col("produced") - F.col("acked") - F.col("failed"))
        value, frequency = F.col("value"), F.col("frequency")
        lat = histograms.where(F.col("metric") == ACK_LATENCY_US).groupBy("run_id").agg(
            F.percentile(value, quantiles, frequency).alias("_lat"), F.max(value).alias("_lat_max"))
        lag = histograms.where(F.col("metric") == VISIBILITY_LAG_US).groupBy("run_id").agg(
            F.percentile(value, F.lit(0.99), frequency).alias("_lag_p99"))
        per_run = counts.join(lat, "run_id", "full_outer").join(lag, "run_id", "full_outer")
    else:
        msgs = _message_columns(outcomes)
        per_run = msgs.groupBy("run_id").agg(
            F.count(F.lit(1)).alias("produced"), _count("_acked").alias("acked"), _count("_failed").alias("failed"),
            _count("_pending").alias("pending"), _count("_acked_lost").alias("acked_lost"),
            _count("_failed_committed").alias("failed_committed"), _count("_stranded").alias("stranded"),
            F.percentile(F.col("_ack_latency_us"), quantiles).alias("_lat"),
            F.max("_ack_latency_us").alias("_lat_max"),
            F.percentile("_visibility_lag_us", F.lit(0.99)).alias("_lag_p99"))
    iv = _clipped_intervals(unavailability, run_info)
    unavailable = iv.groupBy("run_id").agg(F.sum(F.col("end_us") - F.col("start_us")).alias("_unavailable_us"))
    counts = ["produced", "acked", "failed", "pending", "acked_lost", "failed_committed", "stranded",
              "_unavailable_us"]
    out = run_info.join(per_run, "run_id", "left").join(unavailable, "run_id", "left").fillna(0, subset=counts)
    ms = 1000.0
    out = out.select(
        "run_id", "produced", "acked", "failed", "pending", "acked_lost",
        F.when(F.col("acked") > 0, F.col("acked_lost") / F.col("acked")).otherwise(F.lit(0.0))
        .alias("acked_lost_rate"),
        "failed_committed", "stranded",
        F.when(F.col("produced") > 0, F.col("acked") / F.col("produced")).alias("availability"),
        (F.col("_unavailable_us") / 1e6).alias("unavailable_partition_seconds"),
        (F.col("_lat")[0] / ms).alias("ack_latency_p50_ms"), (F.col("_lat")[1] / ms).alias("ack_latency_p99_ms"),
        (F.col("_lat")[2] / ms).alias("ack_latency_p999_ms"), (F.col("_lat_max") / ms).alias("ack_latency_max_ms"),
        (F.col("_lag_p99") / ms).alias("visibility_lag_p99_ms"),
        "brokers_used", "replicas_per_message", "replication_bytes",
    )
    assert tuple(out.columns[1:]) == SUMMARY_FIELDS
    return out
