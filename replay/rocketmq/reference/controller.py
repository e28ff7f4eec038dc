"""The `rocketmq-controller` family's reference (SPEC §3.5): a SyncStateSet, RocketMQ acks, controller
detection and elections (C7), zombie masters; the SyncStateSet rules are in `sync_state_set.py`."""

from __future__ import annotations

from collections.abc import Callable

from replay.policies import CONTROLLER_FIRST_SCAN_MS, FIRST_SYNC_STATE_CHECK_MS, RocketMQControllerPolicy
from replay.results import StateRow
from replay.rocketmq.control import C_CHECK, C_DETECT, C_ELECT, C_POLL, KEY, RouteClock
from replay.rocketmq.reference.group import GroupReference
from replay.rocketmq.reference.state import Entry, Msg, ZombieMaster, common_prefix, last_epoch
from replay.rocketmq.reference.sync_state_set import ControllerSyncStateSet
from replay.shared.reference.records import epoch_runs
from schemas.outcomes import Error
from schemas.trace import Kind
from schemas.units import MS


class ControllerReference(ControllerSyncStateSet, GroupReference):
    """SPEC §3.5: like Kafka with a SyncStateSet, RocketMQ acks and controller detection."""

    def __init__(self, policy: RocketMQControllerPolicy, unit: int, members: tuple[int, ...],
                 duration_us: int, clock: RouteClock | None = None) -> None:
        super().__init__(policy, unit, members, duration_us, clock)
        self.master: int | None = members[0]
        self.target: int | None = members[0]
        self.sss: list[int] = list(members)  # SyncStateSet, starts as every replica
        self.hw = 0
        self.iso_view: tuple[int, ...] | None = None  # SyncStateSet known to an isolated master
        self.zombie: ZombieMaster | None = None
        self.blocked = False  # the master has no eligible log yet (no SyncStateSet member alive)
        self.detect_key: int | None = None
        self.reincarnated = False
        self.housekeeping: dict[int, int] = {}  # slave -> when the master closes its silent HA connection (C-1)

    def _start(self) -> None:
        super()._start()
        self._push(FIRST_SYNC_STATE_CHECK_MS * MS, C_CHECK, "check")  # SPEC §3.7 C-1: 3000 ms after start

    def _leader_for_fetch(self) -> int | None:
        return None if self.master is None or self.blocked else self.master

    def _in_order(self, brokers) -> list[int]:
        return [b for b in self.order if b in brokers]

    # ----- serving and commit
    def _serving(self) -> int | None:
        """The broker the clients' route points to (R-1), if it takes writes."""
        tgt = self.target
        if tgt is None or not self.rep[tgt].up:
            return None
        if tgt == self.master and not self.blocked:
            # a master that restarted while isolated serves nothing until its new incarnation registers (C7)
            return None if self.reincarnated else tgt
        if self.zombie is not None and tgt == self.zombie.broker:
            return tgt
        return None

    def _view(self, b: int) -> tuple[int, ...]:
        if self.zombie is not None and b == self.zombie.broker:
            return self.zombie.view
        return self.iso_view if self.iso_view is not None else tuple(self.sss)

    def _hw_of(self, b: int) -> int:
        return self.zombie.hw if self.zombie is not None and b == self.zombie.broker else self.hw

    def _epoch_of(self, b: int) -> int:
        return self.zombie.epoch if self.zombie is not None and b == self.zombie.broker else self.epoch

    def _ack_point(self, b: int) -> int:
        """SPEC §3.5: all of the SyncStateSet with all_ack_in_sync_state_set, else in_sync_replicas copies."""
        if self.p.all_ack_in_sync_state_set:
            return self._hw_of(b)
        k = self.p.in_sync_replicas
        if k <= 1:
            return len(self.rep[b].log)
        if self.zombie is not None and b == self.zombie.broker:
            return self.zombie.ack
        ends = sorted((len(self.rep[x].log) if x == b else self.rep[x].fetched for x in self.order), reverse=True)
        return ends[k - 1] if k <= len(ends) else 0

    def _visible_point(self, b: int) -> int:
        """B.7: the confirm offset is the SyncStateSet minimum with allAck, else the master's max offset."""
        return self._hw_of(b) if self.p.all_ack_in_sync_state_set else len(self.rep[b].log)

    def _arrive(self, t: int, msg: Msg) -> None:
        """SPEC §3.5 min_insync_replicas (`CommitLog.asyncPutMessage`): refused before append while the serving
        master's SyncStateSet is below it. SPEC §3.7 C-2 (`SendMessageProcessor` maps the refusal to SYSTEM_ERROR;
        `DefaultMQProducerImpl` retries SYSTEM_ERROR on another group within retryTimesWhenSendFailed and
        sendMsgTimeout): the retry is routing's (C9), so a refusal here is final: the send's last attempt, or a
        SyncStateSet that only replication shrank (R2)."""
        srv = self._serving()
        if srv is None:
            self._fail(msg, Error.NO_LEADER)  # R2
            return
        if len(self._view(srv)) < self.p.min_insync_replicas:
            self._fail(msg, Error.IN_SYNC_REPLICAS_NOT_ENOUGH)  # refused before append (R2)
            return
        r = self.rep[srv]
        self._append(t, srv, self._epoch_of(srv), msg, self.p.slave_timeout_ms)
        if self.zombie is not None and srv == self.zombie.broker:
            self._zombie_commit(t)
        else:
            self._recompute_hw(t)
        if not self.p.all_ack_in_sync_state_set:
            self._mark_visible(t, r, len(r.log) - 1, len(r.log))

    def _zombie_commit(self, t: int) -> None:
        z = self.zombie
        if z.view == (z.broker,):
            n = len(self.rep[z.broker].log)
            if self.p.all_ack_in_sync_state_set:
                self._mark_visible(t, self.rep[z.broker], z.hw, n)
            z.hw = n
        self._ack_upto(t, z.broker, z.epoch, self._ack_point(z.broker))

    def _handlers(self) -> dict[str, Callable[[int, int], None]]:
        return {**super()._handlers(), "check": self._on_check, "housekeeping": self._on_housekeeping,
                "detect": self._on_detect, "elect": self._on_elect, "poll": self._on_poll, "refetch": self._on_poll}

    # ----- control (C7)
    def _detect(self, t: int) -> None:
        self.detect_key = t * KEY + C_DETECT
        self._push(t, C_DETECT, "detect")

    def _stop(self, t: int, b: int, kind: Kind) -> None:
        was_iso = self.rep[b].isolated
        self._lose_data(t, self.rep[b], kind)
        if b == self.master:
            if kind in (Kind.CRASH, Kind.SHUTDOWN) and not was_iso:
                self._detect(t)  # the controller sees the channel close
            elif self.detect_key is None:
                self._detect(self._scan_deadline(t))
        if self.zombie is not None and b == self.zombie.broker:
            self.zombie = None  # a stopped zombie refuses the connection; clients learn at their next poll
        self._connection_lost(t, b, kind, was_iso)

    def _scan_deadline(self, t: int) -> int:
        """C7 with SPEC §3.7 C-1 (`DefaultBrokerHeartbeatManager`): scans 2000 ms after start, then every
        controller_scan_ms; the first at or after t + controller_heartbeat_timeout_ms notices the silent master."""
        scan, first = self.p.controller_scan_ms * MS, CONTROLLER_FIRST_SCAN_MS * MS
        k = max(0, -(-(t + self.p.controller_heartbeat_timeout_ms * MS - first) // scan))
        return first + k * scan

    def _isolate(self, t: int, b: int) -> None:
        if b == self.master:
            self.iso_view = tuple(self.sss)
            if self.detect_key is None:
                self._detect(self._scan_deadline(t))
        else:
            self._connection_lost(t, b, Kind.ISOLATE, False)

    def _restart(self, t: int, b: int) -> None:
        self.housekeeping.pop(b, None)  # a new HA connection (C-1)
        if b == self.master:
            self.reincarnated = True
            if not self.rep[b].isolated:
                self._registers(t)
        self._member_back(t, b)

    def _registers(self, t: int) -> None:
        """C7: the master's new incarnation registers with the controller, which elects at once (before that
        instant's sends: a restarted broker serves nothing under its old epoch)."""
        self.detect_key = None
        self._elect(t)

    def _heal(self, t: int, b: int) -> None:
        self.housekeeping.pop(b, None)  # its connection speaks again before the housekeeping closed it (C-1)
        if self.zombie is not None and b == self.zombie.broker:
            self.zombie = None
        if b == self.master and self.rep[b].up:
            self.iso_view = None
            if self.reincarnated:
                self._registers(t)
            else:
                self.detect_key = None  # healed before the controller noticed
            self._recompute_hw(t)
        elif self.rep[b].up and self.master is not None and not self.blocked:
            r = self.rep[b]
            self._truncate(r, common_prefix(r.log, self.rep[self.master].log))  # an old master rejoins
        self._member_back(t, b)

    def _member_back(self, t: int, b: int) -> None:
        if not self.rep[b].alive:
            return
        if self.master is None:
            self._push(t, C_ELECT, "elect")  # an offline group elects when a member comes back
        elif self.blocked and b in self.sss:
            self._unblock(t)

    def _on_detect(self, t: int, _: int) -> None:
        if self.detect_key != t * KEY + C_DETECT:
            return
        self.detect_key = None
        self._elect(t)

    def _on_elect(self, t: int, _: int) -> None:
        if self.master is None:
            self._elect(t)

    def _elect(self, t: int) -> None:
        """Elect from the alive replicas (C1: the first in group order; its log the best eligible one)."""
        old, restarted = self.master, self.reincarnated
        self.reincarnated = False
        eligible = self._alive_members()
        # C7: a master that restarted while isolated serves nothing, so it is no zombie either: its new incarnation
        # never learnt that it led (as Kafka's rule 10, only the incarnation that led believes it leads)
        if old is not None and not restarted and self.rep[old].up and self.rep[old].isolated and old == self.target \
                and self.zombie is None:
            self.zombie = ZombieMaster(old, self.epoch, self.iso_view or (old,), self.hw, self._ack_point(old))
        self.iso_view = None
        if not eligible:
            self.master = None
            self._push(self._next_poll(t), C_POLL, "poll")  # the next poll finds no master
            return
        self.master = eligible[0]
        self.epoch += 1
        self.blocked = True
        self._unblock(t)
        if self.master != self.target:
            # clients (also those of a zombie) learn the new master at their next route poll
            self._push(self._next_poll(t), C_POLL, "poll")

    def _unblock(self, t: int) -> None:
        """The new master takes the best alive SyncStateSet log by (epoch, offset), or any alive replica's with
        enable_elect_unclean_master; without one it waits (C7)."""
        m = self.master
        alive = self._alive_members()
        pool = [b for b in alive if b in self.sss] or (alive if self.p.enable_elect_unclean_master else [])
        if not pool:
            return
        best = max(pool, key=lambda b: (last_epoch(self.rep[b].log), len(self.rep[b].log), -self.order.index(b)))
        self._adopt(t, self.rep[m], self.rep[best])
        self.blocked = False
        lead = self.rep[m].log
        for b in self.order:  # epoch truncation: every replica keeps the prefix it shares with the new master
            r = self.rep[b]
            if b != m and not (self.zombie is not None and b == self.zombie.broker):
                self._truncate(r, common_prefix(r.log, lead))
            if b != m:
                r.fetched = len(r.log)
                r.lcu = t
        self.sss = [m]  # R6a: the new SyncStateSet is the new master; slaves rejoin as they catch up
        self.housekeeping.clear()
        self.hw = len(lead)
        self._mark_visible(t, self.rep[m], 0, self.hw)

    def _on_poll(self, t: int, _: int) -> None:
        """SPEC §3.7 R-1: at a route poll clients learn the group's master of that moment (none if none)."""
        self.target = self.master
        self.zombie = None

    # ----- records
    def _state_row(self, t: int) -> StateRow:
        m = self.master
        shown = m if m is not None and self.rep[m].up and not self.blocked else None
        hw = self.hw if self.p.all_ack_in_sync_state_set else (len(self.rep[m].log) if shown is not None else None)
        return self._row(t, shown, tuple(self.sss), hw)

    def _availability(self) -> tuple[bool, int | None]:
        srv = self._serving()
        if srv is None or len(self._view(srv)) < self.p.min_insync_replicas:
            return True, None
        if not self.p.all_ack_in_sync_state_set and self.p.in_sync_replicas <= 1:
            return False, None
        return False, self._stall_from(srv, self._ack_point(srv), self.p.slave_timeout_ms)

    def _end_view(self):
        srv = self._serving()
        if srv is None:
            return epoch_runs([]), 0, False
        return epoch_runs(self.rep[srv].log), self._visible_point(srv), True

    def _recover(self, t: int) -> list[Entry]:
        """SPEC §4.1: a down master's new incarnation registers and the controller elects (every replica is
        eligible now: the first in group order, with the best SyncStateSet log); an offline or blocked group
        elects too; a master that is up keeps its role."""
        m = self.master
        reelect = m is None or not self.rep[m].up
        for r in self.rep.values():
            r.up, r.isolated = True, False
        self.zombie = None
        if reelect:
            self.master = self.order[0]
            self.epoch += 1
            self.blocked = True
        if self.blocked:
            self._unblock(t)
        return self.rep[self.master].log
