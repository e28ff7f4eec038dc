"""The trace format, version 1 (SPEC §2): manifest, event columns and kinds, in Arrow and Spark form."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.errors import BadInput

TRACE_FORMAT = "replab-trace"
TRACE_VERSION = 1
#: Manifest `client_round_trip_us` when a trace does not carry one (SPEC §3.7 K-7): a same-datacenter round trip.
DEFAULT_CLIENT_ROUND_TRIP_US = 1000


class Kind(IntEnum):
    """Event kinds; the integer value is the order of events with the same ts_us (SPEC §2.2)."""

    CRASH = 0
    POWER_LOSS = 1
    DISK_LOSS = 2
    SHUTDOWN = 3
    ISOLATE = 4
    RESTART = 5
    HEAL = 6
    REPLICATE = 7
    PRODUCE = 8

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def from_label(cls, label: str) -> Kind:
        return cls[label.upper()]


KIND_LABELS: tuple[str, ...] = tuple(k.label for k in Kind)
UNKNOWN_KIND = -1


def kind_codes(labels: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Each kind label's `Kind` value as int8 (KIND_LABELS is in value order), UNKNOWN_KIND where the label is
    not one of them or null: vectorized, where `Kind.from_label` per row took 2 µs."""
    codes = pc.index_in(labels, value_set=pa.array(KIND_LABELS)).fill_null(UNKNOWN_KIND)
    return codes.to_numpy(zero_copy_only=False).astype(np.int8)


#: The fault timeline's kinds (crash … heal): every kind but replicate and produce. Few per trace, so a replay
#: holds them on its driver (`engine.replay.control_timeline`).
CONTROL_KINDS: tuple[Kind, ...] = tuple(k for k in Kind if k not in (Kind.REPLICATE, Kind.PRODUCE))

#: Kinds that stop a broker, and what survives (SPEC §2.2).
STOP_KINDS = frozenset({Kind.CRASH, Kind.POWER_LOSS, Kind.DISK_LOSS, Kind.SHUTDOWN})

#: The event columns of SPEC §2.1, in file order.
EVENT_COLUMNS: tuple[tuple[str, pa.DataType], ...] = (
    ("ts_us", pa.int64()),
    ("kind", pa.string()),
    ("broker", pa.int32()),
    ("msg_id", pa.int64()),
    ("key", pa.string()),
    ("size_bytes", pa.int32()),
    ("producer_id", pa.int32()),
    ("upto_us", pa.int64()),
)
EVENT_ARROW_SCHEMA = pa.schema([pa.field(n, t, nullable=True) for n, t in EVENT_COLUMNS])


def event_spark_schema():
    """The Spark schema of the event columns (same names, same widths as the Arrow schema)."""
    from pyspark.sql import types as T

    spark_type = {pa.int64(): T.LongType(), pa.int32(): T.IntegerType(), pa.string(): T.StringType()}
    return T.StructType([T.StructField(n, spark_type[t], True) for n, t in EVENT_COLUMNS])


@dataclass(frozen=True)
class Broker:
    id: int
    rack: str


@dataclass(frozen=True)
class Manifest:
    """`manifest.json` of a trace directory (SPEC §2)."""

    trace_id: str
    brokers: tuple[Broker, ...]
    duration_us: int
    seed: int | None = None
    generator: dict[str, Any] | None = None
    format: str = TRACE_FORMAT
    version: int = TRACE_VERSION
    # When the producers' first route poll after time 0 fell (SPEC §2, §3.7 R-1): RocketMQ clients poll the
    # NameServer at route_poll_phase_us + k × route_refresh_ms. Generated traces poll from 0; a trace recorded on
    # a real cluster carries its client's phase, so the replay polls when the real client did.
    route_poll_phase_us: int = 0
    # The round trip of a produce request between the clients and a partition leader, its append included (SPEC §2,
    # §3.7 K-7): an acks=1 acknowledgement reaches the client this long after the append. Generated traces assume a
    # same-datacenter network (1 ms); a trace recorded on a real cluster carries the round trip its client measured.
    client_round_trip_us: int = DEFAULT_CLIENT_ROUND_TRIP_US

    @property
    def broker_ids(self) -> tuple[int, ...]:
        return tuple(sorted(b.id for b in self.brokers))

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "version": self.version,
            "trace_id": self.trace_id,
            "brokers": [{"id": b.id, "rack": b.rack} for b in self.brokers],
            "duration_us": self.duration_us,
            "seed": self.seed,
            "generator": self.generator,
        } | ({"route_poll_phase_us": self.route_poll_phase_us} if self.route_poll_phase_us else {}) | (
            {"client_round_trip_us": self.client_round_trip_us}
            if self.client_round_trip_us != DEFAULT_CLIENT_ROUND_TRIP_US else {})

    def write(self, trace_dir: str | Path) -> Path:
        path = Path(trace_dir) / "manifest.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        return path

    @classmethod
    def parse(cls, raw: Any, *, file: str = "manifest.json") -> Manifest:
        """Validate a decoded manifest; every problem names the key."""

        def bad(key: str, why: str) -> BadInput:
            return BadInput(f"manifest key '{key}': {why}", file=file, rule="manifest")

        if not isinstance(raw, dict):
            raise BadInput("manifest must be a JSON object", file=file, rule="manifest")
        known = {"format", "version", "trace_id", "brokers", "duration_us", "seed", "generator", "route_poll_phase_us",
                 "client_round_trip_us"}
        for key in raw:
            if key not in known:
                raise bad(key, f"unknown key (known: {', '.join(sorted(known))})")
        for key in ("format", "version", "trace_id", "brokers", "duration_us"):
            if key not in raw:
                raise bad(key, "missing")
        if raw["format"] != TRACE_FORMAT:
            raise bad("format", f"must be '{TRACE_FORMAT}', got {raw['format']!r}")
        if raw["version"] != TRACE_VERSION or isinstance(raw["version"], bool):
            raise bad("version", f"this replab reads version {TRACE_VERSION}, got {raw['version']!r}")
        if not isinstance(raw["trace_id"], str) or not raw["trace_id"]:
            raise bad("trace_id", "must be a non-empty string")
        duration = raw["duration_us"]
        if not isinstance(duration, int) or isinstance(duration, bool) or duration < 0:
            raise bad("duration_us", f"must be an integer >= 0, got {duration!r}")
        if not isinstance(raw["brokers"], list) or not raw["brokers"]:
            raise bad("brokers", "must be a non-empty list of {id, rack}")
        brokers = []
        for i, b in enumerate(raw["brokers"]):
            if not isinstance(b, dict) or set(b) - {"id", "rack"} or "id" not in b:
                raise bad(f"brokers[{i}]", "must be an object with 'id' (int) and 'rack' (string)")
            if not isinstance(b["id"], int) or isinstance(b["id"], bool) or not (0 <= b["id"] < 2**31):
                raise bad(f"brokers[{i}].id", f"must be an int32 >= 0, got {b['id']!r}")
            rack = b.get("rack", "")
            if not isinstance(rack, str):
                raise bad(f"brokers[{i}].rack", "must be a string")
            brokers.append(Broker(b["id"], rack))
        ids = [b.id for b in brokers]
        if len(set(ids)) != len(ids):
            raise bad("brokers", "broker ids must be unique")
        seed = raw.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise bad("seed", "must be an integer or null")
        gen = raw.get("generator")
        if gen is not None and not isinstance(gen, dict):
            raise bad("generator", "must be an object or null")
        phase = raw.get("route_poll_phase_us", 0)
        if not isinstance(phase, int) or isinstance(phase, bool) or phase < 0:
            raise bad("route_poll_phase_us", f"must be an integer >= 0 (microseconds), got {phase!r}")
        rtt = raw.get("client_round_trip_us", DEFAULT_CLIENT_ROUND_TRIP_US)
        if isinstance(rtt, bool) or not isinstance(rtt, int) or rtt < 0:
            raise bad("client_round_trip_us", f"must be an integer >= 0 (microseconds), got {rtt!r}")
        return cls(raw["trace_id"], tuple(brokers), duration, seed, gen, route_poll_phase_us=phase,
                   client_round_trip_us=rtt)

    @classmethod
    def read(cls, trace_dir: str | Path) -> Manifest:
        path = Path(trace_dir) / "manifest.json"
        if not path.is_file():
            raise BadInput("missing manifest.json (a trace is a directory with manifest.json and events/ or "
                           "events.csv, SPEC §2)", file=str(path), rule="manifest")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise BadInput(f"not valid JSON ({exc.msg} at line {exc.lineno})", file=str(path),
                           rule="manifest") from exc
        return cls.parse(raw, file=str(path))


@dataclass(frozen=True)
class TraceFiles:
    """Where a trace's events live: a Parquet dataset folder or one CSV file."""

    root: Path
    manifest: Manifest
    events_path: Path
    is_csv: bool
    extra: dict[str, Any] = field(default_factory=dict)
