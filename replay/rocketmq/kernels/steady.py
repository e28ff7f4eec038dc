"""The compiled steady path of the RocketMQ kernels (SPEC §3.3-3.5): one event at a time.

Between two control points (faults, detections, elections, route polls) the group's leader, its reachability,
the serving broker and the epoch do not change. `group_steady` applies the produce and replicate events and the
scheduled arrivals (DLedger retries, C2) of such a segment in (ts, kind) order as the reference interpreter does,
one compiled helper per rule named after the reference's method (`_arrive`, `_append`, `_replicate`,
`_progress`, `_recommit`, `_recompute_hw`, `_ack`, `_fail`, `_end_instant`), on named records whose fields are the
reference's (`Segment`, `Replicas`, `LeaderLog`, `Writes`, `Pending`, `StreamCols`, `Outputs`, and the carried
scalars' `CARRIED` record: the leader's `commit`, the controller's confirm offset `hw`, ...). A message's state
changes through `transition`, which checks the reference's `VALID_PREVIOUS_STATES`. The loop closes the instants
it passes (timeline rows, availability; SPEC §4.2-4.3). Writes are returned for the flush model (R3), evaluated
lazily in Python.
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple

import numpy as np

from replay.rocketmq.control import INF, KEY
from replay.rocketmq.reference.state import MsgState, legal_transitions
from replay.shared.kernels.arrays import close_instant, compiled, in_runs, kth_largest, timeline_row
from replay.shared.states import IllegalTransition
from schemas.outcomes import NULL_US, Error
from schemas.trace import Kind


class CommitRule(IntEnum):
    """Which commit point answers the leader's requests."""

    CLASSIC = 0  # rule 4 (SYNC_MASTER): the need-th largest slave copy; need = 0 acks at append (ASYNC_MASTER)
    DLEDGER = 1  # rule 2: the q-th largest log end over the group, leader included; never decreases
    # §3.5: the confirm offset (hw) is the minimum over the master's view of the SyncStateSet; acks at it
    # (allAckInSyncStateSet), at the k-th largest log end (in_sync_replicas k > 1), or at append (k ≤ 1)
    CONTROLLER = 2


NONE = -1  # no replica, broker, row or epoch
C_REPLICATE, C_PRODUCE = int(Kind.REPLICATE), int(Kind.PRODUCE)
# the reference's message states (numba reads module globals as compile-time constants)
_WAITING, _ACKED, _FAILED = int(MsgState.WAITING), int(MsgState.ACKED), int(MsgState.FAILED)
_LEGAL = np.array(legal_transitions(), dtype=np.bool_)  # [new, previous], `VALID_PREVIOUS_STATES`
_SLAVE_NOT_AVAILABLE = int(Error.SLAVE_NOT_AVAILABLE)
_CLASSIC, _DLEDGER, _CONTROLLER = int(CommitRule.CLASSIC), int(CommitRule.DLEDGER), int(CommitRule.CONTROLLER)
# bits of `ctl`, per replica (CONTROLLER): in the master's view of the SyncStateSet (the confirm offset's
# members; the set it knew when isolated), in the SyncStateSet itself (a slave outside it rejoins, §3.5)
IN_VIEW, IN_SSS = 1, 2
#: Columns of `Outputs.rows` (t, log end, high watermark, window end: `arrays.timeline_row`; the first
#: ROW_STATE are the instant's state) and of `Outputs.unavailable` (from, to).
ROW_WIDTH, ROW_STATE, INTERVAL_WIDTH = 4, 3, 2


# ============================================================================== the records `group_steady` reads
class Segment(NamedTuple):
    """What stays fixed over one steady segment (the reference's leader, serving broker, epoch and policy)."""

    stream_end: int  # its stream events: StreamCols.key[stream_pos:stream_end]
    sched_end: int  # its scheduled arrivals: StreamCols.sched_key[sched_pos:sched_end]
    first_row: int  # the pending row of its first produce event (the others follow in order)
    pending_n: int  # pending rows before the segment
    leader: int  # the leader's replica index, or NONE
    leader_broker: int  # its broker id (`Msg.taker`'s), or NONE
    takes: bool  # the serving broker takes writes (else R2: refused before append)
    leader_reachable: bool  # its followers' reports count (§2.2)
    need: int  # CLASSIC: slave copies a SYNC_MASTER waits for; DLEDGER: the quorum; CONTROLLER: in_sync_replicas
    usable: bool  # CLASSIC: enough usable slaves (else rule 4 fails at once)
    commits: bool  # the commit point may move
    epoch: int
    incarnation: int  # the leader's (R1: only this incarnation answers)
    answer_us: int  # the broker's status comes this long after arrival (R1)
    window_us: int
    blocked: bool  # no broker serves clients: the instants are unavailable
    refusal: int  # the Error of a refused write (R2)
    all_ack: bool  # CONTROLLER: allAckInSyncStateSet
    hw_moves: bool  # CONTROLLER: `_recompute_hw` may move the confirm offset


class Replicas(NamedTuple):
    """Per replica, in the group's order (the reference's `Broker` fields)."""

    log_len: np.ndarray
    nbytes: np.ndarray  # bytes in its log
    fetched: np.ndarray  # the leader's view of its log end (R4)
    lcu: np.ndarray  # last time it was caught up
    alive: np.ndarray  # up and reachable
    ctl: np.ndarray  # CONTROLLER: IN_VIEW | IN_SSS bits


class LeaderLog(NamedTuple):
    """The leader's log (runs of (epoch, start, end), append times and cumulative bytes by offset) and its epoch's
    entries (append times, cumulative bytes)."""

    runs: np.ndarray
    append_us: np.ndarray
    cum_bytes: np.ndarray
    epoch_append_us: np.ndarray
    epoch_cum_bytes: np.ndarray


class Writes(NamedTuple):
    """Writes for the flush model (R3): row b holds replica b's (t, log length, bytes), n[b] of them."""

    t: np.ndarray
    length: np.ndarray
    nbytes: np.ndarray
    n: np.ndarray


class Pending(NamedTuple):
    """The pending messages' columns (the reference's `Msg` fields), one row per message, in the order of
    `common.PENDING_COLS`."""

    msg_id: np.ndarray
    produce_us: np.ndarray
    size: np.ndarray
    arrive_us: np.ndarray  # when its request reaches the brokers (a scheduled retry's arrival, C2)
    deadline_us: np.ndarray
    state: np.ndarray  # MsgState
    error: np.ndarray
    epoch: np.ndarray  # its latest position (epoch, offset), or NONE
    offset: np.ndarray
    ack_us: np.ndarray
    visible_us: np.ndarray
    taker_broker: np.ndarray  # `Msg.taker`: the broker that appended it, its incarnation and epoch (R1)
    taker_incarnation: np.ndarray
    taker_epoch: np.ndarray


class StreamCols(NamedTuple):
    """The chunk's stream (`stream_columns`: key, code, reporting replica, upto) and the scheduled arrivals (key,
    pending row)."""

    key: np.ndarray
    code: np.ndarray
    replica: np.ndarray
    upto: np.ndarray
    sched_key: np.ndarray
    sched_row: np.ndarray


class Outputs(NamedTuple):
    """`group_steady`'s output buffers (counts in `CARRIED`) and its scratch."""

    rows: np.ndarray  # timeline rows (`arrays.timeline_row`: t, log end, high watermark, window end)
    unavailable: np.ndarray  # unavailability intervals (from, to)
    offset_row: np.ndarray  # offset - offset_base -> pending row, for the leader's log from the commit point up
    ends: np.ndarray  # one slot per replica, for the k-th largest log end


#: The scalars `group_steady` carries from one segment to the next and its running counts, one record
#: (`carried[0]`).
CARRIED = np.dtype([
    ("cur_t", np.int64),
    ("commit", np.int64),  # the leader's commit point (DLedger's `commit`; CLASSIC: the acked coverage)
    ("hw", np.int64),  # CONTROLLER: the confirm offset
    ("replication_bytes", np.int64), ("lead_n", np.int64), ("cum_n", np.int64), ("epoch_n", np.int64),
    ("stream_pos", np.int64), ("sched_pos", np.int64),
    ("produce_row", np.int64),  # the pending row of the next produce event
    ("appended", np.int64),  # appends of the segment (the leader's log grew by that many)
    ("expand", np.int64),  # CONTROLLER: the replica that rejoins the SyncStateSet, or NONE
    ("n_rows", np.int64), ("n_unavailable", np.int64),
    ("closed", np.int64), ("prev_leo", np.int64), ("prev_hw", np.int64),  # instants closed, the last row's values
    ("offset_base", np.int64),  # the offset of Outputs.offset_row[0]
])


# ================================================================================ the message state machine
@compiled(inline=True)
def transition(state, r, new):
    """Pending row r enters state `new`: the one place the kernels' compiled code checks a message's transition
    against `VALID_PREVIOUS_STATES` (replay/rocketmq/reference/state.py, as the reference's `set_state`)."""
    if not _LEGAL[new, state[r]]:
        raise IllegalTransition("a message state transition VALID_PREVIOUS_STATES does not allow")
    state[r] = new


# ============================================================================ one helper per reference rule
@compiled(inline=True)
def _acks_at_point(rule, seg):
    """Whether the leader's requests wait for a commit point (else they are acknowledged at append): ASYNC_MASTER
    (need 0) and a controller's in_sync_replicas ≤ 1 without allAckInSyncStateSet ack at append."""
    if rule == _CONTROLLER:
        return seg.all_ack or seg.need > 1
    return rule == _DLEDGER or seg.need > 0


@compiled(inline=True)
def _ack_limit(arrive, deadline_us, answer_us):
    """R1: the last instant an ack still counts: the broker's status at arrival + its timeout, or the client's
    deadline (at one instant replication comes first)."""
    return min(arrive + answer_us, deadline_us)


@compiled(inline=True)
def _answers(r, t, seg, msgs):
    """Whether the leader's commit at t answers waiting message r (`GroupReference._ack_upto`; R1: only the
    incarnation and epoch that took it, in time)."""
    return (msgs.state[r] == _WAITING and msgs.taker_broker[r] == seg.leader_broker and
            msgs.taker_epoch[r] == seg.epoch and msgs.taker_incarnation[r] == seg.incarnation and
            t <= _ack_limit(msgs.arrive_us[r], msgs.deadline_us[r], seg.answer_us))


@compiled(inline=True)
def _ack(t, r, msgs):
    """`GroupReference._ack`."""
    transition(msgs.state, r, _ACKED)
    msgs.ack_us[r] = t


@compiled(inline=True)
def _fail(r, error, msgs):
    """`GroupReference._fail`."""
    transition(msgs.state, r, _FAILED)
    msgs.error[r] = error


@compiled(inline=True)
def _point(rule, k, li, log_len, fetched, buf):
    """The leader's commit point now: CLASSIC the k-th largest slave `fetched` (`_coverage`), DLEDGER and
    CONTROLLER the k-th largest of the leader's log end and the others' `fetched` (`_recommit`, `_ack_point`)."""
    m = 0
    for b in range(len(fetched)):
        if b != li:
            buf[m] = fetched[b]
            m += 1
        elif rule != _CLASSIC:
            buf[m] = log_len[b]
            m += 1
    return kth_largest(buf, m, k)


@compiled(inline=True)
def _view_min(li, reps):
    """§3.5 the confirm offset's candidate (`ControllerReference._recompute_hw`): the smallest log end over the
    master's view of the SyncStateSet, the master's own log and the others' `fetched`."""
    m = INF
    for b in range(len(reps.fetched)):
        if reps.ctl[b] & IN_VIEW:
            m = min(m, reps.log_len[b] if b == li else reps.fetched[b])
    return m


@compiled(inline=True)
def _settle(lo, hi, t, mark_visible, acks, c, seg, msgs, out):
    """The leader's point moved from lo to hi at t: its entries there become visible (`_mark_visible`, if
    `mark_visible`) and answer their waiting requests (`_ack_upto`, if `acks`)."""
    for o in range(lo, hi):
        r = out.offset_row[o - c.offset_base]
        if r < 0:
            continue
        if mark_visible and msgs.visible_us[r] == NULL_US:
            msgs.visible_us[r] = t
        if acks and _answers(r, t, seg, msgs):
            _ack(t, r, msgs)


@compiled(inline=True)
def _end_instant(t, c, seg, rule, reps, lead, avail, out):
    """Close the instant c.cur_t, t being the next (`GroupReference._end_instant`): its timeline row (R6: the
    consumer-visible point, the controller's confirm offset with allAckInSyncStateSet, B.7) and its availability
    (R7: stalled once the oldest entry still waiting for its commit is older than the broker's timeout)."""
    li = seg.leader
    leo = reps.log_len[li] if li >= 0 else 0
    hw = c.commit if rule == _DLEDGER else (c.hw if rule == _CONTROLLER and seg.all_ack else leo)
    c.n_rows = timeline_row(out.rows, c.n_rows, c.closed, c.cur_t, leo, hw, c.prev_leo, c.prev_hw, seg.window_us,
                            True)
    c.prev_leo, c.prev_hw = leo, hw
    c.closed += 1
    stall = INF
    if not seg.blocked and _acks_at_point(rule, seg) and c.commit < leo:
        stall = lead.append_us[c.commit] + seg.answer_us
    c.n_unavailable = close_instant(avail, 0, c.cur_t, seg.blocked, stall, out.unavailable, c.n_unavailable)
    c.cur_t = t


@compiled(inline=True)
def _write(b, t, length, nb, writes):
    """Replica b's log reached `length` entries (`nb` bytes) at t: a write for the flush model (R3)."""
    k = writes.n[b]
    writes.t[b, k], writes.length[b, k], writes.nbytes[b, k] = t, length, nb
    writes.n[b] = k + 1


@compiled(inline=True)
def _replicate(t, b, upto, c, seg, reps, lead, writes):
    """SPEC §3.2 rule 5, `GroupReference._replicate`: follower b reports it has fetched the leader's entries
    appended by `upto` (append times never decrease in a log: a scan from its log end, in time proportional to the
    entries it copies; a report never shrinks a log). Returns whether the report counts."""
    li = seg.leader
    if not seg.leader_reachable or b < 0 or b == li or not reps.alive[b]:
        return False  # a down/isolated follower, the leader itself, or an unreachable leader (§2.2)
    leo = reps.log_len[li]
    old = reps.log_len[b]
    new_len = old
    while new_len < leo and lead.append_us[new_len] <= upto:
        new_len += 1
    if new_len > old:
        c.replication_bytes += lead.cum_bytes[new_len] - lead.cum_bytes[old]
        reps.nbytes[b] = lead.cum_bytes[new_len]
        _write(b, t, new_len, reps.nbytes[b], writes)
    reps.log_len[b] = new_len
    reps.fetched[b] = new_len
    reps.lcu[b] = max(reps.lcu[b], t if new_len == leo else upto)
    return True


@compiled(inline=True)
def _append(t, r, c, seg, msgs, reps, lead, writes, out):
    """The leader appends message row r at t (`GroupReference._append`): its log, its epoch's entries, the
    leader cache (append times, cumulative bytes by offset) and a write for the flush model; the message waits
    for this incarnation's answer (R1)."""
    li = seg.leader
    off = reps.log_len[li]
    size = msgs.size[r]
    reps.nbytes[li] += size
    msgs.epoch[r], msgs.offset[r] = seg.epoch, off
    msgs.taker_broker[r], msgs.taker_incarnation[r], msgs.taker_epoch[r] = seg.leader_broker, seg.incarnation, seg.epoch
    reps.log_len[li] = off + 1
    lead.append_us[c.lead_n], lead.cum_bytes[c.cum_n] = t, reps.nbytes[li]
    lead.epoch_append_us[c.epoch_n] = t
    lead.epoch_cum_bytes[c.epoch_n + 1] = lead.epoch_cum_bytes[c.epoch_n] + size
    c.lead_n += 1
    c.cum_n += 1
    c.epoch_n += 1
    c.appended += 1
    _write(li, t, off + 1, reps.nbytes[li], writes)
    out.offset_row[off - c.offset_base] = r
    transition(msgs.state, r, _WAITING)


@compiled(inline=True)
def _arrive(t, r, c, seg, rule, msgs, reps, lead, writes, out):
    """Message row r reaches the brokers at t (a produce event or a scheduled retry, C2), the family's `_arrive`:
    refused before append if the leader does not take writes (R2), else appended; then `ClassicReference._arrive`
    (rule 5: visible at the master's append; rule 4: ASYNC_MASTER acks there, a SYNC_MASTER without enough
    usable slaves fails at once, stored on the master), `ControllerReference._arrive` (B.7: visible there unless
    allAckInSyncStateSet; in_sync_replicas ≤ 1 acks there); DLedger waits for its commit. Returns whether it was
    appended (the commit points then move in `_progress`)."""
    if not seg.takes:
        _fail(r, seg.refusal, msgs)
        return False
    _append(t, r, c, seg, msgs, reps, lead, writes, out)
    if rule == _CLASSIC or (rule == _CONTROLLER and not seg.all_ack):
        msgs.visible_us[r] = t
    if not _acks_at_point(rule, seg):
        if t <= _ack_limit(msgs.arrive_us[r], msgs.deadline_us[r], seg.answer_us):  # R1: a retry past its deadline
            _ack(t, r, msgs)
    elif not seg.usable:
        _fail(r, _SLAVE_NOT_AVAILABLE, msgs)
    return True


@compiled(inline=True)
def _recommit(t, c, seg, rule, msgs, reps, out):
    """CLASSIC rule 4 (`ClassicReference._progress`: the need-th largest slave copy, `_coverage`, acks,
    `_ack_upto`) and DLEDGER rule 2 (`DLedgerReference._recommit`: the q-th largest log end commits, visible to
    consumers and acked); the controller's in_sync_replicas ack point (`ControllerReference._ack_point`)."""
    p = _point(rule, seg.need, seg.leader, reps.log_len, reps.fetched, out.ends)
    if p > c.commit:
        _settle(c.commit, p, t, rule == _DLEDGER, True, c, seg, msgs, out)
        c.commit = p


@compiled(inline=True)
def _recompute_hw(t, c, seg, msgs, reps, out):
    """§3.5 `ControllerReference._recompute_hw`: the confirm offset is the minimum log end over the master's view
    of the SyncStateSet; it never decreases in an epoch; with allAckInSyncStateSet what it passes becomes
    visible (B.7) and is acked at it (`_ack_point`)."""
    h = _view_min(seg.leader, reps)
    if h > c.hw:
        if seg.all_ack:
            _settle(c.hw, h, t, True, False, c, seg, msgs, out)
        c.hw = h


@compiled(inline=True)
def _progress(t, reporter, c, seg, rule, msgs, reps, out):
    """The points after a report from `reporter` (or an append, reporter NONE): the family's `_progress`
    (`_recommit`, `_recompute_hw`). CONTROLLER: a slave outside the SyncStateSet that reaches the confirm offset
    rejoins it (§3.5); returns True then (c.expand: the caller adds it and goes on)."""
    if rule == _CONTROLLER:
        outside = reporter >= 0 and (reps.ctl[reporter] & IN_SSS) == 0
        # without allAck only a rejoin reads the confirm offset here: it is brought up to date there and at the
        # segment's end (its running maximum is the same)
        if seg.hw_moves and (seg.all_ack or outside):
            _recompute_hw(t, c, seg, msgs, reps, out)
        if _acks_at_point(rule, seg) and seg.commits:
            if seg.all_ack:
                if c.hw > c.commit:
                    _settle(c.commit, c.hw, t, False, True, c, seg, msgs, out)
                    c.commit = c.hw
            else:
                _recommit(t, c, seg, rule, msgs, reps, out)
        if outside and reps.log_len[reporter] >= c.hw:
            c.expand = reporter
            return True
    elif _acks_at_point(rule, seg) and seg.commits:
        _recommit(t, c, seg, rule, msgs, reps, out)
    return False


@compiled(inline=True)
def _answer_committed(t0, log_end, c, seg, rule, msgs, lead, out):
    """Before the segment's first event, at t0: map the pending messages in the leader's log from the commit
    point up to their offsets (`Outputs.offset_row`), and answer those already below the commit point (the
    controller's master only while it serves: `ControllerReplay` settles nothing for a master the clients do
    not reach)."""
    base = c.offset_base
    for r in range(seg.pending_n):
        o = msgs.offset[r]
        if base <= o < log_end and msgs.epoch[r] >= 0 and in_runs(lead.runs, msgs.epoch[r], o):
            out.offset_row[o - base] = r
        if 0 <= o < c.commit and (seg.commits or rule != _CONTROLLER) and _answers(r, t0, seg, msgs):
            _ack(t0, r, msgs)


# ================================================================================= the steady loop
def _steady_loop(rule: int):
    """`group_steady` compiled for one commit rule: `rule` is a constant of the closure (numba keys its on-disk
    cache by the closure's values), so the other rules' branches are no code at all. Read at run time, the
    controller's branch alone cost the other families' loops 15-27 %."""

    @compiled(counted=False)
    def group_steady(carried, avail, seg, stream, msgs, reps, lead, writes, out):
        """Apply the events of one steady segment (module docstring): stream events [c.stream_pos,
        seg.stream_end) and scheduled arrivals [c.sched_pos, seg.sched_end), merged. Produce events already have
        rows from seg.first_row on, in order. CONTROLLER stops after a report that brings a slave outside the
        SyncStateSet to the confirm offset (c.expand = its index; the caller adds it, as
        `ControllerReference._progress` does, and goes on). Returns nothing: the carried scalars are in
        `carried[0]` (`CARRIED`), the open instant's availability in `avail`, outputs in `Outputs` and `Writes`
        with their counts in `carried[0]`. `out.offset_row` is scratch of at least one slot per entry of the
        leader's log from the commit point up, per due event, plus one."""
        c = carried[0]
        li = seg.leader
        c.produce_row = seg.first_row
        c.appended, c.n_rows, c.n_unavailable, c.expand = 0, 0, 0, NONE
        c.closed, c.prev_leo, c.prev_hw = 0, NONE, NONE
        # offset -> pending row, for the messages in the leader's log from the commit point up (R1, rule 4)
        leo0 = reps.log_len[li] if li >= 0 else 0
        c.offset_base = min(c.commit, leo0)
        room = (max(leo0 - c.offset_base, 0) + (seg.stream_end - c.stream_pos) + (seg.sched_end - c.sched_pos)
                + 1)
        if len(out.offset_row) < room:
            raise ValueError("group_steady: offset_row is shorter than the leader's uncommitted log and the due "
                             "events")
        out.offset_row[:room] = NONE
        if _acks_at_point(rule, seg) and li >= 0:
            t0 = min(stream.key[c.stream_pos] if c.stream_pos < seg.stream_end else INF,
                     stream.sched_key[c.sched_pos] if c.sched_pos < seg.sched_end else INF) // KEY
            _answer_committed(t0, leo0, c, seg, rule, msgs, lead, out)
        while True:
            i_s, i_r = c.stream_pos, c.sched_pos
            kt = stream.key[i_s] if i_s < seg.stream_end else INF
            kr = stream.sched_key[i_r] if i_r < seg.sched_end else INF
            if kt == INF and kr == INF:
                break
            trace = kt <= kr  # trace events first on equal keys
            t = (kt if trace else kr) // KEY
            if t > c.cur_t:
                _end_instant(t, c, seg, rule, reps, lead, avail, out)
            reporter = NONE
            if trace:
                c.stream_pos = i_s + 1
                if stream.code[i_s] == C_REPLICATE:  # SPEC §3.2 rule 5: a report
                    reporter = stream.replica[i_s]
                    if not _replicate(t, reporter, stream.upto[i_s], c, seg, reps, lead, writes):
                        continue
                else:  # a message arrives (produce)
                    r = c.produce_row
                    c.produce_row = r + 1
                    if not _arrive(t, r, c, seg, rule, msgs, reps, lead, writes, out):
                        continue
            else:  # a scheduled arrival (DLedger retry, C2)
                c.sched_pos = i_r + 1
                if not _arrive(t, stream.sched_row[i_r], c, seg, rule, msgs, reps, lead, writes, out):
                    continue
            if _progress(t, reporter, c, seg, rule, msgs, reps, out):
                break
        if rule == _CONTROLLER and seg.hw_moves:
            c.hw = max(c.hw, _view_min(li, reps))

    return group_steady


#: The compiled steady loop of each commit rule.
GROUP_STEADY = {rule: _steady_loop(int(rule)) for rule in CommitRule}


@compiled
def stream_columns(order, nrep, r_key, p_key, r_broker, r_upto, r_rep):
    """The chunk's stream events in the order `order` (indices into replications then produce events, as
    `arrays.merge_order` gives), with an INF sentinel at the end. Returns (key, code, broker, replica index,
    upto, produce index); replication rows hold produce index -1, produce rows broker and replica index -1."""
    n = len(order)
    key = np.empty(n + 1, dtype=np.int64)
    code, broker, rep, upto, pidx = (np.zeros(n + 1, dtype=np.int64), np.full(n + 1, -1, dtype=np.int64),
                                     np.full(n + 1, -1, dtype=np.int64), np.zeros(n + 1, dtype=np.int64),
                                     np.full(n + 1, -1, dtype=np.int64))
    for o in range(n):
        j = order[o]
        if j < nrep:
            key[o], code[o], broker[o], rep[o], upto[o] = r_key[j], C_REPLICATE, r_broker[j], r_rep[j], r_upto[j]
        else:
            j -= nrep
            key[o], code[o], pidx[o] = p_key[j], C_PRODUCE, j
    key[n] = INF
    return key, code, broker, rep, upto, pidx
