"""Routing of the stream replay's source batches into groups.

`Router` (no state; run by the source as it reads each file) turns source rows into grouped rows, as the batch
job's routing and fan-out do, and packs each group's rows of a source batch into one Arrow IPC value, so that
Spark moves, shuffles and converts a few rows per group instead of one per event: Kafka produces go to their
partition (murmur2 or msg_id order, SPEC §3.2 rule 1; no fault is read), broker events go to every unit hosting
the broker. Classes whose routing reads the fault timeline (the RocketMQ families, `replay/stream.py`) are one
group per class, unit −1: their messages are routed inside the group once every fault routing may read for them
has arrived. Every input row has exactly one *primary* copy, which the
group that receives it counts (rows in, rows late); the end-of-trace marker and broker events no unit hosts go
to the accounting group (−1, −1).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.groups import split_by
from engine.stream.plan import (
    ACCOUNTING,
    END_CODE,
    END_KIND,
    FILLS,
    NULL_BITS,
    PACKED_EVENTS_SCHEMA,
    PRODUCE,
    ROUTED_SCHEMA,
    StreamPlan,
)
from replay.events import PartitionEvents
from replay.families import family_of
from replay.family import RouteInput
from schemas.trace import KIND_LABELS


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

    def emit(self, rows: np.ndarray, class_id, unit, primary, partition=None, delay=None) -> pa.RecordBatch:
        """Rows `rows` for group (class_id, unit); class_id/unit/primary are scalars or per-row arrays."""
        m = len(rows)
        arrays = {name: pa.array(values[rows]) for name, values in self.cols.items()}
        arrays["key"] = self.keys.take(pa.array(rows))
        arrays["class_id"] = pa.array(np.broadcast_to(np.asarray(class_id, dtype=np.int32), m))
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
        """Source rows (source.EVENT_SOURCE_SCHEMA) → one PACKED_EVENTS_SCHEMA row per group they go to."""
        classes, units, max_ts, blobs = [], [], [], []
        for rb in self._routed(_SourceRows(self.plan, batch, self.labels)):
            for u, part in split_by(rb, rb.column("unit").to_numpy()):
                classes.append(int(rb.column("class_id")[0].as_py()))
                units.append(u)
                max_ts.append(int(pc.max(part.column("ts_us")).as_py()))
                blobs.append(part.serialize().to_pybytes())
        return pa.RecordBatch.from_arrays([pa.array(classes, pa.int32()), pa.array(units, pa.int32()),
                                           pa.array(max_ts, pa.int64()), pa.array(blobs, pa.binary())],
                                          schema=PACKED_EVENTS_SCHEMA)


def unpack(blobs) -> pa.Table:
    """The events of packed group rows (PACKED_EVENTS_SCHEMA's `events`), as one ROUTED_SCHEMA table."""
    batches = [pa.ipc.read_record_batch(pa.py_buffer(b), ROUTED_SCHEMA) for b in blobs]
    return pa.Table.from_batches(batches, schema=ROUTED_SCHEMA)
