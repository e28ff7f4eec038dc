"""Small array helpers the kernels share: growable int64 columns, a struct-of-arrays table, the segment merge."""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

import numpy as np


def _grown(buf: np.ndarray, n: int, capacity: int) -> np.ndarray:
    """A buffer of `capacity` holding buf[:n]. Its other slots are left unset (np.empty: the zero-fill cost 1-16 %
    of a kernel's CPU, depending on the host): nothing reads a slot past a buffer's count before writing it, and
    a new row is written in every column (`Table.append`, `steady.steady`), as a row that a compaction
    (`records.hand_over`) left stale must be anyway. `tests/replay/test_arrays.py` fills these slots with garbage
    to hold that."""
    new = np.empty(capacity, dtype=buf.dtype)
    new[:n] = buf[:n]
    return new


class Grow:
    """An int64 array that grows by appends with amortized doubling."""

    __slots__ = ("_buf", "n")

    def __init__(self, initial: np.ndarray | None = None, capacity: int = 16) -> None:
        if initial is None:
            self._buf = np.zeros(capacity, dtype=np.int64)
            self.n = 0
        else:
            self._buf = np.array(initial, dtype=np.int64)
            self.n = len(self._buf)

    def extend(self, values: np.ndarray) -> None:
        k = len(values)
        if self.n + k > len(self._buf):
            self._buf = _grown(self._buf, self.n, max(2 * len(self._buf), self.n + k, 16))
        self._buf[self.n: self.n + k] = values
        self.n += k

    def truncate(self, n: int) -> None:
        self.n = min(self.n, n)

    def drop_front(self, j: int) -> None:
        """Drop the first j values, in place: the buffer keeps its capacity (a new exact-size buffer would be
        grown again by the next append, a copy and fresh pages each time)."""
        self._buf[: self.n - j] = self._buf[j: self.n]
        self.n -= j

    @property
    def view(self) -> np.ndarray:
        return self._buf[: self.n]

    def __len__(self) -> int:
        return self.n

    def __getstate__(self):
        return self.view.copy()

    def __setstate__(self, state) -> None:
        self._buf = state
        self.n = len(state)


class Table:
    """Columns of equal length with appends (the kernels' pending messages and records; `records` compacts them)."""

    def __init__(self, dtypes: dict[str, type]) -> None:
        self.dtypes = dict(dtypes)  # own copy: a kernel adds payload columns to its table, not to every table
        self.cols = {k: np.zeros(0, dtype=t) for k, t in dtypes.items()}
        self.n = 0

    def append(self, **cols: np.ndarray) -> np.ndarray:
        """Append rows; returns their indices."""
        k = len(next(iter(cols.values())))
        start = self.n
        reserve_rows(self, k)
        for name in self.dtypes:  # every column: the rows past n are unset or stale
            self.cols[name][start: start + k] = cols[name]
        self.n += k
        return np.arange(start, start + k)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.cols[name][: self.n]

    def __getstate__(self):
        # the rows only (a stream replay pickles its groups' kernels): not the capacity reserved past them
        return {"dtypes": self.dtypes, "cols": {k: v[: self.n] for k, v in self.cols.items()}, "n": self.n}

    def __setstate__(self, state) -> None:
        self.__dict__.update(state)


def due_segment(s_key: np.ndarray, s_pos: int, sched_key: np.ndarray, limit_key: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int] | None:
    """The next steady segment of a kernel: the trace events from `s_pos` and the scheduled events (retries,
    arrivals; `sched_key` sorted) whose keys are below `limit_key`, merged in key order, trace events first on
    equal keys. Returns (keys, is_trace, trace_index, sched_index, scheduled_count), or None if nothing is due.
    Indices of the other source are 0 where unused, so they can gather with `np.where`."""
    hi = int(np.searchsorted(s_key, limit_key, side="left"))
    shi = int(np.searchsorted(sched_key, limit_key, side="left"))
    if hi <= s_pos and shi == 0:
        return None
    keys = np.concatenate([s_key[s_pos:hi], sched_key[:shi]])
    order = np.argsort(keys, kind="stable")
    ntr = hi - s_pos
    is_tr = order < ntr
    return keys[order], is_tr, np.where(is_tr, order + s_pos, 0), np.where(is_tr, 0, order - ntr), shi


#: The sources whose code or constants the compiled functions hold (numba reads module globals as compile-time
#: constants, and copies inlined helpers into their callers).
COMPILED_SOURCES = ("replay/shared/kernels/*.py", "replay/*/kernels/*.py", "replay/rocketmq/control.py",
                    "schemas/outcomes.py", "schemas/trace.py", "schemas/units.py")


def sources_digest(root: Path) -> str | None:
    """The digest of `COMPILED_SOURCES` under root (None where there are none: code imported from a zip)."""
    files = sorted(f for pattern in COMPILED_SOURCES for f in root.glob(pattern))
    if not files:
        return None
    digest = hashlib.sha256()
    for f in files:
        digest.update(f"{f.relative_to(root).as_posix()}\0".encode())
        digest.update(f.read_bytes())
    return digest.hexdigest()[:16]


@functools.cache
def _versioned_cache() -> None:
    """Keep numba's on-disk cache (NUMBA_CACHE_DIR) in a directory named by `sources_digest`. numba invalidates a
    cached function when its own file changes, not when an inlined helper or a constant it read from another
    module does: after such a change a process would load the old machine code."""
    import numba

    base = os.environ.get("NUMBA_CACHE_DIR")
    digest = sources_digest(Path(__file__).resolve().parents[3])
    if base and digest:
        numba.config.CACHE_DIR = str(Path(base) / digest)


def compiled(fn=None, *, inline: bool = False, counted: bool = True):
    """numba's `njit` with its on-disk cache (NUMBA_CACHE_DIR), or without it where numba cannot cache: code
    imported from a zip (spark-submit --py-files) has no cache locator, so it is compiled in each process.

    `inline=True` for a helper the compiled loops call per event: numba then copies its body into each caller.
    A call passes every array argument as a struct of fields and counts references to it (NRT incref/decref):
    inlining the loops' helpers took 5-16 % off the CPU of the presets with a compiled loop on the steady trace.
    The helper stays callable from Python.

    `counted=False` for a per-event loop that allocates nothing (its buffers come from the caller): it is compiled
    without numba's reference counting (the `_nrt=False` flag). An inlined helper still binds its array arguments
    to new variables, and each binding is an atomic increment and decrement of the array's count that LLVM's
    pruning does not remove where the helper branches: in the steady loops those were 20-25 % of the kernels'
    CPU (perf: one `lock incq`/`lock decq` pair per array per helper per event). Such a loop cannot
    allocate an array (numba refuses to compile it) and must not keep one it was given beyond the call. `_nrt` is
    numba's own option with a leading underscore (its test suite uses it), so numba is pinned (requirements.lock);
    should a release drop it, every kernel test fails at compilation, not in silence."""
    if fn is None:
        return lambda f: compiled(f, inline=inline, counted=counted)
    import numba

    _versioned_cache()
    options = {"inline": "always" if inline else "never", **({} if counted else {"_nrt": False})}
    try:
        return numba.njit(cache=True, **options)(fn)
    except RuntimeError:  # "cannot cache function ...: no locator available for file ..."
        return numba.njit(cache=False, **options)(fn)


def reserve(grow: Grow, k: int) -> np.ndarray:
    """Room for k more values in `grow`; returns its buffer, to be written at [grow.n, grow.n + k)."""
    if grow.n + k > len(grow._buf):
        grow._buf = _grown(grow._buf, grow.n, max(2 * len(grow._buf), grow.n + k, 16))
    return grow._buf


def reserve_rows(table: Table, k: int) -> None:
    """Room for k more rows in `table`'s columns, to be written in place at [table.n, table.n + k), every
    column of each row (the slots are unset, `_grown`)."""
    cap = len(next(iter(table.cols.values())))  # every column has the same capacity
    if table.n + k > cap:
        cap = max(2 * cap, table.n + k, 64)
        for name, arr in table.cols.items():
            table.cols[name] = _grown(arr, table.n, cap)


# ------------------------------------------------------------------------------------------ compiled helpers
@compiled
def kth_largest_columns(stack: np.ndarray, k: int) -> np.ndarray:
    """Column-wise k-th largest over the rows of `stack` (k ≥ 1); 0 where there are fewer than k rows."""
    m, n = stack.shape
    out = np.zeros(n, dtype=np.int64)
    if k > m:
        return out
    buf = np.empty(m, dtype=np.int64)
    for j in range(n):
        for r in range(m):  # insertion sort, descending: m is a group's size (≤ 10)
            v = stack[r, j]
            i = r
            while i > 0 and buf[i - 1] < v:
                buf[i] = buf[i - 1]
                i -= 1
            buf[i] = v
        out[j] = buf[k - 1]
    return out


@compiled(inline=True)
def kth_largest(values: np.ndarray, m: int, k: int) -> int:
    """The k-th largest of values[:m] (k ≥ 1), 0 if there are fewer than k; sorts values[:m] in place."""
    if k > m:
        return 0
    for r in range(1, m):  # insertion sort, descending: m is a group's size (≤ 10)
        v = values[r]
        i = r
        while i > 0 and values[i - 1] < v:
            values[i] = values[i - 1]
            i -= 1
        values[i] = v
    return values[k - 1]


@compiled
def member_index(ids: np.ndarray, members: np.ndarray) -> np.ndarray:
    """The index in `members` of each of `ids`, -1 for an id that is none of them (one pass: a masked assignment
    per member read every id once per member)."""
    out = np.full(len(ids), -1, dtype=np.int64)
    for j in range(len(ids)):
        for i in range(len(members)):
            if members[i] == ids[j]:
                out[j] = i
                break
    return out


@compiled
def take_or(values: np.ndarray, idx: np.ndarray, fill: int) -> np.ndarray:
    """values[idx] where idx ≥ 0, `fill` elsewhere (a gather with a null index)."""
    out = np.empty(len(idx), dtype=np.int64)
    for j in range(len(idx)):
        out[j] = values[idx[j]] if idx[j] >= 0 else fill
    return out


@compiled(inline=True)
def in_runs(runs: np.ndarray, epoch: int, offset: int) -> bool:
    """Whether the log given as (epoch, start, end) runs holds position (epoch, offset) (scalar `runs_contain`)."""
    for j in range(runs.shape[0]):
        if runs[j, 1] <= offset < runs[j, 2]:
            return runs[j, 0] == epoch
    return False


@compiled(inline=True)
def timeline_row(row_out: np.ndarray, n_rows: int, closed: int, t: int, leo: int, hw: int, prev_leo: int,
                 prev_hw: int, window: int, series: bool) -> int:
    """Record the end state of instant t in a compiled loop's timeline rows (t, log end, high watermark, end of
    t's window): the first instant always, then only changes, each window keeping its last (the only one that
    survives `replay.results.coalesce_states`). Returns the new row count. The window's end is kept with the row
    so that an instant in the same window is told by a comparison: two divisions per instant were a fifth of
    the Kafka loop's time."""
    if closed == 0:
        row_out[0, 0], row_out[0, 1], row_out[0, 2], row_out[0, 3] = t, leo, hw, (t // window + 1) * window
        return 1
    if series and (leo != prev_leo or hw != prev_hw):
        if n_rows > 1 and t < row_out[n_rows - 1, 3]:  # rows come in time order: t is in the last row's window
            row_out[n_rows - 1, 0], row_out[n_rows - 1, 1], row_out[n_rows - 1, 2] = t, leo, hw
            return n_rows
        row_out[n_rows, 0], row_out[n_rows, 1], row_out[n_rows, 2], row_out[n_rows, 3] = \
            t, leo, hw, (t // window + 1) * window
        n_rows += 1
    return n_rows


@compiled(inline=True)
def add_interval(out: np.ndarray, n: int, lo: int, hi: int) -> int:
    """Add [lo, hi) to the intervals out[:n], which come in time order: joined to the last one if it touches it
    (as `replay.results.merge_intervals` would join them), dropped if empty. Returns the new count."""
    if lo >= hi:
        return n
    if n > 0 and lo <= out[n - 1, 1]:
        out[n - 1, 1] = max(out[n - 1, 1], hi)
        return n
    out[n, 0], out[n, 1] = lo, hi
    return n + 1


@compiled(inline=True)
def close_instant(sc: np.ndarray, av: int, t: int, blocked: bool, stall: int, unav_out: np.ndarray, n_unav: int) -> int:
    """A compiled loop closes instant t (`Timeline.end_instant`): the availability of the instant before, held in
    sc[av: av + 4] as (open, instant, blocked, stall start), ends at t, its unavailability joined into
    unav_out[:n_unav] (`Timeline.close`); then t's own is held there. Returns the new interval count."""
    if sc[av] == 1:
        if sc[av + 2] == 1:
            n_unav = add_interval(unav_out, n_unav, sc[av + 1], t)
        elif sc[av + 3] < t:
            n_unav = add_interval(unav_out, n_unav, max(sc[av + 1], sc[av + 3]), t)
    sc[av], sc[av + 1], sc[av + 2], sc[av + 3] = 1, t, 1 if blocked else 0, stall
    return n_unav


def joined_intervals(lo: np.ndarray, hi: np.ndarray) -> list[tuple[int, int]]:
    """Intervals [lo, hi) in time order, each starting at or after the previous end, with touching ones joined
    (`add_interval` for a whole array: what `replay.results.merge_intervals` makes of them, without a tuple per
    instant meanwhile)."""
    if not len(lo):
        return []
    first = np.flatnonzero(np.append(True, lo[1:] > hi[:-1]))
    last = np.append(first[1:] - 1, len(lo) - 1)
    return list(zip(lo[first].tolist(), hi[last].tolist(), strict=True))


@compiled
def forward_fill(idx: np.ndarray, values: np.ndarray, n: int, initial: int) -> np.ndarray:
    """out[j] = values[i] for the last i with idx[i] ≤ j (`idx` ascending), `initial` before idx[0]."""
    out = np.empty(n, dtype=np.int64)
    cur = initial
    i = 0
    for j in range(n):
        while i < len(idx) and idx[i] <= j:
            cur = values[i]
            i += 1
        out[j] = cur
    return out


@compiled
def merge_order(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """For ascending `a` and `b`, the order that stably sorts their concatenation (`a` first on equal keys):
    np.argsort(np.concatenate([a, b]), kind="stable") in one linear pass."""
    na, nb = len(a), len(b)
    out = np.empty(na + nb, dtype=np.int64)
    i = j = 0
    for o in range(na + nb):
        if j >= nb or (i < na and a[i] <= b[j]):
            out[o] = i
            i += 1
        else:
            out[o] = na + j
            j += 1
    return out


def is_ascending(a: np.ndarray) -> bool:
    return len(a) < 2 or bool((a[1:] >= a[:-1]).all())


class Timeline:
    """What a kernel records at the end of every instant (SPEC §4.2-4.3): timeline rows, coalesced as
    `replay.results.coalesce_states` does (every control change and the last row of each window), and the
    unavailability intervals between instants. Rows are `replay.results.StateRow`s."""

    def __init__(self, window_us: int) -> None:
        self.window_us = window_us
        self.rows: list = []
        self.last = None  # the last row offered
        self.cand = None  # the window's last row, emitted once a later window starts
        self.av_prev: tuple[int, bool, int] | None = None  # (instant, blocked, stall start) of the open instant
        self.unavail: list[tuple[int, int]] = []

    def offer(self, row) -> None:
        last = self.last
        if last is not None and (row.leader, row.leader_epoch, row.isr, row.log_end_offset, row.high_watermark) == (
                last.leader, last.leader_epoch, last.isr, last.log_end_offset, last.high_watermark):
            return
        control = last is None or row.control_key() != last.control_key()
        cand = self.cand
        if cand is not None and cand.ts_us // self.window_us != row.ts_us // self.window_us:
            self.rows.append(cand)
        self.cand = None
        if control:
            self.rows.append(row)
        else:
            self.cand = row
        self.last = row

    def end_instant(self, row, blocked: bool, stall_from: int) -> None:
        """Record instant `row.ts_us`: its row, and its availability, which holds until the next instant."""
        self.offer(row)
        if self.av_prev is not None:
            self.close(row.ts_us)
        self.av_prev = (row.ts_us, blocked, stall_from)

    def close(self, t_end: int) -> None:
        t0, blocked, stall_from = self.av_prev
        if blocked:
            self.unavail.append((t0, t_end))
        elif stall_from < t_end:
            self.unavail.append((max(t0, stall_from), t_end))

    def finish(self, t_end: int) -> list:
        """Close the last instant at t_end; returns the rows."""
        self.close(t_end)
        if self.cand is not None:
            self.rows.append(self.cand)
            self.cand = None
        return self.rows


# --------------------------------------------------------------------------------- logs as runs of epochs
# A log is a list of runs [epoch, start, end): entries [start, end) were appended by that epoch's leader.
def prefix_runs(runs: list[list[int]], length: int) -> list[list[int]]:
    """The runs of the log's first `length` entries."""
    out = []
    for e, s, end in runs:
        if s >= length:
            break
        out.append([e, s, min(end, length)])
    return out


def extend_runs(runs: list[list[int]], epoch: int, start: int, k: int) -> None:
    """The leader appended entries [start, start + k) in `epoch`: extend its last run, or open one."""
    if runs and runs[-1][0] == epoch and runs[-1][2] == start:
        runs[-1][2] = start + k
    else:
        runs.append([epoch, start, start + k])


def append_time_at(runs: list[list[int]], epochs: dict, offset: int) -> int:
    """Append time of the entry at `offset` of a log: its run's epoch holds the leader's append times
    (`epochs[e] = (start offset, append times, ...)`)."""
    for e, s, end in runs:
        if s <= offset < end:
            start, app, *_ = epochs[e]
            return int(app.view[offset - start])
    raise IndexError(offset)


def common_prefix(a: list[list[int]], b: list[list[int]]) -> int:
    """Entries two logs share: same epoch at every offset (the log matching property; KIP-101/279)."""
    i = j = pos = 0
    while i < len(a) and j < len(b):
        ea, _, na = a[i]
        eb, _, nb = b[j]
        if ea != eb:
            return pos
        end = min(na, nb)
        pos = end
        if na == end:
            i += 1
        if nb == end:
            j += 1
    return pos


def runs_array(runs: list[list[int]]) -> np.ndarray:
    return np.array(runs, dtype=np.int64).reshape(-1, 3)
