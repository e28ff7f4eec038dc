"""What a RocketMQ broker's disk holds (SPEC §3.3 flush, R3), evaluated lazily from its write history."""

from __future__ import annotations

import numpy as np

from replay.kernels._arrays import (
    Grow,
)
from replay.kernels.rocketmq_common import (
    MS,
)
from replay.policies import (
    OS_WRITEBACK_EXPIRE_MS,
    OS_WRITEBACK_PERIOD_MS,
    Policy,
)
from replay.rocketmq_control import (
    INF,
)


class FlushState:
    """What one broker's disk holds (R3), with writes since the last materialization kept as history."""

    def __init__(self, mode: str, policy: Policy) -> None:
        self.mode = mode
        self.flushed = 0  # durable prefix (entries)
        self.flushed_bytes = 0
        self.base_len = 0  # log state before the first history entry
        self.base_bytes = 0
        if mode == "least":
            self.interval = policy.flush_interval_ms * MS
            self.thorough = policy.flush_thorough_interval_ms * MS
            self.least = policy.flush_least_bytes
        elif mode == "interval":
            self.interval = policy.flush_interval_ms * MS
        self.flush_t = -getattr(self, "interval", 1)  # every tick ≤ flush_t has been applied
        self.h_t, self.h_len, self.h_bytes = Grow(), Grow(), Grow()

    def write(self, ts: np.ndarray, lengths: np.ndarray, nbytes: np.ndarray) -> None:
        if len(ts) == 0:
            return
        if self.mode == "sync":
            self.flushed, self.flushed_bytes = int(lengths[-1]), int(nbytes[-1])
            self.base_len, self.base_bytes = self.flushed, self.flushed_bytes
            return
        self.h_t.extend(ts)
        self.h_len.extend(lengths)
        self.h_bytes.extend(nbytes)
        if len(self.h_t) > 8192:
            self.materialize(int(ts[-1]))

    def _fold(self, j: int) -> None:
        """History entries [0, j) are now the base."""
        if j <= 0:
            return
        self.base_len, self.base_bytes = int(self.h_len.view[j - 1]), int(self.h_bytes.view[j - 1])
        self.h_t, self.h_len, self.h_bytes = (Grow(g.view[j:].copy()) for g in (self.h_t, self.h_len, self.h_bytes))

    def materialize(self, t: int) -> None:
        """Apply every flush that happens before instant t (a tick at t comes after t's events)."""
        if self.mode == "sync" or (len(self.h_t) == 0 and self.base_bytes == self.flushed_bytes):
            return
        h_t, h_len, h_bytes = self.h_t.view, self.h_len.view, self.h_bytes.view
        if self.mode in ("interval", "os"):
            if self.mode == "interval":
                bound = ((t - 1) // self.interval) * self.interval  # writes up to the last tick before t
            else:
                period, expire = OS_WRITEBACK_PERIOD_MS * MS, OS_WRITEBACK_EXPIRE_MS * MS
                bound = ((t - 1) // period) * period - expire
            j = int(np.searchsorted(h_t, bound, side="right"))
            if j > 0:
                self._fold(j)
                self.flushed, self.flushed_bytes = self.base_len, self.base_bytes
            return
        interval, thorough = self.interval, self.thorough
        j = 0  # history entries [0, j) are folded into the base
        base_len, base_bytes = self.base_len, self.base_bytes
        while True:
            if base_bytes - self.flushed_bytes >= self.least:
                t_bytes = self.flush_t + interval
            else:
                jb = j + int(np.searchsorted(h_bytes[j:], self.flushed_bytes + self.least, side="left"))
                t_bytes = INF if jb >= len(h_t) else max(-(-int(h_t[jb]) // interval) * interval,
                                                          self.flush_t + interval)
            k = self.flush_t // thorough + 1
            tick = min(t_bytes, -(-(k * thorough) // interval) * interval)
            if tick >= t:
                last = ((t - 1) // interval) * interval
                if last > self.flush_t:
                    j = j + int(np.searchsorted(h_t[j:], last, side="right"))
                    self.flush_t = last
                break
            j = j + int(np.searchsorted(h_t[j:], tick, side="right"))
            if j > 0:
                base_len, base_bytes = int(h_len[j - 1]), int(h_bytes[j - 1])
            self.flushed, self.flushed_bytes = base_len, base_bytes
            self.flush_t = tick
        self.base_len, self.base_bytes = base_len, base_bytes
        if j > 0:
            self._fold(j)

    def durable(self, t: int) -> int:
        self.materialize(t)
        return self.flushed

    def truncate(self, length: int, nbytes: int) -> None:
        """The log was cut to `length` entries (`nbytes` bytes): the prefix keeps its write times."""
        self.flushed = min(self.flushed, length)
        self.flushed_bytes = min(self.flushed_bytes, nbytes)
        self.base_len, self.base_bytes = min(self.base_len, length), min(self.base_bytes, nbytes)
        if len(self.h_len):
            self.h_len = Grow(np.minimum(self.h_len.view, length))
            self.h_bytes = Grow(np.minimum(self.h_bytes.view, nbytes))

    def reset(self, length: int, nbytes: int, t: int) -> None:
        """Everything the broker holds is on disk (restart, shutdown, after a power loss)."""
        self.flushed = self.base_len = length
        self.flushed_bytes = self.base_bytes = nbytes
        self.h_t, self.h_len, self.h_bytes = Grow(), Grow(), Grow()
        if self.mode == "least":
            self.flush_t = max(self.flush_t, ((t - 1) // self.interval) * self.interval)
