"""RocketMQ families: what the fault timeline alone decides (SPEC §3.3-3.5), shared by routing and the kernels.

A replay unit of the `rocketmq`, `dledger` and `rocketmq-controller` families is a broker group: its CommitLog
holds every queue of the group, and flush decisions count the dirty bytes of that log (SPEC §3.3 flush). Units
replay independently, in one shuffle, so where a message goes must be decided before any unit is replayed, from
the produce events and the small fault timeline (crash, power_loss, disk_loss, shutdown, isolate, restart, heal).
This module holds what that decision is made of: a *control plane* per group (who leads, who clients write to,
what the NameServer knows), computed from faults only, and its timeline; the router built on it (SPEC §3.3 rules
1-3) is `replay/rocketmq/routing.py`.

The kernels (`replay/rocketmq/kernels/`) run the same control plane incrementally, so routing and replay agree on
every instant at which a group takes writes. The reference interpreter (`replay/rocketmq/reference/`) has its own,
independent implementation of these rules; the differential tests compare the two.

Modelling choices where SPEC leaves room (each one keeps units independent; all are in the README notes):

C1 Election winner. SPEC §3.4 rule 3 elects the longest log and §3.5 the highest (epoch, offset): both depend on
   replication, which routing cannot see. replab splits the election in two: *who* leads is decided by the fault
   timeline (the first eligible member in group order: up and not isolated), and the winner's log becomes the
   best eligible log (longest / highest (last epoch, length), ties first in group order), as if it had caught up
   from that member before taking writes. Data outcomes are those of SPEC's rule; only the leader's identity can
   differ, and routing knows it exactly.
C2 Cross-group retries happen only for failures the fault timeline predicts: the chosen group takes no writes
   (SPEC §3.3 rule 3, §3.4 rule 1), or, for DLedger, no majority of the group is up and reachable at any instant
   of [send, send + max_wait_ack_ms] (the entry cannot commit: the send fails with IN_SYNC_REPLICAS_NOT_ENOUGH at
   send + max_wait_ack_ms and is retried at the next group then, §3.4 rule 2), or, for controller mode, the
   master refuses before append because its SyncStateSet as the faults decide it is below min_insync_replicas
   (C9: retried at once). Failures that depend on replication (a commit that times out behind a stalled
   follower, a SyncStateSet that only replication shrinks, a master that dies before a message commits) fail in
   the unit with their own error.
C3 SPEC §3.4 R-8: the entry a DLedger attempt appended stays in its group's log whether or not the send is
   retried (C2). Routing notes, per send, the attempts that were appended and then retried, and hands the group
   that replays the message the ones made there (payload `delay`, `pack_delay`); the engines append them at their
   instants as entries of that message (their answers are not the send's) and judge its fate over all its
   copies. A send that fails in routing is replayed at the group of its first such copy. Units replay
   independently, so a copy at a group other than the one that replays the message (a retry at another group,
   C5) is not replayed: that group's log lacks the entry, and the message's fate counts only its replaying
   group's copies. With a single group in the route every attempt is at that group and nothing is left out.
C4 NameServer (SPEC §3.3 rule 1, §3.7 R-5): the group's registered master (leader) is dropped at once when it
   crashes or shuts down while reachable (`RouteInfoManager.onChannelDestroy`), 120000 ms after it loses power or
   disk or is isolated (a crash while isolated is not seen either), and registers again when it is reachable and
   still master; a newly elected leader registers at its election; a DLedger leader that steps down while
   reachable registers again as a follower (`DLedgerRoleChangeHandler` → `BrokerController.changeToSlave`), so
   its group has no master listed. A route holds the queues of exactly the groups with a registered master
   (`MQClientInstance.topicRouteData2TopicPublishInfo` skips a broker name without brokerId 0). Producer polls
   every route_refresh_ms from the trace's route_poll_phase_us (SPEC §2; the route at 0 holds every group) see
   the state after every event of their instant; the route used by a send at t is the last poll strictly before
   t, because derived events such as polls apply after trace events of the same instant (SPEC §2.2).
C8 A producer whose route holds no queue asks the NameServer again at every send (RocketMQ's
   `DefaultMQProducerImpl.tryToFindTopicPublishInfo` refreshes while `TopicPublishInfo.ok()` is false), so such
   a send uses the groups registered at its own instant (after that instant's trace events) instead of an empty
   route. R-5: the first fresh route that holds a queue replaces the cached one, with the masters of that
   moment, until the next poll. replab takes that fetch at the first instant after the empty poll at which any
   group has a registered master (after every event of that instant, as if a send were made then): the
   `RouteClock`'s refetches, which every group's control plane replays as a poll (`routing.refetches`).
C5 Queue choice on failover (SPEC §3.3 rule 3): the next queue in route order whose group differs from the
   failed one; with a single group in the route, the next queue (RocketMQ's fallback selector), so a DLedger
   retry may return to the same group. The route of a send is fixed at its first attempt (RocketMQ fetches
   TopicPublishInfo once per send). A retry needs time left: its instant must be before produce +
   delivery_timeout_ms (sendMsgTimeout).
C6 DLedger (SPEC §3.4 rule 3): a leader that is down, or isolated, or cannot reach a majority (itself
   included) for heartbeat_ms × max_heartbeat_leak steps down (a dead leader at once: the group has no leader
   from that instant). Followers notice a dead or isolated leader that long after it went silent, lose a first
   vote in its term (vote_wait_ms, SPEC §3.7 R-7) and elect vote_delay_ms later; after a step-down the
   election runs vote_delay_ms after a majority is up and reachable.
   A leader takes writes while it is up, not isolated and clients know it (R-1 below). `shutdown` is detected
   like a crash (DLedger has no controlled leadership hand-over).
C7 Controller (SPEC §3.5): a master that crashes or shuts down while reachable is noticed at once (at that
   instant, after its trace events); one that loses power or disk or is isolated at the first controller scan
   tick (at 2000 ms, then every controller_scan_ms: SPEC §3.7 C-1) at least controller_heartbeat_timeout_ms
   later, or when its new incarnation registers (restart; the election then runs at once, before that instant's
   sends), whichever is first; an isolation healed before then changes nothing.
   Clients of an isolated old master (a "zombie", which still takes writes, SPEC §3.3 rule 3) keep writing to
   it until their next route poll, its heal or its stop (then it refuses, R-1), whatever elections happen
   meanwhile. A master that restarted while isolated serves nothing until its new incarnation registers. A group
   without an eligible member elects whenever one comes back. The kernel adds one data-dependent case the router
   cannot see: no SyncStateSet member is eligible (and no unclean election); that group takes no writes
   (`no_leader`) until one is.
C9 Controller refusals (SPEC §3.7 C-2; `SendMessageProcessor` answers IN_SYNC_REPLICAS_NOT_ENOUGH as
   SYSTEM_ERROR, one of `DefaultMQProducerImpl`'s retryResponseCodes, so the producer retries another group at
   once, within retry_times_when_send_failed and the send timeout). The refusal depends on the SyncStateSet,
   which replication changes, while units replay independently. Routing therefore tracks the SyncStateSet *as the
   faults decide it*, an upper bound of the replayed one: every member is in at start; a slave leaves at its
   crash or shutdown, or when the master's HA housekeeping closes its silent connection
   (ha_housekeeping_interval_ms after a power loss, disk loss or isolation), if the master is up and reachable
   then (SPEC §3.7 C-1); an election resets the set to the new master and the slaves that are up and reachable;
   a slave that comes back is counted in (it rejoins once it catches up, which routing cannot see); an isolated
   master (and a zombie) keeps the size it knew when it was cut off. A send whose client-known master has fewer
   than min_insync_replicas there is refused and retried on another group at the same instant; with no retry
   left it goes to that group, which refuses it (`in_sync_replicas_not_enough`). Because the bound is an upper
   bound, a predicted refusal is always a real one (or C7's no-eligible-log case, which takes no writes either):
   every shrink it applies the replay applies too, and a slave out of the set cannot rejoin while it is away.
   Refusals that only replication decides (a slave removed by the ha_max_time_slave_not_catchup_ms check, one
   back but not yet caught up, the set of a new master before its slaves report) are not predicted and fail in
   the unit, as C2 says.
R-1 (SPEC §3.7; `MQClientInstance` pollNameServerInterval, `DefaultMQProducerImpl.tryToFindTopicPublishInfo`):
   `dledger` and `rocketmq-controller` clients learn a group's master only from their route: the polls (every
   route_refresh_ms from the trace's phase; the route at 0 is the initial one, first member as master) and R-5's
   refetches of an empty route (C8). `target` is the client-known master, set at each of them (after the events
   of its instant) to the group's master of that moment (None if none); a send to the group is taken only if
   that broker is still its master (or a zombie) and takes writes, else it is refused at once and retried on
   another group (rule 3). Polls are scheduled lazily, at the first poll at or after a leader change;
   re-electing the client-known broker needs none.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from replay.events import PartitionEvents
from replay.policies import (
    CONTROLLER_FIRST_SCAN_MS,
    NAMESERVER_EXPIRY_MS,
    DLedgerPolicy,
    Policy,
    RocketMQControllerPolicy,
)
from schemas.trace import Kind
from schemas.units import MS

INF = np.iinfo(np.int64).max // 64
# Same-instant order (SPEC §2.2): trace kinds 0-8 (Kind), then derived events in this order.
C_NS = 9  # the NameServer drops a silent master
C_DETECT = 10  # controller notices a dead master; a DLedger leader steps down
C_ELECT = 11  # election
C_CHECK = 12  # controller SyncStateSet check tick (engines only)
C_SWITCH = 13  # clients reach the new leader
C_POLL = 14  # producer route poll (clients of a zombie master learn the new one)
C_ARRIVE = 15  # a send retried at another group arrives (DLedger max_wait_ack failover)
C_TIMEOUT = 16  # broker timeouts and client deadlines (statuses only)
C_FLUSH = 17  # async flush ticks (last: writes of the instant are on the page cache before the flush)
C_LAST = 31
KEY = 32  # key = ts_us * KEY + code


def key_of(ts_us, code):
    return ts_us * KEY + code


#: C3: the produce payload `delay` (`RouteOutput.delay_us`) holds, in its low COPY_SHIFT bits, the µs from the
#: produce to the arrival of the send's last attempt at the group that replays it, and above them the attempts at
#: that group whose entries stay behind: bit k for the one that arrived k × max_wait_ack_ms after the produce
#: (retry_times_when_send_failed ≤ 16 keeps k small; sends last far less than 2^40 µs).
COPY_SHIFT = 40


def pack_delay(arrival_us, copies):
    return arrival_us | (copies << COPY_SHIFT)


def unpack_delay(delay):
    """(arrival offset, copies mask) of payload `delay` values (`pack_delay`)."""
    return delay & ((1 << COPY_SHIFT) - 1), delay >> COPY_SHIFT


STOPS = (Kind.CRASH, Kind.POWER_LOSS, Kind.DISK_LOSS, Kind.SHUTDOWN)


def majority(size: int) -> int:
    return size // 2 + 1


@dataclass(frozen=True)
class RouteClock:
    """When the producers' route changes (SPEC §3.7 R-1, R-5), the same for every group of a trace.

    `phase_us`: polls at phase_us + k × route_refresh_ms (k ≥ 0), the trace manifest's route_poll_phase_us; the
    route at time 0 is the initial one (every group, first member as master). `refetch_us`: the instants at which
    a producer whose polled route held no queue fetched a fresh, non-empty one (R-5): there every group's
    client-known master becomes its master of that moment, until the next poll. Routing derives them from every
    group's NameServer registration (`route_model`); a group's engines only replay them."""

    phase_us: int = 0
    refetch_us: tuple[int, ...] = ()

    def poll_at(self, t: int, refresh_ms: int) -> int:
        """The first route poll at or after t that can teach clients anything (the route at 0 is the initial
        one, so a poll at 0 teaches nothing)."""
        r = refresh_ms * MS
        p = self.phase_us + max(0, -(-(t - self.phase_us) // r)) * r
        return p if p > 0 else r

    def last_poll(self, ts: np.ndarray, refresh_ms: int) -> np.ndarray:
        """The last poll strictly before each instant; 0 (the initial route) where none is after time 0."""
        r = refresh_ms * MS
        k = -(-(np.asarray(ts, dtype=np.int64) - self.phase_us) // r) - 1
        return np.where(k < 0, 0, self.phase_us + k * r)


# ====================================================================================== control plane
@dataclass
class ControlState:
    """A group's control state after one event (what routing samples)."""

    key: int
    writable: bool  # a send reaching the group now is taken (SPEC §3.3 rule 3, §3.4 rule 1)
    registered: bool  # the NameServer lists the group's master (SPEC §3.3 rule 1)
    alive: int  # members up and not isolated (DLedger quorum)


class ControlPlane:
    """Fault-timeline state of one group: liveness, leader, clients' target, NameServer registration.

    Trace events go to `trace()`; derived events are kept in a heap and applied by `pop()` in key order.
    `hooks` (the kernel) is told of elections, step-downs and client switches, to apply their data effects.
    """

    def __init__(self, policy: Policy, members: tuple[int, ...], hooks=None, clock: RouteClock | None = None) -> None:
        self.p = policy
        self.members = tuple(members)
        self.hooks = hooks
        self.clock = clock or RouteClock()
        self.up = {b: True for b in members}
        self.iso = {b: False for b in members}
        self.leader: int | None = members[0]  # master / leader; None while the group has none
        self.epoch = 0
        self.target: int | None = members[0]  # the broker clients send to
        self.heap: list[tuple[int, int, str, int, int]] = []
        self.seq = 0
        self.gen: dict[str, int] = {}
        # NameServer (C4)
        self.reg_broker: int | None = members[0]
        self.registered = True
        self.ns_pending = False
        self.handlers = self._handlers()
        self.refetch_i = 0
        self._next_refetch()

    def _handlers(self) -> dict[str, Callable[[int, int], None]]:
        """Each derived event's handler, by the name it is scheduled under (subclasses add their own)."""
        return {"ns": self._on_ns, "poll": self._on_poll, "refetch": self._on_refetch}

    # ------------------------------------------------------------------------------------ plumbing
    def alive(self, b: int) -> bool:
        return self.up[b] and not self.iso[b]

    def alive_count(self) -> int:
        return sum(1 for b in self.members if self.alive(b))

    def _push(self, t: int, code: int, what: str, arg: int = 0) -> None:
        """Schedule a derived event; scheduling `what` again supersedes the earlier one."""
        g = self.gen.get(what, 0) + 1
        self.gen[what] = g
        self.seq += 1
        heapq.heappush(self.heap, (key_of(t, code), self.seq, what, arg, g))

    def _cancel(self, what: str) -> None:
        self.gen[what] = self.gen.get(what, 0) + 1

    def next_key(self) -> int:
        while self.heap and self.heap[0][4] != self.gen.get(self.heap[0][2], 0):
            heapq.heappop(self.heap)
        return self.heap[0][0] if self.heap else INF

    def pop(self) -> int:
        """Apply the next derived event; returns its key."""
        k = self.next_key()
        _, _, what, arg, _ = heapq.heappop(self.heap)
        self.handlers[what](k // KEY, arg)
        return k

    def writable(self) -> bool:
        raise NotImplementedError

    def state(self, key: int) -> ControlState:
        return ControlState(key, self.writable(), self.registered, self.alive_count())

    # ----------------------------------------------------------------------------- trace events
    def trace(self, t: int, kind: Kind, b: int) -> None:
        if b not in self.up:
            return
        was_iso = self.iso[b]
        if kind in STOPS:
            self.up[b] = False
        elif kind is Kind.ISOLATE:
            self.iso[b] = True
        elif kind is Kind.RESTART:
            self.up[b] = True
        elif kind is Kind.HEAL:
            self.iso[b] = False
        self._nameserver(t, kind, b, was_iso)
        self._rules(t, kind, b, was_iso)

    def _rules(self, t: int, kind: Kind, b: int, was_iso: bool) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------------- NameServer (C4)
    def _nameserver(self, t: int, kind: Kind, b: int, was_iso: bool) -> None:
        if b != self.reg_broker:
            return
        if kind in (Kind.CRASH, Kind.SHUTDOWN) and not was_iso:
            self.registered = False  # its connection closes
            self.ns_pending = False
            self._cancel("ns")
        elif kind in STOPS or kind is Kind.ISOLATE:
            if self.registered and not self.ns_pending:
                self.ns_pending = True
                self._push(t + NAMESERVER_EXPIRY_MS * MS, C_NS, "ns")
        elif self.alive(b):
            self.ns_pending = False
            self._cancel("ns")
            self.registered = self._is_master(b)  # a broker that is no longer master registers as a slave

    def _is_master(self, b: int) -> bool:
        return self.leader == b

    def _on_ns(self, t: int, _: int) -> None:
        self.ns_pending = False
        self.registered = False

    # ------------------------------------------------------------------- route polls (SPEC §3.7 R-1)
    def _poll_at(self, t: int) -> int:
        """The first route poll at or after t (polls every route_refresh_ms from the trace's route-poll phase; the
        route at 0 is the initial one, every group with its first member as master)."""
        return self.clock.poll_at(t, self.p.route_refresh_ms)

    def _schedule_poll(self, t: int) -> None:
        """R-1: clients learn the group's master only from the NameServer route (`MQClientInstance`
        pollNameServerInterval): at their next poll, which sees the state after every event of its instant."""
        self._push(self._poll_at(t), C_POLL, "poll")

    def _on_poll(self, t: int, _: int) -> None:
        self.target = self.leader  # the group's master of that moment, None if it has none
        if self.hooks is not None:
            self.hooks.on_switch(t)

    def _next_refetch(self) -> None:
        if self.refetch_i < len(self.clock.refetch_us):
            self._push(self.clock.refetch_us[self.refetch_i], C_POLL, "refetch")
            self.refetch_i += 1

    def _on_refetch(self, t: int, arg: int) -> None:
        """R-5 (SPEC §3.7): the fresh route an empty one was replaced with names every group's master of now."""
        self._next_refetch()
        self.handlers["poll"](t, arg)

    def _register_leader(self, b: int) -> None:
        self.reg_broker = b
        self.registered = True
        self.ns_pending = False
        self._cancel("ns")


class ClassicControlPlane(ControlPlane):
    """SPEC §3.3: the master never changes; its queues take writes while it is up (rules 3, 5)."""

    def writable(self) -> bool:
        return self.up[self.members[0]]

    def _is_master(self, b: int) -> bool:
        return b == self.members[0]

    def _rules(self, t: int, kind: Kind, b: int, was_iso: bool) -> None:
        if b == self.members[0] and kind is Kind.RESTART:
            self.epoch += 1  # a new incarnation of the master appends under a new epoch


class DLedgerControlPlane(ControlPlane):
    """SPEC §3.4 rule 3 with C1 and C6."""

    def __init__(self, policy: DLedgerPolicy, members: tuple[int, ...], hooks=None,
                 clock: RouteClock | None = None) -> None:
        super().__init__(policy, members, hooks, clock)
        self.q = majority(len(members))
        self.detect_us = policy.heartbeat_ms * policy.max_heartbeat_leak * MS
        self.vote_us = policy.vote_delay_ms * MS
        self.wait_us = policy.vote_wait_ms * MS
        self.hb_us = policy.heartbeat_ms * MS
        self.elected_at: int | None = None  # None: the initial leader, leading since before the trace
        self.silent_since: int | None = None  # when the current leader stopped reaching the group
        self.waiting = False  # leaderless, noticed, waiting for a majority to vote
        self.stepdown_pending = False

    def _handlers(self) -> dict[str, Callable[[int, int], None]]:
        return {**super()._handlers(), "stepdown": self._on_stepdown, "elect": self._on_elect}

    def writable(self) -> bool:
        """R-1: the client-known broker (`target`, set at route polls) is still the leader and is up. R-4
        (`DLedgerServer.handleAppend` checks only leadership): an isolated leader takes writes too, until it
        steps down; they cannot commit (C2 retries them elsewhere)."""
        ldr = self.leader
        return ldr is not None and self.target == ldr and self.up[ldr]

    def can_commit(self) -> bool:
        """The leader reaches a majority (itself included): an entry it takes can commit (C2). SPEC §3.7 R-4: a
        one-member group is its own majority, so its leader commits while isolated too."""
        ldr = self.leader
        return ldr is not None and self.up[ldr] and self._reach() >= self.q

    def _last_heartbeat(self, t: int) -> int:
        """R-3 (SPEC §3.7, `DLedgerLeaderElector`): the leader's last heartbeat round before a failure at t: the
        greatest multiple of heartbeat_ms strictly before t, or its election instant (a new leader heartbeats at
        once, lastSendHeartBeatTime = -1) if later."""
        tick = (t - 1) // self.hb_us * self.hb_us
        return tick if self.elected_at is None else max(tick, self.elected_at)

    def _election_after_loss(self, last: int) -> int:
        """R-7 (SPEC §3.7, `DLedgerLeaderElector.maintainAsCandidate`): followers notice the loss detect_us after
        the last heartbeat (R-3); their first vote is in the lost leader's term, where every member has voted, so
        it fails, and it ends only at its wait (vote_wait_ms), the lost leader never answering; the vote that
        elects runs vote_delay_ms later."""
        return last + self.detect_us + self.wait_us + self.vote_us

    def _reach(self) -> int:
        ldr = self.leader
        return 1 if self.iso[ldr] else self.alive_count()

    def _quorum_check(self, t: int) -> None:
        """A leader that cannot reach a majority steps down detect_us later unless it reaches one again (C6)."""
        if self.leader is None or not self.up[self.leader]:
            return
        if self._reach() < self.q:
            if not self.stepdown_pending:
                self.stepdown_pending = True
                self._push(self._last_heartbeat(t) + self.detect_us, C_DETECT, "stepdown")
        elif self.stepdown_pending:
            self.stepdown_pending = False
            self._cancel("stepdown")

    def _rules(self, t: int, kind: Kind, b: int, was_iso: bool) -> None:
        ldr = self.leader
        if b == ldr and kind in STOPS:
            silent = self.silent_since if was_iso and self.silent_since is not None else t
            last = self._last_heartbeat(silent)  # followers count from the last heartbeat they received
            self._lose_leader(t)
            self._push(max(self._election_after_loss(last), t), C_ELECT, "elect")
            return
        if b == ldr and kind is Kind.ISOLATE:
            self.silent_since = t
        if b == ldr and kind is Kind.HEAL:
            self.silent_since = None
            self._cancel("elect")
        if ldr is not None:
            self._quorum_check(t)
        elif self.waiting and kind in (Kind.RESTART, Kind.HEAL) and self.alive_count() >= self.q:
            self.waiting = False
            self._push(t + self.vote_us, C_ELECT, "elect")

    def _lose_leader(self, t: int) -> None:
        self.leader = None
        self.silent_since = None
        self.stepdown_pending = False
        self._cancel("stepdown")
        self._schedule_poll(t)  # the next poll tells clients the group has no master
        if self.hooks is not None:
            self.hooks.on_leader_lost(t)

    def _on_stepdown(self, t: int, _: int) -> None:
        isolated = self.iso[self.leader]
        if not isolated and self.reg_broker == self.leader and self.registered:
            # a leader that steps down while it reaches the NameServer registers again as a follower
            # (`DLedgerRoleChangeHandler` → `BrokerController.changeToSlave`): the group has no master listed
            self.registered = False
            self.ns_pending = False
            self._cancel("ns")
        self._lose_leader(t)
        if isolated:
            return  # followers noticed at this same instant; the election is scheduled below
        self.waiting = True

    def _on_elect(self, t: int, _: int) -> None:
        if self.leader is not None:
            return
        voters = [b for b in self.members if self.alive(b)]
        if len(voters) < self.q:
            self.waiting = True
            return
        self.waiting = False
        self.leader = voters[0]
        self.elected_at = t
        self.epoch += 1
        self._register_leader(voters[0])
        if self.hooks is not None:
            self.hooks.on_elect(t, voters[0], tuple(voters))
        if voters[0] != self.target:
            self._schedule_poll(t)  # re-electing the client-known broker needs no poll
        self._quorum_check(t)

    def trace(self, t: int, kind: Kind, b: int) -> None:
        ldr = self.leader
        super().trace(t, kind, b)
        if ldr is not None and b == ldr and kind is Kind.ISOLATE:
            # followers stop hearing the isolated leader: they elect as after a crash
            self._push(self._election_after_loss(self._last_heartbeat(t)), C_ELECT, "elect")


class ControllerControlPlane(ControlPlane):
    """SPEC §3.5 with C1 and C7."""

    def __init__(self, policy: RocketMQControllerPolicy, members: tuple[int, ...], hooks=None,
                 clock: RouteClock | None = None) -> None:
        super().__init__(policy, members, hooks, clock)
        self.reincarnated = False  # the master restarted while its death was not yet noticed
        self.detect_pending = False
        self.zombie: int | None = None  # a replaced master, isolated, that still believes it leads (C7)
        # C9: the SyncStateSet as the faults decide it (an upper bound of the replayed one)
        self.maybe_in = {b: True for b in members}  # False: certainly out of the SyncStateSet
        self.hk: dict[int, int] = {}  # slave -> when the master's HA housekeeping closes its silent connection
        self.frozen: dict[int, int] = {}  # isolated master -> SyncStateSet size it knew when it was cut off

    def _handlers(self) -> dict[str, Callable[[int, int], None]]:
        return {**super()._handlers(), "housekeeping": self._on_housekeeping, "detect": self._on_detect,
                "elect": self._on_elect}

    def writable(self) -> bool:
        """R-1: the client-known broker is still the master (or a zombie that believes it is) and is up."""
        tgt = self.target
        if tgt is None or not self.up[tgt]:
            return False
        if tgt == self.leader:
            # a master that restarted while isolated serves nothing until its new incarnation registers (C7)
            return not self.reincarnated
        return tgt == self.zombie

    def refuses(self) -> bool:
        """C9 (SPEC §3.7 C-2): the broker clients write to takes writes but refuses them before append
        (IN_SYNC_REPLICAS_NOT_ENOUGH, `CommitLog.asyncPutMessage`) because its SyncStateSet, as far as the faults
        decide it, is below min_insync_replicas. An isolated master (and a zombie) uses the set it knew when it
        was cut off."""
        tgt = self.target
        if self.p.min_insync_replicas <= 1 or not self.writable():
            return False
        if self.iso[tgt]:
            size = self.frozen.get(tgt, len(self.members))
        else:
            size = 1 + sum(1 for b in self.members if b != tgt and self.maybe_in[b])
        return size < self.p.min_insync_replicas

    def _sync_state(self, t: int, kind: Kind, b: int, was_iso: bool) -> None:
        """C9 with SPEC §3.7 C-1 (`AutoSwitchHAService.removeConnection`, `MessageStoreConfig.haHousekeepingInterval`):
        a slave leaves the SyncStateSet at its crash or shutdown, or ha_housekeeping_interval_ms after it lost
        power or disk or was isolated, if the master is up and reachable then; it may rejoin once it is back."""
        m = self.leader
        if b == m:
            if kind is Kind.ISOLATE:
                self.frozen[b] = 1 + sum(1 for x in self.members if x != b and self.maybe_in[x])
            return
        if kind in (Kind.RESTART, Kind.HEAL):
            self.hk.pop(b, None)
            self.maybe_in[b] = True  # it rejoins when it catches up, which routing cannot see: maybe in
            return
        if m is None or not self.alive(m) or not self.maybe_in[b]:
            return  # an unreachable master changes nothing; a slave already out stays out while it is away
        if kind in (Kind.CRASH, Kind.SHUTDOWN) and not was_iso:
            self.hk.pop(b, None)
            self.maybe_in[b] = False
        elif b not in self.hk:
            self.hk[b] = t + self.p.ha_housekeeping_interval_ms * MS
            self.seq += 1  # one pending closure per slave: pushed under the current generation, never superseded
            heapq.heappush(self.heap, (key_of(self.hk[b], C_CHECK), self.seq, "housekeeping", b,
                                       self.gen.get("housekeeping", 0)))

    def _on_housekeeping(self, t: int, b: int) -> None:
        if self.hk.get(b) != t:
            return  # the slave came back (or an election reset the set) meanwhile
        del self.hk[b]
        m = self.leader
        if m is not None and b != m and self.alive(m):
            self.maybe_in[b] = False

    def _scan_deadline(self, t: int) -> int:
        """C7 with SPEC §3.7 C-1 (`DefaultBrokerHeartbeatManager`): heartbeat scans run 2000 ms after start, then
        every controller_scan_ms; the first at or after t + controller_heartbeat_timeout_ms notices."""
        scan, first = self.p.controller_scan_ms * MS, CONTROLLER_FIRST_SCAN_MS * MS
        due = t + self.p.controller_heartbeat_timeout_ms * MS
        return first + max(0, -(-(due - first) // scan)) * scan

    def _rules(self, t: int, kind: Kind, b: int, was_iso: bool) -> None:
        self._sync_state(t, kind, b, was_iso)
        m = self.leader
        if b == m:
            if kind in (Kind.CRASH, Kind.SHUTDOWN) and not was_iso:
                self._detect(t)  # the controller sees the channel close
            elif (kind in STOPS or kind is Kind.ISOLATE) and not self.detect_pending:
                self._detect(self._scan_deadline(t))
            elif kind is Kind.RESTART:
                self.reincarnated = True
                if not self.iso[b]:
                    self._registers(t)
            elif kind is Kind.HEAL and self.up[b]:
                if self.reincarnated:
                    self._registers(t)
                else:
                    self.detect_pending = False
                    self._cancel("detect")  # an isolation healed before the deadline changes nothing
        if b == self.zombie and kind in (*STOPS, Kind.HEAL):
            self.zombie = None  # a zombie that stops refuses, one that heals learns it is no master
        if m is None and self.alive(b):
            self._push(t, C_ELECT, "elect")  # an offline group elects when a member comes back

    def _detect(self, t: int) -> None:
        self.detect_pending = True
        self._push(t, C_DETECT, "detect")

    def _registers(self, t: int) -> None:
        """The master's new incarnation registers: the controller elects at once, before it serves anyone."""
        self.detect_pending = False
        self._cancel("detect")
        self._elect(t)

    def _on_detect(self, t: int, _: int) -> None:
        self.detect_pending = False
        self._elect(t)

    def _on_elect(self, t: int, _: int) -> None:
        if self.leader is None:
            self._elect(t)

    def _elect(self, t: int) -> None:
        old, restarted = self.leader, self.reincarnated
        self.reincarnated = False
        # C7: a master that restarted while isolated never learnt that it led: no zombie (reference `_elect`)
        if self.zombie is None and old is not None and not restarted and old == self.target and self.up[old] \
                and self.iso[old]:
            self.zombie = old  # clients keep writing to the isolated master they know until their next poll
        eligible = [b for b in self.members if self.alive(b)]
        if not eligible:
            self.leader = None
            if self.hooks is not None:
                self.hooks.on_offline(t)
            self._schedule_poll(t)
            return
        new = eligible[0]
        self.leader = new
        self.epoch += 1
        # C9: the new SyncStateSet is the new master; slaves that are back may rejoin, the others are out
        self.maybe_in = {b: self.alive(b) for b in self.members}
        self.hk.clear()
        self._register_leader(new)
        if self.hooks is not None:
            self.hooks.on_elect(t, new, tuple(eligible))
        if new != self.target:
            self._schedule_poll(t)  # clients learn the new master at their next route poll

    def _on_poll(self, t: int, _: int) -> None:
        self.zombie = None
        super()._on_poll(t, _)


CONTROL_CLASSES = {"rocketmq": ClassicControlPlane, "dledger": DLedgerControlPlane,
                   "rocketmq-controller": ControllerControlPlane}


def control_plane(policy: Policy, members: tuple[int, ...], hooks=None,
                  clock: RouteClock | None = None) -> ControlPlane:
    return CONTROL_CLASSES[policy.family](policy, members, hooks, clock)


# ==================================================================================== route model
@dataclass
class GroupTimeline:
    """A group's control states after every change, keyed (SPEC §2.2 order): a step function."""

    keys: np.ndarray  # int64, sorted; keys[0] = -1 (the initial state)
    writable: np.ndarray  # bool: a send the clients make now is taken
    registered: np.ndarray  # bool
    quorum: np.ndarray  # bool: DLedger: the leader reaches a majority (an entry can commit)
    refused: np.ndarray  # bool: controller: the client-known master refuses before append (C9)

    def at(self, query: np.ndarray) -> np.ndarray:
        """Index of the state in force at each query key (the last change at or before it)."""
        return np.searchsorted(self.keys, query, side="right") - 1


def group_timeline(policy: Policy, members: tuple[int, ...], control: PartitionEvents,
                   duration_us: int, clock: RouteClock | None = None) -> GroupTimeline:
    """Run the control plane over the whole fault timeline and record its state after each event."""
    cp = control_plane(policy, members, clock=clock)
    q = majority(len(members))
    def quorum() -> bool:
        return cp.can_commit() if isinstance(cp, DLedgerControlPlane) else cp.alive_count() >= q

    def refused() -> bool:
        return cp.refuses() if isinstance(cp, ControllerControlPlane) else False

    rows = [(-1, cp.writable(), cp.registered, quorum(), refused())]
    mine = np.isin(control.broker_id, np.array(members, dtype=np.int64))
    ts, kinds, bs = control.broker_ts[mine], control.broker_kind[mine], control.broker_id[mine]
    j = 0
    end_key = key_of(duration_us, C_LAST)
    while True:
        tk = int(key_of(ts[j], kinds[j])) if j < len(ts) else INF
        dk = cp.next_key()
        k = min(tk, dk)
        if k > end_key:
            break
        if tk <= dk:
            cp.trace(int(ts[j]), Kind(int(kinds[j])), int(bs[j]))
            j += 1
        else:
            cp.pop()
        state = (cp.writable(), cp.registered, quorum(), refused())
        if state != rows[-1][1:]:
            if rows[-1][0] == k:
                rows[-1] = (k, *state)
            else:
                rows.append((k, *state))
    arr = list(zip(*rows, strict=True))
    return GroupTimeline(np.array(arr[0], dtype=np.int64), np.array(arr[1], dtype=bool),
                         np.array(arr[2], dtype=bool), np.array(arr[3], dtype=bool), np.array(arr[4], dtype=bool))
