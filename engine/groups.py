"""Executor side of the replay: the two Arrow functions the Spark job maps over its data.

`route_batches` routes produce events (one row per routing class). `run_groups` receives a Spark partition's
events sorted by (class, unit, time) and replays every (class, unit) group in time chunks, feeding each chunk to
one chunked kernel per policy of the class (`replay/kernels/`), so memory holds a chunk and the kernels' carried
state, never a whole partition's history of events. Outputs are one Arrow schema with a row type.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine import worker_imports
from engine.metrics import (
    UNROUTED_PARTITION,
    WINDOW_COUNTS,
    WINDOW_TIMES,
    message_values,
    message_windows,
)
from replay.events import PartitionEvents
from replay.families import Layout, RouteInput, family_of
from replay.policies import Policy
from schemas.outcomes import NULL_US
from schemas.trace import Kind

# Executor code is imported first in a Python worker: from here on its tasks start without re-reading zips.
worker_imports.install()

# Row types of the replay output (WINDOW: a run's message figures per partition and window; ACK_LATENCY and
# VISIBILITY_LAG: the counts of each value of engine.metrics.HISTOGRAM_METRICS, in that order). Codes 5-7 are
# stream mode's (engine.stream.groups), kept as they were before the histograms came.
MESSAGE, STATE, UNAVAILABLE, UNIT, WINDOW = 0, 1, 2, 3, 4
HISTOGRAM_ROW_TYPES = ACK_LATENCY, VISIBILITY_LAG = 8, 9
FINAL_ROW_TYPES = (MESSAGE, STATE, UNAVAILABLE, UNIT, WINDOW, *HISTOGRAM_ROW_TYPES)  # what a unit's finish emits

GROUPED_COLUMNS = ("cls", "unit", "ts_us", "kind_code", "broker", "upto_us", "msg_id", "size_bytes", "key",
                   "producer_id", "partition", "delay_us")

OUTPUT_SCHEMA = pa.schema([
    ("policy_idx", pa.int32()), ("rtype", pa.int8()), ("unit", pa.int32()),
    ("msg_id", pa.int64()), ("key", pa.string()), ("producer_id", pa.int32()), ("partition", pa.int32()),
    ("produce_us", pa.int64()), ("status", pa.int8()), ("error", pa.int8()), ("ack_us", pa.int64()),
    ("visible_us", pa.int64()), ("fate", pa.int8()), ("readable_at_end", pa.bool_()), ("offset", pa.int64()),
    ("ts_us", pa.int64()), ("leader", pa.int32()), ("leader_epoch", pa.int32()), ("isr", pa.list_(pa.int32())),
    ("log_end_offset", pa.int64()), ("high_watermark", pa.int64()),
    ("start_us", pa.int64()), ("end_us", pa.int64()), ("replication_bytes", pa.int64()),
    ("window_start_us", pa.int64()), *[(c, pa.int64()) for c in WINDOW_COUNTS + WINDOW_TIMES],
    ("value", pa.int64()), ("frequency", pa.int64()),
])
_SQL_TYPES = {pa.int8(): "TINYINT", pa.int32(): "INT", pa.int64(): "BIGINT", pa.string(): "STRING",
              pa.bool_(): "BOOLEAN"}


def _sql_type(t: pa.DataType) -> str:
    if pa.types.is_list(t):
        return f"ARRAY<{_sql_type(t.value_type)}>"
    if pa.types.is_struct(t):
        return "STRUCT<" + ", ".join(f"`{f.name}`: {_sql_type(f.type)}" for f in t) + ">"
    return _SQL_TYPES[t]


def ddl(schema: pa.Schema) -> str:
    """The Spark DDL of an Arrow schema of these columns' types (a mapInArrow's output schema)."""
    return ", ".join(f"`{f.name}` {_sql_type(f.type)}" for f in schema)


OUTPUT_DDL = ddl(OUTPUT_SCHEMA)

#: The columns a MESSAGE row fills (and the row's keys); every other column is some other row type's.
MESSAGE_COLUMNS = ("policy_idx", "rtype", "unit", "msg_id", "key", "producer_id", "partition", "produce_us", "status",
                   "error", "ack_us", "visible_us", "fate", "readable_at_end", "offset")
#: OUTPUT_SCHEMA as the batch replay persists it: the other row types' 22 columns in one struct, `detail`, null in
#: a message row. A message row of OUTPUT_SCHEMA is 22 nulls, each a field of its row in the JVM and an entry of
#: the disk cache: 6 M message rows were cached in 7.2-7.6 s with them, 4.3-4.4 s with one null struct, 3.6-3.8 s
#: with only the message columns (bench/HISTORY.md, fourth session).
PACKED_SCHEMA = pa.schema([*(OUTPUT_SCHEMA.field(c) for c in MESSAGE_COLUMNS),
                           pa.field("detail", pa.struct([f for f in OUTPUT_SCHEMA if f.name not in MESSAGE_COLUMNS]))])
PACKED_DDL = ddl(PACKED_SCHEMA)


def packed(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A batch of OUTPUT_SCHEMA in PACKED_SCHEMA (`engine.replay.unpacked` reads it back)."""
    detail_type = PACKED_SCHEMA.field("detail").type
    is_message = pc.equal(batch.column("rtype"), MESSAGE)
    detail = pa.StructArray.from_arrays([batch.column(f.name) for f in detail_type], fields=list(detail_type),
                                        mask=is_message)
    return pa.RecordBatch.from_arrays([*(batch.column(c) for c in MESSAGE_COLUMNS), detail], schema=PACKED_SCHEMA)


ROUTED_DDL = ("cls INT, unit INT, ts_us BIGINT, kind_code TINYINT, broker INT, upto_us BIGINT, msg_id BIGINT, "
              "size_bytes INT, key STRING, producer_id INT, `partition` INT, delay_us BIGINT")


@dataclass
class RouteClass:
    """Policies that route every message identically: one shuffle group set, evaluated together."""

    index: int
    members: list[tuple[int, Policy, Layout]]  # (policy index in the run, policy, its layout)

    @property
    def router(self) -> tuple[Policy, Layout]:
        return self.members[0][1], self.members[0][2]

    @property
    def units(self) -> tuple[int, ...]:
        return self.members[0][2].units


@dataclass
class ReplayPlan:
    """Everything executors need (shipped in the function closures)."""

    manifest: object  # schemas.trace.Manifest
    classes: list[RouteClass]
    control: PartitionEvents  # the fault timeline (no replication progress), for liveness-aware routing
    window_us: int


def route_batches(plan: ReplayPlan):
    """mapInArrow function: produce rows (ts_us, msg_id, key, size_bytes, producer_id, msg_rank) → routed rows."""

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            n = batch.num_rows
            if n == 0:
                continue
            ts = batch.column("ts_us").to_numpy(zero_copy_only=False).astype(np.int64)
            rank = batch.column("msg_rank").to_numpy(zero_copy_only=False).astype(np.int64)
            keys = batch.column("key")
            for rc in plan.classes:
                policy, layout = rc.router
                routed = family_of(policy).route(policy, plan.manifest, layout, plan.control,
                                                 RouteInput(ts, rank, keys))
                delay = routed.delay_us if routed.delay_us is not None else np.zeros(n, dtype=np.int64)
                yield pa.RecordBatch.from_arrays([
                    pa.array(np.full(n, rc.index, dtype=np.int32)), pa.array(routed.unit.astype(np.int32)),
                    batch.column("ts_us"), pa.array(np.full(n, int(Kind.PRODUCE), dtype=np.int8)),
                    pa.nulls(n, pa.int32()), pa.nulls(n, pa.int64()), batch.column("msg_id"),
                    batch.column("size_bytes"), keys, batch.column("producer_id"),
                    pa.array(routed.partition.astype(np.int32)), pa.array(delay.astype(np.int64)),
                ], names=list(GROUPED_COLUMNS))

    return fn


class UnitReplay:
    """One (class, unit) being replayed: a kernel per policy, the key dictionary, the held-back instant."""

    def __init__(self, plan: ReplayPlan, rc: RouteClass, unit: int) -> None:
        self.plan, self.rc, self.unit = plan, rc, unit
        duration = plan.manifest.duration_us
        self.kernels = []
        for idx, policy, layout in rc.members:
            k = family_of(policy).kernel(policy, unit, layout.replicas[unit], duration)
            if hasattr(k, "window_us"):
                k.window_us = plan.window_us
            self.kernels.append((idx, k))
        self.keys: list[str] = []
        self.key_ids: dict[str, int] = {}
        self.held: pa.Table | None = None  # events of the last instant seen: more may follow in the next batch

    def _key_ids(self, keys: pa.Array) -> np.ndarray:
        if len(keys) == 0:
            return np.zeros(0, dtype=np.int64)
        enc = keys.dictionary_encode()
        local = np.array([self.key_ids.setdefault(k, len(self.key_ids)) for k in enc.dictionary.to_pylist()],
                         dtype=np.int64)
        if len(self.key_ids) > len(self.keys):
            self.keys.extend(list(self.key_ids)[len(self.keys):])
        idx = enc.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        return np.where(idx >= 0, local[np.maximum(idx, 0)] if len(local) else -1, -1)

    def _events(self, t: pa.Table) -> PartitionEvents:
        # Each column is read once as numpy and split by kind; only the key (a string) is filtered in Arrow.
        kind = t.column("kind_code").to_numpy().astype(np.int8)
        prod = kind == Kind.PRODUCE
        broker = ~prod

        def col(name: str, fill: int = 0) -> np.ndarray:
            return pc.fill_null(t.column(name), fill).to_numpy().astype(np.int64)

        ts = col("ts_us")
        return PartitionEvents(
            ts[prod], col("msg_id")[prod], col("size_bytes")[prod], ts[broker], kind[broker],
            col("broker", -1)[broker], col("upto_us")[broker],
            # carried untouched to the outputs; "part" and "delay" are also read by the RocketMQ engines
            payload={"pid": col("producer_id", -1)[prod], "part": col("partition", -1)[prod],
                     "delay": col("delay_us")[prod],
                     "keyid": self._key_ids(t.column("key").filter(pa.array(prod)).combine_chunks())},
        )

    def feed(self, chunk: pa.Table) -> None:
        """Events of this group, in time order, possibly continuing the last instant of the previous chunk."""
        if self.held is not None:
            chunk = pa.concat_tables([self.held, chunk])
        # The group's rows arrive sorted by time: the last instant is a suffix, held back whole (zero-copy slices).
        ts = chunk.column("ts_us").to_numpy()
        last = int(ts[-1])
        cut = int(np.searchsorted(ts, last, side="left"))
        ready, self.held = chunk.slice(0, cut), chunk.slice(cut)
        if ready.num_rows:
            events = self._events(ready)
            for _, k in self.kernels:
                k.advance(events, last)

    def finish(self) -> Iterator[pa.RecordBatch]:
        duration = self.plan.manifest.duration_us
        tail = self._events(self.held) if self.held is not None else PartitionEvents.empty()
        for idx, k in self.kernels:
            k.advance(tail, duration + 1)
            result = k.finish()
            yield from _message_batches(idx, self.unit, result.messages, self.keys)
            yield _window_batch(idx, self.unit, result.messages, self.plan.window_us)
            yield from _histogram_batches(idx, self.unit, result.messages)
            yield _state_batch(idx, self.unit, result.states)
            yield _interval_batch(idx, self.unit, result.unavailable)
            yield _unit_batch(idx, self.unit, result.replication_bytes)


def run_groups(plan: ReplayPlan):
    """mapInArrow function over events sorted by (cls, unit, ts_us, kind_code, msg_id, broker) → PACKED_SCHEMA."""
    classes = {rc.index: rc for rc in plan.classes}

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        group: UnitReplay | None = None
        for batch in batches:
            if batch.num_rows == 0:
                continue
            table = pa.Table.from_batches([batch])
            cls = table.column("cls").to_numpy(zero_copy_only=False)
            unit = table.column("unit").to_numpy(zero_copy_only=False)
            change = np.flatnonzero((cls[1:] != cls[:-1]) | (unit[1:] != unit[:-1])) + 1
            bounds = [0, *change.tolist(), len(cls)]
            for a, b in pairwise(bounds):
                key = (int(cls[a]), int(unit[a]))
                if group is None or (group.rc.index, group.unit) != key:
                    if group is not None:
                        yield from map(packed, group.finish())
                    group = UnitReplay(plan, classes[key[0]], key[1])
                group.feed(table.slice(a, b - a))
        if group is not None:
            yield from map(packed, group.finish())

    return fn


# ------------------------------------------------------------------------------------------ output rows
def _nulls(n: int, skip: set[str]) -> dict[str, pa.Array]:
    return {f.name: pa.nulls(n, f.type) for f in OUTPUT_SCHEMA if f.name not in skip}


def _batch(n: int, cols: dict[str, pa.Array]) -> pa.RecordBatch:
    full = {**_nulls(n, set(cols)), **cols}
    return pa.RecordBatch.from_arrays([full[f.name] for f in OUTPUT_SCHEMA], schema=OUTPUT_SCHEMA)


def _opt(values: np.ndarray, dtype) -> pa.Array:
    """int64 with NULL_US → nullable Arrow column."""
    return pa.array(values.astype(dtype), mask=values == NULL_US)


def _message_batches(idx: int, unit: int, judged, keys: list[str], rows_per_batch: int = 262_144):
    rec = judged.records
    n = len(rec)
    if n == 0:
        return
    payload = rec.payload or {}
    keyid = payload.get("keyid", np.full(n, -1))
    key_arr = pa.DictionaryArray.from_arrays(pa.array(keyid.astype(np.int32), mask=keyid < 0),
                                             pa.array(keys, pa.string())).cast(pa.string())
    for a in range(0, n, rows_per_batch):
        b = min(n, a + rows_per_batch)
        s = slice(a, b)
        yield _batch(b - a, {
            "policy_idx": pa.array(np.full(b - a, idx, dtype=np.int32)),
            "rtype": pa.array(np.full(b - a, MESSAGE, dtype=np.int8)),
            "unit": pa.array(np.full(b - a, unit, dtype=np.int32)),
            "msg_id": pa.array(rec.msg_id[s]),
            "key": key_arr.slice(a, b - a),
            "producer_id": _opt(payload.get("pid", np.full(n, NULL_US))[s], np.int32),
            "partition": _opt(payload.get("part", np.full(n, NULL_US))[s], np.int32),
            "produce_us": pa.array(rec.produce_us[s]),
            "status": pa.array(rec.status[s].astype(np.int8)),
            "error": pa.array(rec.error[s].astype(np.int8)),
            "ack_us": _opt(rec.ack_us[s], np.int64),
            "visible_us": _opt(rec.visible_us[s], np.int64),
            "fate": pa.array(judged.fate[s].astype(np.int8)),
            "readable_at_end": pa.array(judged.readable_at_end[s]),
            "offset": _opt(judged.offset[s], np.int64),
        })


def _window_batch(idx: int, unit: int, judged, window_us: int) -> pa.RecordBatch:
    """The unit's message figures per partition and window (`engine.metrics.message_windows`). A partition is
    replayed by one unit, so its windows are whole here; only unrouted messages (no partition) of one run may be
    spread over units, and they are never acknowledged nor visible: their windows add up (frames_from_raw)."""
    rec = judged.records
    part = (rec.payload or {}).get("part", np.full(len(rec), NULL_US))
    part = np.where(part == NULL_US, UNROUTED_PARTITION, part)
    unrouted = part == UNROUTED_PARTITION
    if np.any(unrouted & ((rec.ack_us != NULL_US) | (rec.visible_us != NULL_US))):
        raise AssertionError(f"unit {unit}: an unrouted message was acknowledged or visible")
    w = message_windows(part, rec.produce_us, rec.status, judged.fate, judged.readable_at_end, rec.ack_us,
                        rec.visible_us, window_us)
    n = len(w["partition"])
    return _batch(n, {
        "policy_idx": pa.array(np.full(n, idx, dtype=np.int32)),
        "rtype": pa.array(np.full(n, WINDOW, dtype=np.int8)),
        "unit": pa.array(np.full(n, unit, dtype=np.int32)),
        "partition": pa.array(w["partition"].astype(np.int32)),
        "window_start_us": pa.array(w["window_start_us"]),
        **{c: pa.array(w[c]) for c in WINDOW_COUNTS},
        **{c: _opt(w[c], np.int64) for c in WINDOW_TIMES},
    })


def _histogram_batches(idx: int, unit: int, judged) -> Iterator[pa.RecordBatch]:
    """The unit's ack latencies and visibility lags as (value, frequency) rows (`engine.metrics.message_values`):
    run_summary's exact percentiles over them, summed over units by Spark's `percentile(value, p, frequency)`, read
    a row per distinct value of a unit instead of a row per message (1 M events x 16 presets: 2.4 M rows against 13.8 M
    outcomes)."""
    rec = judged.records
    for rtype, values in zip(HISTOGRAM_ROW_TYPES, message_values(rec.status, rec.produce_us, rec.ack_us,
                                                                          rec.visible_us), strict=True):
        value, frequency = np.unique(values, return_counts=True)
        n = len(value)
        if n:
            yield _batch(n, {
                "policy_idx": pa.array(np.full(n, idx, dtype=np.int32)),
                "rtype": pa.array(np.full(n, rtype, dtype=np.int8)),
                "unit": pa.array(np.full(n, unit, dtype=np.int32)),
                "value": pa.array(value.astype(np.int64)), "frequency": pa.array(frequency.astype(np.int64)),
            })


def _state_batch(idx: int, unit: int, rows) -> pa.RecordBatch:
    n = len(rows)
    return _batch(n, {
        "policy_idx": pa.array(np.full(n, idx, dtype=np.int32)),
        "rtype": pa.array(np.full(n, STATE, dtype=np.int8)),
        "unit": pa.array(np.full(n, unit, dtype=np.int32)),
        "ts_us": pa.array([r.ts_us for r in rows], pa.int64()),
        "leader": pa.array([r.leader for r in rows], pa.int32()),
        "leader_epoch": pa.array([r.leader_epoch for r in rows], pa.int32()),
        "isr": pa.array([list(r.isr) for r in rows], pa.list_(pa.int32())),
        "log_end_offset": pa.array([r.log_end_offset for r in rows], pa.int64()),
        "high_watermark": pa.array([r.high_watermark for r in rows], pa.int64()),
    })


def _interval_batch(idx: int, unit: int, intervals) -> pa.RecordBatch:
    n = len(intervals)
    return _batch(n, {
        "policy_idx": pa.array(np.full(n, idx, dtype=np.int32)),
        "rtype": pa.array(np.full(n, UNAVAILABLE, dtype=np.int8)),
        "unit": pa.array(np.full(n, unit, dtype=np.int32)),
        "start_us": pa.array([a for a, _ in intervals], pa.int64()),
        "end_us": pa.array([b for _, b in intervals], pa.int64()),
    })


def _unit_batch(idx: int, unit: int, replication_bytes: int) -> pa.RecordBatch:
    return _batch(1, {
        "policy_idx": pa.array([idx], pa.int32()), "rtype": pa.array([UNIT], pa.int8()),
        "unit": pa.array([unit], pa.int32()), "replication_bytes": pa.array([replication_bytes], pa.int64()),
    })

