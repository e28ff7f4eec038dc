"""The `kafka` kernel's outputs: per-instant timeline rows and availability, message records, deadlines and the
hand-over of settled messages."""

from __future__ import annotations

import numpy as np

from replay.kafka.kernels.common import (
    ACKED,
    APPENDED,
    FAILED,
    PAYLOAD,
    set_state,
)
from replay.kafka.kernels.steady import INF
from replay.kafka.kernels.stream import any_due
from replay.policies import Acks
from replay.results import (
    StateRow,
)
from replay.shared.kernels.records import hand_over_settled, settled_mask
from schemas.outcomes import Error
from schemas.units import MS

_ACKED, _FAILED = int(ACKED), int(FAILED)
COMPACT_MIN_ROWS = 4096  # a smaller pending table is not worth a compaction
COMPACT_SETTLED_SHARE = 2  # nor one with fewer than 1 / COMPACT_SETTLED_SHARE of its rows settled


class KafkaOutputs:
    """Part of `KafkaPartitionReplay` (replay/kafka/kernels/kernel.py), which holds the state these methods use."""

    # ---------------------------------------------------------------------------- instants and records
    def _state_row(self, t: int, leo: int | None = None, hw: int | None = None) -> StateRow:
        ldr = self.leader
        if ldr < 0:
            return StateRow(t, None, self.epoch, tuple(self.isr), None, None)
        if (not self.up[self.ix[ldr]] or self.must_register[self.ix[ldr]]) and self.down_pub is not None:
            return StateRow(t, ldr, self.epoch, tuple(self.isr), *self.down_pub)
        return StateRow(t, ldr, self.epoch, tuple(self.isr), int(self.log_len[self.ix[ldr]]) if leo is None else leo,
                        self.hw if hw is None else hw)

    def _avail(self) -> tuple[bool, int]:
        srv = self._serving()
        if srv < 0:
            return True, INF
        if self.acks is not Acks.ALL:
            return False, INF
        if self._serving_view_size() < self.min_isr:
            return True, INF
        hw = self._serving_hw()
        if hw >= self.log_len[self.ix[srv]]:
            return False, INF
        return False, self._app_at(srv, hw) + self.p.request_timeout_ms * MS

    def _clock(self, t: int) -> None:
        """Moving to time t closes the current instant: record its end state."""
        if t > self.cur_t:
            self.timeline.end_instant(self._state_row(self.cur_t), *self._avail())
            self.cur_t = t

    # =================================================================================== deadlines
    def _resolve_deadlines(self, t: int) -> None:
        """Messages whose delivery deadline passed (before t) fail; the error reflects the state then."""
        if self.acks is Acks.ZERO or self.pend.n == 0:
            return
        if not any_due(self.pend.cols["state"], self.pend.cols["deadline_us"], self.pend.n, t):
            return
        st = self.pend.cols["state"][: self.pend.n]
        due = (st <= APPENDED) & (self.pend["deadline_us"] < t)
        rows = np.flatnonzero(due)
        srv = self._serving()
        other = Error.NOT_ENOUGH_REPLICAS if srv >= 0 and self._refusing() else Error.NO_LEADER
        err = np.where(st[rows] == APPENDED, Error.REQUEST_TIMEOUT, other).astype(np.int8)
        self.pend.cols["error"][rows] = err
        set_state(st, rows, FAILED)
        # drop their scheduled retries
        if len(self.sched_row):
            keep = ~np.isin(self.sched_row, rows)
            self.sched_key, self.sched_row = self.sched_key[keep], self.sched_row[keep]
        self._compact()

    def _compact(self) -> None:
        """Hand settled messages to the records: acknowledged or failed, and visible or held by no replica."""
        n = self.pend.n
        if n < COMPACT_MIN_ROWS:
            return
        pinned = None
        if self.extra.n:  # retried messages keep their rows until the end (rare)
            pinned = np.isin(self.pend["msg_id"], self.extra["msg_id"])
        settled, count = settled_mask(self.pend, self.runs, pinned, _ACKED, _FAILED)
        if count < n // COMPACT_SETTLED_SHARE:
            return
        remap = hand_over_settled(self.pend, self.recs, settled, PAYLOAD, _ACKED, _FAILED)
        if len(self.sched_row):
            self.sched_row = remap[self.sched_row]
            ok = self.sched_row >= 0
            self.sched_key, self.sched_row = self.sched_key[ok], self.sched_row[ok]
