"""The RocketMQ kernels' pending messages: rows, answers (R1), visibility, compaction into records."""

from __future__ import annotations

import numpy as np

from replay.events import PartitionEvents
from replay.kernels._arrays import (
    runs_array,
)
from replay.kernels.rocketmq_common import (
    ACKED,
    FAILED,
    MS,
    PREARRIVE,
    WAITING,
)
from replay.results import MessageRecords, runs_contain
from replay.rocketmq_control import (
    C_ARRIVE,
    INF,
    key_of,
)
from schemas.outcomes import NULL_US, Error, Status


class GroupMessages:
    """Part of `rocketmq_group.GroupReplay`: the pending messages (R1) and their records."""

    # ================================================================================= messages
    def _add_payload_keys(self, payload: dict) -> None:
        """Columns carried to the outputs untouched; a key first seen in a later chunk is -1 before it."""
        new = sorted(set(payload) - set(self.payload_keys or ()))
        if self.payload_keys is not None and not new:
            return
        self.payload_keys = tuple(self.payload_keys or ()) + tuple(new)
        for k in new:
            self.pend.dtypes[k] = np.int64
            self.pend.cols[k] = np.full(len(self.pend.cols["msg"]), -1, dtype=np.int64)

    def _new_rows(self, msg, prod, size, arrive, payload: dict, state) -> np.ndarray:
        # scalars broadcast into the table's columns (no per-column temporaries)
        cols = dict(msg=msg, prod=prod, size=size, arrive=arrive, dead=prod + self.p.delivery_timeout_ms * MS,
                    state=state, err=0, pe=-1, po=-1, ack=NULL_US, vis=NULL_US, tb=-1, tinc=0, tep=-1)
        for name in self.payload_keys or ():
            cols[name] = payload[name]
        return self.pend.append(**cols)

    def _settle_unrouted(self, ev: PartitionEvents, payload: dict, sel: np.ndarray) -> None:
        """SPEC §3.3 rule 3: no group took it: failed `no_route`, never appended."""
        k = int(sel.sum())
        rec = MessageRecords(ev.produce_msg[sel], ev.produce_ts[sel], np.full(k, Status.FAILED, np.int8),
                             np.full(k, Error.NO_ROUTE, np.int8), np.full(k, NULL_US), np.full(k, NULL_US),
                             np.full(k, -1), np.full(k, -1))
        rec.payload = {name: payload[name][sel] for name in self.payload_keys or ()}
        self.done.append(rec)

    def _schedule_arrivals(self, ev: PartitionEvents, payload: dict, sel: np.ndarray, delay: np.ndarray) -> None:
        ts = ev.produce_ts[sel]
        rows = self._new_rows(ev.produce_msg[sel], ts, ev.produce_size[sel], ts + delay[sel],
                              {k: v[sel] for k, v in payload.items()}, PREARRIVE)
        keys = np.concatenate([self.sched_key, key_of(ts + delay[sel], C_ARRIVE)])
        all_rows = np.concatenate([self.sched_row, rows])
        order = np.lexsort((self.pend["msg"][all_rows], keys))  # same instant: msg_id order
        self.sched_key, self.sched_row = keys[order], all_rows[order]

    def _records(self, mask: np.ndarray) -> MessageRecords:
        """The rows of boolean `mask` as records: a boolean index copies, so they stay as they are when the table
        compacts in place (`Table.keep`)."""
        c = self.pend
        st = c["state"][mask]
        status = np.where(st == ACKED, Status.ACKED, np.where(st == FAILED, Status.FAILED, Status.PENDING))
        rec = MessageRecords(c["msg"][mask], c["prod"][mask], status.astype(np.int8),
                             c["err"][mask], c["ack"][mask], c["vis"][mask],
                             c["pe"][mask], c["po"][mask])
        rec.payload = {k: c[k][mask] for k in self.payload_keys or ()}
        return rec

    def _limit(self, rows: np.ndarray) -> np.ndarray:
        """Last instant at which an ack still counts (R1): the broker's status or the client's deadline."""
        return np.minimum(self.pend["arrive"][rows] + self._answer_ms() * MS, self.pend["dead"][rows])

    def _ack_rows(self, rows: np.ndarray, when: np.ndarray) -> None:
        ok = when <= self._limit(rows)
        self.pend.cols["state"][rows[ok]] = ACKED
        self.pend.cols["ack"][rows[ok]] = when[ok]

    def _waiting_of(self, b: int, epoch: int) -> np.ndarray:
        """Rows waiting for an answer from broker b's current incarnation in `epoch`."""
        n = self.pend.n
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero((self.pend["state"] == WAITING) & (self.pend["tb"] == b) & (self.pend["tep"] == epoch)
                              & (self.pend["tinc"] == self.incarnation[self.ix[b]]))

    def _ack_upto(self, t: int, b: int, epoch: int, upto: int) -> None:
        rows = self._waiting_of(b, epoch)
        if len(rows):
            rows = rows[(self.pend["po"][rows] < upto) & self._held(b, rows)]
            self._ack_rows(rows, np.full(len(rows), t, dtype=np.int64))

    def _held(self, b: int, rows: np.ndarray) -> np.ndarray:
        return runs_contain(runs_array(self.runs[self.ix[b]]), self.pend["pe"][rows], self.pend["po"][rows])

    def _mark_visible(self, t: int, b: int, lo: int, hi: int) -> None:
        if self.pend.n == 0 or hi <= lo:
            return
        po, pe = self.pend["po"], self.pend["pe"]
        vis = self.pend.cols["vis"]
        rows = np.flatnonzero((po >= lo) & (po < hi) & (vis[: self.pend.n] == NULL_US) & (pe >= 0))
        if len(rows):
            rows = rows[self._held(b, rows)]
            vis[rows] = t

    def _resolve(self, t: int) -> None:
        """R1, lazily: waiting messages whose broker status or client deadline came before t fail."""
        n = self.pend.n
        if n == 0:
            return
        st = self.pend.cols["state"]
        rows = np.flatnonzero(st[:n] == WAITING)
        if not len(rows):
            return
        answer_at = self.pend["arrive"][rows] + self._answer_ms() * MS
        dead = self.pend["dead"][rows]
        tb, tinc = self.pend["tb"][rows], self.pend["tinc"][rows]
        end = np.full(len(rows), INF, dtype=np.int64)
        for i, b in enumerate(self.order):
            sel = tb == b
            if sel.any() and self.inc_end[i]:
                ends = np.array(self.inc_end[i], dtype=np.int64)
                inc = tinc[sel]
                end[sel] = np.where(inc < len(ends), ends[np.minimum(inc, len(ends) - 1)], INF)
        answered = (answer_at <= dead) & (end > answer_at)  # its incarnation still up at that instant
        fail_answer = answered & (answer_at < t)
        fail_dead = ~answered & (dead < t)
        err = self.pend.cols["err"]
        st[rows[fail_answer]] = FAILED
        err[rows[fail_answer]] = self.answer_error
        st[rows[fail_dead]] = FAILED
        err[rows[fail_dead]] = Error.DELIVERY_TIMEOUT
        if fail_answer.any() or fail_dead.any():
            self._compact()

    def _compact(self) -> None:
        """Hand settled messages to the output: answered, and visible or held by no broker."""
        n = self.pend.n
        if n < 4096:
            return
        st, vis, pe, po = self.pend["state"], self.pend["vis"], self.pend["pe"], self.pend["po"]
        answered = (st == ACKED) | (st == FAILED)
        settled = answered & (vis != NULL_US)
        maybe = answered & (vis == NULL_US)
        if maybe.any():
            alive = np.zeros(n, dtype=bool)
            for runs in self.runs:
                alive |= runs_contain(runs_array(runs), pe, po)
            settled |= maybe & ~alive
        if settled.sum() < n // 2:
            return
        self.done.append(self._records(settled))
        remap = self.pend.keep(~settled)
        if len(self.sched_row):
            self.sched_row = remap[self.sched_row]
