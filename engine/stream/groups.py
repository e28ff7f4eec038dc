"""The stateful replay of each stream group: `ReplayProcessor` (transformWithStateInPandas on RocksDB, keyed by
(class, unit)), holding one `engine.stream.state.GroupReplay` per group. A micro-batch:

1. rows behind the event-time watermark in force (ts_us < watermark) are late: dropped, counted, and returned as
   LATE rows (the sink quarantines them);
2. the rest go to the group, which feeds its kernels what the watermark allows (`GroupReplay.step`);
3. the state store takes the micro-batch's on-time rows as a log entry, or a new snapshot of the whole group once
   the log has grown as large as the last snapshot (`ReplayProcessor` explains why).

Every group registers one event-time timer at ⌊duration_us / 1000⌋ + 1 ms. The source's end marker moves the
watermark past it, and the timer feeds what is left, finishes the kernels (fates are judged at the end of the
trace, SPEC §4.1) and writes the group's message, state, interval, unit, window and histogram rows, exactly as
`UnitReplay.finish` makes them in batch mode, as one Parquet file of the checkpoint's final folder (`write_final`).
All groups finish in the same micro-batch, with the accounting group's END row.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import BinaryType, BooleanType, LongType, StructField, StructType

from engine.groups import OUTPUT_SCHEMA
from engine.stream.plan import ACCOUNTING, BUFFER_COLUMNS, END, END_CODE, LATE, STATS, STREAM_OUTPUT_SCHEMA, StreamPlan
from engine.stream.routing import unpack
from engine.stream.state import GroupReplay, read_rows, snapshot_parts, write_rows


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

    def _load(self, class_id: int, unit: int) -> tuple[GroupReplay, tuple[int, int, int]] | None:
        if not self.meta.exists():
            return None
        version, log_bytes, snapshot_bytes = (int(v) for v in self.meta.get())
        live = _LIVE.get((self.plan.uid, class_id, unit))
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

    def _save(self, class_id: int, unit: int, group: GroupReplay, meta: tuple[int, int, int] | None, watermark_us: int,
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
        _LIVE[(self.plan.uid, class_id, unit)] = (version + 1, group)

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:
        class_id, unit = int(key[0]), int(key[1])
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
        if (class_id, unit) == ACCOUNTING:
            if (code == END_CODE).any():
                self.handle.registerTimer(self.plan.end_timer_ms)
            yield _output_frame(out)
            return
        ontime = table.filter(pa.array(event & ~late)).select(list(BUFFER_COLUMNS))
        loaded = self._load(class_id, unit)
        if loaded is None:
            group, meta = GroupReplay(self.plan, class_id, unit), None
            self.handle.registerTimer(self.plan.end_timer_ms)
        else:
            group, meta = loaded
        group.step(ontime, watermark_us)
        self._save(class_id, unit, group, meta, watermark_us, ontime)
        yield _output_frame(out)

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
        class_id, unit = int(key[0]), int(key[1])
        watermark_us = max(0, int(timerValues.getCurrentWatermarkInMs())) * 1000
        out = [_rows(1, STATS, unit, rows_in=[0], rows_late=[0], watermark_us=[watermark_us])]
        if (class_id, unit) == ACCOUNTING:
            out.append(_rows(1, END, unit))
        else:
            loaded = self._load(class_id, unit)
            if loaded is not None:
                write_final(self.final_dir, class_id, unit, list(loaded[0].finish()))
                self.snapshot.clear()
                self.log.clear()
                self.meta.clear()
                _LIVE.pop((self.plan.uid, class_id, unit), None)
        yield _output_frame(out)

    def close(self) -> None:
        pass


def write_final(final_dir: str, class_id: int, unit: int, batches: list[pa.RecordBatch]) -> None:
    """A finished group's rows (OUTPUT_SCHEMA) as one Parquet file, named by the group: the micro-batch run again
    (a retried task, a restart before the batch committed) replaces it with the same rows. Written by the task
    itself, because handing a million outcome rows back to Spark (pandas, then Spark's rows, cached by the sink and
    written again) took longer than the replay of the last micro-batch. Written under a hidden name (Spark's
    reader skips it), then renamed: a reader never sees half a file. The folder is the driver's checkpoint folder,
    so on a cluster the checkpoint must be on storage every executor mounts at the same path."""
    path = Path(final_dir) / f"group-{class_id}-{unit}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex}.tmp")
    try:
        pq.write_table(pa.Table.from_batches(batches, schema=OUTPUT_SCHEMA), part)
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)


