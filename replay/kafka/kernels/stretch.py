"""The `kafka` kernel's steady stretches: the compiled loop (`steady.steady`) called with the state it
needs, and its effects on the Python-held state (logs as runs, timeline rows, availability, ISR expansion)."""

from __future__ import annotations

import numpy as np

from replay.kafka.kernels import steady
from replay.kafka.kernels.common import COMPACT_AT, PENDING_COLS
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
        s = steady.Stretch(
            stream_end=hi, retry_end=shi, leader=li, serving=si, serving_is_leader=bool(srv >= 0 and srv == ldr),
            serving_ok=srv >= 0, refusing=bool(refusing), acks=int(acks),
            leader_eligible=bool(ldr >= 0 and self._eligible(ldr)),
            hw_moves=bool(l_up and not self.unaware and not self._frozen(len(view))), epoch=int(epoch),
            epoch_start=int(self.epoch_start), delivery_timeout_us=self.p.delivery_timeout_ms * MS,
            request_timeout_us=self.p.request_timeout_ms * MS, window_us=self.window_us, zombie=bool(zombie),
            zombie_alone=bool(zombie and self.zombie["view"] == (srv,) and not self._frozen(1)),
            blocked=bool(srv < 0 or refusing), series=bool(l_up), flush=self.flush, limit_key=limit_key,
            replica_lag_us=self.p.replica_lag_time_max_ms * MS, tick_period_us=self.tick_period_us,
            duration_us=self.duration_us, compact_at=COMPACT_AT)
        carried = np.zeros(1, dtype=steady.CARRIED)
        c = carried[0]
        c["hw"], c["zombie_hw"], c["zombie_stall_us"] = self.hw, self.zombie["hw"] if zombie else 0, \
            self._avail()[1] if zombie else INF
        c["cur_t"], c["lead_n"], c["cum_n"], c["epoch_n"] = self.cur_t, self.lead_app.n, self.lead_cum.n, ep_app.n
        c["pend_n"], c["stream_pos"], c["tick_key"] = self.pend.n, self.s_pos, self.tick_key
        av = self.timeline.av_prev
        avail = np.array([0, 0, 0, INF] if av is None else [1, av[0], int(av[1]), av[2]], dtype=np.int64)
        reserve_rows(self.pend, arrivals)
        cols = self.pend.cols
        msgs = steady.Pending(*(cols[name] for name in PENDING_COLS))
        replicas = steady.Replicas(
            log_len=self.log_len, fetched=self.fetched, lcu=self.lcu,
            follower_ok=np.array([b != ldr and self._eligible(b) for b in self.order], dtype=bool),
            in_isr=np.array([b in self.isr for b in self.order], dtype=bool),
            in_view=np.array([b in view for b in self.order], dtype=bool))
        lead = steady.LeaderLog(
            runs=runs_array(self.runs[li]) if li >= 0 else np.zeros((0, 3), dtype=np.int64),
            append_us=reserve(self.lead_app, arrivals), cum_size=reserve(self.lead_cum, arrivals),
            epoch_append_us=reserve(ep_app, arrivals), epoch_size=reserve(ep_size, arrivals))
        if len(self.scratch[0]) <= due + ticks:  # output buffers, kept across stretches
            cap = max(2 * len(self.scratch[0]), due + ticks + 1)
            self.scratch = tuple(np.empty((cap, w), dtype=np.int64) for w in steady.OUTPUT_WIDTHS)
        rows, unav, extra, hw_ch = self.scratch
        unsettled = int(self.log_len[li]) - min(self.hw, int(self.log_len[li])) if li >= 0 else 0
        out = steady.Outputs(rows, unav, extra, hw_ch, reserve(self.orow, unsettled + due + 1))
        stream = steady.StreamCols(self.s_key, self.s_src, *self.s_reports, *self.s_produce, self.sched_key,
                                   self.sched_row)
        grow_from = self.log_len.copy()
        old_hw = self.hw
        steady.steady(carried, avail, s, stream, msgs, replicas, self.durability, lead, out)
        # ----- the carried scalars and the growable arrays back
        c = carried[0]
        self.hw, self.cur_t = int(c["hw"]), int(c["cur_t"])
        if zombie:
            self.zombie["hw"] = int(c["zombie_hw"])
        self.replication_bytes += int(c["replication_bytes"])
        self.lead_app.n, self.lead_cum.n = int(c["lead_n"]), int(c["cum_n"])
        ep_app.n = ep_size.n = int(c["epoch_n"])
        self.pend.n = int(c["pend_n"])
        self.s_pos = int(c["stream_pos"])
        self.tick_key = int(c["tick_key"])
        took = int(c["retry_pos"])
        self.sched_key, self.sched_row = self.sched_key[took:], self.sched_row[took:]
        # ----- logs as runs: the serving broker's appends (one epoch), then followers as prefixes of the leader's
        k = int(c["appended"])
        if k:
            if new_epoch:
                self.epochs[epoch] = (ep_start, ep_app, ep_size)
            start = int(self.log_len[si]) - k
            assert self.epochs[epoch][0] + ep_app.n == start + k, "an epoch's leader appends contiguously"
            extend_runs(self.runs[si], epoch, start, k)
        for i in range(n):
            if i not in (li, si) and self.log_len[i] > grow_from[i]:
                self.runs[i] = prefix_runs(self.runs[li], int(self.log_len[i]))
        nx = int(c["n_extra"])
        if nx:
            self.extra.append(msg_id=extra[:nx, 0], epoch=extra[:nx, 1], offset=extra[:nx, 2])
        nh = int(c["n_hw_moves"])
        if nh and self.extra.n and ldr >= 0:
            self._extra_visible(ldr, old_hw, self.hw, hw_ch[:nh, 0], hw_ch[:nh, 1])
        # ----- closed instants: timeline rows and availability
        for t, leo, hw in rows[: int(c["n_rows"]), :3].tolist():
            row = StateRow(t, ldr, self.epoch, tuple(self.isr), leo, hw) if l_up else self._state_row(t)
            self.timeline.offer(row)
        self.timeline.unavail.extend(map(tuple, unav[: int(c["n_unavailable"])].tolist()))
        if avail[0]:  # (open, instant, blocked, stall start), `arrays.close_instant`
            self.timeline.av_prev = (int(avail[1]), bool(avail[2]), int(avail[3]))
        if self.pend.n >= COMPACT_AT:
            self._compact()  # settled messages leave the pending table (it bounds the next stretch's scans)
        b = int(c["expand"])
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
        epoch, offset, msg = self.pend.cols["epoch"], self.pend.cols["offset"], self.pend.cols["msg_id"]
        had = rows[epoch[rows] >= 0]
        if len(had):
            self.extra.append(msg_id=msg[had], epoch=epoch[had], offset=offset[had])

    def _extra_visible(self, broker: int, lo: int, hi: int, ts=None, hw=None, t: int | None = None) -> None:
        """Visibility through an earlier copy of a retried message: a message not yet visible becomes visible at t
        (or when the high watermark `hw`, moving at `ts`, passed the copy) through the first of its copies in
        [lo, hi) that `broker` holds. Vectorized: where a single replica is left, produce requests are refused and
        retried for long, and tens of thousands of copies pile up (`k8-last-replica-standing`)."""
        off = self.extra["offset"]
        due = np.flatnonzero((off >= lo) & (off < hi))
        if not len(due):
            return
        d_msg, d_epoch, d_off = self.extra["msg_id"][due], self.extra["epoch"][due], off[due]
        # the pending rows of those messages only (a map over every pending row cost a third of a fault trace's
        # Kafka kernel time); a message's last row is the one its copies speak for
        msgs = self.pend["msg_id"]
        rows = np.flatnonzero(np.isin(msgs, d_msg))[::-1]
        if not len(rows):
            return
        known, first = np.unique(msgs[rows], return_index=True)
        at = np.minimum(np.searchsorted(known, d_msg), len(known) - 1)
        row = np.where(known[at] == d_msg, rows[first][at], -1)
        vis = self.pend.cols["visible_us"]
        ok = row >= 0
        ok[ok] = vis[row[ok]] == NULL_US
        ok[ok] = runs_contain(runs_array(self.runs[self.ix[broker]]), d_epoch[ok], d_off[ok])
        copy = np.flatnonzero(ok)
        if not len(copy):
            return
        copy = copy[np.unique(row[copy], return_index=True)[1]]  # a message's first copy held, in order, wins
        vis[row[copy]] = t if t is not None else ts[np.minimum(np.searchsorted(hw, d_off[copy], side="right"),
                                                               len(ts) - 1)]
