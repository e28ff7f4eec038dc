"""The `rocketmq` family's reference (SPEC §3.3): master/slave groups, no failover of roles."""

from __future__ import annotations

from replay.policies import BrokerRole, Reconcile, RocketMQPolicy
from replay.results import StateRow
from replay.rocketmq.control import RouteClock
from replay.rocketmq.reference.group import GroupReference
from replay.rocketmq.reference.state import Broker, Entry, Msg, common_prefix
from replay.shared.reference.records import epoch_runs
from schemas.outcomes import Error
from schemas.trace import Kind


class ClassicReference(GroupReference):
    """SPEC §3.3: master/slave, no failover of roles."""

    def __init__(self, policy: RocketMQPolicy, unit: int, members: tuple[int, ...], duration_us: int,
                 clock: RouteClock | None = None) -> None:
        super().__init__(policy, unit, members, duration_us, clock)
        self.master = members[0]
        self.slaves = members[1:]
        sync = policy.broker_role is BrokerRole.SYNC_MASTER and policy.in_sync_replicas > 1
        # Rule 4: SYNC_MASTER waits for in_sync_replicas - 1 slave copies (4.x: one); 1 makes it asynchronous.
        self.need = policy.in_sync_replicas - 1 if sync else 0

    def _leader_for_fetch(self) -> int:
        return self.master

    def _usable_slaves(self) -> list[int]:
        """Slaves SYNC_MASTER can wait for: up and reachable, from a reachable master (rule 4)."""
        if self.rep[self.master].isolated:
            return []
        return [s for s in self.slaves if self.rep[s].alive]

    def _coverage(self) -> int:
        """Entries of the master's log held by `need` slaves (the need-th largest slave log end)."""
        if self.need == 0:
            return len(self.rep[self.master].log)
        ends = sorted((self.rep[s].fetched for s in self.slaves), reverse=True)
        return ends[self.need - 1] if len(ends) >= self.need else 0

    def _arrive(self, t: int, msg: Msg) -> None:
        m = self.rep[self.master]
        if not m.up:
            self._fail(msg, Error.NO_LEADER)  # R2 (routing keeps this from happening: rule 5)
            return
        self._append(t, self.master, self.epoch, msg, self.p.slave_timeout_ms)
        msg.visible_us = t  # rule 5: visibility is at the master's append
        if self.need == 0:
            self._ack(t, msg)  # rule 4: ASYNC_MASTER acks at the master's append
        elif self.p.slave_not_available and len(self._usable_slaves()) < self.need:
            self._fail(msg, Error.SLAVE_NOT_AVAILABLE)  # rule 4: at once, stored on the master (4.x; R-6)
        else:
            self._ack_upto(t, self.master, self.epoch, self._coverage())

    def _progress(self, t: int, b: int) -> None:
        if self.need:
            self._ack_upto(t, self.master, self.epoch, self._coverage())  # rule 4: a slave's copy acks

    def _stop(self, t: int, b: int, kind: Kind) -> None:
        self._lose_data(t, self.rep[b], kind)

    def _isolate(self, t: int, b: int) -> None:
        pass  # rule 3: an isolated master still takes writes; its slaves cannot fetch (SPEC §2.2)

    def _heal(self, t: int, b: int) -> None:
        pass

    def _restart(self, t: int, b: int) -> None:
        if b != self.master:
            self._follow_master(self.rep[b])
            return
        self.epoch += 1  # R5: a new incarnation of the master
        self._reconcile(t, [s for s in self.slaves if self.rep[s].up])

    def _follow_master(self, r: Broker) -> None:
        self._truncate(r, common_prefix(r.log, self.rep[self.master].log))
        r.fetched = len(r.log)

    def _reconcile(self, t: int, sources: list[int]) -> None:
        """Rule 6 (R5): the master's log is the truth; with `union` it first takes a longer slave log."""
        m = self.rep[self.master]
        if self.p.reconcile is Reconcile.UNION:
            best = None
            for s in sources:
                r = self.rep[s]
                if len(r.log) > len(m.log) and common_prefix(r.log, m.log) == len(m.log) and (
                        best is None or len(r.log) > len(best.log)):
                    best = r
            if best is not None:
                self._adopt(t, m, best)
        for s in self.slaves:
            self._follow_master(self.rep[s])

    def _state_row(self, t: int) -> StateRow:
        m = self.rep[self.master]
        isr = (self.master, *self._usable_slaves())
        return self._row(t, self.master if m.up else None, isr, len(m.log))

    def _availability(self) -> tuple[bool, int | None]:
        if not self.rep[self.master].up or len(self._usable_slaves()) < self.need:
            return True, None
        return False, self._stall_from(self.master, self._coverage(), self.p.slave_timeout_ms) if self.need else None

    def _reader(self) -> Broker | None:
        """Rule 5: consumers read the master while it is up, else an up slave (R5: the first in group order)."""
        for b in self.order:
            if self.rep[b].up:
                return self.rep[b]
        return None

    def _end_view(self):
        r = self._reader()
        if r is None:
            return epoch_runs([]), 0, False
        return epoch_runs(r.log), len(r.log), True

    def _recover(self, t: int) -> list[Entry]:
        m = self.rep[self.master]
        was_down = not m.up
        for r in self.rep.values():
            r.up, r.isolated = True, False
        if was_down:
            self._reconcile(t, list(self.slaves))
        return m.log
