"""The producer's side of an acknowledgement (SPEC §3.7 K-6, K-7, K-8), shared by both `kafka` engines.

The engines decide each message's fate and the instant the leader could answer it as if the client sent every
message the moment it was produced. This module turns that instant into the one the application sees:

- K-7 (acks=0, acks=1): the batch leaves linger_ms after the message and the answer comes back one round trip
  (manifest `client_round_trip_us`) after the leader's append; acks=0 counts a message as sent when its batch leaves.
- K-6 (acks=all): the client's per-connection pipeline. The broker serves one request per connection at a time
  (`SocketServer` mutes the channel until the response is sent), a round trip at least (`next_turn`), and an
  acks=all request is answered at the first instant every ISR follower has fetched past its records
  (`DelayedProduce`, `Partition.maybeIncrementLeaderHW`). A message the engine left pending at the end goes through
  the pipeline too; a request answered after the trace holds its slot, and so do the other turns' requests behind
  it on the connection.
  The followers fetch all partitions of one leader in one request, so every partition of that leader sees the same
  fetch instants: the trace's `replicate` events of this partition. A partition's next request is read once the
  connection's previous ones are answered; with P_b partitions led by the broker and `partitions_per_request`
  partitions per request, ceil(P_b / partitions_per_request) requests take turns, one fetch cycle each, whenever
  the partition has more waiting (all partitions are taken to be loaded alike). P_b follows the leaders: a
  broker that takes over a failed broker's partitions serves more turns (`Leadership`, `ClientPipeline.turn_steps`).
  A request is made, and its content fixed, when one of the connection's max_in_flight_requests_per_connection
  slots frees, some answers before the broker reads it (librdkafka `rd_kafka_toppar_producer_serve`, Java
  `InFlightRequests.canSendMore`). Only a live leader (up, and not isolated unless alone in the ISR it knew)
  answers: an ISR change while it is down answers nothing, and a request it left unanswered is answered by the
  next live leader once clients reach it, client_failover_ms after it is first live (librdkafka
  `rd_kafka_broker_fail`; `ClientPipeline.timeline`).

- K-8 (acks=all with librdkafka): after an unclean election of any partition of the topic the idempotent
  producer's next answer from that partition's new leader is a fatal OUT_OF_ORDER_SEQUENCE_NUMBER, and every
  message it still holds fails then (`ClientPipeline.fatal`, at the instants of `Leadership.unclean_us`).

The pass is the same for both engines: the reference interpreter runs `plan_requests` (readable Python), the
kernel its compiled twin (`replay/kafka/kernels/pipeline.py`); the differential tests hold them equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from replay.events import PartitionEvents
from replay.policies import Acks, KafkaPolicy
from replay.results import MessageRecords, StateRow
from schemas.outcomes import NULL_US, Error, Status
from schemas.trace import CONTROL_KINDS, DEFAULT_CLIENT_ROUND_TRIP_US, STOP_KINDS, Kind
from schemas.units import MS

#: No fetch cycle answers the request (no leader, or a follower never fetches again): the engine's instant stands.
NEVER = np.iinfo(np.int64).max


@dataclass(frozen=True, eq=False)
class Leadership:
    """Who leads each partition over the trace, for P_b of SPEC §3.7 K-6: `leader[k, p]` is partition p's leader
    from instant `ts[k]` on (-1: none); `ts` starts at 0 and holds each instant at which some leader changes.
    Built once per trace and policy (`replay.kafka.leadership.leadership`) and handed to every partition's
    engines (`engine_context`), so both engines count the same leaders."""

    ts: np.ndarray  # int64, ascending
    leader: np.ndarray  # int64, shape (len(ts), partitions)
    #: The instants of the topic's unclean elections (any partition), ascending: SPEC §3.7 K-8.
    unclean_us: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @classmethod
    def of(cls, changes: Sequence[Sequence[tuple[int, int | None]]], unclean_us: Sequence[int] = ()) -> Leadership:
        """From each partition's leader changes, (instant, leader or None) in time order, the first at 0, and the
        instants of the topic's unclean elections."""
        ts = np.unique(np.array([0, *(t for part in changes for t, _ in part)], dtype=np.int64))
        leader = np.full((len(ts), len(changes)), -1, dtype=np.int64)
        for p, part in enumerate(changes):
            at = np.array([t for t, _ in part], dtype=np.int64)
            who = np.array([-1 if b is None else b for _, b in part], dtype=np.int64)
            k = np.searchsorted(at, ts, side="right") - 1  # the change in force at each instant
            leader[:, p] = np.where(k >= 0, who[np.maximum(k, 0)], -1)
        return cls(ts, leader, np.unique(np.array(unclean_us, dtype=np.int64)))


@dataclass
class ClientPipeline:
    """What the pass needs of one partition: the policy's client settings, who leads the other partitions (P_b),
    the round trip, and the partition's produce sizes and follower fetches as the engine sees them (chunk by
    chunk for the kernel)."""

    policy: KafkaPolicy
    partition: int
    replicas: tuple[int, ...]
    duration_us: int
    leadership: Leadership | None = None
    round_trip_us: int = DEFAULT_CLIENT_ROUND_TRIP_US
    msg: list[np.ndarray] = field(default_factory=list)
    size: list[np.ndarray] = field(default_factory=list)
    fetch: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)

    def turn_steps(self, rows: Sequence[StateRow]) -> tuple[np.ndarray, np.ndarray]:
        """T of SPEC §3.7 K-6 as a step function (instants, T from each on): the requests that take turns on the
        connection of the partition's leader while every partition has data waiting, ⌈P_b / partitions_per_request⌉,
        with P_b this partition plus the others its leader (the partition's own, from `rows`) leads then. T = 1
        with one request per broker (partitions_per_request null), without a leader, or without `leadership`."""
        per = self.policy.partitions_per_request
        if per is None or self.leadership is None:
            return np.zeros(1, np.int64), np.ones(1, np.int64)
        own_ts = np.array([r.ts_us for r in rows], dtype=np.int64)
        own = np.array([-1 if r.leader is None else r.leader for r in rows], dtype=np.int64)
        lead = self.leadership
        ts = np.union1d(lead.ts, own_ts)
        k_own = np.searchsorted(own_ts, ts, side="right") - 1
        b = np.where(k_own >= 0, own[np.maximum(k_own, 0)], -1)
        others = np.delete(lead.leader, self.partition, axis=1)[np.searchsorted(lead.ts, ts, side="right") - 1]
        p_b = 1 + (others == b[:, None]).sum(axis=1)
        turns = np.where(b >= 0, -(-p_b // per), 1).astype(np.int64)
        keep = np.concatenate([[True], turns[1:] != turns[:-1]])  # the steps only
        return ts[keep], turns[keep]

    def fatal_us(self) -> np.ndarray:
        """The instants the producer fails fatally (SPEC §3.7 K-8), ascending, within the trace: each unclean
        election of the topic plus client_failover_ms and the round trip, when the new leader first answers."""
        if self.leadership is None or not self.policy.fatal_after_unclean_election:
            return np.zeros(0, np.int64)
        at = np.unique(self.leadership.unclean_us + self.policy.client_failover_ms * MS + self.round_trip_us)
        return at[at <= self.duration_us]

    def producer_ends(self, produce_us: np.ndarray) -> np.ndarray:
        """Per message, the instant its producer fails (SPEC §3.7 K-8): the first of `fatal_us` after the message is
        produced (a message produced at a fatal instant belongs to the new producer), NEVER if none."""
        at = self.fatal_us()
        if not len(at):
            return np.full(len(produce_us), NEVER, np.int64)
        k = np.searchsorted(at, produce_us, side="right")
        return np.where(k < len(at), at[np.minimum(k, len(at) - 1)], NEVER)

    @property
    def gap_us(self) -> int:
        """With one request in flight the broker idles a round trip between two requests of the connection."""
        return self.round_trip_us if self.policy.max_in_flight_requests_per_connection == 1 else 0

    def observe(self, ev: PartitionEvents) -> None:
        if self.policy.acks is not Acks.ALL:
            return  # K-7 needs no more than the records
        self.msg.append(ev.produce_msg)
        self.size.append(ev.produce_size)
        self.fetch.append((ev.broker_ts, ev.broker_kind, ev.broker_id, ev.broker_upto))

    def inputs(self, rec: MessageRecords, rows: Sequence[StateRow]) -> tuple:
        """The arrays `plan_requests` takes: messages in produce order, the broker events as observed (the
        planner picks each follower's `replicate` events), and the timeline of the leader that can answer
        (`timeline`)."""
        # records come in msg_id order, usually also produce order: sort only when they are not
        sorted_ = not len(rec.msg_id) or bool(np.all(rec.produce_us[1:] >= rec.produce_us[:-1]))
        order = slice(None) if sorted_ else np.lexsort((rec.msg_id, rec.produce_us))
        msg, size = _joined(self.msg, np.int64), _joined(self.size, np.int64)
        if len(msg) == len(rec.msg_id) and np.array_equal(msg, rec.msg_id[order]):
            sizes = size  # the produce events in the records' produce order (the common case)
        else:
            by_id = np.argsort(msg, kind="stable")
            sizes = size[by_id][np.searchsorted(msg[by_id], rec.msg_id[order])]
        # every message the engine acknowledged or left pending at the end goes through the pipeline; a pending one
        # is answered after the trace (NEVER), and so is the request that carries it
        status = rec.status[order]
        ok = (status == int(Status.ACKED)) | (status == int(Status.PENDING))
        eng = np.where(status == int(Status.PENDING), NEVER, rec.ack_us[order])
        f_ts, f_kind, f_who, f_upto = (_joined([f[i] for f in self.fetch], dt)
                                       for i, dt in enumerate((np.int64, np.int8, np.int64, np.int64)))
        return (order, rec.produce_us[order], eng, ok, sizes, np.array(self.replicas, np.int64),
                f_ts, f_kind, f_who, f_upto, *self.timeline(rows, f_ts, f_kind, f_who))

    def timeline(self, rows: Sequence[StateRow], f_ts: np.ndarray, f_kind: np.ndarray, f_who: np.ndarray
                 ) -> tuple[np.ndarray, ...]:
        """Who can answer a request, from each instant on (SPEC §3.7 K-6): the steps of the engine's `rows` and of
        the partition's fault events, as (instant, ISR followers as a bit mask over `replicas`, leadership, live,
        from). A leadership is one incarnation of a broker leading without another broker leading in between
        (-1: no leader): the connection the client's requests wait on. Live: its leader is up and moves its high
        watermark. An isolated leader gets no follower fetches (SPEC §2.2) and keeps the ISR it knew when cut off
        (rule 10): it is live, with that ISR, only if the ISR held itself alone; one elected while isolated is not
        (it does not know it leads, K-3). From: the first instant it was live plus client_failover_ms, when
        clients whose requests an earlier leadership left unanswered reach it (rule 8)."""
        failover = self.policy.client_failover_ms * MS
        fault = np.flatnonzero(np.isin(f_kind, [int(k) for k in CONTROL_KINDS]))
        stops = [int(k) for k in STOP_KINDS]
        up = dict.fromkeys(self.replicas, True)
        isolated = dict.fromkeys(self.replicas, False)
        incarnation = dict.fromkeys(self.replicas, 0)  # a restart starts a new one: its connections are new
        st: list[tuple[int, int, int, bool, int]] = []
        lead_key: tuple[int, int] | None = None
        isolated_at: dict[int, int] = {}
        lead_id, lead_from, lead_since = -1, NEVER, 0
        view: dict[tuple[int, int], int] = {}  # per leadership and isolation, the ISR (followers) its leader knew

        def step(t: int, row: StateRow) -> None:
            nonlocal lead_key, lead_id, lead_from, lead_since
            ldr = row.leader
            if ldr is not None and (ldr, incarnation.get(ldr, 0)) != lead_key:
                lead_key, lead_id, lead_from, lead_since = (ldr, incarnation.get(ldr, 0)), lead_id + 1, NEVER, t
            mask = 0 if ldr is None else sum(1 << self.replicas.index(b) for b in row.isr
                                             if b != ldr and b in self.replicas)
            live = ldr is not None and up.get(ldr, False)
            if live and isolated.get(ldr, False):
                if isolated_at[ldr] >= lead_since:  # cut off while it led: it keeps the ISR it knew
                    mask = view.setdefault((lead_id, isolated_at[ldr]), mask)
                    live = mask == 0
                else:
                    live = False  # elected while isolated: it does not know it leads (K-3)
            if live and lead_from == NEVER:
                lead_from = t + failover
            now = (mask, -1 if ldr is None else lead_id, live, lead_from)
            if not st or st[-1][1:] != now:
                st.append((t, *now))

        k, row = 0, None
        for nxt in [*rows, None]:
            until = NEVER if nxt is None else nxt.ts_us
            while k < len(fault) and int(f_ts[fault[k]]) <= until:  # faults apply before the row of their instant
                t = int(f_ts[fault[k]])
                while k < len(fault) and int(f_ts[fault[k]]) == t:
                    kind, b = int(f_kind[fault[k]]), int(f_who[fault[k]])
                    if kind in stops or kind == int(Kind.RESTART):
                        up[b] = kind == int(Kind.RESTART)
                        incarnation[b] = incarnation.get(b, 0) + up[b]
                    else:
                        isolated[b] = kind == int(Kind.ISOLATE)
                        isolated_at[b] = t
                    k += 1
                if row is not None and t < until:
                    step(t, row)
            if nxt is not None:
                row = nxt
                step(row.ts_us, row)
        cols = list(zip(*st, strict=True)) if st else [[]] * 5
        return (np.array(cols[0], np.int64), np.array(cols[1], np.int64), np.array(cols[2], np.int64),
                np.array(cols[3], np.bool_), np.array(cols[4], np.int64))

    def apply(self, rec: MessageRecords, rows: Sequence[StateRow], planner, shifter=None) -> MessageRecords:
        """The records with the client's acknowledgement instants (SPEC §3.7 K-6, K-7); `planner` is
        `plan_requests` or its compiled twin, `shifter` the kernel's one-pass K-7 (`shift_acks_compiled`). A
        message whose answer would come after its delivery timeout fails with request_timeout; one whose answer
        would come after the trace's end is pending (SPEC §4.1)."""
        p = self.policy
        linger = p.linger_ms * MS
        timeout = p.delivery_timeout_ms * MS
        if p.acks is not Acks.ALL:
            delay = linger + (self.round_trip_us if p.acks is Acks.ONE else 0)
            if shifter is not None:  # the kernel's records are views of its own columns: changed on copies
                ack, status, error = rec.ack_us.copy(), rec.status.copy(), rec.error.copy()
                shifter(ack, rec.produce_us, status, error, delay, self.duration_us, timeout, int(Status.FAILED),
                        int(Status.PENDING), int(Error.REQUEST_TIMEOUT))
                return replace(rec, status=status, error=error, ack_us=ack)
            ack = rec.ack_us.copy()  # set exactly where the message is acknowledged
            np.add(ack, delay, out=ack, where=ack != NULL_US)
        else:
            order, prod, eng, ok, sizes, *rest = self.inputs(rec, rows)
            planned, made = planner(prod, eng, ok, sizes, linger, self.round_trip_us, *self.turn_steps(rows),
                                    self.gap_us, p.max_in_flight_requests_per_connection, p.batch_size, *rest)
            unsent = ok & ((made > np.minimum(self.duration_us, prod + timeout)) | (made >= self.producer_ends(prod)))
            if isinstance(order, slice):
                ack = planned
            else:
                ack = rec.ack_us.copy()
                ack[order] = planned
                back = np.zeros(len(unsent), dtype=np.bool_)
                back[order] = unsent
                unsent = back
            return self.never_sent(self.settle(rec, ack, timeout), unsent)
        return self.settle(rec, ack, timeout)

    @staticmethod
    def never_sent(rec: MessageRecords, unsent: np.ndarray) -> MessageRecords:
        """SPEC §3.7 K-6: a message whose request would be made after the trace's end, after its delivery
        timeout ran out, or once its producer failed (K-8) never left the client (the queue is purged at the end,
        SPEC §4.1; librdkafka drops an expired message from its queue unsent, and a fatal error purges the queues):
        it was never appended, whatever the engine appended at its produce event."""
        if not unsent.any():
            return rec
        epoch, offset, visible = rec.pos_epoch.copy(), rec.pos_offset.copy(), rec.visible_us.copy()
        epoch[unsent], offset[unsent], visible[unsent] = -1, -1, NULL_US
        extra = rec.extra_positions
        if len(extra):
            extra = extra[~np.isin(extra[:, 0], rec.msg_id[unsent])]
        return replace(rec, pos_epoch=epoch, pos_offset=offset, visible_us=visible, extra_positions=extra)

    def settle(self, rec: MessageRecords, ack: np.ndarray, timeout: int) -> MessageRecords:
        """An answer after the delivery timeout fails the message (request_timeout) if that timeout runs out within
        the trace; any other answer after the trace's end (NEVER included: no fetch of the trace answers it) leaves
        it pending (SPEC §4.1). Then SPEC §3.7 K-8: at each of `fatal_us`, every message the producer of that
        instant still holds fails with out_of_order_sequence_number (`fatal`)."""
        beyond = np.flatnonzero((ack > self.duration_us) | (ack - rec.produce_us > timeout))  # NULL_US is neither
        if not len(beyond):
            return self.fatal(replace(rec, ack_us=ack), timeout)
        status, error = rec.status.copy(), rec.error.copy()
        produce = rec.produce_us[beyond]
        late = (ack[beyond] - produce > timeout) & (produce + timeout <= self.duration_us)
        status[beyond] = np.where(late, int(Status.FAILED), int(Status.PENDING))
        error[beyond[late]] = int(Error.REQUEST_TIMEOUT)
        ack[beyond] = NULL_US
        return self.fatal(replace(rec, status=status, error=error, ack_us=ack), timeout)

    def fatal(self, rec: MessageRecords, timeout: int) -> MessageRecords:
        """SPEC §3.7 K-8. A message belongs to the producer that is live when it is produced, which fails at the first
        of `fatal_us` after that instant; if the message is not answered by then (acknowledged later, pending at
        the end, or failed later: every failure comes at the delivery deadline) it fails then with
        out_of_order_sequence_number. Its fate is the engine's, unless its request was made only once the producer
        had failed: then it was never sent (`apply`, `never_sent`)."""
        f = self.producer_ends(rec.produce_us)
        if not len(rec.msg_id) or not (f != NEVER).any():
            return rec
        held = (f != NEVER) & (
            ((rec.status == int(Status.ACKED)) & (rec.ack_us > f))
            | (rec.status == int(Status.PENDING))
            | ((rec.status == int(Status.FAILED)) & (rec.produce_us + timeout > f)))
        if not held.any():
            return rec
        status, error, ack = rec.status.copy(), rec.error.copy(), rec.ack_us.copy()
        status[held] = int(Status.FAILED)
        error[held] = int(Error.OUT_OF_ORDER_SEQUENCE_NUMBER)
        ack[held] = NULL_US
        return replace(rec, status=status, error=error, ack_us=ack)


def _joined(parts: list[np.ndarray], dtype) -> np.ndarray:
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


def _cycle(s: int, mask: int, f_off, f_ts, f_upto) -> int:
    """The first instant after s at which every follower in `mask` has fetched past what was appended at s."""
    done = s
    k = 0
    while mask >> k:
        if (mask >> k) & 1:
            j = int(np.searchsorted(f_ts[f_off[k]:f_off[k + 1]], s, side="right")) + int(f_off[k])
            while j < f_off[k + 1] and f_upto[j] < s:
                j += 1
            if j == f_off[k + 1]:
                return NEVER
            done = max(done, int(f_ts[j]))
        k += 1
    return done


def next_cycle(s: int, f_off, f_ts, f_upto, st_ts, st_mask, st_lead, st_live, st_from) -> int:
    """When the high watermark passes what was appended at s and a leader answers (SPEC §3.7 K-6): under the ISR in
    force at s, the first instant every follower of it has fetched past s (`_cycle`); if the ISR changes first, or
    the partition has no live leader, the first later ISR of a live leader (from its start) under which that holds,
    as `Partition.maybeIncrementLeaderHW` runs again at each ISR change. Only a live leader answers
    (`ClientPipeline.timeline`): one that is down or isolated neither moves its high watermark nor sends, and a
    later leader answers no earlier than when clients reach it (`st_from`). NEVER when no fetch of the trace answers
    it: the answer lies beyond the trace."""
    r = max(int(np.searchsorted(st_ts, s, side="right")) - 1, 0)
    mine = int(st_lead[r])  # the leadership the request went to
    while r < len(st_ts):
        ends = int(st_ts[r + 1]) if r + 1 < len(st_ts) else NEVER
        if st_live[r]:
            start = int(st_ts[r]) if st_lead[r] == mine else max(int(st_ts[r]), int(st_from[r]))
            cyc = _cycle(s, int(st_mask[r]), f_off, f_ts, f_upto)
            if cyc != NEVER and max(cyc, start) < ends:
                return max(cyc, start)
        r += 1
    return NEVER


def next_turn(read: int, answer: int, gap: int, rtt: int) -> int:
    """When the connection reads its next request (SPEC §3.7 K-6): after the answer of the one read at `read` (plus
    the round trip with one slot: the next request is made only then), and no earlier than a round trip after
    `read`: the broker mutes a connection from a request's read until its response is sent (`SocketServer`), and
    the round trip is almost all the broker's queueing, append and response, so even a request answered at once
    holds its connection that long."""
    return max(answer + gap, read + rtt)


def turns_at(t: int, tn_ts, tn) -> int:
    """T of SPEC §3.7 K-6 at instant t, from the steps of `ClientPipeline.turn_steps`."""
    return int(tn[max(int(np.searchsorted(tn_ts, t, side="right")) - 1, 0)])


def plan_requests(prod, eng, ok, size, linger, rtt, tn_ts, tn, gap, slots, batch, reps, b_ts, b_kind, b_who, b_upto,
                  st_ts, st_mask, st_lead, st_live, st_from) -> tuple[np.ndarray, np.ndarray]:
    """SPEC §3.7 K-6, one request at a time, messages in produce order: those `ok` marks, every message the engine
    acknowledged (at `eng`) or left pending at the end (`eng` NEVER: its request is answered after the trace,
    and so is every message it carries). A request is read by the broker at
    s = max(its first message's send, the partition's turn, when it was made). It was made when one of the
    connection's `slots` (max_in_flight_requests_per_connection) freed: a round trip after the answer `slots`
    requests earlier on the connection (this partition's and the other turns' alike), when that answer reaches the
    client, or at its first message if a slot was free then. It carries the messages waiting when it was made, up to
    batch_size bytes (at least one). It is answered at the later of the fetch cycle after s and the engine's
    instant for its messages (failover, refusals, a frozen high watermark), plus the round trip. If more messages
    wait at that answer, the connection's other T − 1 requests go first, a fetch cycle each, T as at that answer
    (`turns_at`: P_b follows the leaders). A request read after the engine's instants for all its messages (a
    backlog) and that no fetch of the trace answers is answered beyond the trace (NEVER): `settle` leaves its
    messages pending, or failed where their delivery timeout ran out within the trace. Where the engine's instant is
    later, it stands (a sparse trace's last fetch). Returns the answers and, per message, when its request was
    made (`ClientPipeline.apply`: one made after the trace or the message's delivery timeout was never sent)."""
    # each follower's fetches, in time order (the events are), one block per replica
    fetches = b_kind == int(Kind.REPLICATE)
    mine = [fetches & (b_who == b) for b in reps]
    f_ts = np.concatenate([b_ts[m] for m in mine])
    f_upto = np.concatenate([b_upto[m] for m in mine])
    f_off = np.concatenate([[0], np.cumsum([int(m.sum()) for m in mine])]).astype(np.int64)
    n = len(prod)
    out = eng.copy()
    made_at = prod.copy()
    answers: list[int] = []  # the connection's answers, in order: the last `slots` free the slots
    turn = -NEVER
    i = 0
    while i < n:
        if not ok[i]:
            i += 1
            continue
        s = max(int(prod[i]), turn)
        del answers[:-slots]
        if len(answers) < slots:
            made = int(prod[i])
        else:  # a slot frees when an answer reaches the client; one no fetch of the trace gives never frees
            made = NEVER if answers[0] == NEVER else max(int(prod[i]), answers[0] + rtt)
            if made != NEVER:
                s = max(s, made)  # the broker reads a request no earlier than it was made
        j, used, done = i, 0, s
        while j < n and (j == i or int(prod[j]) <= made):
            if ok[j]:
                if j > i and used + int(size[j]) > batch:
                    break
                used += int(size[j])
                done = max(done, int(eng[j]))
                made_at[j] = made
            j += 1
        cyc = NEVER if made == NEVER else next_cycle(s, f_off, f_ts, f_upto, st_ts, st_mask, st_lead, st_live, st_from)
        if cyc != NEVER:
            done = max(done, cyc)
        # answered after the trace: never made (every slot waits on such a one), carrying a message the engine left
        # pending, or no fetch of the trace answers it and the engine answered its messages before it left
        if made == NEVER or done == NEVER or (cyc == NEVER and done == s):
            for k in range(i, j):
                if ok[k]:
                    out[k] = NEVER
            i = j
            turn = next_turn(s, s, gap, rtt)
            answers.append(NEVER)  # its slot never frees within the trace
            if i < n:  # nor do those of the other turns' requests behind it on the connection
                answers.extend([NEVER] * (turns_at(s, tn_ts, tn) - 1))
            continue
        for k in range(i, j):
            if ok[k]:
                out[k] = done + linger + rtt
        i = j
        turn = next_turn(s, done, gap, rtt)
        answers.append(done)
        if i < n and int(prod[i]) <= done:
            for _ in range(turns_at(done, tn_ts, tn) - 1):
                x = next_cycle(turn, f_off, f_ts, f_upto, st_ts, st_mask, st_lead, st_live, st_from)
                if x == NEVER:
                    break
                turn = next_turn(turn, x, gap, rtt)
                answers.append(x)
    return out, made_at
