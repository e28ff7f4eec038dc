"""Small array helpers the kernels share: growable int64 columns, a struct-of-arrays table, the segment merge."""

from __future__ import annotations

import numpy as np


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
            new = np.zeros(max(2 * len(self._buf), self.n + k, 16), dtype=np.int64)
            new[: self.n] = self._buf[: self.n]
            self._buf = new
        self._buf[self.n: self.n + k] = values
        self.n += k

    def truncate(self, n: int) -> None:
        self.n = min(self.n, n)

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
    """Columns of equal length with appends, masks and compaction (the kernels' pending messages)."""

    def __init__(self, dtypes: dict[str, type]) -> None:
        self.dtypes = dict(dtypes)  # own copy: a kernel adds payload columns to its table, not to every table
        self.cols = {k: np.zeros(0, dtype=t) for k, t in dtypes.items()}
        self.n = 0

    def append(self, **cols: np.ndarray) -> np.ndarray:
        """Append rows; returns their indices."""
        k = len(next(iter(cols.values())))
        start = self.n
        if self.n + k > len(self.cols["msg"]):
            cap = max(2 * len(self.cols["msg"]), self.n + k, 64)
            for name, arr in self.cols.items():
                new = np.zeros(cap, dtype=arr.dtype)
                new[: self.n] = arr[: self.n]
                self.cols[name] = new
        for name in self.dtypes:
            self.cols[name][start: start + k] = cols[name]
        self.n += k
        return np.arange(start, start + k)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.cols[name][: self.n]

    def keep(self, mask: np.ndarray) -> np.ndarray:
        """Keep rows where mask is true; returns the old->new index map (-1 for dropped rows)."""
        idx = np.flatnonzero(mask)
        remap = np.full(self.n, -1, dtype=np.int64)
        remap[idx] = np.arange(len(idx))
        for name in self.dtypes:
            self.cols[name] = self.cols[name][: self.n][idx].copy()
        self.n = len(idx)
        return remap


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


def compiled(fn):
    """numba's `njit` with its on-disk cache (NUMBA_CACHE_DIR), or without it where numba cannot cache: code
    imported from a zip (spark-submit --py-files) has no cache locator, so it is compiled in each process."""
    import numba

    try:
        return numba.njit(cache=True)(fn)
    except RuntimeError:  # "cannot cache function ...: no locator available for file ..."
        return numba.njit(cache=False)(fn)


def reserve(grow: Grow, k: int) -> np.ndarray:
    """Room for k more values in `grow`; returns its buffer, to be written at [grow.n, grow.n + k)."""
    if grow.n + k > len(grow._buf):
        new = np.zeros(max(2 * len(grow._buf), grow.n + k, 16), dtype=np.int64)
        new[: grow.n] = grow._buf[: grow.n]
        grow._buf = new
    return grow._buf


def reserve_rows(table: Table, k: int) -> None:
    """Room for k more rows in `table`'s columns, to be written in place at [table.n, table.n + k)."""
    cap = len(table.cols["msg"])
    if table.n + k > cap:
        cap = max(2 * cap, table.n + k, 64)
        for name, arr in table.cols.items():
            new = np.zeros(cap, dtype=arr.dtype)
            new[: table.n] = arr[: table.n]
            table.cols[name] = new
