"""What the stream replay's executors share: the StreamPlan, the row types and schemas of routed, buffered and
output rows, and where broker events go (`fanout`)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from engine.groups import EVENT_SCHEMA, FINAL_ROW_TYPES, OUTPUT_SCHEMA, ReplayPlan, RouteClass, ddl
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
PACKED_EVENTS_SCHEMA = pa.schema([("class_id", pa.int32()), ("unit", pa.int32()), ("max_ts_us", pa.int64()),
                                  ("events", pa.binary())])
PACKED_EVENTS_DDL = ddl(PACKED_EVENTS_SCHEMA)
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
    #: (class_id, unit, broker, primary): where broker events go (built by `fanout`)
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

    def routed_in_state(self, class_id: int) -> bool:
        return reads_fault_timeline(self.replay.classes[class_id].router[0])

    def horizon_us(self, class_id: int) -> int:
        return max(routing_horizon_us(p) for _, p, _ in self.replay.classes[class_id].members)


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
