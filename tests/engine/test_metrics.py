"""Windowed metrics and the run summary (SPEC §4.3, §4.4): hand-computed expectations on a small run, and
window sums equal to the summary on synthetic runs."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from engine import metrics
from engine.metrics import RunInfo
from schemas.tables import SUMMARY_FIELDS, TABLES
from tests.synthetic import make_run

pytestmark = pytest.mark.spark

W = 1_000_000
INFO = RunInfo("m1", 3_500_000, 2, min_insync_replicas=2, brokers_used=3, replicas_per_message=2.0,
               replication_bytes=1234)

# msg_id, partition, produce_us, status, latency_us, fate, readable_at_end, visible_us
MESSAGES = [
    (1, 0, 100_000, "acked", 1000, "committed", True, 100_500),
    (2, 0, 200_000, "acked", 3000, "committed", False, 203_000),  # stranded
    (3, 0, 999_999, "acked", 2000, "lost", False, None),  # acked and lost
    (4, 0, 1_000_000, "failed", None, "committed", True, 1_500_000),  # failed but committed
    (5, 1, 2_500_000, "pending", None, "absent", False, None),
    (6, 1, 3_500_000, "acked", 0, "committed", True, 3_500_100),  # at duration_us: the last window
    (7, None, 500_000, "failed", None, "absent", False, None),  # never routed (no_route)
]
# partition, ts_us, leader, leader_epoch, isr, log_end_offset, high_watermark
STATES = [
    (0, 0, 0, 0, [0, 1, 2], 0, 0),
    (0, 500_000, 0, 0, [0, 1, 2], 3, 2),
    (0, 1_000_000, 1, 1, [1], 3, 3),
    (0, 3_000_000, None, 1, [1], 3, 3),
]
INTERVALS = [(0, 900_000, 2_100_000), (1, 3_400_000, 4_000_000), (1, -50, 10)]


def outcomes_df(spark, run_id="m1", messages=MESSAGES):
    rows = []
    for msg, part, produce, status, latency, fate, readable, visible in messages:
        rows.append({"run_id": run_id, "msg_id": msg, "key": None, "producer_id": 0, "partition": part,
                     "produce_us": produce, "status": status, "error": "no_route" if status == "failed" else None,
                     "ack_us": None if latency is None else produce + latency, "latency_us": latency, "fate": fate,
                     "readable_at_end": readable, "offset": None, "visible_us": visible})
    return spark.createDataFrame(pa.Table.from_pylist(rows, schema=TABLES["message_outcomes"].arrow_schema()))


def states_df(spark, run_id="m1"):
    cols = ("partition", "ts_us", "leader", "leader_epoch", "isr", "log_end_offset", "high_watermark")
    rows = [{"run_id": run_id, **dict(zip(cols, s, strict=True))} for s in STATES]
    return spark.createDataFrame(pa.Table.from_pylist(rows, schema=TABLES["partition_states"].arrow_schema()))


def intervals_df(spark, run_id="m1"):
    rows = [{"run_id": run_id, "partition": p, "start_us": s, "end_us": e} for p, s, e in INTERVALS]
    return spark.createDataFrame(pa.Table.from_pylist(rows, schema=TABLES["unavailability"].arrow_schema()))


def by_key(df, *cols):
    return {tuple(r[c] for c in ("partition", "window_start_us")): {c: r[c] for c in cols} for r in df.collect()}


def test_loss_metrics_by_hand(spark):
    lm = metrics.loss_metrics(outcomes_df(spark), intervals_df(spark), [INFO], 1000)
    assert lm.columns == TABLES["loss_metrics"].columns
    cols = ("produced", "acked", "failed", "acked_lost", "failed_committed", "stranded", "unavailable_us",
            "ack_latency_p50_us", "ack_latency_p99_us", "ack_latency_max_us")
    got = by_key(lm, *cols)
    zero = dict.fromkeys(cols[:7], 0) | dict.fromkeys(cols[7:])
    expected = {(p, k * W): dict(zero) for p in (0, 1) for k in range(4)}
    expected[(0, 0)] |= {"produced": 3, "acked": 3, "acked_lost": 1, "stranded": 1, "unavailable_us": 100_000,
                         # latencies 1000, 2000, 3000: p99 by linear interpolation = 2000 + 0.98 * 1000
                         "ack_latency_p50_us": 2000, "ack_latency_p99_us": 2980, "ack_latency_max_us": 3000}
    expected[(0, W)] |= {"produced": 1, "failed": 1, "failed_committed": 1, "unavailable_us": 1_000_000}
    expected[(0, 2 * W)] |= {"unavailable_us": 100_000}
    expected[(1, 0)] |= {"unavailable_us": 10}  # [-50, 10) clipped to the trace
    expected[(1, 2 * W)] |= {"produced": 1}
    expected[(1, 3 * W)] |= {"produced": 1, "acked": 1, "unavailable_us": 100_000,  # clipped at duration_us
                             "ack_latency_p50_us": 0, "ack_latency_p99_us": 0, "ack_latency_max_us": 0}
    expected[(-1, 0)] = dict(zero) | {"produced": 1, "failed": 1}
    assert got == expected
    assert {r.window_end_us - r.window_start_us for r in lm.collect()} == {W}


def test_committed_offsets_by_hand(spark):
    co = metrics.committed_offsets(states_df(spark), outcomes_df(spark), [INFO], 1000)
    assert co.columns == TABLES["committed_offsets"].columns
    cols = ("high_watermark", "log_end_offset", "leader", "isr_size", "under_min_isr", "visibility_lag_p99_us")
    got = by_key(co, *cols)
    empty = dict.fromkeys(cols)
    expected = {
        # as of the last row with ts_us < window end: the row at 1_000_000 belongs to window 1, not window 0
        (0, 0): {"high_watermark": 2, "log_end_offset": 3, "leader": 0, "isr_size": 3, "under_min_isr": False,
                 "visibility_lag_p99_us": 2975},  # lags 500 and 3000: 500 + 0.99 * 2500
        (0, W): {"high_watermark": 3, "log_end_offset": 3, "leader": 1, "isr_size": 1, "under_min_isr": True,
                 "visibility_lag_p99_us": 500_000},
        (0, 2 * W): {"high_watermark": 3, "log_end_offset": 3, "leader": 1, "isr_size": 1, "under_min_isr": True,
                     "visibility_lag_p99_us": None},  # carried forward: no change in this window
        (0, 3 * W): {"high_watermark": 3, "log_end_offset": 3, "leader": None, "isr_size": 1, "under_min_isr": True,
                     "visibility_lag_p99_us": None},  # offline
        (1, 0): empty, (1, W): empty, (1, 2 * W): empty,
        (1, 3 * W): dict(empty) | {"visibility_lag_p99_us": 100},
    }
    assert got == expected


def test_under_min_isr_is_null_without_a_min_isr(spark):
    info = RunInfo("m1", 3_500_000, 2, min_insync_replicas=None)
    co = metrics.committed_offsets(states_df(spark), outcomes_df(spark), [info], 1000)
    assert {r.under_min_isr for r in co.collect()} == {None}


def test_run_summary_by_hand(spark):
    summary = metrics.run_summary(outcomes_df(spark), intervals_df(spark), [INFO])
    assert summary.columns == ["run_id", *SUMMARY_FIELDS]
    row = summary.collect()[0].asDict()
    assert row == {
        "run_id": "m1", "produced": 7, "acked": 4, "failed": 2, "pending": 1, "acked_lost": 1,
        "acked_lost_rate": 0.25, "failed_committed": 1, "stranded": 1, "availability": 4 / 7,
        "unavailable_partition_seconds": pytest.approx(1.30001, abs=1e-12),
        # acked latencies 0, 1000, 2000, 3000 µs; exact percentiles, linear interpolation
        "ack_latency_p50_ms": 1.5, "ack_latency_p99_ms": pytest.approx(2.97), "ack_latency_p999_ms":
            pytest.approx(2.997), "ack_latency_max_ms": 3.0,
        # visibility lags 100, 500, 3000, 500000 µs: p99 = 3000 + 0.97 * 497000
        "visibility_lag_p99_ms": pytest.approx(485.09),
        "brokers_used": 3, "replicas_per_message": 2.0, "replication_bytes": 1234,
    }


def test_summary_of_a_run_without_messages(spark):
    info = RunInfo("empty", 1_000_000, 1)
    empty = outcomes_df(spark).limit(0)
    row = metrics.run_summary(empty, intervals_df(spark).limit(0), [info]).collect()[0]
    assert (row.produced, row.acked, row.acked_lost_rate, row.availability, row.ack_latency_p50_ms) == (
        0, 0, 0.0, None, None)
    lm = metrics.loss_metrics(empty, intervals_df(spark).limit(0), [info], 1000)
    assert sorted((r.partition, r.window_start_us, r.produced) for r in lm.collect()) == [(0, 0, 0), (0, W, 0)]


def test_watermarks_batch_mode(spark):
    events = spark.createDataFrame([(5,), (900,), (40,)], "ts_us BIGINT")
    rows = metrics.watermarks(events, [INFO, RunInfo("m2", 10, 1)]).collect()
    assert sorted(tuple(r) for r in rows) == [("m1", 0, 900, 900, 3, 0), ("m2", 0, 900, 900, 3, 0)]


@pytest.mark.parametrize("window_ms", [1000, 250, 7000])
def test_window_sums_equal_the_summary(spark, window_ms):
    runs = [make_run("s1", 11), make_run("s2", 12, n_messages=700, partitions=5)]
    outcomes = spark.createDataFrame(pa.concat_tables([r.outcomes for r in runs]))
    intervals = spark.createDataFrame(pa.concat_tables([r.unavailability for r in runs]))
    infos = [r.info for r in runs]
    sums = (metrics.loss_metrics(outcomes, intervals, infos, window_ms).groupBy("run_id")
            .agg(*[F.sum(c).alias(c) for c in ("produced", "acked", "failed", "acked_lost", "failed_committed",
                                                 "stranded", "unavailable_us")]))
    summary = {r.run_id: r for r in metrics.run_summary(outcomes, intervals, infos).collect()}
    for s in sums.collect():
        total = summary[s.run_id]
        for c in ("produced", "acked", "failed", "acked_lost", "failed_committed", "stranded"):
            assert s[c] == total[c], (s.run_id, c)
        assert s.unavailable_us == round(total.unavailable_partition_seconds * 1e6)
        assert total.produced == total.acked + total.failed + total.pending


def test_windows_cover_every_partition_even_without_traffic(spark):
    run = make_run("s3", 5, n_messages=10, partitions=4)
    outcomes = spark.createDataFrame(run.outcomes).where("`partition` = 1")
    lm = metrics.loss_metrics(outcomes, spark.createDataFrame(run.unavailability), [run.info], 1000)
    n_windows = run.info.duration_us // W + 1
    counts = {r.partition: r["count"] for r in lm.groupBy("partition").count().collect()}
    assert counts == dict.fromkeys(range(4), n_windows)


def test_the_replay_tasks_percentiles_are_sparks_bit_for_bit(spark):
    """`metrics.spark_percentile` (the replay tasks' per-window latencies) against Spark's exact `percentile` on
    groups of every size from 1 to 60, with many ties, at the percentiles the tables use; and the HALF_UP rounding
    of Spark's `round` (exact .5 fractions arise from two-value interpolations)."""
    import numpy as np

    rng = np.random.default_rng(7)
    sizes = np.repeat(np.arange(1, 61), 4)
    group = np.repeat(np.arange(len(sizes)), sizes)
    values = np.where(rng.random(len(group)) < 0.5, rng.integers(0, 5, len(group)),
                      rng.integers(0, 10**9, len(group)))
    ps = (0.5, 0.99, 0.999, 0.25)
    df = spark.createDataFrame(pa.table({"g": group, "v": values}))
    got_spark = {r.g: (list(r.p), list(r.rounded)) for r in df.groupBy("g").agg(
        F.percentile("v", F.array(*[F.lit(p) for p in ps])).alias("p")).select(
        "g", "p", F.transform("p", lambda x: F.round(x).cast("long")).alias("rounded")).collect()}
    order = np.lexsort((values, group))
    sorted_values = values[order]
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    mine = [metrics.spark_percentile(sorted_values, starts, sizes, p) for p in ps]
    for g in range(len(sizes)):
        exact, rounded = got_spark[g]
        assert [m[g] for m in mine] == exact, g
        assert [int(metrics.round_half_up(np.array([m[g]]))[0]) for m in mine] == rounded, g
    halves = [2.5, 3.49999, -0.5, -2.5, -1.49, 7.0, 0.0]
    rounded = spark.createDataFrame([(x,) for x in halves], "x DOUBLE").select(F.round("x").cast("long")).collect()
    assert metrics.round_half_up(np.array(halves)).tolist() == [r[0] for r in rounded] == [3, 3, -1, -3, -1, 7, 0]


def test_the_replay_tasks_windows_stay_apart_across_2_to_the_32_windows():
    """`message_windows` keys a (partition, window) as one int64 while a unit's windows span under 2^32; a longer
    trace (here 1 µs windows) takes the pairs themselves: windows 2^32 apart are two windows, not one."""
    import numpy as np

    from schemas.outcomes import NULL_US, Fate, Status

    for far in (1 << 31, 1 << 32, 3 << 32):
        produce = np.array([0, far, far + 1, 5, far], dtype=np.int64)
        n = len(produce)
        out = metrics.message_windows(
            np.array([0, 0, 0, 1, 1]), produce, np.full(n, int(Status.ACKED)), np.full(n, int(Fate.COMMITTED)),
            np.ones(n, dtype=bool), produce + 7, np.full(n, NULL_US), window_us=1)
        rows = sorted(zip(out["partition"].tolist(), out["window_start_us"].tolist(), out["produced"].tolist(),
                          out["ack_latency_max_us"].tolist(), strict=True))
        assert rows == [(0, 0, 1, 7), (0, far, 1, 7), (0, far + 1, 1, 7), (1, 5, 1, 7), (1, far, 1, 7)], far
