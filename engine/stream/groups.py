"""Executor side of the stream replay: routing of each micro-batch, and the stateful replay of each group.

`Router` (no state; run by the source as it reads each file) turns source rows into grouped rows, as the batch
job's routing and fan-out do, and packs each group's rows of a source batch into one Arrow IPC value, so that
Spark moves, shuffles and converts a few rows per group instead of one per event: Kafka produces go to their
partition (murmur2 or msg_id order, SPEC §3.2 rule 1; no fault is read), broker events go to every unit hosting
the broker. Classes whose routing reads the fault timeline (the RocketMQ families, `replay/stream.py`) are one
group per class, unit −1: their messages are routed inside the group once every fault routing may read for them
has arrived. Every input row has exactly one *primary* copy, which the
group that receives it counts (rows in, rows late); the end-of-trace marker and broker events no unit hosts go
to the accounting group (−1, −1).

`ReplayProcessor` (transformWithStateInPandas on RocksDB, keyed by (class, unit)) holds, per group, one
`GroupReplay`: the events not yet fed (ts ≥ the feed frontier), the kernels of `engine/groups.UnitReplay`
with their carried state, and, for classes routed in state, the fault timeline seen so far. A micro-batch:

1. rows behind the event-time watermark in force (ts_us < watermark) are late: dropped, counted, and returned as
   LATE rows (the sink quarantines them);
2. the rest join the buffer; the *feed frontier* F is the largest time below which no on-time row can still
   arrive: max(watermark, (⌊own max event ms⌋ − allowed lateness) ms), since the next watermark is at least the
   max event time Spark sees minus the lateness. Buffered events with ts < F (minus the routing horizon for
   classes routed in state) are fed to the kernels in SPEC §2.2 order with `advance(events, F)`;
3. the state store takes the micro-batch's on-time rows as a log entry, or a new snapshot of the whole group
   (pickled: kernels are plain numpy/Python objects) once the log has grown as large as the last snapshot
   (`ReplayProcessor` explains why).

Every group registers one event-time timer at ⌊duration_us / 1000⌋ + 1 ms. The source's end marker moves the
watermark past it, and the timer feeds what is left, finishes the kernels (fates are judged at the end of the
trace, SPEC §4.1) and writes the group's message, state, interval, unit, window and histogram rows, exactly as
`UnitReplay.finish` makes them in batch mode, as one Parquet file of the checkpoint's final folder (`write_final`).
All groups finish in the same micro-batch, with the accounting group's END row.
"""

from __future__ import annotations

import os
import pickle
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import BinaryType, BooleanType, LongType, StructField, StructType

from engine.groups import (
    EVENT_SCHEMA,
    FINAL_ROW_TYPES,
    OUTPUT_SCHEMA,
    ReplayPlan,
    RouteClass,
    UnitReplay,
    ddl,
    sort_events,
    split_by,
)
from replay.events import PartitionEvents
from replay.families import family_of
from replay.family import RouteInput
from replay.stream import reads_fault_timeline, routing_horizon_us
from schemas.trace import KIND_LABELS, Kind

# Row types beyond engine.groups' final ones (codes fixed: a checkpoint's rows keep theirs across versions)
STATS, LATE, END = 5, 6, 7
assert not {STATS, LATE, END} & set(FINAL_ROW_TYPES)
ACCOUNTING = (-1, -1)
END_CODE = len(KIND_LABELS)  # kind_code of the end-of-trace marker
REPLICATE = int(Kind.REPLICATE)
PRODUCE = int(Kind.PRODUCE)
#: The kind label of the source's end-of-trace marker row
END_KIND = "_end"

# null_mask bits: the trace columns that were null in the source row (a LATE row's raw text restores them)
NULL_BITS = {"broker": 1, "msg_id": 2, "size_bytes": 4, "producer_id": 8, "upto_us": 16}
FILLS = {"broker": -1, "msg_id": 0, "size_bytes": 0, "producer_id": -1, "upto_us": 0}

#: What routing hands to the groups: one row per (group, source batch), the group's events of that batch packed as
#: an Arrow IPC record batch (ROUTED_SCHEMA). Spark then shuffles, sorts and converts a few rows per group and
#: micro-batch instead of one per event (transformWithStateInPandas would turn every event into a pandas row).
PACKED_SCHEMA = pa.schema([("class_id", pa.int32()), ("unit", pa.int32()), ("max_ts_us", pa.int64()),
                           ("events", pa.binary())])
PACKED_DDL = ddl(PACKED_SCHEMA)
#: A group's routed events: the batch job's event columns (`engine.groups.EVENT_SCHEMA`) between the group key and
#: the stream's own columns (the rank for routing in state, and the accounting of each source row).
ROUTED_SCHEMA = pa.schema([
    ("class_id", pa.int32()), ("unit", pa.int32()), *EVENT_SCHEMA,
    ("msg_rank", pa.int64()), ("is_primary", pa.bool_()), ("null_mask", pa.int8()), ("file_idx", pa.int32()),
    ("row", pa.int64()),
])
#: The group key. Not `cls`: pyspark builds the key as Row(**columns), whose first parameter is named cls.
GROUP_KEY = ("class_id", "unit")
#: What the kernels read of an event (`engine.groups.EVENT_SCHEMA`, as the batch job bundles them), and the unit.
EVENT_COLUMNS = ("unit", *EVENT_SCHEMA.names)
#: What a group keeps of a buffered row: the event columns plus the rank (routing in state).
BUFFER_COLUMNS = (*EVENT_COLUMNS, "msg_rank")
BUFFER_SCHEMA = pa.schema([ROUTED_SCHEMA.field(c) for c in BUFFER_COLUMNS])

_EXTRA_OUTPUT = [
    ("kind_code", pa.int8()), ("broker", pa.int32()), ("upto_us", pa.int64()), ("size_bytes", pa.int32()),
    ("null_mask", pa.int8()), ("file_idx", pa.int32()), ("row", pa.int64()), ("rows_in", pa.int64()),
    ("rows_late", pa.int64()), ("max_event_us", pa.int64()), ("watermark_us", pa.int64()),
]
STREAM_OUTPUT_SCHEMA = pa.schema([*OUTPUT_SCHEMA, *_EXTRA_OUTPUT])
STREAM_OUTPUT_DDL = ddl(STREAM_OUTPUT_SCHEMA)


@dataclass
class StreamPlan:
    """What executors need (shipped in closures): the batch plan plus the stream's own settings."""

    replay: ReplayPlan
    allowed_lateness_ms: int
    #: msg_rank = msg_id − rank_base (dense ids); or the index in `sorted_msg_ids` (a finite trace with gaps).
    rank_base: int = 1
    sorted_msg_ids: np.ndarray | None = None
    #: (cls, unit, broker, primary): where broker events go (built by `fanout`)
    fanout: list[tuple[int, int, int, bool]] = field(default_factory=list)
    #: Identifies one run of the query (a restart gets a new one): the key of the workers' live groups.
    uid: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def duration_us(self) -> int:
        return self.replay.manifest.duration_us

    @property
    def end_timer_ms(self) -> int:
        """Expiry of every group's end-of-trace timer: the first ms whose watermark is past duration_us."""
        return self.duration_us // 1000 + 1

    @property
    def end_marker_us(self) -> int:
        """Event time of the source's end marker: the watermark after it passes every end timer."""
        return (self.end_timer_ms + 1 + self.allowed_lateness_ms) * 1000

    def routed_in_state(self, cls: int) -> bool:
        return reads_fault_timeline(self.replay.classes[cls].router[0])

    def horizon_us(self, cls: int) -> int:
        return max(routing_horizon_us(p) for _, p, _ in self.replay.classes[cls].members)


def fanout(classes: list[RouteClass], broker_ids: tuple[int, ...]) -> list[tuple[int, int, int, bool]]:
    """Destinations of broker events: every unit hosting the broker (Kafka classes), the class group (classes
    routed in state); the first destination of a broker carries its primary copy, the accounting group takes the
    primary copy of brokers nobody hosts."""
    out: list[tuple[int, int, int, bool]] = []
    seen: set[int] = set()
    for rc in classes:
        policy, layout = rc.router
        if reads_fault_timeline(policy):
            dests = [(-1, b) for b in broker_ids]
        else:
            dests = [(u, b) for u in rc.units for b in layout.replicas[u]]
        for unit, b in dests:
            out.append((rc.index, unit, b, b not in seen))
            seen.add(b)
    out += [(*ACCOUNTING, b, True) for b in broker_ids if b not in seen]
    return out


# ------------------------------------------------------------------------------------------------ routing
def _filled(batch: pa.RecordBatch, name: str, dtype) -> tuple[np.ndarray, np.ndarray]:
    col = batch.column(name)
    return (pc.fill_null(col, FILLS[name]).to_numpy(zero_copy_only=False).astype(dtype),
            pc.is_null(col).to_numpy(zero_copy_only=False))


class _SourceRows:
    """One source batch as filled numpy columns (nulls → FILLS, remembered in null_mask), ready to be copied out."""

    def __init__(self, plan: StreamPlan, batch: pa.RecordBatch, labels: pa.Array) -> None:
        n = batch.num_rows
        code = pc.fill_null(pc.index_in(batch.column("kind"), value_set=labels), -1)
        self.code = code.to_numpy(zero_copy_only=False).astype(np.int8)
        cols: dict[str, np.ndarray] = {
            "ts_us": batch.column("ts_us").to_numpy(zero_copy_only=False).astype(np.int64), "kind_code": self.code}
        mask = np.zeros(n, dtype=np.int8)
        for name, dtype in (("broker", np.int32), ("msg_id", np.int64), ("size_bytes", np.int32),
                            ("producer_id", np.int32), ("upto_us", np.int64)):
            cols[name], nulls = _filled(batch, name, dtype)
            mask |= np.where(nulls, NULL_BITS[name], 0).astype(np.int8)
        cols["null_mask"] = mask
        if plan.sorted_msg_ids is not None:
            cols["msg_rank"] = np.searchsorted(plan.sorted_msg_ids, cols["msg_id"]).astype(np.int64)
        else:
            cols["msg_rank"] = cols["msg_id"] - plan.rank_base
        cols["file_idx"] = pc.fill_null(batch.column("file_idx"), -1).to_numpy(zero_copy_only=False)
        cols["row"] = pc.fill_null(batch.column("row"), 0).to_numpy(zero_copy_only=False)
        self.cols, self.keys = cols, batch.column("key")

    def emit(self, rows: np.ndarray, cls, unit, primary, partition=None, delay=None) -> pa.RecordBatch:
        """Rows `rows` for group (cls, unit); cls/unit/primary are scalars or per-row arrays."""
        m = len(rows)
        arrays = {name: pa.array(values[rows]) for name, values in self.cols.items()}
        arrays["key"] = self.keys.take(pa.array(rows))
        arrays["class_id"] = pa.array(np.broadcast_to(np.asarray(cls, dtype=np.int32), m))
        arrays["unit"] = pa.array(np.broadcast_to(np.asarray(unit, dtype=np.int32), m))
        arrays["is_primary"] = pa.array(np.broadcast_to(np.asarray(primary, dtype=bool), m))
        arrays["partition"] = pa.array(np.full(m, -1, dtype=np.int32) if partition is None
                                       else np.asarray(partition, dtype=np.int32))
        arrays["delay_us"] = pa.array(np.zeros(m, dtype=np.int64) if delay is None
                                      else np.asarray(delay, dtype=np.int64))
        return pa.RecordBatch.from_arrays([arrays[f.name].cast(f.type) for f in ROUTED_SCHEMA], schema=ROUTED_SCHEMA)


class Router:
    """Routing and fan-out of source batches, packed per group (the stream's version of the batch job's
    `engine.groups.bundle_batches`, with the stream's accounting columns)."""

    def __init__(self, plan: StreamPlan) -> None:
        self.plan = plan
        self.labels = pa.array([*KIND_LABELS, END_KIND])
        self.fan = np.array(plan.fanout, dtype=np.int64).reshape(-1, 4)
        self.known_brokers = np.unique(self.fan[:, 2])

    def _routed(self, src: _SourceRows) -> Iterator[pa.RecordBatch]:
        plan, code = self.plan, src.code
        produce = np.flatnonzero(code == PRODUCE)
        if len(produce):
            for rc in plan.replay.classes:
                primary = rc.index == 0
                if plan.routed_in_state(rc.index):
                    yield src.emit(produce, rc.index, -1, primary)
                    continue
                policy, layout = rc.router
                out = family_of(policy).route(
                    policy, plan.replay.manifest, layout, PartitionEvents.empty(),
                    RouteInput(src.cols["ts_us"][produce], src.cols["msg_rank"][produce],
                               src.keys.take(pa.array(produce))))
                yield src.emit(produce, rc.index, out.unit, primary, out.partition, out.delay_us)
        is_broker = (code >= 0) & (code < PRODUCE)
        if is_broker.any():
            broker = src.cols["broker"]
            for c, u, b, p in self.fan:
                rows = np.flatnonzero(is_broker & (broker == b))
                if len(rows):
                    yield src.emit(rows, c, u, bool(p))
            unknown = np.flatnonzero(is_broker & ~np.isin(broker, self.known_brokers))
            if len(unknown):  # the trace gate names them; counted here so that rows_in stays exact
                yield src.emit(unknown, *ACCOUNTING, True)
        other = np.flatnonzero((code < 0) | (code == END_CODE))
        if len(other):  # the end marker, and unknown kinds (counted; the trace gate names them)
            yield src.emit(other, *ACCOUNTING, code[other] != END_CODE)

    def pack(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """Source rows (source.EVENT_SOURCE_SCHEMA) → one PACKED_SCHEMA row per group they go to."""
        classes, units, max_ts, blobs = [], [], [], []
        for rb in self._routed(_SourceRows(self.plan, batch, self.labels)):
            for u, part in split_by(rb, rb.column("unit").to_numpy()):
                classes.append(int(rb.column("class_id")[0].as_py()))
                units.append(u)
                max_ts.append(int(pc.max(part.column("ts_us")).as_py()))
                blobs.append(part.serialize().to_pybytes())
        return pa.RecordBatch.from_arrays([pa.array(classes, pa.int32()), pa.array(units, pa.int32()),
                                           pa.array(max_ts, pa.int64()), pa.array(blobs, pa.binary())],
                                          schema=PACKED_SCHEMA)


def unpack(blobs) -> pa.Table:
    """The events of packed group rows (PACKED_DDL's `events`), as one ROUTED_SCHEMA table."""
    batches = [pa.ipc.read_record_batch(pa.py_buffer(b), ROUTED_SCHEMA) for b in blobs]
    return pa.Table.from_batches(batches, schema=ROUTED_SCHEMA)


# ------------------------------------------------------------------------------------------------ groups
def _concat(a: pa.Table | None, b: pa.Table | None) -> pa.Table | None:
    parts = [t for t in (a, b) if t is not None and t.num_rows]
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts).combine_chunks()


def _split(table: pa.Table | None, before_us: int) -> tuple[pa.Table | None, pa.Table | None]:
    if table is None:
        return None, None
    early = pc.less(table.column("ts_us"), before_us)
    return table.filter(early), table.filter(pc.invert(early))


class GroupReplay:
    """The state of one stream group (class, unit): see the module docstring. Pickled between micro-batches."""

    def __init__(self, plan: StreamPlan, cls: int, unit: int) -> None:
        self.cls, self.unit = cls, unit
        self.routed_in_state = plan.routed_in_state(cls)
        self.horizon_us = plan.horizon_us(cls) if self.routed_in_state else 0
        self.buffer: pa.Table | None = None  # BUFFER_COLUMNS, not yet fed
        self.max_event_us = -1  # of this group's on-time rows
        self.frontier_us = 0  # no on-time row can arrive with ts_us below it
        self.fed_us = 0  # the kernels have applied everything before it
        self.control = PartitionEvents.empty()  # routed in state: the faults with ts_us < frontier_us
        self.groups: dict[int, UnitReplay] = {}
        self._plan: StreamPlan | None = plan

    # -------------------------------------------------------------------------------- (de)serialization
    def dumps(self) -> bytes:
        plan, self._plan = self._plan, None
        refs = {u: (g.plan, g.rc) for u, g in self.groups.items()}
        for g in self.groups.values():
            g.plan = g.rc = None  # shipped with the processor, not with every state value
        try:
            return pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL)
        finally:
            self._plan = plan
            for u, (p, rc) in refs.items():
                self.groups[u].plan, self.groups[u].rc = p, rc

    @classmethod
    def loads(cls, blob: bytes, plan: StreamPlan) -> GroupReplay:
        state: GroupReplay = pickle.loads(blob)
        state._plan = plan
        for g in state.groups.values():
            g.plan, g.rc = plan.replay, plan.replay.classes[state.cls]
        return state

    # -------------------------------------------------------------------------------- feeding
    def add(self, rows: pa.Table) -> None:
        """On-time rows of this micro-batch (BUFFER_COLUMNS)."""
        if rows.num_rows:
            self.max_event_us = max(self.max_event_us, int(pc.max(rows.column("ts_us")).as_py()))
            self.buffer = _concat(self.buffer, rows)

    def step(self, rows: pa.Table, watermark_us: int) -> None:
        """One micro-batch: its on-time rows, then feed what the watermark (and this group's own events) allow."""
        self.add(rows)
        self.advance(watermark_us)

    def advance(self, watermark_us: int) -> None:
        plan = self._plan
        own = (self.max_event_us // 1000 - plan.allowed_lateness_ms) * 1000 if self.max_event_us >= 0 else 0
        frontier = max(self.frontier_us, watermark_us, own)
        self._feed(frontier)

    def finish(self) -> Iterator[pa.RecordBatch]:
        """Feed everything, finish every kernel: the group's outputs in OUTPUT_SCHEMA."""
        self._feed(None)
        for unit in sorted(self.groups):
            yield from self.groups[unit].finish()

    def _group(self, unit: int) -> UnitReplay:
        g = self.groups.get(unit)
        if g is None:
            plan = self._plan.replay
            g = self.groups[unit] = UnitReplay(plan, plan.classes[self.cls], unit)
        return g

    def _feed(self, frontier: int | None) -> None:
        """Confirm the faults before `frontier`, feed the kernels everything before it (None: the trace ended)."""
        final = frontier is None
        if self.routed_in_state:
            self._confirm_faults(frontier)
        if final:
            ready, self.buffer = self.buffer, None
            upto = None
        else:
            self.frontier_us = frontier
            upto = max(self.fed_us, frontier - self.horizon_us)
            ready, self.buffer = _split(self.buffer, upto)
        per_unit = self._route(ready) if self.routed_in_state else ({self.unit: ready} if ready is not None else {})
        for unit, rows in per_unit.items():
            if rows is None or not rows.num_rows:
                continue
            g = self._group(unit)
            rows = sort_events(rows.select(list(EVENT_COLUMNS)))
            if final:
                g.held = rows  # UnitReplay.finish feeds the held rows up to duration_us + 1
            else:
                events = g._events(rows)
                for _, kernel in g.kernels:
                    kernel.advance(events, upto)
        if upto is not None:
            self.fed_us = upto

    def _confirm_faults(self, frontier: int | None) -> None:
        """Add the buffered faults the frontier has passed to the timeline routing reads."""
        if self.buffer is None:
            return
        code = self.buffer.column("kind_code")
        new = pc.and_(pc.less(code, REPLICATE), pc.greater_equal(self.buffer.column("ts_us"), self.frontier_us))
        if frontier is not None:
            new = pc.and_(new, pc.less(self.buffer.column("ts_us"), frontier))
        faults = self.buffer.filter(new)
        if not faults.num_rows:
            return

        def arr(name: str, dtype) -> np.ndarray:
            return faults.column(name).to_numpy(zero_copy_only=False).astype(dtype)

        c = self.control
        z = np.zeros(0, dtype=np.int64)
        self.control = PartitionEvents(
            z, z, z, np.concatenate([c.broker_ts, arr("ts_us", np.int64)]),
            np.concatenate([c.broker_kind, arr("kind_code", np.int8)]),
            np.concatenate([c.broker_id, arr("broker", np.int64)]),
            np.zeros(len(c.broker_ts) + faults.num_rows, dtype=np.int64)).sorted()

    def _route(self, ready: pa.Table | None) -> dict[int, pa.Table]:
        """Classes routed in state: produces to their unit (with the fault timeline confirmed so far), broker events
        to every unit that hosts the broker."""
        if ready is None or not ready.num_rows:
            return {}
        plan = self._plan.replay
        rc = plan.classes[self.cls]
        policy, layout = rc.router
        is_produce = pc.equal(ready.column("kind_code"), PRODUCE)
        produce, brokers = ready.filter(is_produce), ready.filter(pc.invert(is_produce))
        parts: dict[int, list[pa.Table]] = {}
        if produce.num_rows:
            routed = family_of(policy).route(
                policy, plan.manifest, layout, self.control,
                RouteInput(produce.column("ts_us").to_numpy().astype(np.int64),
                           produce.column("msg_rank").to_numpy().astype(np.int64), produce.column("key")))
            unit = np.asarray(routed.unit, dtype=np.int32)
            delay = routed.delay_us if routed.delay_us is not None else np.zeros(len(unit), dtype=np.int64)
            produce = (produce.set_column(produce.schema.get_field_index("unit"), "unit", pa.array(unit))
                       .set_column(produce.schema.get_field_index("partition"), "partition",
                                   pa.array(np.asarray(routed.partition, dtype=np.int32)))
                       .set_column(produce.schema.get_field_index("delay_us"), "delay_us",
                                   pa.array(np.asarray(delay, dtype=np.int64))))
            for u in np.unique(unit).tolist():
                parts.setdefault(int(u), []).append(produce.filter(pa.array(unit == u)))
        if brokers.num_rows:
            bid = brokers.column("broker")
            for u in rc.units:
                mine = brokers.filter(pc.is_in(bid, pa.array(layout.replicas[u], pa.int32())))
                if mine.num_rows:
                    parts.setdefault(u, []).append(mine)
        return {u: pa.concat_tables(ts) for u, ts in parts.items()}


# ------------------------------------------------------------------------------------------------ processor
def _output_frame(batches: list[pa.RecordBatch]) -> pd.DataFrame:
    """Output rows as pandas, with nullable integer columns kept exact (no float round trip)."""
    full = []
    for b in batches:
        names = set(b.schema.names)
        full.append(pa.RecordBatch.from_arrays(
            [b.column(f.name) if f.name in names else pa.nulls(b.num_rows, f.type) for f in STREAM_OUTPUT_SCHEMA],
            schema=STREAM_OUTPUT_SCHEMA))
    table = pa.Table.from_batches(full, schema=STREAM_OUTPUT_SCHEMA)
    return table.to_pandas(types_mapper=_PANDAS_TYPES.get)


_PANDAS_TYPES = {pa.int8(): pd.Int8Dtype(), pa.int32(): pd.Int32Dtype(), pa.int64(): pd.Int64Dtype(),
                 pa.bool_(): pd.BooleanDtype()}


def _rows(n: int, rtype: int, unit: int, **cols) -> pa.RecordBatch:
    """`n` rows of a stream-only row type (STATS, LATE, END); columns not given are null."""
    arrays: dict[str, pa.Array] = {"policy_idx": pa.array(np.full(n, -1, dtype=np.int32)),
                                   "rtype": pa.array(np.full(n, rtype, dtype=np.int8)),
                                   "unit": pa.array(np.full(n, unit, dtype=np.int32))}
    for name, values in cols.items():
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        typ = STREAM_OUTPUT_SCHEMA.field(name).type
        arrays[name] = values.cast(typ) if isinstance(values, pa.Array) else pa.array(values, typ)
    return pa.RecordBatch.from_arrays([arrays.get(f.name, pa.nulls(n, f.type)) for f in STREAM_OUTPUT_SCHEMA],
                                      schema=STREAM_OUTPUT_SCHEMA)


#: Largest value a state variable takes in one message to the state server: pyspark sends each state update as
#: one protobuf message, and a value of tens of MB left the 4.1 state server (and the micro-batch) hanging.
STATE_CHUNK_BYTES = 4 << 20

#: Per Python worker: the groups it replayed last, by (plan uid, class, unit), with the state version they match.
#: Spark keeps a stream's Python workers from one micro-batch to the next, so a group usually finds its kernels
#: here and the state store only has to take what changed (see `ReplayProcessor`).
_LIVE: dict[tuple[str, int, int], tuple[int, GroupReplay]] = {}


class ReplayProcessor(StatefulProcessor):
    """transformWithStateInPandas processor over (class, unit) groups: see the module docstring.

    A group's state is a snapshot (the pickled GroupReplay) plus a log of what was applied since (each
    micro-batch's on-time rows and watermark), and a version. A micro-batch appends to the log, or, once the log
    is as large as the snapshot, writes a new snapshot and clears the log: what the state store writes per
    micro-batch is then proportional to the new events (amortized), not to the kernels' whole history, which a
    snapshot per micro-batch would rewrite every time. The worker keeps the group it just advanced (`_LIVE`);
    the next micro-batch uses it when its version is the stored one, and otherwise (another worker ran the
    group, a retried or restarted micro-batch) rebuilds it: the snapshot, then the log applied again, which is
    deterministic.
    """

    def __init__(self, plan: StreamPlan, final_dir: str) -> None:
        self.plan = plan
        self.final_dir = final_dir

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.snapshot = handle.getListState("snapshot", StructType([StructField("part", BinaryType(), True)]))
        self.log = handle.getListState("log", StructType([StructField("watermark_us", LongType(), True),
                                                          StructField("last", BooleanType(), True),
                                                          StructField("rows", BinaryType(), True)]))
        self.meta = handle.getValueState("meta", StructType([StructField(n, LongType(), True) for n in (
            "version", "log_bytes", "snapshot_bytes")]))

    def _load(self, cls: int, unit: int) -> tuple[GroupReplay, tuple[int, int, int]] | None:
        if not self.meta.exists():
            return None
        version, log_bytes, snapshot_bytes = (int(v) for v in self.meta.get())
        live = _LIVE.get((self.plan.uid, cls, unit))
        if live is not None and live[0] == version:
            return live[1], (version, log_bytes, snapshot_bytes)
        group = GroupReplay.loads(b"".join(part for (part,) in self.snapshot.get()), self.plan)
        pieces: list[pa.Table] = []
        for watermark_us, last, rows in self.log.get():
            pieces.append(read_rows(rows))
            if last:
                group.step(pa.concat_tables(pieces), int(watermark_us))
                pieces = []
        return group, (version, log_bytes, snapshot_bytes)

    def _save(self, cls: int, unit: int, group: GroupReplay, meta: tuple[int, int, int] | None, watermark_us: int,
              rows: pa.Table) -> None:
        version, log_bytes, snapshot_bytes = meta or (0, 0, 0)
        entries = write_rows(rows)
        size = sum(len(e) for e in entries)
        if meta is None or log_bytes + size > snapshot_bytes:
            blob = group.dumps()
            self.snapshot.clear()
            for part in snapshot_parts(blob):
                self.snapshot.appendValue((part,))
            self.log.clear()
            log_bytes, snapshot_bytes = 0, len(blob)
        else:
            for i, entry in enumerate(entries):
                self.log.appendValue((watermark_us, i == len(entries) - 1, entry))
            log_bytes += size
        self.meta.update((version + 1, log_bytes, snapshot_bytes))
        _LIVE[(self.plan.uid, cls, unit)] = (version + 1, group)

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:
        cls, unit = int(key[0]), int(key[1])
        watermark_us = max(0, int(timerValues.getCurrentWatermarkInMs())) * 1000
        blobs = [b for pdf in rows for b in pdf["events"]]
        if not blobs:
            return
        table = unpack(blobs)
        code = table.column("kind_code").to_numpy(zero_copy_only=False)
        ts = table.column("ts_us").to_numpy(zero_copy_only=False)
        primary = table.column("is_primary").to_numpy(zero_copy_only=False)
        event = (code >= 0) & (code != END_CODE)
        late = event & (ts < watermark_us)
        counted = primary & (code != END_CODE)  # unknown kinds are counted too: the trace gate names them
        out = [_rows(1, STATS, unit, rows_in=[int(counted.sum())], rows_late=[int((counted & late).sum())],
                     max_event_us=[int(ts[event].max()) if event.any() else None], watermark_us=[watermark_us])]
        reported = np.flatnonzero(counted & late)
        if len(reported):
            lt = table.take(pa.array(reported))
            out.append(_rows(len(reported), LATE, unit, **{c: lt.column(c) for c in (
                "ts_us", "kind_code", "broker", "upto_us", "msg_id", "key", "size_bytes", "producer_id",
                "null_mask", "file_idx", "row")}))
        if (cls, unit) == ACCOUNTING:
            if (code == END_CODE).any():
                self.handle.registerTimer(self.plan.end_timer_ms)
            yield _output_frame(out)
            return
        ontime = table.filter(pa.array(event & ~late)).select(list(BUFFER_COLUMNS))
        loaded = self._load(cls, unit)
        if loaded is None:
            group, meta = GroupReplay(self.plan, cls, unit), None
            self.handle.registerTimer(self.plan.end_timer_ms)
        else:
            group, meta = loaded
        group.step(ontime, watermark_us)
        self._save(cls, unit, group, meta, watermark_us, ontime)
        yield _output_frame(out)

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
        cls, unit = int(key[0]), int(key[1])
        watermark_us = max(0, int(timerValues.getCurrentWatermarkInMs())) * 1000
        out = [_rows(1, STATS, unit, rows_in=[0], rows_late=[0], watermark_us=[watermark_us])]
        if (cls, unit) == ACCOUNTING:
            out.append(_rows(1, END, unit))
        else:
            loaded = self._load(cls, unit)
            if loaded is not None:
                write_final(self.final_dir, cls, unit, list(loaded[0].finish()))
                self.snapshot.clear()
                self.log.clear()
                self.meta.clear()
                _LIVE.pop((self.plan.uid, cls, unit), None)
        yield _output_frame(out)

    def close(self) -> None:
        pass


def write_final(final_dir: str, cls: int, unit: int, batches: list[pa.RecordBatch]) -> None:
    """A finished group's rows (OUTPUT_SCHEMA) as one Parquet file, named by the group: the micro-batch run again
    (a retried task, a restart before the batch committed) replaces it with the same rows. Written by the task
    itself, because handing a million outcome rows back to Spark (pandas, then Spark's rows, cached by the sink and
    written again) took longer than the replay of the last micro-batch. Written under a hidden name (Spark's
    reader skips it), then renamed: a reader never sees half a file. The folder is the driver's checkpoint folder,
    so on a cluster the checkpoint must be on storage every executor mounts at the same path."""
    path = Path(final_dir) / f"group-{cls}-{unit}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex}.tmp")
    try:
        pq.write_table(pa.Table.from_batches(batches, schema=OUTPUT_SCHEMA), part)
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)


def snapshot_parts(blob: bytes) -> list[bytes]:
    """A group snapshot as state values of at most STATE_CHUNK_BYTES (at least one); joined back in order."""
    return [blob[i:i + STATE_CHUNK_BYTES] for i in range(0, max(len(blob), 1), STATE_CHUNK_BYTES)]


def write_rows(rows: pa.Table) -> list[bytes]:
    """A micro-batch's log entries: its on-time rows (BUFFER_SCHEMA) as Arrow IPC record batches of at most about
    STATE_CHUNK_BYTES each (at least one, possibly empty)."""
    rows = rows.combine_chunks()
    pieces = max(1, -(-rows.nbytes // STATE_CHUNK_BYTES))
    step = max(1, -(-rows.num_rows // pieces))
    batches = rows.to_batches(max_chunksize=step) or [pa.RecordBatch.from_pylist([], schema=BUFFER_SCHEMA)]
    return [b.serialize().to_pybytes() for b in batches]


def read_rows(entry: bytes) -> pa.Table:
    return pa.Table.from_batches([pa.ipc.read_record_batch(pa.py_buffer(entry), BUFFER_SCHEMA)])
