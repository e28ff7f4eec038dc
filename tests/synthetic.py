"""A synthetic run's outputs (not a replay: plausible, seeded data in the declared schemas) for testing the
lakehouse, the metrics and the output gate independently of the replay core.

Also runnable as a writer process for the kill and concurrency tests:
`python -m tests.synthetic --lakehouse DIR --run-id R --seed N` prints one line per step
(`step <name>`) and flushes, so that a test can kill it at a chosen point.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from engine.metrics import RunInfo
from schemas.tables import TABLES

DURATION_US = 20_000_000
PARTITIONS = 3


@dataclass
class SyntheticRun:
    run_id: str
    info: RunInfo
    outcomes: pa.Table
    states: pa.Table
    unavailability: pa.Table


def make_run(run_id: str, seed: int, n_messages: int = 400, partitions: int = PARTITIONS,
             duration_us: int = DURATION_US) -> SyntheticRun:
    rng = np.random.default_rng(seed)
    n = n_messages
    msg_id = np.arange(1, n + 1, dtype=np.int64)
    produce = np.sort(rng.integers(0, duration_us + 1, n)).astype(np.int64)
    partition = (msg_id % partitions).astype(np.int32)
    status = rng.choice(np.array(["acked", "failed", "pending"]), n, p=[0.8, 0.15, 0.05])
    acked = status == "acked"
    latency = np.where(acked, rng.integers(0, 50_000, n), -1).astype(np.int64)
    ack_us = np.where(acked, produce + latency, -1)
    fate = np.where(acked, np.where(rng.random(n) < 0.9, "committed", "lost"),
                    np.where(rng.random(n) < 0.3, "committed", "absent"))
    committed = fate == "committed"
    readable = committed & (rng.random(n) < 0.9)
    offset = np.full(n, -1, dtype=np.int64)
    for p in range(partitions):
        sel = committed & (partition == p)
        offset[sel] = np.arange(sel.sum())
    visible = np.where(committed, produce + rng.integers(0, 80_000, n), -1)
    error = np.where(status == "failed", "request_timeout", None)

    def opt(a: np.ndarray, t: pa.DataType) -> pa.Array:
        return pa.array(a, t, mask=(a < 0))

    outcomes = pa.table({
        "run_id": pa.array([run_id] * n), "msg_id": msg_id,
        "key": pa.array([f"k{i % 7}" if i % 3 else None for i in range(n)], pa.string()),
        "producer_id": pa.array(np.zeros(n, dtype=np.int32)), "partition": pa.array(partition),
        "produce_us": produce, "status": pa.array(status.tolist()), "error": pa.array(error.tolist(), pa.string()),
        "ack_us": opt(ack_us, pa.int64()), "latency_us": opt(latency, pa.int64()), "fate": pa.array(fate.tolist()),
        "readable_at_end": pa.array(readable), "offset": opt(offset, pa.int64()),
        "visible_us": opt(visible, pa.int64()),
    }, schema=TABLES["message_outcomes"].arrow_schema())

    st = {name: [] for name in TABLES["partition_states"].columns}
    iv = {name: [] for name in TABLES["unavailability"].columns}
    for p in range(partitions):
        times = np.unique(np.concatenate([[0], rng.integers(1, duration_us, 25)]))
        epoch, leo, hw = 0, 0, 0
        for t in times:
            if rng.random() < 0.15:
                epoch += 1  # a new leader: the high watermark may restart lower in the new epoch
                hw = max(0, hw - int(rng.integers(0, 3)))
            leo += int(rng.integers(0, 20))
            hw = min(leo, hw + int(rng.integers(0, 20)))
            isr = sorted(rng.choice(3, int(rng.integers(1, 4)), replace=False).tolist())
            offline = rng.random() < 0.05
            for name, value in (("run_id", run_id), ("partition", p), ("ts_us", int(t)),
                                ("leader", None if offline else isr[0]), ("leader_epoch", epoch), ("isr", isr),
                                ("log_end_offset", leo), ("high_watermark", hw)):
                st[name].append(value)
        starts = np.sort(rng.integers(0, duration_us, 3))
        for s in starts:
            end = min(int(s) + int(rng.integers(1, 3_000_000)), duration_us + 500_000)  # some run past the end
            if iv["end_us"] and iv["partition"][-1] == p and iv["end_us"][-1] > s:
                continue  # keep a partition's intervals disjoint
            for name, value in (("run_id", run_id), ("partition", p), ("start_us", int(s)), ("end_us", end)):
                iv[name].append(value)
    states = pa.table(st, schema=TABLES["partition_states"].arrow_schema())
    unavailability = pa.table(iv, schema=TABLES["unavailability"].arrow_schema())
    info = RunInfo(run_id, duration_us, partitions, min_insync_replicas=2, brokers_used=3,
                   replicas_per_message=3.0, replication_bytes=int(n * 200))
    return SyntheticRun(run_id, info, outcomes, states, unavailability)


def run_tables(spark, run: SyntheticRun, window_ms: int = 1000, events=None) -> dict:
    """Every run table of the synthetic run, computed with engine.metrics (persisted)."""
    from engine import metrics

    outcomes = spark.createDataFrame(run.outcomes)
    states = spark.createDataFrame(run.states)
    unavailability = spark.createDataFrame(run.unavailability)
    if events is None:
        events = outcomes.select("produce_us").withColumnRenamed("produce_us", "ts_us")
    tables = {
        "message_outcomes": outcomes,
        "partition_states": states,
        "unavailability": unavailability,
        "committed_offsets": metrics.committed_offsets(states, outcomes, [run.info], window_ms),
        "loss_metrics": metrics.loss_metrics(outcomes, unavailability, [run.info], window_ms),
        "watermarks": metrics.watermarks(events, [run.info]),
        "run_summary": metrics.run_summary(outcomes, unavailability, [run.info]),
    }
    return {name: df.persist() for name, df in tables.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lakehouse", required=True)
    parser.add_argument("--run-id", required=True, action="append")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--messages", type=int, default=400)
    args = parser.parse_args(argv)

    from storage.lakehouse import Lakehouse, RunRecord
    from storage.session import get_spark

    # a small replay's writer, as `replab replay` starts one (`engine.replay.short_lived_jvm`)
    spark = get_spark("synthetic-writer", master="local[2]", shuffle_partitions=2, short_lived=True)
    lh = Lakehouse(args.lakehouse, spark)
    print("step created", flush=True)
    for i, run_id in enumerate(args.run_id):
        run = make_run(run_id, args.seed + i, args.messages)
        tables = run_tables(spark, run)
        record = RunRecord(run_id, "synthetic-trace", f"synthetic:seed={args.seed + i}", "synthetic",
                           {"seed": str(args.seed + i)})
        # The replay's own protocol (tables written concurrently); a step is printed as its commit lands.
        lh.publish_runs([record], tables, progress=lambda text, run_id=run_id: print(f"step {text} {run_id}",
                                                                                     flush=True))
        print(f"step succeeded {run_id}", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
