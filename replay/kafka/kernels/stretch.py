"""The `kafka` kernel's steady stretches: the compiled loop (`steady.steady`) called with the state it
needs, and its effects on the Python-held state (logs as runs, timeline rows, availability, ISR expansion)."""

from __future__ import annotations

import numpy as np

from replay.kafka.kernels import steady
from replay.kafka.kernels.common import (
    COMPACT_AT,
)
from replay.kafka.kernels.steady import CODES_PER_INSTANT, INF, AckCode
from replay.policies import Acks
from replay.results import (
    StateRow,
    runs_contain,
)
from replay.shared.kernels.arrays import Grow, extend_runs, prefix_runs, reserve, reserve_rows, runs_array
from schemas.outcomes import NULL_US
from schemas.units import MS


class KafkaStretches:
    """Part of `KafkaPartitionReplay` (replay/kafka/kernels/kernel.py), which holds the state these methods use."""

    # ================================================================================== steady stretches
    def _stream(self, limit_key: int) -> None:
        """Process produce/replicate events, scheduled retries and idle ISR check ticks with keys below
        `limit_key`; stop at a tick that is not idle (`advance` runs it)."""
        while True:
            hi = int(np.searchsorted(self.s_key, limit_key, side="left"))
            shi = int(np.searchsorted(self.sched_key, limit_key, side="left"))
            if hi <= self.s_pos and shi == 0:
                return  # ticks with no event before the limit run in Python
            if self._steady(hi, shi, limit_key):
                return
            # loop: an ISR expansion may have cut the stretch or scheduled retries before limit_key

    def _steady(self, hi: int, shi: int, limit_key: int) -> bool:
        """One steady stretch in compiled code (`steady.steady`), then its effects on the Python-held state.
        Returns whether it stopped at an ISR check tick that is not idle."""
        ticks = 0  # at most one closed instant per event and per tick
        if self.tick_key < limit_key:
            ticks = (limit_key // CODES_PER_INSTANT - self.tick_key // CODES_PER_INSTANT) // self.tick_period_us + 1
        due = hi - self.s_pos + shi
        arrivals = int(np.count_nonzero(self.s_src[self.s_pos: hi] >= 0)) + shi  # new rows and appends, at most
        ldr, srv = self.leader, self._serving()
        li = self.ix[ldr] if ldr >= 0 else -1
        si = self.ix[srv] if srv >= 0 else -1
        view = self._view()
        n = len(self.order)
        l_up = ldr >= 0 and bool(self.up[li]) and not self.must_register[li]
        zombie = srv >= 0 and self._is_zombie_target()
        refusing = srv >= 0 and self._refusing()
        acks = {Acks.ZERO: AckCode.ZERO, Acks.ONE: AckCode.ONE, Acks.ALL: AckCode.ALL}[self.acks]
        epoch = self._serving_epoch() if srv >= 0 else -1
        new_epoch = srv >= 0 and epoch not in self.epochs
        if srv >= 0:
            ep_start, ep_app, ep_size = (int(self.log_len[si]), Grow(), Grow()) if new_epoch else self.epochs[epoch]
            if new_epoch:  # room for the chunk's appends (`KafkaPartitionReplay.advance`)
                reserve(ep_app, self.room)
                reserve(ep_size, self.room)
        else:
            ep_start, ep_app, ep_size = 0, Grow(), Grow()
        cf = np.array([
            hi, shi, li, si, int(srv >= 0 and srv == ldr), int(srv >= 0), int(refusing), int(acks),
            int(ldr >= 0 and self._eligible(ldr)), int(l_up and not self.unaware and not self._frozen(len(view))),
            epoch, self.epoch_start, self.p.delivery_timeout_ms * MS, self.p.request_timeout_ms * MS, self.window_us,
            int(zombie), int(zombie and self.zombie["view"] == (srv,) and not self._frozen(1)),
            int(srv < 0 or refusing), int(l_up), *self.flush, limit_key, self.p.replica_lag_time_max_ms * MS,
            self.tick_period_us, self.duration_us, COMPACT_AT], dtype=np.int64)
        av = self.timeline.av_prev or (0, False, INF)
        sc = np.zeros(steady.N_SCALARS, dtype=np.int64)
        sc[[steady.S_HW, steady.S_ZHW, steady.S_ZSTALL, steady.S_CUR_T, steady.S_AV_HAS, steady.S_AV_T,
            steady.S_AV_BLOCKED, steady.S_AV_STALL, steady.S_LEAD_N, steady.S_CUM_N, steady.S_EP_N, steady.S_PEND_N,
            steady.S_POS, steady.S_TICK]] = [
            self.hw, self.zombie["hw"] if zombie else 0, self._avail()[1] if zombie else INF, self.cur_t,
            int(self.timeline.av_prev is not None), av[0], int(av[1]), av[2], self.lead_app.n, self.lead_cum.n,
            ep_app.n, self.pend.n, self.s_pos, self.tick_key]
        reserve_rows(self.pend, arrivals)
        c = self.pend.cols
        in_view = np.array([b in view for b in self.order], dtype=bool)
        in_isr = np.array([b in self.isr for b in self.order], dtype=bool)
        ok_rep = np.array([b != ldr and self._eligible(b) for b in self.order], dtype=bool)
        lead_runs = runs_array(self.runs[li]) if li >= 0 else np.zeros((0, 3), dtype=np.int64)
        if len(self.scratch[0]) <= due + ticks:  # output buffers, kept across stretches
            cap = max(2 * len(self.scratch[0]), due + ticks + 1)
            self.scratch = tuple(np.empty((cap, w), dtype=np.int64) for w in steady.OUTPUT_WIDTHS)
        rows, unav, extra, hw_ch = self.scratch
        unsettled = int(self.log_len[li]) - min(self.hw, int(self.log_len[li])) if li >= 0 else 0
        orow = reserve(self.orow, unsettled + due + 1)  # offset -> pending row, scratch of the loop
        grow_from = self.log_len.copy()
        old_hw = self.hw
        steady.steady(sc, cf, self.s_key, self.s_src, *self.s_reports, *self.s_produce, self.sched_key,
                      self.sched_row, c["msg"], c["prod"], c["size"], c["dead"], c["state"], c["err"], c["anchor"],
                      c["nref"], c["pe"], c["po"], c["req"], c["ack"], c["vis"], c["pid"], c["part"], c["keyid"],
                      self.log_len, self.fetched, self.lcu, self.flushed_all, self.dur_d, self.dur_len, self.dur_n,
                      ok_rep, in_isr, in_view, lead_runs, reserve(self.lead_app, arrivals),
                      reserve(self.lead_cum, arrivals), reserve(ep_app, arrivals), reserve(ep_size, arrivals), rows,
                      unav, extra, hw_ch, orow)
        # ----- the carried scalars and the growable arrays back
        self.hw, self.cur_t = int(sc[steady.S_HW]), int(sc[steady.S_CUR_T])
        if zombie:
            self.zombie["hw"] = int(sc[steady.S_ZHW])
        self.replication_bytes += int(sc[steady.S_REPL_BYTES])
        self.lead_app.n, self.lead_cum.n = int(sc[steady.S_LEAD_N]), int(sc[steady.S_CUM_N])
        ep_app.n = ep_size.n = int(sc[steady.S_EP_N])
        self.pend.n = int(sc[steady.S_PEND_N])
        self.s_pos = int(sc[steady.S_POS])
        self.tick_key = int(sc[steady.S_TICK])
        took = int(sc[steady.S_SCHED_POS])
        self.sched_key, self.sched_row = self.sched_key[took:], self.sched_row[took:]
        # ----- logs as runs: the serving broker's appends (one epoch), then followers as prefixes of the leader's
        k = int(sc[steady.S_APPENDED])
        if k:
            if new_epoch:
                self.epochs[epoch] = (ep_start, ep_app, ep_size)
            start = int(self.log_len[si]) - k
            assert self.epochs[epoch][0] + ep_app.n == start + k, "an epoch's leader appends contiguously"
            extend_runs(self.runs[si], epoch, start, k)
        for i in range(n):
            if i not in (li, si) and self.log_len[i] > grow_from[i]:
                self.runs[i] = prefix_runs(self.runs[li], int(self.log_len[i]))
        nx = int(sc[steady.S_NEXTRA])
        if nx:
            self.extra.append(msg=extra[:nx, 0], epoch=extra[:nx, 1], offset=extra[:nx, 2])
        nh = int(sc[steady.S_NHW])
        if nh and self.extra.n and ldr >= 0:
            self._extra_visible(ldr, old_hw, self.hw, hw_ch[:nh, 0], hw_ch[:nh, 1])
        # ----- closed instants: timeline rows and availability
        for t, leo, hw in rows[: int(sc[steady.S_NROWS]), :3].tolist():
            row = StateRow(t, ldr, self.epoch, tuple(self.isr), leo, hw) if l_up else self._state_row(t)
            self.timeline.offer(row)
        self.timeline.unavail.extend(map(tuple, unav[: int(sc[steady.S_NUNAV])].tolist()))
        if sc[steady.S_AV_HAS]:
            self.timeline.av_prev = (int(sc[steady.S_AV_T]), bool(sc[steady.S_AV_BLOCKED]), int(sc[steady.S_AV_STALL]))
        if self.pend.n >= COMPACT_AT:
            self._compact()  # settled messages leave the pending table (it bounds the next stretch's scans)
        b = int(sc[steady.S_EXPAND])
        if b >= 0:  # rule 7: the report that brought b up to the high watermark ends the stretch
            t = self.cur_t
            self._resolve_deadlines(t)  # deadlines before the expansion saw the state before it
            self._expand(t, self.order[b])
            self._reschedule_pool(t)
            return False
        return self.tick_key < limit_key


    def _append_entries(self, si: int, epoch: int, app_ts: np.ndarray, sizes: np.ndarray,
                        offsets: np.ndarray) -> None:
        if epoch not in self.epochs:
            self.epochs[epoch] = (int(offsets[0]), Grow(), Grow())
        start, app, size = self.epochs[epoch]
        assert start + len(app) == offsets[0], "an epoch's leader appends contiguously"
        app.extend(app_ts)
        size.extend(sizes)
        end = int(offsets[-1]) + 1
        extend_runs(self.runs[si], epoch, int(offsets[0]), end - int(offsets[0]))
        self.log_len[si] = end
        self._wrote(si, int(app_ts[-1]), int(offsets[-1]) + 1)  # one instant: one durability bucket
        if self.order[si] == self.leader:
            self.lead_app.extend(app_ts)
            self.lead_cum.extend(self.lead_cum.view[-1] + np.cumsum(sizes))

    def _move_positions(self, rows: np.ndarray) -> None:
        """A message appended again keeps its earlier position for judging fate (a copy may survive)."""
        pe, po, msg = self.pend.cols["pe"], self.pend.cols["po"], self.pend.cols["msg"]
        had = rows[pe[rows] >= 0]
        if len(had):
            self.extra.append(msg=msg[had], epoch=pe[had], offset=po[had])

    def _extra_visible(self, broker: int, lo: int, hi: int, ts=None, hw=None, t: int | None = None) -> None:
        """Visibility through an earlier copy of a retried message: a message not yet visible becomes visible at t
        (or when the high watermark `hw`, moving at `ts`, passed the copy) through the first of its copies in
        [lo, hi) that `broker` holds. Vectorized: where a single replica is left, produce requests are refused and
        retried for long, and tens of thousands of copies pile up (`k8-last-replica-standing`)."""
        off = self.extra["offset"]
        due = np.flatnonzero((off >= lo) & (off < hi))
        if not len(due):
            return
        d_msg, d_epoch, d_off = self.extra["msg"][due], self.extra["epoch"][due], off[due]
        # the pending rows of those messages only (a map over every pending row cost a third of a fault trace's
        # Kafka kernel time); a message's last row is the one its copies speak for
        msgs = self.pend["msg"]
        rows = np.flatnonzero(np.isin(msgs, d_msg))[::-1]
        if not len(rows):
            return
        known, first = np.unique(msgs[rows], return_index=True)
        at = np.minimum(np.searchsorted(known, d_msg), len(known) - 1)
        row = np.where(known[at] == d_msg, rows[first][at], -1)
        vis = self.pend.cols["vis"]
        ok = row >= 0
        ok[ok] = vis[row[ok]] == NULL_US
        ok[ok] = runs_contain(runs_array(self.runs[self.ix[broker]]), d_epoch[ok], d_off[ok])
        copy = np.flatnonzero(ok)
        if not len(copy):
            return
        copy = copy[np.unique(row[copy], return_index=True)[1]]  # a message's first copy held, in order, wins
        vis[row[copy]] = t if t is not None else ts[np.minimum(np.searchsorted(hw, d_off[copy], side="right"),
                                                               len(ts) - 1)]
