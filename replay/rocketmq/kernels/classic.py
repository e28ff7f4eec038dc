"""The `rocketmq` family's kernel (SPEC §3.3 master/slave)."""

from __future__ import annotations

from replay.policies import (
    BrokerRole,
    Reconcile,
    RocketMQPolicy,
)
from replay.results import StateRow
from replay.rocketmq.control import RouteClock
from replay.rocketmq.kernels.group import GroupReplay
from replay.rocketmq.kernels.steady import CommitRule
from replay.rocketmq.kernels.stretch import SteadyRule, SteadySegments
from replay.shared.kernels.arrays import (
    common_prefix,
    runs_array,
)
from schemas.trace import Kind
from schemas.units import S


class ClassicReplay(SteadySegments, GroupReplay):
    """SPEC §3.3 master/slave; steady segments run in compiled code (`stretch`)."""

    def __init__(self, policy: RocketMQPolicy, unit: int, members: tuple[int, ...], duration_us: int,
                 window_us: int = S, clock: RouteClock | None = None) -> None:
        super().__init__(policy, unit, members, duration_us, window_us, clock)
        self.master = members[0]
        self.slaves = members[1:]
        sync = policy.broker_role is BrokerRole.SYNC_MASTER and policy.in_sync_replicas > 1
        self.need = policy.in_sync_replicas - 1 if sync else 0
        self.lead_for_cache = self.master

    def _data_leader(self) -> int:
        return self.master

    def _serving(self) -> int | None:
        return self.master if self.cp.up[self.master] else None

    def _steady_rule(self) -> SteadyRule:
        m = self.master
        return SteadyRule(m, bool(self.cp.up[m]), bool(self.cp.alive(m)), CommitRule.CLASSIC, self.need,
                          self._usable() >= self.need or not self.p.slave_not_available, True,
                          self._coverage_now() if self.need else int(self.log_len[self.ix[m]]))

    def _usable(self) -> int:
        if self.cp.iso[self.master]:
            return 0
        return sum(1 for s in self.slaves if self.cp.alive(s))

    def _coverage_now(self) -> int:
        if self.need == 0:
            return int(self.log_len[0])
        ends = sorted((int(self.fetched[self.ix[s]]) for s in self.slaves), reverse=True)
        return ends[self.need - 1] if len(ends) >= self.need else 0

    def _blocked(self) -> bool:
        return not self.cp.up[self.master] or self._usable() < self.need

    def _ack_point_now(self, s: int) -> int | None:
        return None if self.need == 0 else self._coverage_now()

    def _state_row(self, t: int, leo: int | None = None, hw: int | None = None) -> StateRow:
        isr = (self.master, *([] if self.cp.iso[self.master] else [s for s in self.slaves if self.cp.alive(s)]))
        if not self.cp.up[self.master]:
            return StateRow(t, None, self.cp.epoch, isr, None, None)
        n = int(self.log_len[0]) if leo is None else leo
        return StateRow(t, self.master, self.cp.epoch, isr, n, n)

    def _after_cp(self, t: int, kind: Kind, b: int) -> None:
        if kind is not Kind.RESTART:
            return
        if b != self.master:
            self._follow(self.ix[b], self.master)
            self.fetched[self.ix[b]] = self.log_len[self.ix[b]]
            return
        self._reconcile(t, [s for s in self.slaves if self.cp.up[s]])

    def _reconcile(self, t: int, sources: list[int]) -> None:
        """Rule 6 (R5): the master's log is the truth; with `union` it first takes a longer slave log."""
        if self.p.reconcile is Reconcile.UNION:
            best = None
            m_len = int(self.log_len[0])
            for s in sources:
                i = self.ix[s]
                if self.log_len[i] > m_len and common_prefix(self.runs[i], self.runs[0]) == m_len and (
                        best is None or self.log_len[i] > self.log_len[self.ix[best]]):
                    best = s
            if best is not None:
                self._adopt(t, 0, self.ix[best])
                self._rebuild_leader_cache()
        for s in self.slaves:
            i = self.ix[s]
            self._follow(i, self.master)
            self.fetched[i] = self.log_len[i]

    def _end_view(self):
        for b in self.order:
            if self.cp.up[b]:
                i = self.ix[b]
                return runs_array(self.runs[i]), int(self.log_len[i]), True
        return runs_array([]), 0, False

    def _recover(self, t: int) -> int:
        was_down = not self.cp.up[self.master]
        if was_down:
            self._reconcile(t, list(self.slaves))
        return self.master
