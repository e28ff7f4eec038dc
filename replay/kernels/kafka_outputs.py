"""The `kafka` kernel's outputs: per-instant timeline rows and availability, message records, deadlines and the
hand-over of settled messages."""

from __future__ import annotations

import numpy as np

from replay.kernels._arrays import compiled, in_runs, reserve_rows, runs_array
from replay.kernels.kafka_common import (
    ACKED,
    APPENDED,
    FAILED,
    MS,
    PAYLOAD,
    PENDING_I8,
    PENDING_I64,
    RECORD_I64,
)
from replay.kernels.kafka_steady import INF
from replay.kernels.kafka_stream import any_due
from replay.policies import Acks
from replay.results import (
    MessageRecords,
    StateRow,
)
from schemas.outcomes import NULL_US, Error, Status

# Integer constants for the compiled code (numba reads module globals as compile-time constants).
_ACKED, _FAILED = int(ACKED), int(FAILED)
_ST_ACKED, _ST_FAILED, _ST_PENDING = int(Status.ACKED), int(Status.FAILED), int(Status.PENDING)
#: Where each record column comes from in the pending table's int64 columns (`hand_over`).
_TAKE_FROM = np.array([PENDING_I64.index(name) for name in RECORD_I64], dtype=np.int64)


@compiled
def settled_rows(n, state, vis, pe, po, runs, starts, pinned):
    """`KafkaOutputs._compact`'s rule over the first n pending rows: acknowledged or failed, and visible or held by
    no replica (replica i's log is runs[starts[i]:starts[i + 1]]), unless pinned (a retried message keeps its row
    until the end). Returns the flags and their count."""
    out = np.zeros(n, dtype=np.bool_)
    count = 0
    for r in range(n):
        if state[r] < _ACKED or pinned[r]:
            continue
        held = False  # not yet visible, but a replica holds it: it may still become visible
        if vis[r] == NULL_US:
            for i in range(len(starts) - 1):
                held = held or in_runs(runs[starts[i]: starts[i + 1]], pe[r], po[r])
        if not held:
            out[r] = True
            count += 1
    return out, count


@compiled
def hand_over(settled, n, p64, p8, take_from, r64, r8, r_n):
    """Move the pending rows flagged in settled[:n] to the records from row r_n on (status from state) and
    compact the other rows to the table's front in order, in place: one gather per column, where numpy's boolean
    gathers and the records' concatenation at the end made a copy each. p64/p8: the pending table's int64
    (`PENDING_I64`) and int8 (state, err) columns; r64/r8: the records' (`RECORD_I64`; status, err). Returns the
    old -> new row map (-1 for a row handed over)."""
    remap = np.empty(n, dtype=np.int64)
    moved, kept = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    m = k = 0
    for r in range(n):
        if settled[r]:
            remap[r] = -1
            moved[m] = r
            m += 1
        else:
            remap[r] = k
            kept[k] = r
            k += 1
    for c in range(len(r64)):
        src, dst = p64[take_from[c]], r64[c]
        for j in range(m):
            dst[r_n + j] = src[moved[j]]
    state, err, status, r_err = p8[0], p8[1], r8[0], r8[1]
    for j in range(m):
        s = state[moved[j]]
        status[r_n + j] = _ST_ACKED if s == _ACKED else _ST_FAILED if s == _FAILED else _ST_PENDING
        r_err[r_n + j] = err[moved[j]]
    for c in range(len(p64)):  # kept[j] >= j: a forward pass moves each row once
        col = p64[c]
        for j in range(k):
            col[j] = col[kept[j]]
    for c in range(len(p8)):
        col8 = p8[c]
        for j in range(k):
            col8[j] = col8[kept[j]]
    return remap


class KafkaOutputs:
    """Part of `KafkaPartitionReplay` (replay/kernels/kafka.py), which holds the state these methods use."""

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

    def _hand_over(self, settled: np.ndarray) -> np.ndarray:
        """Move the pending rows flagged in `settled` to the records (`hand_over`); returns the old -> new map."""
        pend, recs = self.pend, self.recs
        k = int(np.count_nonzero(settled))
        reserve_rows(recs, k)
        remap = hand_over(settled, pend.n, tuple(pend.cols[c] for c in PENDING_I64),
                          tuple(pend.cols[c] for c in PENDING_I8), _TAKE_FROM,
                          tuple(recs.cols[c] for c in RECORD_I64), (recs.cols["status"], recs.cols["err"]), recs.n)
        recs.n += k
        pend.n -= k
        return remap

    def _all_records(self) -> MessageRecords:
        """Every message's record: the settled ones, then what is still pending (end of trace)."""
        self._hand_over(np.ones(self.pend.n, dtype=bool))
        r = self.recs
        rec = MessageRecords(r["msg"], r["prod"], r["status"], r["err"], r["ack"], r["vis"], r["pe"], r["po"])
        rec.payload = {name: r[name] for name in PAYLOAD}
        return rec

    # =================================================================================== deadlines
    def _resolve_deadlines(self, t: int) -> None:
        """Messages whose delivery deadline passed (before t) fail; the error reflects the state then."""
        if self.acks is Acks.ZERO or self.pend.n == 0:
            return
        if not any_due(self.pend.cols["state"], self.pend.cols["dead"], self.pend.n, t):
            return
        st = self.pend.cols["state"][: self.pend.n]
        due = (st <= APPENDED) & (self.pend["dead"] < t)
        rows = np.flatnonzero(due)
        srv = self._serving()
        other = Error.NOT_ENOUGH_REPLICAS if srv >= 0 and self._refusing() else Error.NO_LEADER
        err = np.where(st[rows] == APPENDED, Error.REQUEST_TIMEOUT, other).astype(np.int8)
        self.pend.cols["err"][rows] = err
        st[rows] = FAILED
        # drop their scheduled retries
        if len(self.sched_row):
            keep = ~np.isin(self.sched_row, rows)
            self.sched_key, self.sched_row = self.sched_key[keep], self.sched_row[keep]
        self._compact()

    def _compact(self) -> None:
        """Hand settled messages to the records: acknowledged or failed, and visible or held by no replica."""
        n = self.pend.n
        if n < 4096:
            return
        c = self.pend.cols
        if self.extra:  # retried messages keep their rows until the end (rare)
            pinned = np.isin(c["msg"][:n], np.array([m for m, _, _ in self.extra], dtype=np.int64))
        else:
            pinned = np.zeros(n, dtype=bool)
        logs = [runs_array(runs) for runs in self.runs]
        starts = np.cumsum([0, *(len(runs) for runs in logs)])
        settled, count = settled_rows(n, c["state"], c["vis"], c["pe"], c["po"], np.concatenate(logs), starts,
                                      pinned)
        if count < n // 2:
            return
        remap = self._hand_over(settled)
        if len(self.sched_row):
            self.sched_row = remap[self.sched_row]
            ok = self.sched_row >= 0
            self.sched_key, self.sched_row = self.sched_key[ok], self.sched_row[ok]
