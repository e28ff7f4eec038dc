"""The `kafka` kernel's control points (SPEC §3.2 rules 6, 8-11; §3.7 K-3, K-4): faults, fencing, elections, a new
leader taking over, client failover scheduling and ISR check ticks, each mirroring `KafkaReference`."""

from __future__ import annotations

import numpy as np

from replay.kafka.kernels.common import (
    C_CLIENT,
    C_FENCE,
    key,
)
from replay.kafka.kernels.steady import C_TICK, INF
from replay.shared.kernels.arrays import Grow, common_prefix
from schemas.trace import Kind
from schemas.units import MS


class KafkaControl:
    """Part of `KafkaPartitionReplay` (replay/kafka/kernels/kernel.py), which holds the state these methods use."""

    # ================================================================================ control points
    def _trace_control(self, t: int, kind: Kind, b: int) -> None:
        if kind in (Kind.CRASH, Kind.POWER_LOSS, Kind.DISK_LOSS):
            self._stop_unclean(t, b, kind)
        elif kind is Kind.SHUTDOWN:
            self._shutdown(t, b)
        elif kind is Kind.ISOLATE:
            self._isolate(t, b)
        elif kind is Kind.RESTART:
            self._restart(t, b)
        elif kind is Kind.HEAL:
            self._heal(t, b)

    def _became_unreachable(self, t: int, i: int) -> None:
        if self.unreach[i] < 0:
            self.unreach[i] = t
            self._push(t + self.session_us, C_FENCE, "fence", self.order[i])

    def _zombie_stops(self, b: int) -> None:
        if self.zombie is not None and self.zombie["broker"] == b:
            self.zombie = None

    def _durable_prefix(self, i: int, t: int) -> int:
        n = int(self.flushed_all[i])
        k = self.durable_n[i]
        for d, ln in zip(self.durable_at_us[i, :k].tolist(), self.durable_len[i, :k].tolist(), strict=True):
            if d < t:  # a flush tick at the very instant of the power loss comes after it (SPEC §2.2)
                n = max(n, ln)
        return min(n, int(self.log_len[i]))

    def _stop_unclean(self, t: int, b: int, kind: Kind) -> None:
        i = self.ix[b]
        if b == self.leader and self.down_pub is None:
            self.down_pub = (int(self.log_len[i]), self.hw)
        self.up[i] = False
        self.unclean[i] = True
        if kind is Kind.POWER_LOSS:
            self._truncate(i, self._durable_prefix(i, t))
        elif kind is Kind.DISK_LOSS:
            self._truncate(i, 0)
        self.flushed_all[i] = self.log_len[i]
        self.durable_n[i] = 0
        self._became_unreachable(t, i)
        self._zombie_stops(b)
        if b == self.target and self.leader >= 0 and self.leader != b:
            self._schedule_switch(t)

    def _shutdown(self, t: int, b: int) -> None:
        i = self.ix[b]
        if b == self.leader and self.down_pub is None:
            self.down_pub = (int(self.log_len[i]), self.hw)
        self.up[i] = False
        self.unclean[i] = False
        self.flushed_all[i] = self.log_len[i]
        self.durable_n[i] = 0
        self.unreach[i] = -1
        self._zombie_stops(b)
        self._leave_isr(b)
        if b == self.leader:
            self._elect(t)
        else:
            self._recompute_hw(t)
            if b == self.target and self.leader >= 0:
                self._schedule_switch(t)

    def _isolate(self, t: int, b: int) -> None:
        i = self.ix[b]
        self.iso[i] = True
        self.iso_since[i] = t
        if b == self.leader:
            self.iso_view = tuple(self.isr)
            if b == self.target:
                self._schedule_refresh(t)
        self._became_unreachable(t, i)

    def _restart(self, t: int, b: int) -> None:
        i = self.ix[b]
        self.up[i] = True
        self.flushed_all[i] = self.log_len[i]
        self.durable_n[i] = 0
        if self.iso[i]:
            self.must_register[i] = True
            return
        self._register(t, b)

    def _register(self, t: int, b: int) -> None:
        i = self.ix[b]
        self.must_register[i] = False
        if self.p.eligible_leader_replicas and self.unclean[i]:
            if b in self.isr:
                self.isr.remove(b)
                self._recompute_hw(t)
            if b in self.elr:
                self.elr.remove(b)
        if self.unreach[i] >= 0:
            self._fence(t, b)
        if self.leader < 0:
            self._elect(t)

    def _heal(self, t: int, b: int) -> None:
        i = self.ix[b]
        self.iso[i] = False
        self.iso_since[i] = -1
        self._zombie_stops(b)
        if self.up[i] and self.must_register[i]:
            self._register(t, b)
        elif self.up[i]:
            self.unreach[i] = -1
        if b == self.leader and self.unaware and self.up[i] and not self.must_register[i]:
            self.unaware = False  # SPEC §3.7 K-3: it learns of its election and leads from now
            self._lead(t)
        elif b == self.leader:
            self.iso_view = None
            self._recompute_hw(t)
        elif self.up[i] and self.leader >= 0 and not self.unaware:
            self._truncate_to_leader(i)
        if b == self.target and self.leader != b:
            self._schedule_switch(t)
        if self.leader < 0 and self.up[i]:
            self._elect(t)

    def _on_fence(self, t: int, b: int) -> None:
        i = self.ix[b]
        if self.unreach[i] < 0 or self.unreach[i] + self.session_us != t:
            return
        self._fence(t, b)

    def _fence(self, t: int, b: int) -> None:
        self.unreach[self.ix[b]] = -1
        self._leave_isr(b)
        if b == self.leader:
            self._elect(t)
        else:
            self._recompute_hw(t)

    def _leave_isr(self, b: int) -> None:
        if b not in self.isr:
            return
        if len(self.isr) == 1 and not self.p.eligible_leader_replicas:
            return
        self.isr.remove(b)
        self._maybe_elr(b)

    def _maybe_elr(self, b: int) -> None:
        if self.p.eligible_leader_replicas and len(self.isr) < self.min_isr and b not in self.elr:
            self.elr.append(b)

    def _electable(self, b: int) -> bool:
        """The controller's view (SPEC §3.7 K-3, as `KafkaReference._electable`): up, registered, and, if
        isolated, not yet fenced."""
        i = self.ix[b]
        if not self.up[i] or self.must_register[i]:
            return False
        return bool(not self.iso[i] or self.unreach[i] >= 0)

    def _elect(self, t: int) -> None:
        cands = [b for b in self._in_order(self.isr) if self._electable(b)]
        chosen, new_isr = (cands[0], self.isr) if cands else (-1, None)
        if chosen < 0 and self.p.eligible_leader_replicas:
            elr = [b for b in self._in_order(self.elr) if self._electable(b)]
            if elr:
                chosen, new_isr = elr[0], [elr[0]]
                self.elr.remove(elr[0])
        if chosen < 0 and self.p.eligible_leader_replicas and not self.p.unclean_leader_election \
                and not self.isr and not self.elr and self._electable(self.last_leader):
            chosen, new_isr = self.last_leader, [self.last_leader]  # SPEC §3.7 K-4, as the reference
        if chosen < 0 and self.p.unclean_leader_election:
            up = [b for b in self.order if self._electable(b)]
            if up:
                chosen, new_isr = up[0], [up[0]]
                self.elr = []
        old = self.leader
        if old >= 0 and self._can_be_zombie(old) and old == self.target and self.zombie is None \
                and not self.unaware:
            self.zombie = {"broker": old, "epoch": self.epoch, "view": self.iso_view or (old,), "hw": self.hw}
        self.unaware = False
        if chosen < 0:
            self.leader = -1
            self.iso_view = None
            return
        self.isr = self._in_order(new_isr)
        self._set_leader(t, chosen)

    def _clients_stay(self) -> bool:
        """As `KafkaReference._clients_stay`: only a zombie or a restarted unregistered old leader keeps them."""
        tgt = self.target
        if tgt < 0 or not self.up[self.ix[tgt]] or not self.iso[self.ix[tgt]]:
            return False
        return bool(self.must_register[self.ix[tgt]]) or self._is_zombie_target()

    def _set_leader(self, t: int, n: int) -> None:
        """The controller elects n; an isolated n learns of it only when it heals (SPEC §3.7 K-3)."""
        self.leader = n
        self.last_leader = n
        self.epoch += 1
        self.iso_view = None
        self.down_pub = None
        self._zombie_stops(n)
        if self.p.eligible_leader_replicas and len(self.isr) >= self.min_isr:
            self.elr = []
        ni = self.ix[n]
        if self.iso[ni]:
            self.unaware = True
            self.hw = min(self.hw, int(self.log_len[ni]))
            if not self._clients_stay():
                self._schedule_switch(t)
            return
        self._lead(t)

    def _lead(self, t: int) -> None:
        """The leader takes over: truncation (rule 9), followers caught up, the high watermark restarts."""
        n = self.leader
        ni = self.ix[n]
        self.epoch_start = int(self.log_len[ni])
        for i, b in enumerate(self.order):
            if b != n and not (self.zombie is not None and b == self.zombie["broker"]):
                self._truncate_to_leader(i)
            if b != n:
                self.fetched[i] = self.log_len[i]
                self.lcu[i] = t
        self._rebuild_leader_log()
        if self._frozen(len(self.isr)):
            self.hw = min(self.hw, int(self.log_len[ni]))
        else:
            self.hw = min(int(self.log_len[ni]) if b == n else int(self.fetched[self.ix[b]]) for b in self.isr)
        self._mark_visible(t, n, 0, self.hw)
        if not self._clients_stay():
            self._schedule_switch(t)
        self._ack_committed(t)  # as the reference: clients already on the new leader need no failover

    def _truncate_to_leader(self, i: int) -> None:
        ldr = self.leader
        if ldr < 0 or self.order[i] == ldr:
            return
        self._truncate(i, common_prefix(self.runs[i], self.runs[self.ix[ldr]]))

    def _rebuild_leader_log(self) -> None:
        app, cum = [], [np.zeros(1, dtype=np.int64)]
        total = 0
        for e, s, end in self.runs[self.ix[self.leader]]:
            start, a, sz = self.epochs[e]
            app.append(a.view[s - start: end - start])
            c = np.cumsum(sz.view[s - start: end - start]) + total
            cum.append(c)
            total = int(c[-1]) if len(c) else total
        self.lead_app = Grow(np.concatenate(app) if app else np.zeros(0, dtype=np.int64))
        self.lead_cum = Grow(np.concatenate(cum))

    def _schedule_switch(self, t: int) -> None:
        self._push(t + self.p.client_failover_ms * MS, C_CLIENT, "switch", 0)

    def _schedule_refresh(self, t: int) -> None:
        self._push(t + self.p.metadata_max_age_ms * MS, C_CLIENT, "refresh", t)

    def _on_refresh(self, t: int, since: int) -> None:
        tgt = self.target
        if tgt < 0 or not self.iso[self.ix[tgt]] or self.iso_since[self.ix[tgt]] > since:
            return
        if self.leader != tgt:
            self._schedule_switch(t)
        else:
            self._schedule_refresh(t)

    def _on_tick(self, t: int) -> None:
        """Rule 6: ISR check tick (the compiled loop passes the ones that change nothing, `steady.tick_idle`)."""
        period = self.tick_period_us
        self.tick_key = key(t + period, C_TICK) if t + period <= self.duration_us else INF
        ldr = self.leader
        if ldr < 0 or not self._eligible(ldr):
            return
        leo = int(self.log_len[self.ix[ldr]])
        for f in list(self.isr):
            i = self.ix[f]
            if f != ldr and t - self.lcu[i] > self.p.replica_lag_time_max_ms * MS and self.fetched[i] < leo:
                self.isr.remove(f)
                self._maybe_elr(f)
        self._recompute_hw(t)
