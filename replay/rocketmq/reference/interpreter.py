"""Reference interpreter of the RocketMQ families for one broker group (SPEC §3.1, §3.3-3.5, §4).

One loop over the group's time-ordered events, explicit state, every rule cited. Written for reading and for
differential tests, not for speed. The replay unit is a broker group: its CommitLog holds all its queues, so
offsets are CommitLog positions (entries) and flush decisions count the group's dirty bytes (SPEC §3.3).
Messages arrive as routed by `replay/rocketmq/control.py` (SPEC §3.3 rules 1-3): payload `part` = -1 marks a
send that failed in routing (`no_route`); payload `delay` is the time from the produce to the arrival here
(a DLedger retry after max_wait_ack_ms at a group without quorum). This module implements the control rules
(who leads, detection, elections, clients' target) on its own, independently of `replay/rocketmq/control.py`,
following the modelling choices C1-C7 documented there. Further choices, shared with the kernel:

R1 A request is answered only by the broker incarnation that took it: an ack when that leader's commit point
   passes the message (SYNC_MASTER: the need-th slave copy; DLedger: a majority; controller: in_sync_replicas
   copies or the whole SyncStateSet); a broker status (FLUSH_SLAVE_TIMEOUT, IN_SYNC_REPLICAS_NOT_ENOUGH) at
   arrival + slave_timeout_ms / max_wait_ack_ms if that incarnation is still up; otherwise the client gives up
   at produce + delivery_timeout_ms (`delivery_timeout`). At one instant: replication first (trace), then the
   broker's status, then the client's deadline. No retry inside a group (RocketMQ retries other groups, C2).
R2 A message that reaches a group that takes no writes (which routing did not predict: a controller group with
   no eligible SyncStateSet member) fails with `no_leader`; one refused before append (controller
   SyncStateSet below min_insync_replicas) fails with `in_sync_replicas_not_enough`. Both are `absent`.
   SPEC §3.7 C-2 (`SendMessageProcessor` answers IN_SYNC_REPLICAS_NOT_ENOUGH as SYSTEM_ERROR, which
   `DefaultMQProducerImpl` retries on another group at once): routing (`replay/rocketmq/control.py` C9) sends a
   refused send to another group when the faults alone put the SyncStateSet below min_insync_replicas, so a
   group sees a refusal only on a send's last attempt or when replication alone shrank its set.
R3 Flush (SPEC §3.1, §3.3): `rocketmq` and `rocketmq-controller` with flush=async flush a broker's CommitLog at
   ticks every flush_interval_ms from 0 when at least flush_least_bytes are dirty, and fully at the first tick
   at or after each multiple of flush_thorough_interval_ms; `dledger` flushes at every tick (a write is durable
   at the first tick at or after it); flush=sync is durable at write; flush_interval_ms=null means no fsync:
   the OS writes back pages older than 30000 ms every 5000 ms (as §3.2). A tick at the instant of a power loss
   comes after it. A down broker does not flush; a restart or shutdown leaves everything on disk.
R4 The leader's view of a follower (`fetched`) changes only when the follower reports or is truncated; at a
   leader change it is reset to the follower's log end (DLedger: for reachable members only; others count 0
   until they report). Commit points never decrease within an epoch.
R5 Classic: the master's epoch increments at each restart (a new incarnation). When the master restarts,
   `reconcile=union` first takes the longest log of an up slave that extends the master's; then every slave
   (up or down) keeps only its common prefix with the master (`master_wins` drops slave-only messages). A
   down slave's extra messages are not recovered. Readers use the master while it is up, else the first up
   slave in group order.
R6 Timeline (SPEC §4.2): leader = the broker taking writes for the group (null when it is down, or the group
   has none, or a controller master has no eligible log); isr = classic: the master and the slaves SYNC_MASTER
   can use (up, reachable, master reachable); dledger: the members up and reachable; controller: the
   SyncStateSet. log_end_offset = the leader's CommitLog entries; high_watermark = the consumer-visible point
   (classic: the log end; dledger: the commit index; controller: the SyncStateSet minimum with
   all_ack_in_sync_state_set, else the log end).
R7 Unavailability (SPEC §4.3): the group takes no writes (see R6), or refuses them (SYNC_MASTER without enough
   usable slaves, controller SyncStateSet below min_insync_replicas, DLedger without a reachable majority),
   or the oldest entry still waiting for its ack was appended more than slave_timeout_ms / max_wait_ack_ms ago.
"""

from __future__ import annotations

import copy
import heapq
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from replay.events import PartitionEvents
from replay.policies import (
    CONTROLLER_FIRST_SCAN_MS,
    FIRST_SYNC_STATE_CHECK_MS,
    OS_WRITEBACK_EXPIRE_MS,
    OS_WRITEBACK_PERIOD_MS,
    BrokerRole,
    DLedgerPolicy,
    FlushMode,
    Policy,
    Reconcile,
    RocketMQControllerPolicy,
    RocketMQPolicy,
)
from replay.results import FinalView, MessageRecords, PartitionResult, StateRow, judge
from replay.rocketmq.control import (
    C_ARRIVE,
    C_CHECK,
    C_DETECT,
    C_ELECT,
    C_FLUSH,
    C_LAST,
    C_POLL,
    C_TIMEOUT,
    KEY,
    STOPS,
    majority,
)
from replay.shared.reference.records import epoch_runs, message_records, unavailable_intervals
from schemas.outcomes import NULL_US, Error, Status
from schemas.trace import Kind
from schemas.units import MS


@dataclass
class Entry:
    epoch: int  # epoch of the leader (master incarnation) that appended it
    msg_id: int
    append_us: int  # when that leader appended it (SPEC §3.2 rule 5: copies keep it)
    size: int


@dataclass
class Broker:
    id: int
    up: bool = True
    isolated: bool = False
    incarnation: int = 0  # bumped at every stop
    log: list[Entry] = field(default_factory=list)
    written_us: list[int] = field(default_factory=list)  # when each entry was written on this broker
    durable: int = 0  # prefix known to be on disk
    fetched: int = 0  # the leader's view of this broker's log end (R4)
    lcu: int = 0  # last time it was caught up (SPEC §3.2 rule 5, §3.5)

    @property
    def alive(self) -> bool:
        return self.up and not self.isolated


@dataclass
class Msg:
    msg_id: int
    produce_us: int
    size: int
    deadline_us: int
    payload: dict
    state: str = "new"  # waiting | acked | failed
    status: Status = Status.PENDING
    error: Error = Error.NONE
    ack_us: int = NULL_US
    visible_us: int = NULL_US
    positions: list[tuple[int, int]] = field(default_factory=list)
    taker: tuple[int, int, int] | None = None  # (broker, its incarnation, epoch) that appended it (R1)


def common_prefix(a: list[Entry], b: list[Entry]) -> int:
    """Entries two logs share: same (epoch, msg) at every offset (leader-epoch truncation)."""
    n = 0
    while n < min(len(a), len(b)) and (a[n].epoch, a[n].msg_id) == (b[n].epoch, b[n].msg_id):
        n += 1
    return n


class GroupReference:
    """Replays one broker group. Subclasses hold each family's control and commit rules."""

    answer_error = Error.FLUSH_SLAVE_TIMEOUT

    def __init__(self, policy: Policy, unit: int, members: tuple[int, ...], duration_us: int) -> None:
        self.p = policy
        self.unit = unit
        self.order = tuple(members)
        self.duration_us = duration_us
        self.rep = {b: Broker(b) for b in members}
        self.epoch = 0
        self.msgs: dict[int, Msg] = {}
        self.waiting: set[int] = set()  # messages appended and not yet answered
        self.heap: list[tuple[int, int, int, str, int]] = []
        self.seq = 0
        self.rows: list[StateRow] = []
        self.avail: list[tuple[int, bool, int | None]] = []
        self.replication_bytes = 0
        self.virtual = False
        self.handlers = self._handlers()

    # --------------------------------------------------------------------------------------- plumbing
    def _handlers(self) -> dict[str, Callable[[int, int], None]]:
        """Each derived event's handler, by the name it is scheduled under (subclasses add their own)."""
        return {"noop": self._on_noop, "flush": self._on_flush, "arrive": self._on_arrive,
                "answer": self._on_answer, "deadline": self._on_deadline}

    def _push(self, t: int, code: int, what: str, arg: int = 0, sub: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t * KEY + code, sub, self.seq, what, arg))

    def _alive_members(self) -> list[int]:
        return [b for b in self.order if self.rep[b].alive]

    # ------------------------------------------------------------------------------- durability (R3)
    def _flush_mode(self) -> str:
        if self.p.flush is FlushMode.SYNC:
            return "sync"
        if self.p.flush_interval_ms is None:
            return "os"
        return "interval" if isinstance(self.p, DLedgerPolicy) else "least"

    def _durable_prefix(self, r: Broker, t: int) -> int:
        mode = self._flush_mode()
        if mode in ("sync",):
            return len(r.log)
        if mode == "least":
            return r.durable  # maintained by the flush ticks (a tick at t comes after the power loss)
        n = r.durable
        while n < len(r.log) and self._durable_at(r.written_us[n]) < t:
            n += 1
        return n

    def _durable_at(self, written: int) -> int:
        if self._flush_mode() == "os":
            period, expire = OS_WRITEBACK_PERIOD_MS * MS, OS_WRITEBACK_EXPIRE_MS * MS
            return -(-(written + expire) // period) * period
        period = self.p.flush_interval_ms * MS
        return -(-written // period) * period

    def _on_flush(self, t: int, _: int) -> None:
        """SPEC §3.3 flush: a tick flushes a broker's CommitLog when flush_least_bytes are dirty, or fully at the
        first tick at or after each multiple of flush_thorough_interval_ms (R3)."""
        period = self.p.flush_interval_ms * MS
        if t + period <= self.duration_us:
            self._push(t + period, C_FLUSH, "flush")
        thorough_us = self.p.flush_thorough_interval_ms * MS
        thorough = t // thorough_us > (t - period) // thorough_us
        for r in self.rep.values():
            if not r.up:
                continue
            dirty = sum(e.size for e in r.log[r.durable:])
            if dirty >= self.p.flush_least_bytes or thorough:
                r.durable = len(r.log)

    def _write(self, r: Broker, entries: list[Entry], t: int) -> None:
        r.log.extend(entries)
        r.written_us.extend([t] * len(entries))
        if self._flush_mode() == "sync":
            r.durable = len(r.log)

    def _truncate(self, r: Broker, length: int) -> None:
        del r.log[length:]
        del r.written_us[length:]
        r.durable = min(r.durable, length)
        r.fetched = min(r.fetched, length)

    def _lose_data(self, t: int, r: Broker, kind: Kind) -> None:
        """SPEC §2.2 / §3.3 rule 6: a crash keeps everything, power loss the durable prefix, disk loss nothing."""
        r.up = False
        r.incarnation += 1
        if kind is Kind.POWER_LOSS:
            self._truncate(r, self._durable_prefix(r, t))
        elif kind is Kind.DISK_LOSS:
            self._truncate(r, 0)
        r.durable = len(r.log)  # what is left is on disk (a shutdown flushes everything)

    def _adopt(self, t: int, r: Broker, source: Broker) -> None:
        """C1: the elected broker takes the best eligible log (as if it caught up from it)."""
        if source is r:
            return
        n = common_prefix(r.log, source.log)
        self._truncate(r, n)
        extra = source.log[n:]
        self._write(r, list(extra), t)
        self.replication_bytes += sum(e.size for e in extra)

    # ------------------------------------------------------------------------------------ main loop
    def run(self, events: PartitionEvents) -> PartitionResult:
        trace = self._trace_events(events)
        self._start()
        i = 0
        end_key = (self.duration_us + 1) * KEY
        while True:
            k_trace = trace[i][0] if i < len(trace) else None
            k_derived = self.heap[0][0] if self.heap else None
            cands = [k for k in (k_trace, k_derived) if k is not None and k < end_key]
            if not cands:
                break
            t = min(cands) // KEY
            while True:  # every event of instant t, trace and derived, in key order
                k_trace = trace[i][0] if i < len(trace) else None
                k_derived = self.heap[0][0] if self.heap else None
                nxt = min(k for k in (k_trace, k_derived, (t + 1) * KEY) if k is not None)
                if nxt >= (t + 1) * KEY:
                    break
                if k_trace is not None and k_trace == nxt:
                    self._apply_trace(t, *trace[i][1:])
                    i += 1
                else:
                    _, _, _, what, arg = heapq.heappop(self.heap)
                    self.handlers[what](t, arg)
            self._end_instant(t)
        return self._finish()

    def _start(self) -> None:
        self._push(0, C_LAST, "noop")  # the timeline starts at 0 whatever happens then
        if self._flush_mode() == "least":
            self._push(0, C_FLUSH, "flush")

    def _on_noop(self, t: int, _: int) -> None:
        pass

    def _trace_events(self, ev: PartitionEvents) -> list[tuple]:
        rows = [(int(ev.broker_ts[j]) * KEY + int(ev.broker_kind[j]), int(ev.broker_kind[j]), int(ev.broker_id[j]),
                 int(ev.broker_upto[j]), None) for j in range(len(ev.broker_ts)) if int(ev.broker_id[j]) in self.rep]
        payload = getattr(ev, "payload", None) or {}
        for j in range(len(ev.produce_ts)):
            pay = {k: int(v[j]) for k, v in payload.items()}
            rows.append((int(ev.produce_ts[j]) * KEY + int(Kind.PRODUCE), int(Kind.PRODUCE), int(ev.produce_msg[j]),
                         int(ev.produce_size[j]), pay))
        rows.sort(key=lambda r: (r[0], r[2]))  # SPEC §2.2: kind order, then broker / msg_id
        return rows

    def _apply_trace(self, t: int, kind: int, who: int, value: int, payload) -> None:
        k = Kind(kind)
        if k is Kind.PRODUCE:
            self._produce(t, who, value, payload)
        elif k is Kind.REPLICATE:
            self._replicate(t, who, value)
        elif k in STOPS:
            self._stop(t, who, k)
        elif k is Kind.ISOLATE:
            self.rep[who].isolated = True
            self._isolate(t, who)
        elif k is Kind.RESTART:
            r = self.rep[who]
            r.up = True
            r.durable = len(r.log)
            self._restart(t, who)
        elif k is Kind.HEAL:
            self.rep[who].isolated = False
            self._heal(t, who)

    # ------------------------------------------------------------------------- produce (SPEC §3.3)
    def _produce(self, t: int, msg_id: int, size: int, payload: dict) -> None:
        msg = Msg(msg_id, t, size, t + self.p.delivery_timeout_ms * MS, payload)
        self.msgs[msg_id] = msg
        if payload.get("part", 0) < 0:
            self._fail(msg, Error.NO_ROUTE)  # SPEC §3.3 rule 3: no group took it
            return
        self._push(msg.deadline_us, C_TIMEOUT, "deadline", msg_id, sub=1)
        delay = payload.get("delay", 0)
        if delay > 0:
            self._push(t + delay, C_ARRIVE, "arrive", msg_id, sub=msg_id)  # C2: a retry after max_wait_ack
        else:
            self._arrive(t, msg)

    def _on_arrive(self, t: int, msg_id: int) -> None:
        self._arrive(t, self.msgs[msg_id])

    def _arrive(self, t: int, msg: Msg) -> None:
        raise NotImplementedError

    def _append(self, t: int, b: int, epoch: int, msg: Msg, timeout_ms: int) -> None:
        r = self.rep[b]
        msg.positions.append((epoch, len(r.log)))
        self._write(r, [Entry(epoch, msg.msg_id, t, msg.size)], t)
        msg.state = "waiting"
        self.waiting.add(msg.msg_id)
        msg.taker = (b, r.incarnation, epoch)
        self._push(t + timeout_ms * MS, C_TIMEOUT, "answer", msg.msg_id, sub=0)

    def _ack(self, t: int, msg: Msg) -> None:
        msg.state, msg.status, msg.ack_us = "acked", Status.ACKED, t
        self.waiting.discard(msg.msg_id)

    def _fail(self, msg: Msg, error: Error) -> None:
        msg.state, msg.status, msg.error = "failed", Status.FAILED, error
        self.waiting.discard(msg.msg_id)

    def _on_answer(self, t: int, msg_id: int) -> None:
        """R1: the broker that took the request answers its timeout status if it is still that incarnation."""
        msg = self.msgs[msg_id]
        if msg.state != "waiting":
            return
        b, inc, _ = msg.taker
        r = self.rep[b]
        if r.up and r.incarnation == inc:
            self._fail(msg, self.answer_error)

    def _on_deadline(self, t: int, msg_id: int) -> None:
        msg = self.msgs[msg_id]
        if msg.state == "waiting":
            self._fail(msg, Error.DELIVERY_TIMEOUT)  # SPEC §3.1: the client gives up

    def _ack_upto(self, t: int, b: int, epoch: int, upto: int) -> None:
        """Acknowledge waiting messages that `b` appended in `epoch` below offset `upto` of its log."""
        r = self.rep[b]
        for msg_id in sorted(self.waiting):
            msg = self.msgs[msg_id]
            if msg.taker[0] != b or msg.taker[2] != epoch or msg.taker[1] != r.incarnation:
                continue
            e, o = msg.positions[-1]
            if o < upto and o < len(r.log) and (r.log[o].epoch, r.log[o].msg_id) == (e, msg.msg_id):
                self._ack(t, msg)

    def _mark_visible(self, t: int, r: Broker, lo: int, hi: int) -> None:
        if self.virtual:
            return
        for offset in range(lo, min(hi, len(r.log))):
            entry = r.log[offset]
            msg = self.msgs.get(entry.msg_id)
            if msg is not None and msg.visible_us == NULL_US and (entry.epoch, offset) in msg.positions:
                msg.visible_us = t

    # -------------------------------------------------------------- replication (SPEC §3.2 rule 5)
    def _leader_for_fetch(self) -> int | None:
        raise NotImplementedError

    def _replicate(self, t: int, b: int, upto: int) -> None:
        ldr = self._leader_for_fetch()
        r = self.rep[b]
        if ldr is None or b == ldr or not r.alive or not self.rep[ldr].alive:
            return  # SPEC §2.2: ignored for a down/isolated follower or an unreachable leader
        lead = self.rep[ldr].log
        if r.log:  # a follower's log is always a prefix of its leader's (truncation at every leader change)
            last = len(r.log) - 1
            assert (r.log[last].epoch, r.log[last].msg_id) == (lead[last].epoch, lead[last].msg_id)
        count = bisect_right(lead, upto, key=lambda e: e.append_us)
        new_len = max(len(r.log), count)
        copied = lead[len(r.log): new_len]
        self._write(r, list(copied), t)
        self.replication_bytes += sum(e.size for e in copied)
        r.fetched = new_len
        r.lcu = t if new_len == len(lead) else max(r.lcu, upto)
        self._progress(t, b)

    def _progress(self, t: int, b: int) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------------------ records
    def _row(self, t: int, leader: int | None, isr: tuple[int, ...], hw: int | None) -> StateRow:
        if leader is None:
            return StateRow(t, None, self.epoch, isr, None, None)
        return StateRow(t, leader, self.epoch, isr, len(self.rep[leader].log), hw)

    def _end_instant(self, t: int) -> None:
        row = self._state_row(t)
        last = self.rows[-1] if self.rows else None
        if last is None or (row.leader, row.leader_epoch, row.isr, row.log_end_offset, row.high_watermark) != (
                last.leader, last.leader_epoch, last.isr, last.log_end_offset, last.high_watermark):
            self.rows.append(row)
        self.avail.append((t, *self._availability()))

    def _stall_from(self, b: int, commit: int, timeout_ms: int) -> int | None:
        log = self.rep[b].log
        return None if commit >= len(log) else log[commit].append_us + timeout_ms * MS

    def _unavailable_intervals(self) -> list[tuple[int, int]]:
        return unavailable_intervals(self.avail, self.duration_us)

    def _finish(self) -> PartitionResult:
        end_runs, end_hw, end_up = self._end_view()
        final = copy.deepcopy(self)
        final.virtual = True
        final.heap = []
        final_log = final._recover(self.duration_us)  # SPEC §4.1: every broker back, rules run to the end
        view = FinalView(None if final_log is None else epoch_runs(final_log), end_runs, end_hw, end_up)
        return PartitionResult(self.unit, judge(self._records(), view), self.rows, self._unavailable_intervals(),
                               self.replication_bytes)

    def _records(self) -> MessageRecords:
        msgs, rec = message_records(self.msgs)
        keys = sorted({k for m in msgs for k in m.payload})
        rec.payload = {k: np.array([m.payload.get(k, -1) for m in msgs], dtype=np.int64) for k in keys}
        return rec

    # hooks
    def _state_row(self, t: int) -> StateRow: ...

    def _availability(self) -> tuple[bool, int | None]: ...

    def _end_view(self) -> tuple[np.ndarray, int, bool]: ...

    def _recover(self, t: int) -> list[Entry] | None: ...

    def _stop(self, t: int, b: int, kind: Kind) -> None: ...

    def _isolate(self, t: int, b: int) -> None: ...

    def _restart(self, t: int, b: int) -> None: ...

    def _heal(self, t: int, b: int) -> None: ...


# ================================================================================ rocketmq (§3.3)
class ClassicReference(GroupReference):
    """SPEC §3.3: master/slave, no failover of roles."""

    def __init__(self, policy: RocketMQPolicy, unit: int, members: tuple[int, ...], duration_us: int) -> None:
        super().__init__(policy, unit, members, duration_us)
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
        elif len(self._usable_slaves()) < self.need:
            self._fail(msg, Error.SLAVE_NOT_AVAILABLE)  # rule 4: at once, stored on the master
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


# ================================================================================ dledger (§3.4)
class DLedgerReference(GroupReference):
    """SPEC §3.4: Raft groups, majority commit, heartbeat-leak detection, deterministic vote delay."""

    answer_error = Error.IN_SYNC_REPLICAS_NOT_ENOUGH

    def __init__(self, policy: DLedgerPolicy, unit: int, members: tuple[int, ...], duration_us: int) -> None:
        super().__init__(policy, unit, members, duration_us)
        self.q = majority(len(members))
        self.detect_us = policy.heartbeat_ms * policy.max_heartbeat_leak * MS
        self.vote_us = policy.vote_delay_ms * MS
        self.hb_us = policy.heartbeat_ms * MS
        self.elected_at: int | None = None  # the initial leader leads from before the trace
        self.leader: int | None = members[0]
        self.target: int | None = members[0]  # the leader clients know from their last route poll
        self.commit = 0
        self.silent_since: int | None = None
        self.stepdown_at: int | None = None
        self.elect_at: int | None = None
        self.await_majority = False

    def _leader_for_fetch(self) -> int | None:
        return self.leader

    def _writable(self) -> bool:
        """Rule 1 with SPEC §3.7 R-1: a group takes writes while the broker its clients know from their last route
        poll (`MQClientInstance` pollNameServerInterval, `DefaultMQProducerImpl.tryToFindTopicPublishInfo`) is
        still its leader and is up. SPEC §3.7 R-4 (`DLedgerServer.handleAppend` checks only leadership and a full
        pending queue): an isolated leader still appends until it steps down; its entries cannot commit, fail
        with IN_SYNC_REPLICAS_NOT_ENOUGH after max_wait_ack_ms (R1) and survive if its log wins a later vote."""
        ldr = self.leader
        return ldr is not None and self.target == ldr and self.rep[ldr].up

    def _can_commit(self) -> bool:
        # the leader reaches a majority, itself included; a one-member group is its own majority, so its
        # leader commits while isolated too (isolation only cuts it from other brokers)
        ldr = self.leader
        return ldr is not None and self.rep[ldr].up and self._reach() >= self.q

    def _arrive(self, t: int, msg: Msg) -> None:
        if not self._writable():
            self._fail(msg, Error.NO_LEADER)  # R2 (routing keeps this from happening)
            return
        self._append(t, self.leader, self.epoch, msg, self.p.max_wait_ack_ms)
        self._recommit(t)

    def _progress(self, t: int, b: int) -> None:
        self._recommit(t)

    def _recommit(self, t: int) -> None:
        """Rule 2: an entry commits when a majority holds it (leader included); the ack comes at commit."""
        ldr = self.leader
        if ldr is None or not self.rep[ldr].up or (self.rep[ldr].isolated and self.q > 1):
            return  # an isolated leader commits only as a one-member group, its own majority
        ends = sorted((len(self.rep[b].log) if b == ldr else self.rep[b].fetched for b in self.order), reverse=True)
        cand = ends[self.q - 1]
        if cand > self.commit:
            self._mark_visible(t, self.rep[ldr], self.commit, cand)  # rule 4: consumers see committed entries
            self.commit = cand
        if not self.virtual:
            self._ack_upto(t, ldr, self.epoch, self.commit)

    # ----- control (rule 3, C6)
    def _heard_last(self, t: int) -> int:
        """SPEC §3.7 R-3 (`DLedgerLeaderElector`: followers notice leader loss when
        elapsed(lastLeaderHeartBeatTime) > maxHeartBeatLeak × heartBeatTimeIntervalMs): the leader heartbeats at
        every multiple of heartbeat_ms from 0 and none at the instant it fails, so the last heartbeat before a
        failure at t is the greatest multiple strictly before t; a leader elected later than that heartbeats at its
        election (maintainAsLeader with lastSendHeartBeatTime = -1)."""
        last = (t - 1) // self.hb_us * self.hb_us
        return last if self.elected_at is None else max(last, self.elected_at)

    def _reach(self) -> int:
        return 1 if self.rep[self.leader].isolated else len(self._alive_members())

    def _quorum_check(self, t: int) -> None:
        if self.leader is None or not self.rep[self.leader].up:
            return
        if self._reach() < self.q:
            if self.stepdown_at is None:
                self.stepdown_at = self._heard_last(t) + self.detect_us  # from its last good round
                self._push(self.stepdown_at, C_DETECT, "stepdown")
        else:
            self.stepdown_at = None

    def _schedule_election(self, at: int) -> None:
        self.elect_at = at
        self._push(at, C_ELECT, "elect")

    def _lose_leader(self, t: int) -> None:
        self.leader = None
        self.silent_since = None
        self.stepdown_at = None
        self._push(_next_poll(self.p, t), C_POLL, "poll")  # the next poll finds no master

    def _handlers(self) -> dict[str, Callable[[int, int], None]]:
        return {**super()._handlers(), "poll": self._on_poll, "stepdown": self._on_stepdown, "elect": self._on_elect}

    def _on_poll(self, t: int, _: int) -> None:
        """SPEC §3.7 R-1: at every route poll clients learn the group's leader of that moment (none if none)."""
        self.target = self.leader

    def _stop(self, t: int, b: int, kind: Kind) -> None:
        was_iso = self.rep[b].isolated
        self._lose_data(t, self.rep[b], kind)
        if b == self.leader:
            silent = self.silent_since if was_iso and self.silent_since is not None else t
            heard = self._heard_last(silent)
            self._lose_leader(t)
            # noticed, then a vote (a lone member's isolated leader may die after that delay: vote now)
            self._schedule_election(max(heard + self.detect_us + self.vote_us, t))
        elif self.leader is not None:
            self._quorum_check(t)

    def _isolate(self, t: int, b: int) -> None:
        if b == self.leader:
            self.silent_since = t
            self._quorum_check(t)  # an isolated leader reaches no majority: it steps down detect_us later
            self._schedule_election(self._heard_last(t) + self.detect_us + self.vote_us)
        elif self.leader is not None:
            self._quorum_check(t)

    def _heal(self, t: int, b: int) -> None:
        if b == self.leader:
            self.silent_since = None
            self.elect_at = None  # healed before anyone noticed
        self._member_back(t, b)

    def _restart(self, t: int, b: int) -> None:
        self._member_back(t, b)

    def _member_back(self, t: int, b: int) -> None:
        if self.leader is not None:
            self._quorum_check(t)
        elif self.await_majority and len(self._alive_members()) >= self.q:
            self.await_majority = False
            self._schedule_election(t + self.vote_us)

    def _on_stepdown(self, t: int, _: int) -> None:
        if self.stepdown_at != t or self.leader is None:
            return
        isolated = self.rep[self.leader].isolated
        self._lose_leader(t)
        if not isolated:
            self.await_majority = True  # no majority: the group takes no writes until one returns

    def _on_elect(self, t: int, _: int) -> None:
        if self.elect_at != t or self.leader is not None:
            return
        self.elect_at = None
        voters = self._alive_members()
        if len(voters) < self.q:
            self.await_majority = True
            return
        self._elect(t, voters)
        if self.leader != self.target:
            self._push(_next_poll(self.p, t), C_POLL, "poll")  # a re-elected known leader needs no poll
        self._quorum_check(t)

    def _elect(self, t: int, voters: list[int]) -> None:
        """Rule 3 with C1: the first voter leads with the longest voter log (Raft order: last epoch, length)."""
        best = max(voters, key=lambda b: (_last_epoch(self.rep[b].log), len(self.rep[b].log), -self.order.index(b)))
        new = voters[0]
        self._adopt(t, self.rep[new], self.rep[best])
        self.leader = new
        self.elected_at = t
        self.epoch += 1
        lead = self.rep[new].log
        for b in self.order:  # others truncate to the common prefix with the new leader
            r = self.rep[b]
            if b != new:
                self._truncate(r, common_prefix(r.log, lead))
            r.fetched = len(r.log) if r.alive else 0  # R4
        ends = sorted((len(lead) if b == new else self.rep[b].fetched for b in self.order), reverse=True)
        self.commit = ends[self.q - 1]
        self._mark_visible(t, self.rep[new], 0, self.commit)

    # ----- records
    def _state_row(self, t: int) -> StateRow:
        return self._row(t, self.leader, tuple(self._alive_members()), self.commit)

    def _availability(self) -> tuple[bool, int | None]:
        if not self._writable() or not self._can_commit():
            return True, None  # R7: no leader clients know, or one that cannot reach a majority
        return False, self._stall_from(self.leader, self.commit, self.p.max_wait_ack_ms)

    def _end_view(self):
        ldr = self.leader
        if ldr is None or not self.rep[ldr].up:
            return epoch_runs([]), 0, False
        return epoch_runs(self.rep[ldr].log), self.commit, True

    def _recover(self, t: int) -> list[Entry]:
        for r in self.rep.values():
            r.up, r.isolated = True, False
        if self.leader is None:
            self._elect(t, list(self.order))
        return self.rep[self.leader].log


def _next_poll(p: Policy, t: int) -> int:
    """SPEC §3.7 R-1: the first route poll at or after t (polls every route_refresh_ms from 0; the poll at 0 is
    the initial route, so the first that can teach clients a new master is at route_refresh_ms)."""
    r = p.route_refresh_ms * MS
    return max(r, -(-t // r) * r)


def _last_epoch(log: list[Entry]) -> int:
    return log[-1].epoch if log else -1


# ===================================================================== rocketmq-controller (§3.5)
@dataclass
class ZombieMaster:
    """An isolated master replaced by the controller that clients still write to (SPEC §3.2 rule 10, C7)."""

    broker: int
    epoch: int
    view: tuple[int, ...]
    hw: int
    ack: int  # its in_sync_replicas ack point when replaced: its slaves' copies are not counted after that


class ControllerReference(GroupReference):
    """SPEC §3.5: like Kafka with a SyncStateSet, RocketMQ acks and controller detection."""

    def __init__(self, policy: RocketMQControllerPolicy, unit: int, members: tuple[int, ...],
                 duration_us: int) -> None:
        super().__init__(policy, unit, members, duration_us)
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

    def _recompute_hw(self, t: int) -> None:
        """The high watermark (confirm offset) is the SyncStateSet minimum; it never decreases in an epoch."""
        m = self.master
        if m is None or self.blocked or not self.rep[m].up:
            return
        view = self._view(m)
        cand = min(len(self.rep[b].log) if b == m else self.rep[b].fetched for b in view)
        if cand > self.hw:
            if self.p.all_ack_in_sync_state_set:
                self._mark_visible(t, self.rep[m], self.hw, cand)
            self.hw = cand
        if not self.virtual:
            self._ack_upto(t, m, self.epoch, self._ack_point(m))

    def _progress(self, t: int, b: int) -> None:
        self._recompute_hw(t)
        if b not in self.sss and self.rep[b].fetched >= self.hw:
            self.sss = self._in_order([*self.sss, b])  # a slave rejoins once it reaches the confirm offset
            self._recompute_hw(t)

    def _handlers(self) -> dict[str, Callable[[int, int], None]]:
        return {**super()._handlers(), "check": self._on_check, "housekeeping": self._on_housekeeping,
                "detect": self._on_detect, "elect": self._on_elect, "poll": self._on_poll}

    def _on_check(self, t: int, _: int) -> None:
        """SPEC §3.5: a slave not caught up for ha_max_time_slave_not_catchup_ms leaves the SyncStateSet; checked
        by a master that is up and reachable 3000 ms after start, then every check_sync_state_set_period_ms
        (SPEC §3.7 C-1, `ReplicasManager`)."""
        period = self.p.check_sync_state_set_period_ms * MS
        if t + period <= self.duration_us:
            self._push(t + period, C_CHECK, "check")
        m = self.master
        if m is None or self.blocked or not self.rep[m].alive:
            return
        leo = len(self.rep[m].log)
        for f in list(self.sss):
            r = self.rep[f]
            if f != m and t - r.lcu > self.p.ha_max_time_slave_not_catchup_ms * MS and r.fetched < leo:
                self.sss.remove(f)
        self._recompute_hw(t)

    def _connection_lost(self, t: int, b: int, kind: Kind, was_iso: bool) -> None:
        """SPEC §3.7 C-1 (`AutoSwitchHAService.removeConnection`): a slave whose HA connection closes leaves the
        SyncStateSet at once: at its crash or shutdown; after a power loss, disk loss or isolation, when the
        master's housekeeping closes the silent connection ha_housekeeping_interval_ms later
        (`MessageStoreConfig.haHousekeepingInterval`), unless the catch-up check removed it first. A master that
        cannot reach the controller (isolated) changes nothing."""
        m = self.master
        if m is None or b == m or self.blocked or not self.rep[m].alive or b not in self.sss:
            return
        if kind in (Kind.CRASH, Kind.SHUTDOWN) and not was_iso:
            self.housekeeping.pop(b, None)
            self._shrink(t, b)
        elif b not in self.housekeeping:
            due = t + self.p.ha_housekeeping_interval_ms * MS
            self.housekeeping[b] = due
            self._push(due, C_CHECK, "housekeeping", b)

    def _on_housekeeping(self, t: int, b: int) -> None:
        if self.housekeeping.get(b) != t:
            return
        del self.housekeeping[b]
        m = self.master
        if m is not None and b != m and not self.blocked and self.rep[m].alive and b in self.sss:
            self._shrink(t, b)

    def _shrink(self, t: int, b: int) -> None:
        self.sss.remove(b)
        self._recompute_hw(t)  # the confirm offset may move past what only b lacked

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
            self._push(_next_poll(self.p, t), C_POLL, "poll")  # the next poll finds no master
            return
        self.master = eligible[0]
        self.epoch += 1
        self.blocked = True
        self._unblock(t)
        if self.master != self.target:
            # clients (also those of a zombie) learn the new master at their next route poll
            self._push(_next_poll(self.p, t), C_POLL, "poll")

    def _unblock(self, t: int) -> None:
        """The new master takes the best alive SyncStateSet log by (epoch, offset), or any alive replica's with
        enable_elect_unclean_master; without one it waits (C7)."""
        m = self.master
        alive = self._alive_members()
        pool = [b for b in alive if b in self.sss] or (alive if self.p.enable_elect_unclean_master else [])
        if not pool:
            return
        best = max(pool, key=lambda b: (_last_epoch(self.rep[b].log), len(self.rep[b].log), -self.order.index(b)))
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


REFERENCES = {"rocketmq": ClassicReference, "dledger": DLedgerReference, "rocketmq-controller": ControllerReference}


def replay_group(policy: Policy, unit: int, members: tuple[int, ...], events: PartitionEvents,
                 duration_us: int) -> PartitionResult:
    """Reference replay of one broker group (SPEC §9)."""
    return REFERENCES[policy.family](policy, unit, members, duration_us).run(events)
