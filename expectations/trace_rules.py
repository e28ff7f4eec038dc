"""The row rules of the trace gate (SPEC §2.3) on Arrow tables, chunk by chunk: their one definition.

The Spark gate (`expectations.trace_gate.annotate`) runs them in `mapInArrow` tasks, and a sweep runs them on
every seed's trace inside its Spark task (`engine/sweep/job.py`). They are evaluated with numpy over the chunks of
one trace, with each broker's state carried from one chunk to the next (down, isolated, incarnation, the
largest applied upto_us since the last restart) and the msg_ids seen so far.

Order: within a chunk, a broker's rows are taken in (ts_us, SPEC §2.2 kind order, row) order and produce rows in
row order; chunks are taken in their order. The Spark gate hands each task its rows sorted so that this is
(ts_us, kind order, file, row) per broker and (file, row) for produce rows; a sweep hands the chunks in file
order, which is time order for generated traces (SPEC §8 output layout). Unlike the Spark gate, no GX suite runs
here: the counts are the result, and the sweep's output gate runs once on the sweep's results.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.trace import KIND_LABELS, STOP_KINDS, UNKNOWN_KIND, Kind, Manifest, kind_codes

FATAL = "fatal"
QUARANTINE = "quarantine"


@dataclass(frozen=True)
class Rule:
    """One validity rule of SPEC §2.3. `detail` is formatted with the offending row (and `duration_us`,
    `brokers`) to say what exactly is wrong."""

    name: str
    severity: str
    description: str
    detail: str

    @property
    def column(self) -> str:
        return "r_" + self.name.replace("-", "_")


RULES: tuple[Rule, ...] = (
    Rule("column-missing", FATAL, "a column of SPEC §2.1 is missing", "{detail}"),
    Rule("column-type", FATAL, "a column has the wrong type", "{detail}"),
    Rule("kind-unknown", FATAL, "unknown kind", "kind {kind!r} (known: " + ", ".join(KIND_LABELS) + ")"),
    Rule("ts-out-of-range", FATAL, "ts_us outside [0, duration_us]",
         "{kind} at ts_us {ts_us} is outside [0, {duration_us}]"),
    Rule("broker-not-in-manifest", FATAL, "broker not in the manifest",
         "{kind} of broker {broker} (manifest brokers: {brokers})"),
    Rule("produce-without-msg-id", FATAL, "produce without msg_id", "produce at ts_us {ts_us} has no msg_id"),
    Rule("size-not-positive", FATAL, "produce with size_bytes <= 0",
         "produce msg_id {msg_id} has size_bytes {size_bytes}"),
    Rule("msg-id-duplicate", FATAL, "duplicate msg_id",
         "msg_id {msg_id} was already produced at {_first_file} row {_first_row}"),
    Rule("replicate-without-upto", FATAL, "replicate without upto_us",
         "replicate of broker {broker} at ts_us {ts_us} has no upto_us"),
    Rule("upto-after-ts", FATAL, "upto_us > ts_us", "replicate of broker {broker}: upto_us {upto_us} > ts_us {ts_us}"),
    Rule("restart-of-up-broker", FATAL, "restart of a broker that is up",
         "restart of broker {broker} at ts_us {ts_us}, which is up"),
    Rule("stop-of-down-broker", FATAL, "crash/power_loss/disk_loss/shutdown of a broker that is down",
         "{kind} of broker {broker} at ts_us {ts_us}, which is already down"),
    Rule("heal-of-unisolated-broker", FATAL, "heal of a broker that is not isolated",
         "heal of broker {broker} at ts_us {ts_us}, which is not isolated"),
    Rule("replicate-while-unavailable", QUARANTINE, "replicate for a broker that is down or isolated",
         "replicate of broker {broker} at ts_us {ts_us} while it is down or isolated"),
    Rule("upto-decreasing", QUARANTINE,
         "replicate whose upto_us is below an earlier report of the same broker since its last restart",
         "replicate of broker {broker} at ts_us {ts_us}: upto_us {upto_us} < {_prev_max_upto_us} reported before"),
)
RULES_BY_NAME = {r.name: r for r in RULES}
SCHEMA_RULES = ("column-missing", "column-type")
ROW_RULES: tuple[Rule, ...] = tuple(r for r in RULES if r.name not in SCHEMA_RULES)

_STOP_CODES = np.array(sorted(int(k) for k in STOP_KINDS), dtype=np.int16)


@dataclass
class _BrokerState:
    down: bool = False
    isolated: bool = False
    incarnation: int = 0
    max_upto: int | None = None  # largest applied upto_us in the current incarnation


@dataclass
class ChunkVerdict:
    """One chunk's rule flags: rows to drop (fatal or quarantine) and the rule counts of this chunk."""

    fatal: np.ndarray  # bool per row
    quarantine: np.ndarray  # bool per row
    counts: dict[str, int]
    flags: dict[str, np.ndarray]  # rule name -> bool per row
    #: Per broker row: the largest upto_us of the applied reports before it in its broker's incarnation, where
    #: `has_prev_max_upto`; what an `upto-decreasing` row is reported with.
    prev_max_upto: np.ndarray
    has_prev_max_upto: np.ndarray


@dataclass
class SeenIds:
    """The msg_ids seen so far, as sorted runs, each older run larger than the next (a binary counter of merges,
    a merge being linear: two sorted runs through timsort). A chunk of k ids costs about k log n, where
    re-sorting everything seen for each chunk cost n log n per chunk, quadratic over a trace (minutes for the
    produce rows of a 10 M-event trace in Arrow batches of 65 536 rows)."""

    runs: list[np.ndarray] = field(default_factory=list)

    def contains(self, ids: np.ndarray) -> np.ndarray:
        hit = np.zeros(len(ids), dtype=bool)
        for run in self.runs:
            pos = np.searchsorted(run, ids)
            hit |= run[np.minimum(pos, len(run) - 1)] == ids
        return hit

    def add(self, ids: np.ndarray) -> None:
        if not len(ids):
            return
        run, _ = _first_of_each(ids)
        while self.runs and len(self.runs[-1]) <= len(run):
            run = _merge_unique(self.runs.pop(), run)
        self.runs.append(run)


def _first_of_each(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sorted distinct values of `ids` and where each first occurs. A stable sort (timsort) is near-linear on
    a trace's mostly increasing msg_ids: 1 M events' produce rows took 0.45 s through np.unique's hashing."""
    order = np.argsort(ids, kind="stable")
    ordered = ids[order]
    first = np.ones(len(ordered), dtype=bool)
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    return ordered[first], order[first]


def _merge_unique(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The sorted union of two sorted arrays of unique values."""
    both = np.concatenate([a, b])
    both.sort(kind="stable")  # timsort: two sorted runs merge in linear time
    keep = np.empty(len(both), dtype=bool)
    keep[0] = True
    np.not_equal(both[1:], both[:-1], out=keep[1:])
    return both[keep]


@dataclass
class TraceRules:
    """Carried state of the row rules over one trace's chunks; `counts` accumulates per rule."""

    manifest: Manifest
    counts: dict[str, int] = field(default_factory=lambda: {r.name: 0 for r in ROW_RULES})
    rows: int = 0
    _brokers: dict[int, _BrokerState] = field(default_factory=dict)
    _seen: SeenIds = field(default_factory=SeenIds)

    @property
    def fatal_rows(self) -> int:
        return sum(self.counts[r.name] for r in ROW_RULES if r.severity == FATAL)

    @property
    def quarantined_rows(self) -> int:
        return sum(self.counts[r.name] for r in ROW_RULES if r.severity == QUARANTINE)

    def check(self, table: pa.Table) -> ChunkVerdict:
        n = table.num_rows
        self.rows += n
        flags = {r.name: np.zeros(n, dtype=bool) for r in ROW_RULES}
        kind_col = table.column("kind")
        code = kind_codes(kind_col).astype(np.int16)
        kind_null = kind_col.is_null().to_numpy(zero_copy_only=False)
        ts, ts_null = _ints(table, "ts_us")
        broker, broker_null = _ints(table, "broker")
        msg, msg_null = _ints(table, "msg_id")
        size, size_null = _ints(table, "size_bytes")
        upto, upto_null = _ints(table, "upto_us")
        produce, replicate = code == int(Kind.PRODUCE), code == int(Kind.REPLICATE)

        flags["kind-unknown"] = code == UNKNOWN_KIND
        flags["ts-out-of-range"] = ts_null | (ts < 0) | (ts > self.manifest.duration_us)
        flags["broker-not-in-manifest"] = ~kind_null & ~produce & (
            broker_null | ~np.isin(broker, np.array(self.manifest.broker_ids, dtype=np.int64)))
        flags["produce-without-msg-id"] = produce & msg_null
        flags["size-not-positive"] = produce & (size_null | (size <= 0))
        flags["replicate-without-upto"] = replicate & upto_null
        flags["upto-after-ts"] = replicate & ~upto_null & ~ts_null & (upto > ts)
        flags["msg-id-duplicate"] = self._duplicates(produce & ~msg_null, msg)
        prev_max_upto = np.zeros(n, dtype=np.int64)
        has_prev = np.zeros(n, dtype=bool)
        self._broker_rules(flags, (prev_max_upto, has_prev), code, ts, ts_null, broker, broker_null, upto, upto_null,
                           produce)

        counts = {name: int(f.sum()) for name, f in flags.items()}
        for name, c in counts.items():
            self.counts[name] += c
        fatal = np.zeros(n, dtype=bool)
        quarantine = np.zeros(n, dtype=bool)
        for r in ROW_RULES:
            if r.severity == FATAL:
                fatal |= flags[r.name]
            else:
                quarantine |= flags[r.name]
        return ChunkVerdict(fatal, quarantine, counts, flags, prev_max_upto, has_prev)

    def _duplicates(self, has_id: np.ndarray, msg: np.ndarray) -> np.ndarray:
        """Every occurrence of a msg_id after its first one (file order), across chunks."""
        out = np.zeros(len(msg), dtype=bool)
        idx = np.flatnonzero(has_id)
        if not len(idx):
            return out
        ids = msg[idx]
        distinct, first = _first_of_each(ids)
        later = np.ones(len(ids), dtype=bool)
        later[first] = False
        later |= self._seen.contains(ids)
        out[idx] = later
        self._seen.add(distinct)
        return out

    def _broker_rules(self, flags, prev, code, ts, ts_null, broker, broker_null, upto, upto_null,
                      produce):
        """The broker state machine of `trace_gate.annotate`, per broker in (ts, kind order, row) order."""
        prev_max_upto, has_prev = prev
        rows = np.flatnonzero(~produce)
        if not len(rows):
            return
        # Spark sorts null ts/kind order first; the unknown kind's order is null too (UNKNOWN_KIND is -1).
        ts_key = np.where(ts_null[rows], np.iinfo(np.int64).min, ts[rows])
        kind_key = code[rows]
        rows = rows[np.lexsort((rows, kind_key, ts_key))]
        for b in np.unique(np.where(broker_null[rows], -1, broker[rows])):
            mine = rows[np.where(broker_null[rows], -1, broker[rows]) == b]
            state = self._brokers.setdefault(int(b), _BrokerState())
            for i in mine:
                k = int(code[i])
                if k != int(Kind.RESTART) and state.max_upto is not None:
                    prev_max_upto[i], has_prev[i] = state.max_upto, True
                if k == int(Kind.REPLICATE):
                    if state.down or state.isolated:
                        flags["replicate-while-unavailable"][i] = True
                        continue
                    if not upto_null[i]:
                        if state.max_upto is not None and upto[i] < state.max_upto:
                            flags["upto-decreasing"][i] = True
                        state.max_upto = int(upto[i]) if state.max_upto is None else max(state.max_upto,
                                                                                          int(upto[i]))
                elif k in _STOP_CODES:
                    flags["stop-of-down-broker"][i] = state.down
                    state.down = True
                elif k == int(Kind.RESTART):
                    flags["restart-of-up-broker"][i] = not state.down
                    state.down = False
                    state.incarnation += 1
                    state.max_upto = None
                elif k == int(Kind.ISOLATE):
                    state.isolated = True
                elif k == int(Kind.HEAL):
                    flags["heal-of-unisolated-broker"][i] = not state.isolated
                    state.isolated = False


def _ints(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A column as int64 with nulls as 0, and its null mask."""
    col = table.column(name)
    null = col.is_null().to_numpy(zero_copy_only=False)
    values = pc.fill_null(col, 0).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return values, null
