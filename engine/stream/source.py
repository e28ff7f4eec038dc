"""A streaming source over a trace's `events/` folder, in time order, with an end-of-trace marker.

Why not Spark's file source: it takes new files by modification time, and a generator writes a trace's files in
parallel, so its micro-batches would arrive out of time order (every row behind the watermark would be late).
The trace format fixes the order instead (generators/generate.py: `part-NNNNNN.parquet`, "the lexicographic
order of names is the time order"), and this source follows it:

- offsets are `{"files": n, "end": 0|1}`: the first n files in name order, then the end marker;
- each micro-batch takes at most `max_files` new files (bounded memory per trigger); a file is one Spark task;
- rows carry `file_idx` (position in name order) and `row` (1-based row in the file), which the replay uses to
  name late rows in the quarantine table, and rows listed in `exclude` (the trace gate's quarantined rows) are
  skipped;
- once the trace is complete the source emits one marker row (kind `_end`, ts_us = `end_us`) after the last
  file. Its event time moves the event-time watermark past `duration_us`, which fires every replay group's
  end-of-trace timer (engine/stream/query.py). A trace is complete when `events/_COMPLETE` (JSON
  `{"files": N}`, written last by `replab generate`, live or not) names N files and N are present; with
  `complete_as_is` (a hand-written trace, whose manifest has no generator) the files present when the query
  first plans a batch are the whole trace.

Python data sources have no admission control in Spark 4.1 (`latestOffset()` gets no start offset), so the
reader remembers the end of the last batch it planned; on a restart Spark calls `partitions()` for the last
batch of the offset log before asking for a new offset, which restores that position.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from engine.stream.plan import END_KIND
from schemas.trace import EVENT_ARROW_SCHEMA, EVENT_COLUMNS

SOURCE_NAME = "replab_trace_events"
COMPLETE_MARKER = "_COMPLETE"
#: The events as read, with where they come from: what `engine.stream.routing.Router` routes and packs.
EVENT_SOURCE_SCHEMA = pa.schema([*EVENT_ARROW_SCHEMA, pa.field("file_idx", pa.int32()),
                                 pa.field("row", pa.int64())])
ROWS_PER_BATCH = 65_536


def event_files(events_dir: str | Path) -> list[str]:
    """The trace's event files in time order (their names' order); hidden and `_`-prefixed files are not data."""
    return sorted(n for n in os.listdir(events_dir) if not n.startswith(("_", ".")))


def complete_file_count(events_dir: str | Path) -> int | None:
    """N from `events/_COMPLETE` once the trace is complete, else None."""
    marker = Path(events_dir) / COMPLETE_MARKER
    if not marker.is_file():
        return None
    try:
        return int(json.loads(marker.read_text())["files"])
    except (ValueError, KeyError, TypeError):
        return None  # being written: the next look sees it whole


class _FilePart(InputPartition):
    def __init__(self, plan: str, path: str, file_idx: int, exclude: Sequence[int]) -> None:
        self.plan, self.path, self.file_idx, self.exclude = plan, path, file_idx, list(exclude)


class _EndPart(InputPartition):
    def __init__(self, plan: str, end_us: int) -> None:
        self.plan, self.end_us = plan, end_us


_ROUTERS: dict[str, object] = {}


def _router(plan_file: str):
    """The Router of a pickled StreamPlan, once per Python worker."""
    router = _ROUTERS.get(plan_file)
    if router is None:
        import pickle

        from engine.stream.routing import Router

        router = _ROUTERS[plan_file] = Router(pickle.loads(Path(plan_file).read_bytes()))
    return router


class _Reader(DataSourceStreamReader):
    def __init__(self, options) -> None:
        self.events_dir = options["path"]
        self.plan = options["plan"]
        self.max_files = max(1, int(options.get("max_files", "1")))
        self.end_us = int(options["end_us"])
        self.complete_as_is = options.get("complete_as_is", "false") == "true"
        exclude = options.get("exclude", "")
        self.exclude: dict[str, list[int]] = json.loads(Path(exclude).read_text()) if exclude else {}
        self.position: dict | None = None
        self._as_is: list[str] | None = None

    def _available(self) -> tuple[list[str], bool]:
        """(files that may be read, whether they are the whole trace)."""
        if self.complete_as_is:
            if self._as_is is None:
                self._as_is = event_files(self.events_dir)
            return self._as_is, True
        count = complete_file_count(self.events_dir)
        names = event_files(self.events_dir)
        if count is not None and len(names) >= count:
            return names[:count], True
        return names, False

    def initialOffset(self) -> dict:
        return {"files": 0, "end": 0}

    def latestOffset(self) -> dict:
        start = self.position or self.initialOffset()
        if start["end"]:
            return start
        names, complete = self._available()
        files = min(len(names), start["files"] + self.max_files)
        self.position = {"files": files, "end": int(complete and files == len(names))}
        return self.position

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        self._advance(end)
        names = event_files(self.events_dir)
        parts: list[InputPartition] = [
            _FilePart(self.plan, os.path.join(self.events_dir, names[i]), i, self.exclude.get(names[i], ()))
            for i in range(start["files"], end["files"])]
        if end["end"] and not start["end"]:
            parts.append(_EndPart(self.plan, self.end_us))
        return parts

    def commit(self, end: dict) -> None:
        self._advance(end)

    def _advance(self, offset: dict) -> None:
        if self.position is None or (offset["files"], offset["end"]) > (self.position["files"], self.position["end"]):
            self.position = dict(offset)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        router = _router(partition.plan)
        if isinstance(partition, _EndPart):
            arrays = [pa.array([partition.end_us], pa.int64()), pa.array([END_KIND], pa.string()),
                      *(pa.nulls(1, f.type) for f in EVENT_SOURCE_SCHEMA if f.name not in ("ts_us", "kind"))]
            yield router.pack(pa.RecordBatch.from_arrays(arrays, schema=EVENT_SOURCE_SCHEMA))
            return
        from storage.trace_loader import check_arrow_schema

        pf = pq.ParquetFile(partition.path)
        check_arrow_schema(pf.schema_arrow, file=partition.path)
        table = pf.read(columns=[n for n, _ in EVENT_COLUMNS]).cast(EVENT_ARROW_SCHEMA)
        n = table.num_rows
        table = table.append_column("file_idx", pa.array(np.full(n, partition.file_idx, dtype=np.int32)))
        table = table.append_column("row", pa.array(np.arange(1, n + 1, dtype=np.int64)))
        if partition.exclude:
            table = table.filter(pc.invert(pc.is_in(table.column("row"), pa.array(partition.exclude, pa.int64()))))
        for batch in table.to_batches(max_chunksize=ROWS_PER_BATCH):
            yield router.pack(batch)


class TraceEventsSource(DataSource):
    """`spark.readStream.format("replab_trace_events").option("path", <trace>/events)...`: see the module doc."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        from engine.stream.plan import PACKED_EVENTS_DDL

        return PACKED_EVENTS_DDL

    def streamReader(self, schema) -> DataSourceStreamReader:
        return _Reader(self.options)
