"""The events of one partition's replay, as arrays in the order SPEC §2.2 applies them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from schemas.trace import UNKNOWN_KIND, Kind, kind_codes


def hosted_rows(broker_ids: np.ndarray, replicas) -> np.ndarray:
    """The rows of the broker events (by their `broker_ids`) that a unit with these replicas reads: its replicas'
    own. A unit's engines ignore every other broker's events (`PartitionEvents`), so the Spark job sends a unit only
    these (`engine.groups.bundle_batches`), and the local replay does the same (`replay.local.unit_events`).
    `replicas`: broker ids, in any order and with repeats."""
    return np.flatnonzero(np.isin(broker_ids, replicas))


def in_order(*keys: np.ndarray) -> bool:
    """Whether rows are in ascending lexicographic order of `keys` (first key primary; ties allowed)."""
    if len(keys[0]) < 2:
        return True
    tied = None  # adjacent pairs equal on every key so far
    for k in keys:
        step = np.diff(k.astype(np.int64, copy=False))
        if (step[tied] < 0).any() if tied is not None else (step < 0).any():
            return False
        tied = step == 0 if tied is None else tied & (step == 0)
        if not tied.any():
            return True
    return True


@dataclass
class PartitionEvents:
    """Produce events routed to one partition and the broker events of its replicas (`hosted_rows`).

    Both are sorted: produces by (ts_us, msg_id); broker events by (ts_us, kind, broker). Broker events of
    brokers that hold no replica of the partition are harmless (the engines ignore them).
    """

    produce_ts: np.ndarray  # int64
    produce_msg: np.ndarray  # int64
    produce_size: np.ndarray  # int64
    broker_ts: np.ndarray  # int64
    broker_kind: np.ndarray  # int8, schemas.trace.Kind
    broker_id: np.ndarray  # int64
    broker_upto: np.ndarray  # int64 (replicate only; 0 otherwise)
    #: Per-produce values the replay carries to its outputs untouched (e.g. producer id, reported partition,
    #: key id); aligned with produce_ts.
    payload: dict[str, np.ndarray] | None = None

    @classmethod
    def empty(cls) -> PartitionEvents:
        i64 = np.zeros(0, dtype=np.int64)
        return cls(i64, i64, i64, i64, np.zeros(0, dtype=np.int8), i64, i64)

    def __post_init__(self) -> None:
        self.produce_ts = np.asarray(self.produce_ts, dtype=np.int64)
        self.produce_msg = np.asarray(self.produce_msg, dtype=np.int64)
        self.produce_size = np.asarray(self.produce_size, dtype=np.int64)
        self.broker_ts = np.asarray(self.broker_ts, dtype=np.int64)
        self.broker_kind = np.asarray(self.broker_kind, dtype=np.int8)
        self.broker_id = np.asarray(self.broker_id, dtype=np.int64)
        self.broker_upto = np.asarray(self.broker_upto, dtype=np.int64)

    @property
    def n_events(self) -> int:
        return len(self.produce_ts) + len(self.broker_ts)

    def sorted(self) -> PartitionEvents:
        """The events in replay order. Rows already in order (a unit's share of an ordered trace) are checked in
        O(n) and kept as they are: `np.lexsort` is stable, so it would return the identity there."""
        if in_order(self.produce_ts, self.produce_msg) and in_order(self.broker_ts, self.broker_kind, self.broker_id):
            return PartitionEvents(self.produce_ts, self.produce_msg, self.produce_size, self.broker_ts,
                                   self.broker_kind, self.broker_id, self.broker_upto,
                                   None if self.payload is None else dict(self.payload))
        p = np.lexsort((self.produce_msg, self.produce_ts))
        b = np.lexsort((self.broker_id, self.broker_kind, self.broker_ts))
        payload = None if self.payload is None else {k: v[p] for k, v in self.payload.items()}
        return PartitionEvents(self.produce_ts[p], self.produce_msg[p], self.produce_size[p], self.broker_ts[b],
                               self.broker_kind[b], self.broker_id[b], self.broker_upto[b], payload)

    def slice_time(self, start_us: int, end_us: int) -> PartitionEvents:
        """Events with start_us <= ts_us < end_us (a time chunk)."""
        pa_, pb = np.searchsorted(self.produce_ts, [start_us, end_us], side="left")
        ba, bb = np.searchsorted(self.broker_ts, [start_us, end_us], side="left")
        payload = None if self.payload is None else {k: v[pa_:pb] for k, v in self.payload.items()}
        return PartitionEvents(self.produce_ts[pa_:pb], self.produce_msg[pa_:pb], self.produce_size[pa_:pb],
                               self.broker_ts[ba:bb], self.broker_kind[ba:bb], self.broker_id[ba:bb],
                               self.broker_upto[ba:bb], payload)


def split_trace_table(table: pa.Table) -> tuple[dict[str, np.ndarray], PartitionEvents]:
    """Split a trace table into its produce columns (unrouted) and the broker events (shared by partitions)."""
    kind = kind_codes(table.column("kind"))
    if (kind == UNKNOWN_KIND).any():
        row = int(np.argmax(kind == UNKNOWN_KIND))
        raise ValueError(f"unknown or null kind in row {row} (the trace loader checks kinds)")
    ts = table.column("ts_us").to_numpy(zero_copy_only=False).astype(np.int64)
    is_produce = kind == Kind.PRODUCE
    produce = {
        "ts_us": ts[is_produce],
        "msg_id": table.column("msg_id").to_numpy(zero_copy_only=False)[is_produce].astype(np.int64),
        "size_bytes": table.column("size_bytes").to_numpy(zero_copy_only=False)[is_produce].astype(np.int64),
        "key": np.array(table.column("key").to_pylist(), dtype=object)[is_produce],
        "producer_id": table.column("producer_id").to_numpy(zero_copy_only=False)[is_produce],
    }
    broker = ~is_produce
    upto = table.column("upto_us").to_numpy(zero_copy_only=False)
    upto = np.where(np.isnan(upto.astype(float)), 0, upto).astype(np.int64) if upto.dtype == object or \
        upto.dtype.kind == "f" else upto.astype(np.int64)
    events = PartitionEvents(
        np.zeros(0), np.zeros(0), np.zeros(0), ts[broker], kind[broker],
        table.column("broker").to_numpy(zero_copy_only=False)[broker].astype(np.int64), upto[broker],
    ).sorted()
    return produce, events
