"""Steady segments of the RocketMQ kernels: the compiled loop of the family's commit rule
(`steady.GROUP_STEADY`) called with the state it needs, and its effects on the Python-held state (logs as
runs, flush history, timeline rows, availability). The family says which commit rule answers its leader's requests
(`_steady_rule`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from replay.rocketmq.control import INF, KEY
from replay.rocketmq.kernels import steady
from replay.rocketmq.kernels.common import PENDING_COLS
from replay.rocketmq.kernels.steady import CommitRule
from replay.shared.kernels.arrays import Grow, extend_runs, prefix_runs, reserve, runs_array
from schemas.outcomes import Error
from schemas.trace import Kind
from schemas.units import MS

C_PRODUCE = int(Kind.PRODUCE)


@dataclass(frozen=True)
class SteadyRule:
    """What a family fixes for one steady segment."""

    leader: int | None  # the broker followers fetch from (and whose commit point answers requests)
    takes: bool  # the leader takes arriving messages (else they fail with no_leader, R2)
    reachable: bool  # followers' reports reach the leader
    rule: CommitRule
    k: int  # CLASSIC: slave copies needed (0: ack at append); DLEDGER: the majority
    usable: bool  # CLASSIC: enough usable slaves (else slave_not_available at once)
    commits: bool  # the commit point may move (DLEDGER: the leader reaches a majority, R-4; CONTROLLER: it serves)
    commit: int  # the commit point before the segment
    refusal: Error = Error.NO_LEADER  # why an arrival fails when the leader does not take it (R2)
    # CONTROLLER (§3.5): the confirm offset, whether it may move (the master is up), allAckInSyncStateSet, and
    # the brokers of the master's view of the SyncStateSet and of the set itself
    hw: int = 0
    hw_moves: bool = False
    all_ack: bool = False
    view: tuple[int, ...] = ()
    sss: tuple[int, ...] = ()


class SteadySegments:
    """Part of `rocketmq.ClassicReplay` and `rocketmq.DLedgerReplay`, which hold the state these methods use."""

    #: Trace events per compiled segment at most: fewer Python round trips than the numpy path's segments, while
    #: the pending table (compacted between segments) stays bounded.
    SEGMENT_MAX = 1 << 17

    def _steady_rule(self) -> SteadyRule:
        raise NotImplementedError

    def _scratch(self, n: int) -> tuple[np.ndarray, ...]:
        """The loop's output buffers (writes per replica, timeline rows, unavailability), room for n events, kept
        across segments (fresh large arrays cost a page fault per 4 KiB)."""
        bufs = self.__dict__.get("_bufs")
        if bufs is None or len(bufs[-1]) < n:
            cap = max(n, 2 * len(bufs[-1]) if bufs is not None else 0)
            bufs = (*(np.empty((len(self.order), cap), dtype=np.int64) for _ in ("t", "length", "nbytes")),
                    np.empty((cap, steady.ROW_WIDTH), dtype=np.int64),
                    np.empty((cap, steady.INTERVAL_WIDTH), dtype=np.int64))
            self._bufs = bufs
        return bufs

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_bufs", None)  # scratch: not part of the replay's state (stream snapshots stay small)
        state.pop("_orow", None)
        return state

    def _steady_done(self, commit: int, hw: int, expand: int | None) -> None:
        """Carry the segment's final commit point and confirm offset; `expand`: the broker that rejoins the
        SyncStateSet at the segment's last event (CONTROLLER)."""

    def _stream(self, limit_key: int) -> None:
        """Process replicate/produce events and scheduled arrivals with keys below `limit_key`, one compiled
        segment (at most `segment_max` trace events) at a time."""
        while True:
            hi = min(int(np.searchsorted(self.s_key, limit_key, side="left")), self.s_pos + self.segment_max)
            # scheduled arrivals before the next trace event left for later (s_key ends with an INF sentinel)
            shi = int(np.searchsorted(self.sched_key, min(limit_key, int(self.s_key[hi])), side="left"))
            if hi <= self.s_pos and shi == 0:
                return
            self._steady(hi, shi)
            self._compact()  # keeps the pending table (and the scans over it) at about a segment's size

    def _steady(self, hi: int, shi: int) -> None:
        """Stream events [s_pos, hi) and scheduled arrivals [0, shi) in compiled code, then their effects."""
        lo = self.s_pos
        due = hi - lo + shi
        # produce events get their rows first (vectorized), in order; the loop fills in their outcome
        new = lo + np.flatnonzero(self.s_code[lo:hi] == C_PRODUCE)
        pend_n = self.pend.n
        if len(new):
            ts = self.s_key[new] // KEY
            msg, size, pay = self._produced(self.s_pidx[new])
            self._new_rows(msg, ts, size, ts, pay, 0)
        arrivals = len(new) + shi  # at most one append each
        cols = self.pend.cols
        rule = self._steady_rule()
        ldr = rule.leader
        li = self.ix[ldr] if ldr is not None else steady.NONE
        assert self.lead_for_cache == ldr, "the leader cache holds the leader's log"
        epoch = self.cp.epoch
        new_epoch = epoch not in self.epochs
        ep_start, ep_app, ep_cum = ((int(self.log_len[li]), Grow(), Grow(np.zeros(1, dtype=np.int64))) if new_epoch
                                    else self.epochs[epoch])
        if new_epoch:  # room for the chunk's appends (`GroupReplay.advance`)
            reserve(ep_app, self.room)
            reserve(ep_cum, self.room)
        seg = steady.Segment(
            stream_end=hi, sched_end=shi, first_row=pend_n, pending_n=pend_n, leader=li,
            leader_broker=steady.NONE if ldr is None else ldr, takes=bool(rule.takes and ldr is not None),
            leader_reachable=bool(rule.reachable), need=int(rule.k), usable=bool(rule.usable),
            commits=bool(rule.commits), epoch=int(epoch), incarnation=int(self.incarnation[li]) if li >= 0 else 0,
            answer_us=self._answer_ms() * MS, window_us=int(self.timeline.window_us), blocked=bool(self._blocked()),
            refusal=int(rule.refusal), all_ack=bool(rule.all_ack), hw_moves=bool(rule.hw_moves))
        av = self.timeline.av_prev
        avail = np.array((1, av[0], int(av[1]), av[2]) if av is not None else (0, 0, 0, INF), dtype=np.int64)
        carried = np.zeros(1, dtype=steady.CARRIED)
        c = carried[0]
        c["cur_t"], c["commit"], c["hw"] = self.cur_t, rule.commit, rule.hw
        c["lead_n"], c["cum_n"], c["epoch_n"], c["stream_pos"] = self.lead_app.n, self.lead_cum.n, ep_app.n, lo
        n = len(self.order)
        alive = np.array([self.cp.alive(b) for b in self.order], dtype=bool)
        ctl = np.array([steady.IN_VIEW * (b in rule.view) + steady.IN_SSS * (b in rule.sss) for b in self.order],
                       dtype=np.int64)
        lead_runs = runs_array(self.runs[li]) if li >= 0 else runs_array([])
        before = self.log_len.copy()
        w_t, w_len, w_bytes, rows, unav = self._scratch(due + 1)
        w_n = np.zeros(n, dtype=np.int64)
        leo0 = int(self.log_len[li]) if li >= 0 else 0
        orow = reserve(self.__dict__.setdefault("_orow", Grow()), max(leo0 - min(rule.commit, leo0), 0) + due + 1)
        steady.GROUP_STEADY[rule.rule](
            carried, avail, seg,
            steady.StreamCols(self.s_key, self.s_code, self.s_rep, self.s_upto, self.sched_key, self.sched_row),
            steady.Pending(*(cols[name] for name in PENDING_COLS)),
            steady.Replicas(self.log_len, self.nbytes, self.fetched, self.lcu, alive, ctl),
            steady.LeaderLog(lead_runs, reserve(self.lead_app, arrivals), reserve(self.lead_cum, arrivals),
                             reserve(ep_app, arrivals), reserve(ep_cum, arrivals)),
            steady.Writes(w_t, w_len, w_bytes, w_n), steady.Outputs(rows, unav, orow, np.empty(n, dtype=np.int64)))
        # ----- the carried scalars and the growable arrays back
        c = carried[0]
        self.cur_t = int(c["cur_t"])
        self.s_pos = int(c["stream_pos"])
        # a segment cut short at a rejoin (CONTROLLER): the rows made for the produce events it did not reach go,
        # and the next segment makes them again
        self.pend.n = int(c["produce_row"])
        took = int(c["sched_pos"])
        if took:
            self.sched_key, self.sched_row = self.sched_key[took:], self.sched_row[took:]
        self.replication_bytes += int(c["replication_bytes"])
        self.lead_app.n, self.lead_cum.n = int(c["lead_n"]), int(c["cum_n"])
        ep_app.n = int(c["epoch_n"])
        ep_cum.n = ep_app.n + 1
        # ----- logs as runs: the leader's appends (one epoch), then followers as prefixes of the leader's log
        k = int(c["appended"])
        if k:
            if new_epoch:
                self.epochs[epoch] = (ep_start, ep_app, ep_cum)
            start = int(self.log_len[li]) - k
            assert self.epochs[epoch][0] + ep_app.n == start + k, "an epoch's leader appends contiguously"
            extend_runs(self.runs[li], epoch, start, k)
        for i in range(n):
            if i != li and self.log_len[i] > before[i]:
                self.runs[i] = prefix_runs(self.runs[li], int(self.log_len[i]))
        # ----- writes, for the flush model (R3)
        for i, k in enumerate(w_n.tolist()):
            if k:
                self.flush[i].write(w_t[i, :k], w_len[i, :k], w_bytes[i, :k])
        # ----- closed instants: timeline rows and availability
        for t, leo, hw in rows[: int(c["n_rows"]), : steady.ROW_STATE].tolist():
            self.timeline.offer(self._state_row(t, leo, hw))
        self.timeline.unavail.extend(map(tuple, unav[: int(c["n_unavailable"])].tolist()))
        if avail[0]:
            self.timeline.av_prev = (int(avail[1]), bool(avail[2]), int(avail[3]))
        expand = int(c["expand"])
        self._steady_done(int(c["commit"]), int(c["hw"]), self.order[expand] if expand >= 0 else None)
