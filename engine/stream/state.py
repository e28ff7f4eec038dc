"""The state of one stream group (class, unit), `GroupReplay`, and how it is cut into state store values.

A group holds the events not yet fed (ts ≥ the feed frontier), the kernels of `engine/groups.UnitReplay` with
their carried state, and, for classes routed in state, the fault timeline seen so far. Per micro-batch
(`engine.stream.groups.ReplayProcessor` drops the late rows first), the on-time rows join the buffer; the *feed
frontier* F is the largest time below which no on-time row can still arrive: max(watermark, (⌊own max event ms⌋ −
allowed lateness) ms), since the next watermark is at least the max event time Spark sees minus the lateness.
Buffered events with ts < F (minus the routing horizon for classes routed in state) are fed to the kernels in
SPEC §2.2 order with `advance(events, F)`. The state store keeps a group as a pickled snapshot (kernels are plain
numpy/Python objects) plus a log of the micro-batches since, each cut into values of at most STATE_CHUNK_BYTES.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.groups import UnitReplay, sort_events
from engine.stream.plan import BUFFER_SCHEMA, EVENT_COLUMNS, PRODUCE, REPLICATE, StreamPlan
from replay.events import PartitionEvents
from replay.families import family_of
from replay.family import RouteInput


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

    def __init__(self, plan: StreamPlan, class_id: int, unit: int) -> None:
        self.class_id, self.unit = class_id, unit
        self.routed_in_state = plan.routed_in_state(class_id)
        self.horizon_us = plan.horizon_us(class_id) if self.routed_in_state else 0
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
            g.plan, g.rc = plan.replay, plan.replay.classes[state.class_id]
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
            g = self.groups[unit] = UnitReplay(plan, plan.classes[self.class_id], unit)
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
        rc = plan.classes[self.class_id]
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


#: Largest value a state variable takes in one message to the state server: pyspark sends each state update as
#: one protobuf message, and a value of tens of MB left the 4.1 state server (and the micro-batch) hanging.
STATE_CHUNK_BYTES = 4 << 20

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
