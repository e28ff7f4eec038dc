"""The `kafka` kernel's client-side rules at control points (SPEC §3.2 rules 3-4, 7-8, 12; §3.7 K-2): ISR expansion,
the high watermark, acknowledgements and visibility, client switches with their retries, and the
NotEnoughReplicas retry schedule."""

from __future__ import annotations

import numpy as np

from replay.kafka.kernels.common import (
    ACKED,
    APPENDED,
    C_RETRY,
    EXTRA_COLS,
    REFUSED,
    WAITING,
    key,
    set_state,
)
from replay.policies import Acks
from replay.results import (
    runs_contain,
)
from replay.shared.kernels.arrays import runs_array
from schemas.outcomes import NULL_US
from schemas.units import MS


class KafkaClients:
    """Part of `KafkaPartitionReplay` (replay/kafka/kernels/kernel.py), which holds the state these methods use."""

    def _expand(self, t: int, b: int) -> None:
        """Rule 7, applied right after the report that brought b up to the high watermark."""
        self.isr = self._in_order([*self.isr, b])
        if b in self.elr:
            self.elr.remove(b)
        if self.p.eligible_leader_replicas and len(self.isr) >= self.min_isr:
            self.elr = []
        self._recompute_hw(t)

    def _recompute_hw(self, t: int) -> None:
        """Rule 4, as `KafkaReference._recompute_hw`: not while the leader is down, unregistered, or unaware of its
        election (SPEC §3.7 K-3: an isolated broker elected does not lead until it heals)."""
        ldr = self.leader
        if ldr < 0 or not self.up[self.ix[ldr]] or self.must_register[self.ix[ldr]] or self.unaware:
            return
        view = self._view()
        if ldr not in view:
            return  # the leader just left the ISR (KIP-966 unclean restart); an election follows
        li = self.ix[ldr]
        if not self._frozen(len(view)):
            cand = min(int(self.log_len[li]) if b == ldr else int(self.fetched[self.ix[b]]) for b in view)
            if cand > self.hw:
                old = self.hw
                self.hw = cand
                self._mark_visible(t, ldr, old, cand)
        self._ack_committed(t)

    def _mark_visible(self, t: int, broker: int, lo: int, hi: int) -> None:
        if self.pend.n == 0 or hi <= lo:
            return
        epoch, offset = self.pend["epoch"], self.pend["offset"]
        vis = self.pend.cols["visible_us"]
        rows = np.flatnonzero((offset >= lo) & (offset < hi) & (vis[: self.pend.n] == NULL_US) & (epoch >= 0))
        if len(rows):
            rows = rows[runs_contain(runs_array(self.runs[self.ix[broker]]), epoch[rows], offset[rows])]
            vis[rows] = t
        self._extra_visible(broker, lo, hi, t=t)

    def _ack_committed(self, t: int) -> None:
        srv = self._serving()
        if srv < 0 or self.acks is Acks.ZERO or self.pend.n == 0:
            return
        st = self.pend.cols["state"]
        rows = np.flatnonzero((st[: self.pend.n] == APPENDED) & (self.pend["request_us"] <= t)
                              & (self.pend["deadline_us"] >= t))
        if not len(rows):
            return
        epoch, offset = self.pend["epoch"][rows], self.pend["offset"][rows]
        held = runs_contain(runs_array(self.runs[self.ix[srv]]), epoch, offset)
        ok = held if self.acks is Acks.ONE else held & (offset < self._serving_hw())
        set_state(st, rows[ok], ACKED)
        self.pend.cols["ack_us"][rows[ok]] = t

    def _on_switch(self, t: int, _: int) -> None:
        """Clients reach the current leader and retry every unacknowledged message within its deadline (rule 8)."""
        self.target = self.leader
        self.zombie = None
        n = self.pend.n
        if n == 0:
            return
        st = self.pend.cols["state"]
        rows = np.flatnonzero((st[:n] <= APPENDED) & (self.pend["deadline_us"] >= t))
        lazy = rows[st[rows] == REFUSED]
        if len(self.sched_row):
            lazy = lazy[~np.isin(lazy, self.sched_row)]
        self._skip_refused_retries(lazy, t)  # their retries before t were refused: they count (K-2)
        if len(self.sched_row):  # their pending retries are superseded by this attempt
            keep = ~np.isin(self.sched_row, rows)
            self.sched_key, self.sched_row = self.sched_key[keep], self.sched_row[keep]
        if not len(rows):
            return
        srv = self._serving()
        held = np.zeros(len(rows), dtype=bool)
        if srv >= 0:
            runs = runs_array(self.runs[self.ix[srv]])
            held = runs_contain(runs, self.pend["epoch"][rows], self.pend["offset"][rows])
            if self.extra.n:
                self._promote_extra(rows, held, runs)
        hrows = rows[held]
        set_state(st, hrows, APPENDED)  # the idempotent retry finds its copy
        self.pend.cols["request_us"][hrows] = t
        retry = rows[~held]
        retry = retry[np.argsort(self.pend["msg_id"][retry], kind="stable")]
        self._attempt_now(t, retry)
        self._ack_committed(t)

    def _promote_extra(self, rows, held, runs) -> None:
        """A retried message whose earlier copy the new leader holds: that copy becomes its position."""
        msgs = self.pend["msg_id"]
        todo = np.flatnonzero(~held & np.isin(msgs[rows], self.extra["msg_id"]))
        if not len(todo):
            return
        extra = list(zip(*(self.extra[c].tolist() for c in EXTRA_COLS), strict=True))  # (msg, epoch, offset)
        by_msg: dict[int, list[tuple[int, int]]] = {}
        for m, e, o in extra:
            by_msg.setdefault(m, []).append((e, o))
        for j in todo.tolist():
            r = int(rows[j])
            m = int(msgs[r])
            for e, o in by_msg[m]:
                if runs_contain(runs, np.array([e]), np.array([o]))[0]:
                    extra.remove((m, e, o))  # the copy becomes the position, the position a copy (at the end)
                    extra.append((m, int(self.pend["epoch"][r]), int(self.pend["offset"][r])))
                    self.pend.cols["epoch"][r], self.pend.cols["offset"][r] = e, o
                    held[j] = True
                    break
        columns = np.array(extra, dtype=np.int64).reshape(-1, len(EXTRA_COLS)).T
        self.extra.n = 0
        self.extra.append(**dict(zip(EXTRA_COLS, columns, strict=True)))

    def _attempt_now(self, t: int, rows: np.ndarray) -> None:
        """Attempts at a control instant (the switch), in msg_id order."""
        if not len(rows):
            return
        srv = self._serving()
        st = self.pend.cols["state"]
        if srv < 0:
            set_state(st, rows, WAITING)
            return
        if self._refusing():
            set_state(st, rows, REFUSED)
            self.pend.cols["refused_us"][rows] = t
            self.pend.cols["refusals"][rows] += 1
            return
        si = self.ix[srv]
        epoch = self._serving_epoch()
        offsets = int(self.log_len[si]) + np.arange(len(rows))
        self._move_positions(rows)
        self.pend.cols["epoch"][rows] = epoch
        self.pend.cols["offset"][rows] = offsets
        self._append_entries(si, epoch, np.full(len(rows), t, dtype=np.int64), self.pend["size"][rows], offsets)
        set_state(st, rows, APPENDED)
        self.pend.cols["request_us"][rows] = t
        if self.acks is Acks.ONE:
            set_state(st, rows, ACKED)
            self.pend.cols["ack_us"][rows] = t
        if self._is_zombie_target():
            self._zombie_commit(t)
        else:
            self._recompute_hw(t)

    def _zombie_commit(self, t: int) -> None:
        z = self.zombie
        if z["view"] == (z["broker"],) and not self._frozen(1):
            n = int(self.log_len[self.ix[z["broker"]]])
            self._mark_visible(t, z["broker"], z["hw"], n)
            z["hw"] = n
        self._ack_committed(t)

    def _retry_delay_us(self, n: np.ndarray) -> np.ndarray:
        """Wait before the n-th retry of a refused message (SPEC §3.7 K-2, as `KafkaReference._retry_backoff_us`):
        min(retry_backoff_max_ms, retry_backoff_ms × 2^(n−1)), computed without overflow."""
        base, cap = self.p.retry_backoff_ms * MS, self.p.retry_backoff_max_ms * MS
        doublings = 0  # the first exponent at which the backoff reaches the cap
        while base << doublings < cap:
            doublings += 1
        e = n - 1
        return np.where(e >= doublings, cap, base << np.minimum(e, doublings))

    def _skip_refused_retries(self, rows: np.ndarray, t: int) -> np.ndarray:
        """Rows refused while the serving broker kept refusing: their retries strictly before t were refused too
        (not materialized, see `_reschedule_pool`). Advances each row's last refusal (`anchor`) and refusal count
        (`nref`) over them and returns its next retry time, the first at or after t (SPEC §3.7 K-2)."""
        if not len(rows):
            return np.zeros(0, dtype=np.int64)
        cap = self.p.retry_backoff_max_ms * MS
        anchor, nref = self.pend["refused_us"][rows].copy(), self.pend["refusals"][rows].copy()
        nxt = anchor + self._retry_delay_us(nref)
        while True:
            behind = nxt < t
            if not behind.any():
                break
            delay = self._retry_delay_us(nref + 1)
            at_cap = behind & (delay >= cap)
            if at_cap.any():  # constant steps from here: jump over all but the last one before t
                k = (t - nxt[at_cap] - 1) // cap  # further retries strictly before t after nxt
                anchor[at_cap] = nxt[at_cap] + k * cap
                nref[at_cap] += 1 + k
                nxt[at_cap] = anchor[at_cap] + cap
            step = behind & ~at_cap
            anchor[step] = nxt[step]
            nref[step] += 1
            nxt[step] = anchor[step] + delay[step]
        self.pend.cols["refused_us"][rows] = anchor
        self.pend.cols["refusals"][rows] = nref
        return nxt

    def _reschedule_pool(self, t: int) -> None:
        """Refused messages retry after an exponential backoff (rule 3, SPEC §3.7 K-2). While the serving broker
        refuses, those retries would be refused again, so they are only materialized once it may not refuse."""
        if self.acks is not Acks.ALL or self.pend.n == 0:
            return
        if self._serving() >= 0 and self._refusing():
            return
        st = self.pend["state"]
        rows = np.flatnonzero(st == REFUSED)
        if len(self.sched_row):
            rows = rows[~np.isin(rows, self.sched_row)]
        if not len(rows):
            return
        nxt = self._skip_refused_retries(rows, t)
        ok = nxt <= self.pend["deadline_us"][rows]
        all_keys = np.concatenate([self.sched_key, key(nxt[ok], C_RETRY)])
        all_rows = np.concatenate([self.sched_row, rows[ok]])
        order = np.lexsort((self.pend["msg_id"][all_rows], all_keys))  # same instant: msg_id order
        self.sched_key, self.sched_row = all_keys[order], all_rows[order]
