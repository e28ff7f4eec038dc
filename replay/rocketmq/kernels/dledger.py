"""The `dledger` family's kernel (SPEC §3.4 Raft groups)."""

from __future__ import annotations

from replay.policies import (
    DLedgerPolicy,
)
from replay.results import StateRow
from replay.rocketmq.control import (
    RouteClock,
    majority,
)
from replay.rocketmq.kernels.common import NONE
from replay.rocketmq.kernels.group import GroupReplay
from replay.rocketmq.kernels.steady import CommitRule
from replay.rocketmq.kernels.stretch import SteadyRule, SteadySegments
from replay.shared.kernels.arrays import (
    runs_array,
)
from schemas.outcomes import Error
from schemas.units import S


class DLedgerReplay(SteadySegments, GroupReplay):
    """SPEC §3.4 Raft groups; steady segments run in compiled code (`stretch`)."""

    answer_error = Error.IN_SYNC_REPLICAS_NOT_ENOUGH

    def __init__(self, policy: DLedgerPolicy, unit: int, members: tuple[int, ...], duration_us: int,
                 window_us: int = S, clock: RouteClock | None = None) -> None:
        super().__init__(policy, unit, members, duration_us, window_us, clock)
        self.q = majority(len(members))
        self.leader: int | None = members[0]
        self.commit = 0
        self.lead_for_cache = self.leader

    def _answer_ms(self) -> int:
        return self.p.max_wait_ack_ms

    def _data_leader(self) -> int | None:
        return self.leader

    def _serving(self) -> int | None:
        return self.leader if self.cp.writable() else None

    def _steady_rule(self) -> SteadyRule:
        ldr = self.leader
        up = ldr is not None and bool(self.cp.up[ldr])
        # an isolated leader commits only as a one-member group, its own majority (SPEC §3.7 R-4)
        commits = up and (not self.cp.iso[ldr] or self.q == 1)
        return SteadyRule(ldr, self._serving() is not None, ldr is not None and bool(self.cp.alive(ldr)),
                          CommitRule.DLEDGER, self.q, True, commits, self.commit)

    def _steady_done(self, commit: int, hw: int, expand: int | None) -> None:
        self.commit = commit

    def _blocked(self) -> bool:
        # R7: refusing (R-4: a leader without a reachable majority takes writes that cannot commit)
        return not self.cp.writable() or not self.cp.can_commit()

    def _ack_point_now(self, s: int) -> int | None:
        return self.commit

    def _state_row(self, t: int, leo: int | None = None, hw: int | None = None) -> StateRow:
        isr = tuple(b for b in self.order if self.cp.alive(b))
        if self.leader is None:
            return StateRow(t, None, self.cp.epoch, isr, None, None)
        return StateRow(t, self.leader, self.cp.epoch, isr,
                        int(self.log_len[self.ix[self.leader]]) if leo is None else leo,
                        self.commit if hw is None else hw)

    def on_leader_lost(self, t: int) -> None:
        self.leader = None

    def on_elect(self, t: int, new: int, voters: tuple[int, ...]) -> None:
        """Rule 3 with C1: the first voter leads with the best voter log (Raft order: last epoch, length)."""

        def rank(b):
            runs = self.runs[self.ix[b]]
            return (runs[-1][0] if runs else NONE, int(self.log_len[self.ix[b]]), -self.ix[b])

        best = max(voters, key=rank)
        ni = self.ix[new]
        self._adopt(t, ni, self.ix[best])
        self.leader = new
        for i, b in enumerate(self.order):
            if b != new:
                self._follow(i, new)
            self.fetched[i] = self.log_len[i] if self.cp.alive(b) else 0  # R4
        self._rebuild_leader_cache()
        ends = sorted((int(self.log_len[ni]) if b == new else int(self.fetched[self.ix[b]]) for b in self.order),
                      reverse=True)
        self.commit = ends[self.q - 1]
        self._mark_visible(t, new, 0, self.commit)

    def _end_view(self):
        ldr = self.leader
        if ldr is None or not self.cp.up[ldr]:
            return runs_array([]), 0, False
        return runs_array(self.runs[self.ix[ldr]]), self.commit, True

    def _recover(self, t: int) -> int:
        for b in self.order:
            self.cp.up[b], self.cp.iso[b] = True, False
        if self.leader is None:
            self._mark_visible = lambda *a: None  # type: ignore[method-assign]
            self.on_elect(t, self.order[0], self.order)
        return self.leader
