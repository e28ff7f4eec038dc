"""The compiled steady path of the `kafka` kernel (SPEC §3.1-3.2): one event at a time between control points.

Between two control points (faults, fencing deadlines, ISR check ticks, client switches, ISR expansions) the
partition's leader, ISR, serving broker and refusal do not change. `steady` applies the produce and replicate
events and the scheduled NotEnoughReplicas retries of such a stretch in (ts, kind) order as the reference
interpreter would, one compiled helper per rule named after the reference's method (`_produce`, `_attempt`,
`_append`, `_replicate`, `_recompute_hw`, `_end_instant`), on named records (`Stretch`, `Replicas`, `Durability`,
`LeaderLog`, `Pending`, `StreamCols`, `Outputs`, and the carried scalars' `CARRIED` record). A message's state
changes through `transition`, which checks the reference's `VALID_PREVIOUS_STATES`. It returns to Python at the
end of the stretch or right after the report that expands the ISR (rule 7, a control change). It also closes the
instants it passes (timeline rows, availability), and passes the ISR check ticks (rule 6) that would change
nothing (`tick_idle`): in steady state that is every tick, so a partition's stretch is not cut every
replica_lag_time_max_ms / 2 of trace.
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple

import numpy as np

from replay.kafka.reference.state import CLIENT, FENCE, ISR_CHECK, RETRY, MsgState, legal_transitions
from replay.shared.kernels.arrays import close_instant, compiled, in_runs, timeline_row
from replay.shared.states import IllegalTransition
from schemas.outcomes import NULL_US, Error
from schemas.trace import Kind

__all__ = ["MsgState"]  # the reference's message states, the codes of the pending `state` column

INF = np.iinfo(np.int64).max // 64  # "never": a key or time past any trace, with room for sums
NONE = -1  # no replica, row, epoch or offset
C_REPLICATE, C_PRODUCE = int(Kind.REPLICATE), int(Kind.PRODUCE)
# An event's position within its instant (SPEC §2.2): trace kinds first, then the derived events in the
# reference's order (`replay/kafka/reference/state.py`). A sort key is ts * CODES_PER_INSTANT + code.
C_DERIVED = max(int(k) for k in Kind) + 1
C_FENCE, C_TICK, C_CLIENT, C_RETRY = (C_DERIVED + FENCE, C_DERIVED + ISR_CHECK, C_DERIVED + CLIENT,
                                      C_DERIVED + RETRY)
CODES_PER_INSTANT = 16
assert C_RETRY < CODES_PER_INSTANT
DUR_CAP = 128  # durability buckets per replica before the ones surely on disk are folded


class FlushCode(IntEnum):
    """How `durable_at` computes when a write reaches the disk (SPEC §3.1 flush rule)."""

    SYNC = 0
    OS = 1  # no fsync: the OS writes back pages older than the expiry every period
    INTERVAL = 2


class AckCode(IntEnum):
    ZERO = 0
    ONE = 1
    ALL = 2


# Integer constants for the compiled code (numba reads module globals as compile-time constants).
_NEW, _WAITING, _REFUSED, _APPENDED, _ACKED = (int(MsgState.NEW), int(MsgState.WAITING), int(MsgState.REFUSED),
                                               int(MsgState.APPENDED), int(MsgState.ACKED))
#: `VALID_PREVIOUS_STATES` as a table: [new - NEW, previous - NEW] (a global array numba freezes as a constant).
_LEGAL = np.array(legal_transitions(), dtype=np.bool_)
_SYNC, _OS = int(FlushCode.SYNC), int(FlushCode.OS)
_NO_ERROR = int(Error.NONE)
_ZERO, _ONE, _ALL = int(AckCode.ZERO), int(AckCode.ONE), int(AckCode.ALL)


# ============================================================================== the records `steady` reads
class Flush(NamedTuple):
    """The flush rule (SPEC §3.1), as `KafkaReference._durable_at` reads it from the policy."""

    mode: int  # FlushCode
    period_us: int
    expire_us: int


class Stretch(NamedTuple):
    """What stays fixed over one steady stretch (the reference's leader, ISR, target and policy)."""

    stream_end: int  # the stream events of the stretch: StreamCols.key[stream_pos:stream_end]
    retry_end: int  # its scheduled retries: StreamCols.retry_key[retry_pos:retry_end]
    leader: int  # the leader's replica index, or NONE
    serving: int  # the serving broker's replica index (`_serving`), or NONE
    serving_is_leader: bool
    serving_ok: bool  # a broker serves clients
    refusing: bool  # it refuses acks=all writes (rule 3)
    acks: int  # AckCode
    leader_eligible: bool  # the leader is up and reachable: its followers' reports count (rule 5)
    hw_moves: bool  # `_recompute_hw` may move the high watermark (a leader that knows it leads, not frozen)
    epoch: int  # the serving broker's leader epoch
    epoch_start: int  # the leader's log end when its epoch began (SPEC §3.7 K-5)
    delivery_timeout_us: int
    request_timeout_us: int
    window_us: int
    zombie: bool  # the serving broker is a zombie (rule 10)
    zombie_alone: bool  # ... whose ISR was itself alone: it commits on its own
    blocked: bool  # no broker serves, or it refuses: the instants are unavailable
    series: bool  # the leader is up: the instants' rows are a series of (log end, high watermark)
    flush: Flush
    limit_key: int  # the stretch ends before this key
    replica_lag_us: int  # replica_lag_time_max_ms (rule 6)
    tick_period_us: int  # ISR check ticks every replica_lag_time_max_ms / 2
    duration_us: int
    compact_at: int  # pending rows from which the stretch ends so that settled ones are handed over


class Replicas(NamedTuple):
    """Per replica, in assignment order (the reference's `Replica` fields)."""

    log_len: np.ndarray
    fetched: np.ndarray  # the leader's view of its log end
    lcu: np.ndarray  # last time it was caught up with the leader
    follower_ok: np.ndarray  # an eligible follower, its reports count (rule 5)
    in_isr: np.ndarray
    in_view: np.ndarray  # in the ISR the leader acts on (`_view`)


class Durability(NamedTuple):
    """Per replica, what a power loss keeps (SPEC §3.1): `flushed_all` and the buckets of writes not yet surely on
    disk, (durable_at_us, length) for the first durable_n of each row."""

    flushed_all: np.ndarray
    durable_at_us: np.ndarray
    durable_len: np.ndarray
    durable_n: np.ndarray


class LeaderLog(NamedTuple):
    """The leader's log (runs of (epoch, start, end), append times, cumulative sizes) and the serving broker's
    epoch's appends (append times, sizes)."""

    runs: np.ndarray
    append_us: np.ndarray
    cum_size: np.ndarray
    epoch_append_us: np.ndarray
    epoch_size: np.ndarray


class Pending(NamedTuple):
    """The pending messages' columns (the reference's `Msg` fields), one row per message (`common.PENDING_COLS`)."""

    msg_id: np.ndarray
    produce_us: np.ndarray
    size: np.ndarray
    deadline_us: np.ndarray
    state: np.ndarray  # MsgState
    error: np.ndarray
    refused_us: np.ndarray  # its last NotEnoughReplicas answer, from which its retry is due
    refusals: np.ndarray
    epoch: np.ndarray  # its latest position (epoch, offset), or NONE
    offset: np.ndarray
    request_us: np.ndarray
    ack_us: np.ndarray
    visible_us: np.ndarray
    pid: np.ndarray  # carried untouched to the outputs
    part: np.ndarray
    keyid: np.ndarray


class StreamCols(NamedTuple):
    """The chunk's stream (`stream.merge_stream`: key, and src pointing into the reports' or the produce events'
    columns) and the scheduled NotEnoughReplicas retries (key, pending row)."""

    key: np.ndarray
    src: np.ndarray
    report_replica: np.ndarray
    report_upto: np.ndarray
    produce_msg_id: np.ndarray
    produce_size: np.ndarray
    produce_pid: np.ndarray
    produce_part: np.ndarray
    produce_keyid: np.ndarray
    retry_key: np.ndarray
    retry_row: np.ndarray


class Outputs(NamedTuple):
    """`steady`'s output buffers (counts in `CARRIED`) and its scratch map from offset to pending row."""

    rows: np.ndarray  # timeline rows (`arrays.timeline_row`: t, log end, high watermark, window end)
    unavailable: np.ndarray  # unavailability intervals (from, to)
    extra: np.ndarray  # earlier copies of messages appended again (msg, epoch, offset)
    hw_moves: np.ndarray  # high watermark moves (t, value)
    offset_row: np.ndarray  # offset - offset_base -> pending row, for the leader's log from the high watermark up


#: Columns of the `Outputs` buffers but `offset_row`.
OUTPUT_WIDTHS = (4, 2, 3, 2)

#: The scalars `steady` carries from one stretch to the next and its running counts, one record (`carried[0]`).
CARRIED = np.dtype([
    ("hw", np.int64), ("zombie_hw", np.int64), ("zombie_stall_us", np.int64), ("cur_t", np.int64),
    ("replication_bytes", np.int64), ("lead_n", np.int64), ("cum_n", np.int64), ("epoch_n", np.int64),
    ("pend_n", np.int64), ("stream_pos", np.int64), ("retry_pos", np.int64), ("tick_key", np.int64),
    ("appended", np.int64),  # appends of the stretch (the serving broker's log grew by that many)
    ("expand", np.int64),  # the replica whose report may expand the ISR (rule 7), or NONE
    ("n_rows", np.int64), ("n_unavailable", np.int64), ("n_extra", np.int64), ("n_hw_moves", np.int64),
    ("closed", np.int64), ("prev_leo", np.int64), ("prev_hw", np.int64),  # instants closed, the last row's values
    ("offset_base", np.int64),  # the offset of Outputs.offset_row[0]
])


# ================================================================================ the message state machine
@compiled(inline=True)
def transition(state, r, new):
    """Pending row r enters state `new`: the one place the kernel's compiled code checks a message's transition
    against `VALID_PREVIOUS_STATES` (replay/kafka/reference/state.py, as the reference's `_set_state`)."""
    if not _LEGAL[new - _NEW, state[r] - _NEW]:
        raise IllegalTransition("a message state transition VALID_PREVIOUS_STATES does not allow")
    state[r] = new


# ============================================================================= durability (SPEC §3.1)
@compiled(inline=True)
def durable_at(t, flush):
    """When an entry written at t is on disk (as `KafkaReference._durable_at`)."""
    if flush.mode == _SYNC:
        return t
    if flush.mode == _OS:
        return -(-(t + flush.expire_us) // flush.period_us) * flush.period_us
    return -(-t // flush.period_us) * flush.period_us


@compiled(inline=True)
def wrote(i, t, length, dur, flush):
    """Replica i's log reached `length` at time t: keep it per durability bucket for a power loss (SPEC §3.1)."""
    if flush.mode == _SYNC:
        dur.flushed_all[i] = max(dur.flushed_all[i], length)
        return
    d_at, d_len = dur.durable_at_us, dur.durable_len
    n = dur.durable_n[i]
    # the last bucket, if t falls in it (most writes): its flush tick is the first at or after t (+ expiry)
    last = d_at[i, n - 1] if n > 0 else 0
    if n > 0 and last - flush.period_us < t + (flush.expire_us if flush.mode == _OS else 0) <= last:
        d_len[i, n - 1] = max(d_len[i, n - 1], length)
        return
    d = durable_at(t, flush)
    if n == d_at.shape[1]:  # fold the buckets surely on disk by now: a later power loss keeps them
        k = 0
        for j in range(n):
            if d_at[i, j] < t:
                dur.flushed_all[i] = max(dur.flushed_all[i], d_len[i, j])
            else:
                d_at[i, k], d_len[i, k] = d_at[i, j], d_len[i, j]
                k += 1
        n = k
    d_at[i, n], d_len[i, n] = d, length
    dur.durable_n[i] = n + 1


# ================================================================================== rule 6: ISR check ticks
@compiled(counted=False)
def tick_idle(t, s, hw, serving_hw, rep, msgs, pend_n):
    """Whether the ISR check tick at t would change nothing: `KafkaReference._on_isr_check` (rule 6, then rule 4's
    recomputation and its acknowledgements) and what every control point does around it (`_resolve_deadlines`,
    `_reschedule_pool`). Errs on the side of False: the tick then runs in Python, as any control point."""
    li = s.leader
    if s.leader_eligible:  # the tick only checks the ISR under an eligible leader
        leo = rep.log_len[li]
        candidate = leo
        for b in range(len(rep.log_len)):
            if b == li:
                continue
            if rep.in_isr[b] and t - rep.lcu[b] > s.replica_lag_us and rep.fetched[b] < leo:
                return False  # rule 6: b leaves the ISR
            if rep.in_view[b]:
                candidate = min(candidate, rep.fetched[b])
        if s.hw_moves and rep.in_view[li] and candidate > hw:
            return False  # rule 4: the high watermark would move
    acks = s.acks
    for r in range(pend_n):
        st = msgs.state[r]
        if st > _APPENDED:
            continue
        if acks != _ZERO and msgs.deadline_us[r] < t:
            return False  # a delivery deadline passed: the message fails
        if st == _REFUSED and acks == _ALL and not (s.serving_ok and s.refusing):
            return False  # a NotEnoughReplicas retry may be due (rule 3)
        if (st == _APPENDED and s.serving_ok and acks != _ZERO and msgs.request_us[r] <= t
                and (acks == _ONE or msgs.offset[r] < serving_hw)):
            return False  # an acknowledgement may be due (rule 12)
    return True


# ============================================================================ one helper per reference rule
@compiled(inline=True)
def _end_instant(t, c, s, rep, lead, avail, out):
    """Close the instant c.cur_t, t being the next (`KafkaReference._end_instant`): its timeline row and its
    availability (stalled if the oldest entry waiting for the high watermark is older than request_timeout)."""
    li = s.leader
    leo = rep.log_len[li] if li >= 0 else 0
    hw = c.hw
    c.n_rows = timeline_row(out.rows, c.n_rows, c.closed, c.cur_t, leo, hw, c.prev_leo, c.prev_hw, s.window_us,
                            s.series)
    c.prev_leo, c.prev_hw = leo, hw
    c.closed += 1
    stall = INF
    if not s.blocked and s.acks == _ALL:
        if s.serving_is_leader:
            if hw < rep.log_len[li]:
                stall = lead.append_us[hw] + s.request_timeout_us  # the oldest entry waiting for the high watermark
        elif c.zombie_hw < rep.log_len[s.serving]:
            stall = c.zombie_stall_us
    c.n_unavailable = close_instant(avail, 0, c.cur_t, s.blocked, stall, out.unavailable, c.n_unavailable)
    c.cur_t = t


@compiled(inline=True)
def _replicate(t, b, upto, c, s, rep, dur, lead):
    """Rule 5: replica b reports it fetched the leader's entries appended by `upto` (`KafkaReference._replicate`).
    Marks b for the ISR expansion check (rule 7) if it is out of the ISR. Returns whether the report counts."""
    if not s.leader_eligible or b < 0 or not rep.follower_ok[b]:
        return False  # a down/isolated follower, the leader itself, or an unreachable leader (§2.2)
    li = s.leader
    leo = rep.log_len[li]
    old = rep.log_len[b]
    # The count of the leader's entries appended by upto, if above the follower's log end (a report never
    # shrinks a follower's log): append times never decrease in a log, so a scan from the log end finds it in
    # time proportional to the entries it copies.
    new_len = old
    while new_len < min(leo, c.lead_n) and lead.append_us[new_len] <= upto:
        new_len += 1
    if new_len > old:
        c.replication_bytes += lead.cum_size[new_len] - lead.cum_size[old]
        wrote(b, t, new_len, dur, s.flush)
    rep.log_len[b] = new_len
    rep.fetched[b] = new_len
    rep.lcu[b] = max(rep.lcu[b], t if new_len == leo else upto)
    if not rep.in_isr[b]:
        c.expand = b  # checked against the high watermark after `_recompute_hw`
    return True


@compiled(inline=True)
def _produce(t, j, c, s, stream, msgs):
    """A new message from produce event j (`KafkaReference._produce`); returns its pending row. Every column of
    the new row is written: its slots are unset (`arrays._grown`) or stale (a compaction, `records.hand_over`)."""
    r = c.pend_n
    c.pend_n += 1
    msgs.msg_id[r], msgs.produce_us[r], msgs.size[r] = stream.produce_msg_id[j], t, stream.produce_size[j]
    msgs.deadline_us[r], msgs.state[r], msgs.error[r] = t + s.delivery_timeout_us, _NEW, _NO_ERROR
    msgs.refused_us[r], msgs.refusals[r], msgs.epoch[r], msgs.offset[r] = t, 0, NONE, NONE
    msgs.request_us[r], msgs.ack_us[r], msgs.visible_us[r] = INF, NULL_US, NULL_US
    msgs.pid[r], msgs.part[r], msgs.keyid[r] = stream.produce_pid[j], stream.produce_part[j], stream.produce_keyid[j]
    return r


@compiled(inline=True)
def _append(t, r, c, s, msgs, rep, dur, lead, out):
    """Message r joins the serving broker's log (`KafkaReference._append`, with `_zombie_hw` for a zombie)."""
    si = s.serving
    off = rep.log_len[si]
    if msgs.epoch[r] >= 0:  # appended again: the earlier copy may survive, it is judged too
        n = c.n_extra
        out.extra[n, 0], out.extra[n, 1], out.extra[n, 2] = msgs.msg_id[r], msgs.epoch[r], msgs.offset[r]
        c.n_extra = n + 1
    msgs.epoch[r], msgs.offset[r] = s.epoch, off
    lead.epoch_append_us[c.epoch_n], lead.epoch_size[c.epoch_n] = t, msgs.size[r]
    c.epoch_n += 1
    c.appended += 1
    rep.log_len[si] = off + 1
    wrote(si, t, off + 1, dur, s.flush)
    if s.serving_is_leader:
        lead.append_us[c.lead_n] = t
        c.lead_n += 1
        lead.cum_size[c.cum_n] = lead.cum_size[c.cum_n - 1] + msgs.size[r]
        c.cum_n += 1
        out.offset_row[off - c.offset_base] = r
    if s.acks != _ZERO:
        transition(msgs.state, r, _APPENDED)
        msgs.request_us[r] = t
        if s.acks == _ONE:
            transition(msgs.state, r, _ACKED)
            msgs.ack_us[r] = t
    if s.zombie:
        if s.zombie_alone:  # a zombie whose ISR was itself alone commits on its own (rule 10)
            c.zombie_hw = off + 1
            if msgs.visible_us[r] == NULL_US:
                msgs.visible_us[r] = t
            if s.acks == _ALL:
                transition(msgs.state, r, _ACKED)
                msgs.ack_us[r] = t
        elif off == c.zombie_hw:
            c.zombie_stall_us = t + s.request_timeout_us


@compiled(inline=True)
def _attempt(t, r, c, s, msgs, rep, dur, lead, out):
    """Rules 3-4: a new message or a NotEnoughReplicas retry is sent to the serving broker
    (`KafkaReference._attempt`; acks=0 is acknowledged as it leaves and never refused, `_produce`)."""
    if s.acks == _ZERO:
        transition(msgs.state, r, _ACKED)  # counted as sent when it leaves (rule 4)
        msgs.ack_us[r] = t
    elif not s.serving_ok:
        transition(msgs.state, r, _WAITING)
    elif s.refusing:
        transition(msgs.state, r, _REFUSED)
        msgs.refused_us[r] = t
        msgs.refusals[r] += 1
    if s.serving_ok and (not s.refusing or s.acks == _ZERO):
        _append(t, r, c, s, msgs, rep, dur, lead, out)


@compiled(inline=True)
def _recompute_hw(t, c, s, rep, msgs, out):
    """Rule 4: high watermark = min log end over the ISR (`KafkaReference._recompute_hw`), with what it makes
    visible (rule 12, `_mark_visible`) and the acks=all requests the leader then acknowledges (`_ack_committed`)."""
    li = s.leader
    candidate = rep.log_len[li]
    for b in range(len(rep.log_len)):
        if rep.in_view[b] and b != li:
            candidate = min(candidate, rep.fetched[b])
    hw = c.hw
    if candidate <= hw:
        return
    for o in range(hw, candidate):
        r = out.offset_row[o - c.offset_base]
        if r < 0:
            continue
        if msgs.visible_us[r] == NULL_US:
            msgs.visible_us[r] = t
        if s.serving_is_leader and s.acks == _ALL:
            ack_t = max(t, msgs.request_us[r])
            if msgs.state[r] == _APPENDED and ack_t <= msgs.deadline_us[r]:
                transition(msgs.state, r, _ACKED)
                msgs.ack_us[r] = ack_t
    n = c.n_hw_moves
    out.hw_moves[n, 0], out.hw_moves[n, 1] = t, candidate
    c.n_hw_moves = n + 1
    c.hw = candidate


# ================================================================================= the steady loop
@compiled(counted=False)
def steady(carried, avail, s, stream, msgs, rep, dur, lead, out):
    """Apply the due stream events of one steady stretch (see the module docstring). Returns nothing: the
    carried scalars are in `carried[0]` (`CARRIED`), the open instant's availability in `avail`, outputs in the
    `Outputs` buffers with their counts in `carried[0]`. `out.offset_row` is scratch of at least one slot per
    entry of the leader's log from the high watermark up, per due event, plus one."""
    c = carried[0]
    li = s.leader
    c.appended = 0
    c.expand = NONE
    c.n_rows, c.n_unavailable, c.n_extra, c.n_hw_moves = 0, 0, 0, 0
    c.closed, c.prev_leo, c.prev_hw = 0, NONE, NONE
    # offset -> pending row, for the leader's log from the high watermark up (rules 4, 12)
    base = min(c.hw, rep.log_len[li]) if li >= 0 else 0  # a leader may hold less than the high watermark (rule 9)
    c.offset_base = base
    room = ((rep.log_len[li] - base if li >= 0 else 0) + (s.stream_end - c.stream_pos) + (s.retry_end - c.retry_pos)
            + 1)
    orow = out.offset_row
    if len(orow) < room:
        raise ValueError("steady: offset_row holds fewer slots than the leader's unsettled log and the due events")
    orow[:room] = NONE
    if li >= 0:
        for r in range(c.pend_n):
            o = msgs.offset[r]
            if msgs.epoch[r] >= 0 and c.hw <= o < rep.log_len[li] and in_runs(lead.runs, msgs.epoch[r], o):
                orow[o - base] = r
    while True:
        i_s, i_r = c.stream_pos, c.retry_pos
        kt = stream.key[i_s] if i_s < s.stream_end else INF
        kr = stream.retry_key[i_r] if i_r < s.retry_end else INF
        kc = c.tick_key if c.tick_key < s.limit_key else INF  # the next ISR check tick, if before the stretch's end
        if kt == INF and kr == INF and kc == INF:
            break
        at_tick = kc < kt and kc < kr
        if at_tick and (c.pend_n >= s.compact_at or not tick_idle(
                kc // CODES_PER_INSTANT, s, c.hw, c.zombie_hw if s.zombie else c.hw, rep, msgs, c.pend_n)):
            break  # a control point, its handler in Python (or the pending table to compact, which bounds scans)
        trace = not at_tick and kt <= kr  # trace events first on equal keys
        t = (kc if at_tick else kt if trace else kr) // CODES_PER_INSTANT
        if t > c.cur_t:
            _end_instant(t, c, s, rep, lead, avail, out)
        if at_tick:  # rule 6: an idle ISR check tick; the next one is due
            c.tick_key = kc + s.tick_period_us * CODES_PER_INSTANT if t + s.tick_period_us <= s.duration_us else INF
            continue
        if trace:
            j = stream.src[i_s]
            c.stream_pos = i_s + 1
            if j < 0:  # rule 5: a report
                j = -1 - j
                if not _replicate(t, stream.report_replica[j], stream.report_upto[j], c, s, rep, dur, lead):
                    continue
            else:  # rules 3-4: a new message
                _attempt(t, _produce(t, j, c, s, stream, msgs), c, s, msgs, rep, dur, lead, out)
        else:  # a NotEnoughReplicas retry (rule 3)
            c.retry_pos = i_r + 1
            _attempt(t, stream.retry_row[i_r], c, s, msgs, rep, dur, lead, out)
        if s.hw_moves:
            _recompute_hw(t, c, s, rep, msgs, out)
        if c.expand >= 0:
            # Rule 7 with SPEC §3.7 K-5: rejoin once the log end reaches the high watermark and the epoch start.
            b = c.expand
            if rep.log_len[b] >= c.hw and rep.log_len[b] >= s.epoch_start:
                break
            c.expand = NONE
