"""The reference replay of one RocketMQ broker group: the shared state and the event loop (SPEC §2.2 order),
produce, replication and the answers to clients (R1). Each family's control and commit rules are a subclass:
`classic.py`, `dledger.py`, `controller.py`; the logs on disk are in `logs.py`, the outputs in `outputs.py`."""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Callable

import numpy as np

from replay.events import PartitionEvents
from replay.policies import Policy
from replay.results import PartitionResult, StateRow
from replay.rocketmq.control import (
    C_ARRIVE,
    C_FLUSH,
    C_LAST,
    C_POLL,
    C_TIMEOUT,
    KEY,
    STOPS,
    RouteClock,
    unpack_delay,
)
from replay.rocketmq.reference.logs import GroupReferenceLogs
from replay.rocketmq.reference.outputs import GroupReferenceOutputs
from replay.rocketmq.reference.state import Broker, Entry, Msg, MsgState, next_poll, set_state
from schemas.outcomes import NULL_US, Error, Status
from schemas.trace import Kind
from schemas.units import MS


class GroupReference(GroupReferenceLogs, GroupReferenceOutputs):
    """Replays one broker group. Subclasses hold each family's control and commit rules."""

    answer_error = Error.FLUSH_SLAVE_TIMEOUT

    def __init__(self, policy: Policy, unit: int, members: tuple[int, ...], duration_us: int,
                 clock: RouteClock | None = None) -> None:
        self.p = policy
        # SPEC §3.7 R-1/R-5: the producers' poll phase and the instants an empty route was fetched afresh (routing
        # derives them from every group; the reference replays them)
        self.clock = clock or RouteClock()
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
        return {"noop": self._on_noop, "refetch": self._on_noop, "flush": self._on_flush, "arrive": self._on_arrive,
                "copy": self._on_copy, "answer": self._on_answer, "deadline": self._on_deadline}

    def _push(self, t: int, code: int, what: str, arg: int = 0, sub: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t * KEY + code, sub, self.seq, what, arg))

    def _next_poll(self, t: int) -> int:
        return next_poll(self.p, t, self.clock.phase_us)

    def _alive_members(self) -> list[int]:
        return [b for b in self.order if self.rep[b].alive]

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
        for t in self.clock.refetch_us:  # clients learn every group's master of that moment
            self._push(t, C_POLL, "refetch")
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
        delay, copies = unpack_delay(payload.get("delay", 0))
        for k in range(copies.bit_length()):  # C3: earlier attempts here whose entries stay in the log
            if copies >> k & 1:
                if k == 0:
                    self._copy(t, msg)
                else:
                    self._push(t + k * self.p.max_wait_ack_ms * MS, C_ARRIVE, "copy", msg_id, sub=msg_id)
        if payload.get("part", 0) < 0:
            self._fail(msg, Error.NO_ROUTE)  # SPEC §3.3 rule 3: no group took it
            return
        self._push(msg.deadline_us, C_TIMEOUT, "deadline", msg_id, sub=1)
        if delay > 0:
            self._push(t + delay, C_ARRIVE, "arrive", msg_id, sub=msg_id)  # C2: a retry after max_wait_ack
        else:
            self._arrive(t, msg)

    def _on_arrive(self, t: int, msg_id: int) -> None:
        self._arrive(t, self.msgs[msg_id])

    def _arrive(self, t: int, msg: Msg) -> None:
        raise NotImplementedError

    def _on_copy(self, t: int, msg_id: int) -> None:
        self._copy(t, self.msgs[msg_id])

    def _copy(self, t: int, msg: Msg) -> None:
        """C3 (DLedger): an attempt that was appended and then retried; its entry stays, its answer is not the
        send's."""
        raise NotImplementedError

    def _append(self, t: int, b: int, epoch: int, msg: Msg, timeout_ms: int) -> None:
        r = self.rep[b]
        msg.positions.append((epoch, len(r.log)))
        self._write(r, [Entry(epoch, msg.msg_id, t, msg.size)], t)
        set_state(msg, MsgState.WAITING)
        self.waiting.add(msg.msg_id)
        msg.taker = (b, r.incarnation, epoch)
        self._push(t + timeout_ms * MS, C_TIMEOUT, "answer", msg.msg_id, sub=0)

    def _ack(self, t: int, msg: Msg) -> None:
        set_state(msg, MsgState.ACKED)
        msg.status, msg.ack_us = Status.ACKED, t
        self.waiting.discard(msg.msg_id)

    def _fail(self, msg: Msg, error: Error) -> None:
        set_state(msg, MsgState.FAILED)
        msg.status, msg.error = Status.FAILED, error
        self.waiting.discard(msg.msg_id)

    def _on_answer(self, t: int, msg_id: int) -> None:
        """R1: the broker that took the request answers its timeout status if it is still that incarnation."""
        msg = self.msgs[msg_id]
        if msg.state != MsgState.WAITING:
            return
        b, inc, _ = msg.taker
        r = self.rep[b]
        if r.up and r.incarnation == inc:
            self._fail(msg, self.answer_error)

    def _on_deadline(self, t: int, msg_id: int) -> None:
        msg = self.msgs[msg_id]
        if msg.state == MsgState.WAITING:
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

    # hooks
    def _state_row(self, t: int) -> StateRow: ...

    def _availability(self) -> tuple[bool, int | None]: ...

    def _end_view(self) -> tuple[np.ndarray, int, bool]: ...

    def _recover(self, t: int) -> list[Entry] | None: ...

    def _stop(self, t: int, b: int, kind: Kind) -> None: ...

    def _isolate(self, t: int, b: int) -> None: ...

    def _restart(self, t: int, b: int) -> None: ...

    def _heal(self, t: int, b: int) -> None: ...
