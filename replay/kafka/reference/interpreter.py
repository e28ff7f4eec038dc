"""Reference interpreter of the `kafka` family for one partition (SPEC §3.1-3.2, §4).

One loop over the partition's time-ordered events, explicit state, every rule cited. Written for reading and
for differential tests, not for speed.
The class is split by concern: faults, fencing and elections in `control.py`, clients in
`clients.py`, per-instant records and the end-of-trace judgement in `outputs.py`, the state's types in
`state.py`; replication and the event loop are here.

Modelling choices where SPEC §3.2 leaves room (the README's "Modelling choices" points here):
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
- K-6 the client's per-connection pipeline and K-7 the acks=0/1 acknowledgement (`SocketServer`, `DelayedProduce`,
  the producer's `linger.ms`): `replay.kafka.pipeline.plan_requests`, applied to the records in `_finish`; only a
  live leader answers (`ClientPipeline.timeline`, from these rows and the partition's fault events).
- K-8 the idempotent producer's fatal error after an unclean election (librdkafka `rd_kafka_idemp_set_fatal_error`):
  `ClientPipeline.settle`, at the instants `_elect` records in `unclean_us` in the fault-only replay of
  `replay.kafka.leadership`.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Callable

from replay.events import PartitionEvents
from replay.kafka.pipeline import ClientPipeline, Leadership
from replay.kafka.reference.clients import KafkaReferenceClients
from replay.kafka.reference.control import KafkaReferenceControl
from replay.kafka.reference.outputs import KafkaReferenceOutputs
from replay.kafka.reference.state import (
    ISR_CHECK,
    ISR_CHECKS_PER_LAG_TIME,
    RETRY,
    Msg,
    MsgState,
    Replica,
    Zombie,
    check_transition,
)
from replay.policies import OS_WRITEBACK_EXPIRE_MS, OS_WRITEBACK_PERIOD_MS, FlushMode, KafkaPolicy
from replay.results import PartitionResult, StateRow
from schemas.outcomes import NULL_US
from schemas.trace import DEFAULT_CLIENT_ROUND_TRIP_US, Kind
from schemas.units import MS


class KafkaReference(KafkaReferenceControl, KafkaReferenceClients, KafkaReferenceOutputs):
    """Replays one partition of a trace under a `kafka` policy."""

    def __init__(self, policy: KafkaPolicy, partition: int, replicas: tuple[int, ...], duration_us: int,
                 leadership: Leadership | None = None,
                 round_trip_us: int = DEFAULT_CLIENT_ROUND_TRIP_US) -> None:
        self.p = policy
        # SPEC §3.7 K-6, K-7: the client's side of each acknowledgement, applied in `_finish`
        self.client = ClientPipeline(policy, partition, tuple(replicas), duration_us, leadership, round_trip_us)
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
        self.unclean_us: list[int] = []  # the instants of its unclean elections (SPEC §3.2 rule 8, §3.7 K-8)
        self.down_published: tuple[int, int] | None = None  # (leo, hw) last published by a leader now down
        self.msgs: dict[int, Msg] = {}
        self.unacked: set[int] = set()  # messages in state APPENDED
        self.replication_bytes = 0
        self.heap: list[tuple[int, int, int, int, str, int]] = []
        self.seq = 0
        self.rows: list[StateRow] = []
        self.avail: list[tuple[int, bool, int | None]] = []  # (instant, down_or_refusing, stall_from_us)
        self.virtual = False  # true during the end-of-trace recovery of SPEC §4.1
        self.handlers: dict[str, Callable[[int, int], None]] = {
            "isr_check": self._on_isr_check, "fence": self._on_fence, "refresh": self._on_refresh,
            "switch": self._on_switch, "retry": self._on_retry, "deadline": self._on_deadline}

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

    def _set_state(self, msg: Msg, state: MsgState) -> None:
        check_transition(msg.state, state)
        msg.state = state
        if state is MsgState.APPENDED:
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
        self.client.observe(events)
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
                self.handlers[what](t, arg)
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
        period = self.p.replica_lag_time_max_ms * MS // ISR_CHECKS_PER_LAG_TIME
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


def replay_partition(policy: KafkaPolicy, partition: int, replicas: tuple[int, ...], events: PartitionEvents,
                     duration_us: int, leadership: Leadership | None = None,
                     round_trip_us: int = DEFAULT_CLIENT_ROUND_TRIP_US) -> PartitionResult:
    """Reference replay of one partition (SPEC §9)."""
    return KafkaReference(policy, partition, replicas, duration_us, leadership, round_trip_us).run(events)
