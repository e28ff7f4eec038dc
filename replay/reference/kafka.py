"""Reference interpreter of the `kafka` family for one partition (SPEC §3.1-3.2, §4).

One loop over the partition's time-ordered events, explicit state, every rule cited. Written for reading and
for differential tests, not for speed.

Modelling choices where SPEC §3.2 leaves room (the README's "Modelling choices" points here):
- (v1 made an isolated broker unelectable before its fencing; SPEC §3.7 K-3 replaces that, see `_electable`.)
- The leader's view of a follower's log end (`fetched`) only changes when the follower fetches or truncates,
  so a follower's power loss does not pull the high watermark back. The high watermark never decreases within
  a leader epoch; a new leader starts from min(log end) over the ISR.
- A follower's log end after a report is max(its log end, the count of SPEC §3.2 rule 5): a report never
  shrinks a follower's log.
- An isolated leader keeps the ISR it knew when it was cut off (it cannot reach the controller). Once
  replaced it serves clients as a "zombie" with that ISR (rule 10): it acknowledges acks=0/1, and acks=all
  only if that ISR was itself alone. Clients learn of the new leader at the first metadata refresh
  (isolation + k·metadata_max_age_ms) after the replacement, when the zombie heals, or when it goes down.
  Only a broker still up and running the incarnation that led becomes a zombie: an isolated leader that is
  down when it is replaced (crashed, or shut down while isolated) or restarted but not yet registered answers
  no client, and its log is truncated at the election like any other replica's (rule 9).
- A message's `error` is decided at its delivery deadline: `request_timeout` if its last attempt was appended
  and is waiting for the high watermark; else `not_enough_replicas` if the broker clients use refuses
  acks=all writes at that moment; else `no_leader`.
- Unavailability: no up broker serves clients; or acks=all is refused (ISR below min); or (acks=all) the
  oldest entry above the serving leader's high watermark was appended more than request_timeout_ms ago
  (requests are timing out). It is measured by the traffic: an idle partition is not stalled.

SPEC §3.7 corrections (v1.1), each next to its rule below:
- K-1 effective min ISR everywhere (`Partition.effectiveMinIsr`, `Partition.maybeIncrementLeaderHW`): `_frozen`,
  `_attempt`, `_maybe_elr` all use min(min_insync_replicas, replication_factor).
- K-2 exponential retry backoff (KIP-580, `CommonClientConfigs`, `RecordAccumulator`): `_retry_backoff_us`.
- K-5 ISR expand needs the leader epoch's start offset too (`Partition.isFollowerInSync`): `_replicate`.
- K-3 the controller's view of electability (`ClusterControlManager.isActive`, `ReplicationControlManager`):
  `_electable`; an isolated broker elected learns of it only when it heals (`unaware`, `_lead`).
- K-4 last known leader with ELR (KIP-966, `PartitionChangeBuilder`): `_elect`.
"""

from __future__ import annotations

import copy
import heapq
from bisect import bisect_right
from dataclasses import dataclass, field

import numpy as np

from replay.events import PartitionEvents
from replay.policies import OS_WRITEBACK_EXPIRE_MS, OS_WRITEBACK_PERIOD_MS, Acks, FlushMode, KafkaPolicy
from replay.results import (
    FinalView,
    MessageRecords,
    PartitionResult,
    StateRow,
    judge,
    merge_intervals,
)
from schemas.outcomes import NULL_US, Error, Status
from schemas.trace import Kind

MS = 1000

# Derived events at the same instant apply after trace events, in this order (SPEC §2.2).
FENCE, ISR_CHECK, CLIENT, RETRY, DEADLINE = range(5)


@dataclass
class Entry:
    epoch: int  # leader epoch in which it was appended
    msg_id: int
    append_us: int  # when the leader that took it from the client appended it (rule 5)
    size: int


@dataclass
class Replica:
    broker: int
    up: bool = True
    isolated: bool = False
    unclean_stop: bool = False  # last stop was crash, power_loss or disk_loss (KIP-966)
    log: list[Entry] = field(default_factory=list)
    written_us: list[int] = field(default_factory=list)  # when each entry was written on this broker
    flushed_all: int = 0  # prefix known to be on disk (clean shutdown, or what survived a power loss)
    fetched: int = 0  # the leader's view of this replica's log end
    lcu: int = 0  # last time it was caught up with the leader
    unreachable_since: int | None = None
    isolated_since: int | None = None
    must_register: bool = False  # restarted while isolated: the new incarnation registers when it heals
    visible_upto: int = 0  # prefix of this broker's log already announced visible while it served

    @property
    def eligible(self) -> bool:
        """Reachable: it fetches, and it can lead at once."""
        return self.up and not self.isolated

    @property
    def can_be_zombie(self) -> bool:
        """Still running the incarnation that led, cut off from the controller: it can go on answering clients
        (SPEC §3.2 rule 10). A broker that is down (crash, power loss, or a controlled shutdown while isolated)
        answers nothing, nor does a new incarnation that has not registered; such a replica is truncated at the
        election like any other (rule 9)."""
        return self.up and self.isolated and not self.must_register


@dataclass
class Msg:
    msg_id: int
    produce_us: int
    size: int
    deadline_us: int
    state: str = "new"  # waiting | refused | appended | acked | failed
    status: Status = Status.PENDING
    error: Error = Error.NONE
    ack_us: int = NULL_US
    visible_us: int = NULL_US
    positions: list[tuple[int, int]] = field(default_factory=list)  # (epoch, offset) of every append
    request_us: int | None = None  # from when an ack for a held copy can reach the client
    retry_at: int | None = None  # the pending NotEnoughReplicas retry
    refusals: int = 0  # NotEnoughReplicas answers so far: the exponent of the next backoff (SPEC §3.7 K-2)


@dataclass
class Zombie:
    """A replaced leader that clients still write to (SPEC §3.2 rule 10)."""

    broker: int
    epoch: int
    view: tuple[int, ...]
    hw: int


class KafkaReference:
    """Replays one partition of a trace under a `kafka` policy."""

    def __init__(self, policy: KafkaPolicy, partition: int, replicas: tuple[int, ...], duration_us: int) -> None:
        self.p = policy
        self.partition = partition
        self.order = replicas  # assignment order; the first is the preferred leader
        self.duration_us = duration_us
        self.rep = {b: Replica(b) for b in replicas}
        # SPEC §3.7 K-1: every use of min ISR (refusal, strict_min_isr freeze, ELR) is the effective one,
        # min(min_insync_replicas, replication_factor) (`Partition.effectiveMinIsr`).
        self.min_isr = policy.effective_min_isr
        self.session_us = policy.session_timeout_ms * MS
        # Rule 2: the first replica in assignment order that is up leads; the ISR starts as all replicas.
        self.leader: int | None = replicas[0]
        self.epoch = 0
        self.isr: list[int] = list(replicas)
        self.elr: list[int] = []
        self.hw = 0
        self.epoch_start = 0  # the leader's log end when its epoch began (SPEC §3.7 K-5)
        self.iso_view: tuple[int, ...] | None = None  # ISR known to an isolated leader
        self.target: int | None = replicas[0]  # the broker clients send to
        self.unaware = False  # the leader was elected while isolated and has not learned it yet (SPEC §3.7 K-3)
        self.last_leader = replicas[0]  # the last broker elected (SPEC §3.7 K-4)
        self.zombie: Zombie | None = None
        self.down_published: tuple[int, int] | None = None  # (leo, hw) last published by a leader now down
        self.msgs: dict[int, Msg] = {}
        self.unacked: set[int] = set()  # messages in state "appended"
        self.replication_bytes = 0
        self.heap: list[tuple[int, int, int, int, str, int]] = []
        self.seq = 0
        self.rows: list[StateRow] = []
        self.avail: list[tuple[int, bool, int | None]] = []  # (instant, down_or_refusing, stall_from_us)
        self.virtual = False  # true during the end-of-trace recovery of SPEC §4.1

    # ------------------------------------------------------------------------------------------- helpers
    def _push(self, t: int, klass: int, what: str, arg: int) -> None:
        self.seq += 1
        # Retries due at the same instant go in msg_id order; other derived events in the order they arose.
        tiebreak = arg if klass == RETRY else 0
        heapq.heappush(self.heap, (t, klass, tiebreak, self.seq, what, arg))

    def _in_order(self, brokers) -> list[int]:
        return [b for b in self.order if b in brokers]

    def _view(self) -> tuple[int, ...]:
        """The ISR the controller leader acts on (frozen while it is isolated)."""
        return self.iso_view if self.iso_view is not None else tuple(self.isr)

    def _frozen(self, view_size: int) -> bool:
        """strict_min_isr freezes the high watermark below the *effective* min ISR (SPEC §3.7 K-1,
        `Partition.effectiveMinIsr` used by `Partition.maybeIncrementLeaderHW`): min ISR above the replication
        factor acts as the replication factor, so such a topic still commits once every replica holds a write."""
        return self.p.strict_min_isr and view_size < self.min_isr

    def _serving(self) -> int | None:
        """The broker that takes clients' writes now: the leader, or a zombie clients still use; None if none."""
        tgt = self.target
        if tgt is None or not self.rep[tgt].up or self.rep[tgt].must_register:
            return None  # a restarted broker serves nothing until its new incarnation registers
        if tgt == self.leader and self.unaware:
            return None  # it does not know it leads: NOT_LEADER_OR_FOLLOWER (SPEC §3.7 K-3)
        if tgt == self.leader or (self.zombie is not None and tgt == self.zombie.broker):
            return tgt
        return None

    def _set_state(self, msg: Msg, state: str) -> None:
        msg.state = state
        if state == "appended":
            self.unacked.add(msg.msg_id)
        else:
            self.unacked.discard(msg.msg_id)

    def _serving_hw(self) -> int:
        if self.zombie is not None and self.target == self.zombie.broker:
            return self.zombie.hw
        return self.hw

    def _serving_view_size(self) -> int:
        if self.zombie is not None and self.target == self.zombie.broker:
            return len(self.zombie.view)
        return len(self._view())

    def _serving_epoch(self) -> int:
        if self.zombie is not None and self.target == self.zombie.broker:
            return self.zombie.epoch
        return self.epoch

    # ------------------------------------------------------------------------------ durability (§3.1)
    def _durable_at(self, written_us: int) -> int:
        """When an entry written at `written_us` is on disk (SPEC §3.1 flush rule, §3.2 `flush`)."""
        if self.p.flush is FlushMode.SYNC:
            return written_us
        if self.p.flush_interval_ms is None:  # no fsync: the OS writes back pages older than 30 s every 5 s
            period, expire = OS_WRITEBACK_PERIOD_MS * MS, OS_WRITEBACK_EXPIRE_MS * MS
            return -(-(written_us + expire) // period) * period
        period = self.p.flush_interval_ms * MS
        return -(-written_us // period) * period

    def _durable_prefix(self, r: Replica, t: int) -> int:
        n = r.flushed_all
        # A flush tick at the very instant of the power loss comes after it (derived events apply after trace
        # events at the same instant, SPEC §2.2).
        while n < len(r.log) and self._durable_at(r.written_us[n]) < t:
            n += 1
        return n

    def _truncate(self, r: Replica, length: int) -> None:
        del r.log[length:]
        del r.written_us[length:]
        r.flushed_all = min(r.flushed_all, length)
        r.fetched = min(r.fetched, length)
        r.visible_upto = min(r.visible_upto, length)

    # ------------------------------------------------------------------------------------- main loop
    def run(self, events: PartitionEvents) -> PartitionResult:
        trace = self._trace_events(events)
        # Rule 6: ISR check ticks every replica_lag_time_max_ms / 2 from time 0.
        self._push(0, ISR_CHECK, "isr_check", 0)
        i = 0
        while True:
            t_trace = trace[i][0] if i < len(trace) else None
            t_derived = self.heap[0][0] if self.heap else None
            candidates = [t for t in (t_trace, t_derived) if t is not None and t <= self.duration_us]
            if not candidates:
                break
            t = min(candidates)
            while i < len(trace) and trace[i][0] == t:
                self._apply_trace(*trace[i])
                i += 1
            while self.heap and self.heap[0][0] == t:
                _, _, _, _, what, arg = heapq.heappop(self.heap)
                getattr(self, "_on_" + what)(t, arg)
            self._end_instant(t)
        return self._finish()

    def _trace_events(self, ev: PartitionEvents) -> list[tuple]:
        rows = [(int(ev.broker_ts[j]), int(ev.broker_kind[j]), int(ev.broker_id[j]), int(ev.broker_upto[j]), 0)
                for j in range(len(ev.broker_ts)) if int(ev.broker_id[j]) in self.rep]
        rows += [(int(ev.produce_ts[j]), int(Kind.PRODUCE), int(ev.produce_msg[j]), 0, int(ev.produce_size[j]))
                 for j in range(len(ev.produce_ts))]
        rows.sort(key=lambda r: (r[0], r[1], r[2]))  # SPEC §2.2 same-instant order
        return rows

    def _apply_trace(self, t: int, kind: int, who: int, upto: int, size: int) -> None:
        k = Kind(kind)
        if k is Kind.PRODUCE:
            self._produce(t, who, size)
        elif k is Kind.REPLICATE:
            self._replicate(t, who, upto)
        elif k in (Kind.CRASH, Kind.POWER_LOSS, Kind.DISK_LOSS):
            self._stop_unclean(t, who, k)
        elif k is Kind.SHUTDOWN:
            self._shutdown(t, who)
        elif k is Kind.ISOLATE:
            self._isolate(t, who)
        elif k is Kind.RESTART:
            self._restart(t, who)
        elif k is Kind.HEAL:
            self._heal(t, who)

    # ------------------------------------------------------------------------------ faults (rules 6, 8-11)
    def _became_unreachable(self, t: int, r: Replica) -> None:
        if r.unreachable_since is None:
            r.unreachable_since = t
            self._push(t + self.session_us, FENCE, "fence", r.broker)

    def _zombie_stops(self, b: int) -> None:
        if self.zombie is not None and self.zombie.broker == b:
            self.zombie = None  # a zombie that stops or rejoins no longer believes it leads

    def _stop_unclean(self, t: int, b: int, kind: Kind) -> None:
        r = self.rep[b]
        if b == self.leader and self.down_published is None:
            self.down_published = (len(r.log), self.hw)
        r.up = False
        r.unclean_stop = True
        if kind is Kind.POWER_LOSS:  # rule 11: cut to the durable prefix
            self._truncate(r, self._durable_prefix(r, t))
        elif kind is Kind.DISK_LOSS:
            self._truncate(r, 0)
        r.flushed_all = len(r.log)  # what is left is on disk
        self._became_unreachable(t, r)
        self._zombie_stops(b)
        if b == self.target and self.leader is not None and self.leader != b:
            self._schedule_switch(t)  # clients of a zombie learn when it stops answering

    def _shutdown(self, t: int, b: int) -> None:
        """Controlled shutdown (SPEC §2.2, §3.2 rule 8): flush, leave the ISR, hand leadership over at once."""
        r = self.rep[b]
        if b == self.leader and self.down_published is None:
            self.down_published = (len(r.log), self.hw)
        r.up = False
        r.unclean_stop = False
        r.flushed_all = len(r.log)
        r.unreachable_since = None  # no detection delay: the controller knows now
        self._zombie_stops(b)
        self._leave_isr(b)
        if b == self.leader:
            self._elect(t)
        else:
            self._recompute_hw(t)
            if b == self.target and self.leader is not None:
                self._schedule_switch(t)

    def _isolate(self, t: int, b: int) -> None:
        r = self.rep[b]
        r.isolated = True
        r.isolated_since = t
        if b == self.leader:
            self.iso_view = tuple(self.isr)
            if b == self.target:
                self._schedule_refresh(t)
        self._became_unreachable(t, r)

    def _restart(self, t: int, b: int) -> None:
        r = self.rep[b]
        r.up = True
        r.flushed_all = len(r.log)
        if r.isolated:
            r.must_register = True  # it cannot reach the controller yet
            return
        self._register(t, b)

    def _register(self, t: int, b: int) -> None:
        """A new incarnation of broker b registers with the controller."""
        r = self.rep[b]
        r.must_register = False
        if self.p.eligible_leader_replicas and r.unclean_stop:
            # KIP-966: a new incarnation after an unclean shutdown leaves ISR and ELR.
            if b in self.isr:
                self.isr.remove(b)
                self._recompute_hw(t)
            if b in self.elr:
                self.elr.remove(b)
        if r.unreachable_since is not None:
            self._fence(t, b, at_restart=True)  # rule 6: fenced at once when it registers again
        if self.leader is None:
            self._elect(t)  # rule 8: an offline partition elects again when a replica comes back

    def _heal(self, t: int, b: int) -> None:
        r = self.rep[b]
        r.isolated = False
        r.isolated_since = None
        self._zombie_stops(b)
        if r.up and r.must_register:
            self._register(t, b)
        elif r.up:
            r.unreachable_since = None  # an isolation that heals before the deadline causes no fencing (rule 6)
        if b == self.leader and self.unaware and r.up and not r.must_register:
            self.unaware = False  # SPEC §3.7 K-3: it learns of its election and leads from now
            self._lead(t)
        elif b == self.leader:
            self.iso_view = None
            self._recompute_hw(t)
        elif r.up and self.leader is not None and not self.unaware:
            self._truncate_to_leader(r)  # rule 10: the zombie is truncated once it rejoins
        if b == self.target and self.leader != b:
            self._schedule_switch(t)
        if self.leader is None and r.up:
            self._elect(t)

    def _on_fence(self, t: int, b: int) -> None:
        r = self.rep[b]
        if r.unreachable_since is None or r.unreachable_since + self.session_us != t:
            return  # came back before the deadline
        self._fence(t, b, at_restart=False)

    def _fence(self, t: int, b: int, *, at_restart: bool) -> None:
        self.rep[b].unreachable_since = None
        self._leave_isr(b)
        if b == self.leader:
            self._elect(t)
        else:
            self._recompute_hw(t)  # a smaller ISR may let the high watermark advance

    def _leave_isr(self, b: int) -> None:
        """Rule 6/8: leave the ISR unless last (pre-ELR); with ELR, a replica leaving below min ISR is in ELR."""
        if b not in self.isr:
            return
        if len(self.isr) == 1 and not self.p.eligible_leader_replicas:
            return
        self.isr.remove(b)
        self._maybe_elr(b)

    def _maybe_elr(self, b: int) -> None:
        if self.p.eligible_leader_replicas and len(self.isr) < self.min_isr and b not in self.elr:
            self.elr.append(b)

    # --------------------------------------------------------------------------- election (rules 8-9)
    def _electable(self, b: int) -> bool:
        """The controller's view (SPEC §3.7 K-3, `ClusterControlManager.isActive` used by
        `ReplicationControlManager`): it excludes only fenced or shutting-down brokers, so an isolated broker is
        electable until its fencing deadline. A broker that is down is not (v1 rule 8), nor a new incarnation
        that has not registered yet."""
        r = self.rep[b]
        if not r.up or r.must_register:
            return False
        return not r.isolated or r.unreachable_since is not None  # isolated: only until it is fenced

    def _elect(self, t: int) -> None:
        candidates = [b for b in self._in_order(self.isr) if self._electable(b)]
        chosen, new_isr = (candidates[0], self.isr) if candidates else (None, None)
        if chosen is None and self.p.eligible_leader_replicas:
            elr = [b for b in self._in_order(self.elr) if self._electable(b)]
            if elr:
                chosen, new_isr = elr[0], [elr[0]]
                self.elr.remove(elr[0])
        if chosen is None and self.p.eligible_leader_replicas and not self.p.unclean_leader_election \
                and not self.isr and not self.elr and self._electable(self.last_leader):
            # SPEC §3.7 K-4 (KIP-966, `PartitionChangeBuilder`): with ISR and ELR both empty, the last known
            # leader leads again when it comes back, keeping what it holds.
            chosen, new_isr = self.last_leader, [self.last_leader]
        if chosen is None and self.p.unclean_leader_election:
            up = [b for b in self.order if self._electable(b)]
            if up:
                chosen, new_isr = up[0], [up[0]]
                self.elr = []
        old = self.leader
        if old is not None and self.rep[old].can_be_zombie and old == self.target and self.zombie is None \
                and not self.unaware:  # a leader that never knew it led answers no client as leader
            self.zombie = Zombie(old, self.epoch, self.iso_view or (old,), self.hw)
        self.unaware = False
        if chosen is None:
            self.leader = None  # offline
            self.iso_view = None
            return
        self.isr = self._in_order(new_isr)
        self._set_leader(t, chosen)

    def _clients_stay(self) -> bool:
        """Clients keep their broker across an election only while it answers them as leader (a zombie, rule
        10) or is a restarted, unregistered old leader they cannot tell from one; an isolated broker that
        answers NOT_LEADER_OR_FOLLOWER (SPEC §3.7 K-3) makes them refresh metadata."""
        tgt = self.target
        if tgt is None or not self.rep[tgt].up or not self.rep[tgt].isolated:
            return False
        return self.rep[tgt].must_register or (self.zombie is not None and self.zombie.broker == tgt)

    def _set_leader(self, t: int, n: int) -> None:
        """The controller elects n (a new leader epoch). An isolated n cannot learn of it (SPEC §3.7 K-3): it
        takes no writes, and nothing else changes until it heals (`_lead`) or is fenced (a new election)."""
        self.leader = n
        self.last_leader = n
        self.epoch += 1
        self.iso_view = None
        self.down_published = None
        self._zombie_stops(n)
        if self.p.eligible_leader_replicas and len(self.isr) >= self.min_isr:
            self.elr = []
        if self.rep[n].isolated:
            self.unaware = True
            self.hw = min(self.hw, len(self.rep[n].log))
            if not self._clients_stay():
                self._schedule_switch(t)
            return
        self._lead(t)

    def _lead(self, t: int) -> None:
        """The leader takes over (at its election, or when an isolated one heals, SPEC §3.7 K-3): followers keep
        the prefix they share with it (rule 9), count as caught up, and the high watermark restarts."""
        n = self.leader
        lead = self.rep[n]
        self.epoch_start = len(lead.log)
        for b, r in self.rep.items():
            if b != n and not (self.zombie is not None and b == self.zombie.broker):
                self._truncate_to_leader(r)  # rule 9: keep only the prefix shared with the new leader
            if b != n:
                r.fetched = len(r.log)
                r.lcu = t  # after a leader change every follower counts as caught up
        if self._frozen(len(self.isr)):
            self.hw = min(self.hw, len(lead.log))
        else:
            self.hw = min(len(lead.log) if b == n else self.rep[b].fetched for b in self.isr)
        self._mark_visible(t, n, self.hw)
        if not self._clients_stay():
            self._schedule_switch(t)
        if not self.virtual:
            # Clients already writing to the new leader (it led before, e.g. an ex-zombie re-elected) need no
            # failover: what the election committed is acknowledged now (rule 4), not at the next HW move.
            self._ack_committed(t)

    def _truncate_to_leader(self, r: Replica) -> None:
        if self.leader is None or r.broker == self.leader:
            return
        lead = self.rep[self.leader].log
        # Leader-epoch truncation (KIP-101/279): entries match when written by the same leader epoch.
        common = 0
        while common < min(len(r.log), len(lead)) and (
                r.log[common].epoch, r.log[common].msg_id) == (lead[common].epoch, lead[common].msg_id):
            common += 1
        self._truncate(r, common)

    # --------------------------------------------------------------------------------- clients (§3.1)
    def _schedule_switch(self, t: int) -> None:
        self._push(t + self.p.client_failover_ms * MS, CLIENT, "switch", 0)

    def _schedule_refresh(self, t: int) -> None:
        """Clients writing to an isolated leader refresh metadata every metadata_max_age_ms (rule 10)."""
        self._push(t + self.p.metadata_max_age_ms * MS, CLIENT, "refresh", t)

    def _on_refresh(self, t: int, since: int) -> None:
        tgt = self.target
        if tgt is None or not self.rep[tgt].isolated or self.rep[tgt].isolated_since > since:
            return  # clients moved on, or the broker healed (and maybe was isolated again) meanwhile
        if self.leader != tgt:
            self._schedule_switch(t)
        else:
            self._schedule_refresh(t)

    def _on_switch(self, t: int, _: int) -> None:
        """Clients reach the current leader; unacknowledged messages within their deadline are retried (rule 8)."""
        if self.virtual:
            return
        self.target = self.leader
        self.zombie = None
        pending = sorted(m for m, msg in self.msgs.items()
                         if msg.state in ("waiting", "refused", "appended") and t <= msg.deadline_us)
        held = self._held_positions()
        for m in pending:
            msg = self.msgs[m]
            if any(p in held for p in msg.positions):
                self._set_state(msg, "appended")  # idempotent retry of a copy the leader holds
                msg.request_us = t
            else:
                self._attempt(t, msg)
        self._ack_committed(t)

    def _held_positions(self) -> set[tuple[int, int]]:
        if self._serving() is None:
            return set()
        return {(e.epoch, o) for o, e in enumerate(self.rep[self.target].log) if e.msg_id in self.msgs}

    # --------------------------------------------------------------------------- produce (rules 3-4)
    def _produce(self, t: int, msg_id: int, size: int) -> None:
        msg = Msg(msg_id, t, size, t + self.p.delivery_timeout_ms * MS)
        self.msgs[msg_id] = msg
        if self.p.acks is Acks.ZERO:
            # acks=0: the client counts the message as sent when it leaves; no retries (rule 4).
            msg.status, msg.state, msg.ack_us = Status.ACKED, "acked", t
            if self._serving() is not None:
                self._append(t, msg)
            return
        self._push(msg.deadline_us, DEADLINE, "deadline", msg_id)
        self._attempt(t, msg)

    def _attempt(self, t: int, msg: Msg) -> None:
        msg.retry_at = None
        if self._serving() is None:
            self._set_state(msg, "waiting")  # retried when clients reach a leader
            return
        if self.p.acks is Acks.ALL and self._serving_view_size() < self.min_isr:
            self._set_state(msg, "refused")  # NotEnoughReplicas before append (rule 3), retriable
            msg.refusals += 1
            retry = t + self._retry_backoff_us(msg.refusals)
            if retry <= msg.deadline_us:
                msg.retry_at = retry
                self._push(retry, RETRY, "retry", msg.msg_id)
            return
        self._append(t, msg)

    def _retry_backoff_us(self, n: int) -> int:
        """The wait before the n-th retry of a refused message (SPEC §3.7 K-2, KIP-580: `CommonClientConfigs`
        retry.backoff.max.ms, `RecordAccumulator`): min(retry_backoff_max_ms, retry_backoff_ms × 2^(n−1)), without
        the 20 % jitter (deterministic replay). n counts the message's refusals over its whole life, as the
        producer's batch attempt count never resets."""
        return min(self.p.retry_backoff_max_ms, self.p.retry_backoff_ms * 2 ** (n - 1)) * MS

    def _on_retry(self, t: int, msg_id: int) -> None:
        msg = self.msgs[msg_id]
        if msg.state == "refused" and msg.retry_at == t:
            self._attempt(t, msg)

    def _append(self, t: int, msg: Msg) -> None:
        tgt = self.target
        r = self.rep[tgt]
        offset = len(r.log)
        epoch = self._serving_epoch()
        r.log.append(Entry(epoch, msg.msg_id, t, msg.size))
        r.written_us.append(t)
        msg.positions.append((epoch, offset))
        if msg.status is not Status.ACKED:  # acks=0 messages are already acked
            self._set_state(msg, "appended")
            msg.request_us = t
            if self.p.acks is Acks.ONE:
                self._ack(t, msg)
        if self.zombie is not None and tgt == self.zombie.broker:
            self._zombie_hw(t)
        else:
            self._recompute_hw(t)

    def _ack(self, t: int, msg: Msg) -> None:
        msg.status, msg.ack_us = Status.ACKED, t
        self._set_state(msg, "acked")

    def _ack_committed(self, t: int) -> None:
        """Acknowledge requests held by the serving broker: acks=1 at once, acks=all below its HW (rule 4)."""
        srv = self._serving()
        if srv is None or self.p.acks is Acks.ZERO:
            return
        hw = self._serving_hw()
        log = self.rep[srv].log
        for msg_id in sorted(self.unacked):
            msg = self.msgs[msg_id]
            if msg.request_us is None or msg.request_us > t or t > msg.deadline_us:
                continue
            for epoch, offset in msg.positions:
                if offset < len(log) and (log[offset].epoch, log[offset].msg_id) == (epoch, msg_id):
                    if self.p.acks is Acks.ONE or offset < hw:
                        self._ack(t, msg)
                    break

    def _on_deadline(self, t: int, msg_id: int) -> None:
        msg = self.msgs[msg_id]
        if msg.state == "acked":
            return
        if msg.state == "appended":
            msg.error = Error.REQUEST_TIMEOUT
        elif self._serving() is not None and self.p.acks is Acks.ALL and self._serving_view_size() < self.min_isr:
            msg.error = Error.NOT_ENOUGH_REPLICAS
        else:
            msg.error = Error.NO_LEADER
        msg.status = Status.FAILED
        self._set_state(msg, "failed")

    # ------------------------------------------------------------------------- replication (rules 5-7)
    def _replicate(self, t: int, b: int, upto: int) -> None:
        r = self.rep[b]
        ldr = self.leader
        if ldr is None or b == ldr or not r.eligible or not self.rep[ldr].eligible:
            return  # ignored: down/isolated follower, the leader itself, or an unreachable leader (§2.2)
        lead = self.rep[ldr].log
        if r.log:  # a follower's log is always a prefix of its leader's (rule 9 truncation)
            assert (r.log[-1].epoch, r.log[-1].msg_id) == (lead[len(r.log) - 1].epoch, lead[len(r.log) - 1].msg_id)
        count = bisect_right(lead, upto, key=lambda e: e.append_us)  # append times never decrease in a log
        new_len = max(len(r.log), count)
        for entry in lead[len(r.log):new_len]:
            r.log.append(entry)
            r.written_us.append(t)
            self.replication_bytes += entry.size
        r.fetched = new_len
        r.lcu = t if new_len == len(lead) else max(r.lcu, upto)
        self._recompute_hw(t)
        # Rule 7 with SPEC §3.7 K-5 (`Partition.isFollowerInSync`): rejoin once the log end reaches both the high
        # watermark and the current leader epoch's start offset.
        if b not in self.isr and new_len >= self.hw and new_len >= self.epoch_start:
            self.isr = self._in_order([*self.isr, b])
            if b in self.elr:
                self.elr.remove(b)
            if self.p.eligible_leader_replicas and len(self.isr) >= self.min_isr:
                self.elr = []
            self._recompute_hw(t)

    def _on_isr_check(self, t: int, _: int) -> None:
        """Rule 6: the leader drops followers not caught up for more than replica_lag_time_max_ms."""
        period = self.p.replica_lag_time_max_ms * MS // 2
        if t + period <= self.duration_us:
            self._push(t + period, ISR_CHECK, "isr_check", 0)
        ldr = self.leader
        if ldr is None or not self.rep[ldr].eligible:
            return
        leo = len(self.rep[ldr].log)
        for f in list(self.isr):
            r = self.rep[f]
            if f != ldr and t - r.lcu > self.p.replica_lag_time_max_ms * MS and r.fetched < leo:
                self.isr.remove(f)
                self._maybe_elr(f)
        self._recompute_hw(t)

    def _recompute_hw(self, t: int) -> None:
        """Rule 4: high watermark = min log end over the ISR, frozen below min ISR (strict_min_isr)."""
        ldr = self.leader
        if ldr is None or not self.rep[ldr].up or self.rep[ldr].must_register or self.unaware:
            return
        view = self._view()
        if ldr not in view:
            return  # the leader just left the ISR (KIP-966 unclean restart); an election follows
        lead_len = len(self.rep[ldr].log)
        if not self._frozen(len(view)):
            candidate = min(lead_len if b == ldr else self.rep[b].fetched for b in view)
            if candidate > self.hw:
                self._mark_visible(t, ldr, candidate)
                self.hw = candidate
        if not self.virtual:
            self._ack_committed(t)

    def _zombie_hw(self, t: int) -> None:
        z = self.zombie
        if z.view == (z.broker,) and not self._frozen(1):
            n = len(self.rep[z.broker].log)
            self._mark_visible(t, z.broker, n)
            z.hw = n
        self._ack_committed(t)

    def _mark_visible(self, t: int, broker: int, upto: int) -> None:
        """Rule 12: consumers see what is below the serving leader's high watermark."""
        if self.virtual:
            return
        r = self.rep[broker]
        for entry in r.log[r.visible_upto:upto]:
            msg = self.msgs.get(entry.msg_id)
            if msg is not None and msg.visible_us == NULL_US:
                msg.visible_us = t
        r.visible_upto = max(r.visible_upto, upto)

    # ------------------------------------------------------------------------------ per-instant records
    def _end_instant(self, t: int) -> None:
        if self.virtual:
            return
        ldr = self.leader
        if ldr is None:
            row = StateRow(t, None, self.epoch, tuple(self.isr), None, None)
        elif (not self.rep[ldr].up or self.rep[ldr].must_register) and self.down_published is not None:
            leo, hw = self.down_published
            row = StateRow(t, ldr, self.epoch, tuple(self.isr), leo, hw)
        else:
            row = StateRow(t, ldr, self.epoch, tuple(self.isr), len(self.rep[ldr].log), self.hw)
        if not self.rows or (row.leader, row.leader_epoch, row.isr, row.log_end_offset, row.high_watermark) != (
                self.rows[-1].leader, self.rows[-1].leader_epoch, self.rows[-1].isr,
                self.rows[-1].log_end_offset, self.rows[-1].high_watermark):
            self.rows.append(row)
        self.avail.append((t, *self._availability()))

    def _availability(self) -> tuple[bool, int | None]:
        """(no up broker serves clients or acks=all is refused, time from which acks=all stalls)."""
        tgt = self._serving()
        if tgt is None:
            return True, None
        if self.p.acks is not Acks.ALL:
            return False, None
        if self._serving_view_size() < self.min_isr:
            return True, None
        # Stalled: the oldest entry still waiting for the high watermark has waited past request_timeout_ms.
        log, hw = self.rep[tgt].log, self._serving_hw()
        if hw >= len(log):
            return False, None
        return False, log[hw].append_us + self.p.request_timeout_ms * MS

    def _unavailable_intervals(self) -> list[tuple[int, int]]:
        out = []
        points = self.avail
        for j, (t, blocked, stall_from) in enumerate(points):
            end = points[j + 1][0] if j + 1 < len(points) else self.duration_us
            if blocked:
                out.append((t, end))
            elif stall_from is not None:
                out.append((max(t, stall_from), end))
        return merge_intervals(out)

    # ---------------------------------------------------------------------------- end of trace (§4.1)
    def _finish(self) -> PartitionResult:
        end_view = self._end_view()
        final = copy.deepcopy(self)
        final.virtual = True
        final.heap = []
        t = self.duration_us
        for b in sorted(final.rep):  # SPEC §2.2: restarts, then heals, by broker id
            if not final.rep[b].up:
                final._restart(t, b)
        for b in sorted(final.rep):
            if final.rep[b].isolated:
                final._heal(t, b)
        if final.leader is not None:
            for r in final.rep.values():
                final._truncate_to_leader(r)
        final_runs = None if final.leader is None else _runs(final.rep[final.leader].log)
        view = FinalView(final_runs, *end_view)
        return PartitionResult(self.partition, judge(self._records(), view), self.rows,
                               self._unavailable_intervals(), self.replication_bytes)

    def _end_view(self) -> tuple[np.ndarray, int, bool]:
        srv = self._serving()
        if srv is None:
            return _runs([]), 0, False
        return _runs(self.rep[srv].log), self._serving_hw(), True

    def _records(self) -> MessageRecords:
        msgs = [self.msgs[k] for k in sorted(self.msgs)]
        last = [m.positions[-1] if m.positions else (-1, -1) for m in msgs]
        extra = [(m.msg_id, e, o) for m in msgs for (e, o) in m.positions[:-1]]
        rec = MessageRecords(
            np.array([m.msg_id for m in msgs], dtype=np.int64),
            np.array([m.produce_us for m in msgs], dtype=np.int64),
            np.array([m.status for m in msgs], dtype=np.int8),
            np.array([m.error for m in msgs], dtype=np.int8),
            np.array([m.ack_us for m in msgs], dtype=np.int64),
            np.array([m.visible_us for m in msgs], dtype=np.int64),
            np.array([p[0] for p in last], dtype=np.int64),
            np.array([p[1] for p in last], dtype=np.int64),
        )
        rec.extra_positions = np.array(extra, dtype=np.int64).reshape(-1, 3)
        return rec


def _runs(log: list[Entry]) -> np.ndarray:
    out: list[list[int]] = []
    for offset, entry in enumerate(log):
        if out and out[-1][0] == entry.epoch:
            out[-1][2] = offset + 1
        else:
            out.append([entry.epoch, offset, offset + 1])
    return np.array(out, dtype=np.int64).reshape(-1, 3)


def replay_partition(policy: KafkaPolicy, partition: int, replicas: tuple[int, ...], events: PartitionEvents,
                     duration_us: int) -> PartitionResult:
    """Reference replay of one partition (SPEC §9)."""
    return KafkaReference(policy, partition, replicas, duration_us).run(events)
