"""The compiled steady path of the RocketMQ kernels (SPEC §3.3-3.5): one event at a time.

Between two control points (faults, detections, elections, route polls) the group's leader, its reachability,
the serving broker and the epoch do not change. `group_steady` applies the produce and replicate events and the
scheduled arrivals (DLedger retries, C2) of such a segment in (ts, kind) order as the reference interpreter does
(`GroupReference._append`, `_replicate`, `_ack_upto`, `_mark_visible`; `ClassicReference._arrive`, `_progress`;
`DLedgerReference._arrive`, `_recommit`; `ControllerReference._arrive`, `_recompute_hw`, `_progress`), with the
state in named records whose fields are the reference's (`Segment`, `Replicas`: `log_len`, `fetched`, `lcu`,
`nbytes`; `LeaderLog`, `Writes`; the leader's `commit` and the controller's `hw` carried in `sc`), and closes
the instants it passes (timeline rows, availability; SPEC §4.2-4.3). Writes are returned for the flush model
(R3), evaluated lazily in Python.
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple

import numpy as np

from replay.rocketmq.control import INF, KEY
from replay.rocketmq.reference.state import IllegalTransition, MsgState, legal_transitions
from replay.shared.kernels.arrays import close_instant, compiled, in_runs, kth_largest, timeline_row
from schemas.outcomes import NULL_US, Error
from schemas.trace import Kind


class CommitRule(IntEnum):
    """Which commit point answers the leader's requests."""

    CLASSIC = 0  # rule 4 (SYNC_MASTER): the need-th largest slave copy; need = 0 acks at append (ASYNC_MASTER)
    DLEDGER = 1  # rule 2: the q-th largest log end over the group, leader included; never decreases
    # §3.5: the confirm offset (hw) is the minimum over the master's view of the SyncStateSet; acks at it
    # (allAckInSyncStateSet), at the k-th largest log end (in_sync_replicas k > 1), or at append (k ≤ 1)
    CONTROLLER = 2


C_REPLICATE, C_PRODUCE = int(Kind.REPLICATE), int(Kind.PRODUCE)
# the reference's message states (numba reads module globals as compile-time constants)
_WAITING, _ACKED, _FAILED = int(MsgState.WAITING), int(MsgState.ACKED), int(MsgState.FAILED)
_LEGAL = np.array(legal_transitions(), dtype=np.bool_)  # [new, previous], `VALID_PREVIOUS_STATES`
_SLAVE_NOT_AVAILABLE = int(Error.SLAVE_NOT_AVAILABLE)
_CLASSIC, _DLEDGER, _CONTROLLER = int(CommitRule.CLASSIC), int(CommitRule.DLEDGER), int(CommitRule.CONTROLLER)
# bits of `ctl`, per replica (CONTROLLER): in the master's view of the SyncStateSet (the confirm offset's
# members; the set it knew when isolated), in the SyncStateSet itself (a slave outside it rejoins, §3.5)
IN_VIEW, IN_SSS = 1, 2

# Indices of the carried scalars in `sc` (read and written back by `group_steady`).
(S_CUR_T, S_COMMIT, S_REPL_BYTES, S_AV_HAS, S_AV_T, S_AV_BLOCKED, S_AV_STALL, S_LEAD_N, S_CUM_N, S_EP_N, S_POS,
 S_SCHED_POS, S_APPENDED, S_NROWS, S_NUNAV, S_HW, S_ROW, S_EXPAND) = range(18)
N_SCALARS = 18
assert (S_AV_T, S_AV_BLOCKED, S_AV_STALL) == (S_AV_HAS + 1, S_AV_HAS + 2, S_AV_HAS + 3)  # `close_instant`


class Segment(NamedTuple):
    """What stays fixed over one steady segment (the reference's leader, serving broker, epoch and policy)."""

    stream_end: int  # its stream events: s_key[sc[S_POS]:stream_end]
    sched_end: int  # its scheduled arrivals: sched_key[sc[S_SCHED_POS]:sched_end]
    first_row: int  # the pending row of its first produce event (the others follow in order)
    pending_n: int  # pending rows before the segment
    leader: int  # the leader's replica index, or -1
    leader_broker: int  # its broker id (`Msg.taker`'s), or -1
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


@compiled(inline=True)
def transition(state, r, new):
    """Pending row r enters state `new`: the one place the kernels' compiled code checks a message's transition
    against `VALID_PREVIOUS_STATES` (replay/rocketmq/reference/state.py, as the reference's `set_state`)."""
    if not _LEGAL[new, state[r]]:
        raise IllegalTransition("a message state transition VALID_PREVIOUS_STATES does not allow")
    state[r] = new


@compiled(inline=True)
def _ack_limit(arrive, dead, answer_us):
    """R1: the last instant an ack still counts: the broker's status at arrival + its timeout, or the client's
    deadline (at one instant replication comes first)."""
    return min(arrive + answer_us, dead)


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
def _view_min(li, ctl, log_len, fetched):
    """§3.5 the confirm offset's candidate (`ControllerReference._recompute_hw`): the smallest log end over the
    master's view of the SyncStateSet, the master's own log and the others' `fetched`."""
    m = INF
    for b in range(len(fetched)):
        if ctl[b] & IN_VIEW:
            m = min(m, log_len[b] if b == li else fetched[b])
    return m


@compiled(inline=True)
def _settle(lo, hi, base, orow, t, mark_visible, acks, lb, epoch, inc, answer_us, state, ack, vis, tb, tep, tinc,
            arrive, dead):
    """The leader's point moved from lo to hi at t: its entries there become visible (`_mark_visible`, if
    `mark_visible`) and answer their waiting requests (`_ack_upto`, if `acks`; R1: only this incarnation's, in
    time)."""
    for o in range(lo, hi):
        r = orow[o - base]
        if r < 0:
            continue
        if mark_visible and vis[r] == NULL_US:
            vis[r] = t
        if acks and state[r] == _WAITING and tb[r] == lb and tep[r] == epoch and tinc[r] == inc and \
                t <= _ack_limit(arrive[r], dead[r], answer_us):
            transition(state, r, _ACKED)
            ack[r] = t


@compiled(inline=True)
def _write(b, t, length, nb, writes):
    """Replica b's log reached `length` entries (`nb` bytes) at t: a write for the flush model (R3)."""
    k = writes.n[b]
    writes.t[b, k], writes.length[b, k], writes.nbytes[b, k] = t, length, nb
    writes.n[b] = k + 1


@compiled(inline=True)
def _replicate(t, b, upto, li, reps, lead, writes):
    """SPEC §3.2 rule 5, `GroupReference._replicate`: follower b reports it has fetched the leader's entries
    appended by `upto` (append times never decrease in a log: a scan from its log end, in time proportional to the
    entries it copies; a report never shrinks a log). Returns the bytes it copied."""
    leo = reps.log_len[li]
    old = reps.log_len[b]
    new_len = old
    while new_len < leo and lead.append_us[new_len] <= upto:
        new_len += 1
    copied = 0
    if new_len > old:
        copied = lead.cum_bytes[new_len] - lead.cum_bytes[old]
        reps.nbytes[b] = lead.cum_bytes[new_len]
        _write(b, t, new_len, reps.nbytes[b], writes)
    reps.log_len[b] = new_len
    reps.fetched[b] = new_len
    reps.lcu[b] = max(reps.lcu[b], t if new_len == leo else upto)
    return copied


@compiled(inline=True)
def _append(r, t, li, lb, epoch, inc, size, pe, po, tb, tinc, tep, reps, lead, lead_n, cum_n, ep_n, writes):
    """The leader appends message row r at t (`GroupReference._append`): its log, its epoch's entries, the
    leader cache (append times, cumulative bytes by offset) and a write for the flush model; the message is
    answered by this incarnation (R1)."""
    off = reps.log_len[li]
    reps.nbytes[li] += size
    pe[r], po[r], tb[r], tinc[r], tep[r] = epoch, off, lb, inc, epoch
    reps.log_len[li] = off + 1
    lead.append_us[lead_n], lead.cum_bytes[cum_n] = t, reps.nbytes[li]
    lead.epoch_append_us[ep_n] = t
    lead.epoch_cum_bytes[ep_n + 1] = lead.epoch_cum_bytes[ep_n] + size
    _write(li, t, off + 1, reps.nbytes[li], writes)


@compiled(inline=True)
def _on_append(r, t, vis_at_append, ack_at_append, usable_ok, answer_us, state, err, ack, vis, arrive, dead):
    """The family's decision at append: `ClassicReference._arrive` (rule 5: visible at the master's append;
    rule 4: ASYNC_MASTER acks there, a SYNC_MASTER without enough usable slaves fails at once, stored on the
    master); `ControllerReference._arrive` (B.7: visible there unless allAckInSyncStateSet; in_sync_replicas ≤ 1
    acks there); DLedger waits for its commit."""
    transition(state, r, _WAITING)
    if vis_at_append:
        vis[r] = t
    if ack_at_append:
        if t <= _ack_limit(arrive[r], dead[r], answer_us):  # R1: a retry that arrives past its deadline
            transition(state, r, _ACKED)
            ack[r] = t
    elif not usable_ok:
        transition(state, r, _FAILED)
        err[r] = _SLAVE_NOT_AVAILABLE


def _steady_loop(rule: int):
    """`group_steady` compiled for one commit rule: `rule` is a constant of the closure (numba keys its on-disk
    cache by the closure's values), so the other rules' branches are no code at all. Read at run time, the
    controller's branch alone cost the other families' loops 15-27 %."""

    @compiled(counted=False)
    def group_steady(sc, seg, s_key, s_code, s_rep, s_upto, sched_key, sched_row,
                     size, state, err, pe, po, tb, tinc, tep, ack, vis, arrive, dead,
                     reps, lead, buf, writes, row_out, unav_out, orow):
        """Apply the events of one steady segment (module docstring): stream events [sc[S_POS], seg.stream_end) and
        scheduled arrivals [sc[S_SCHED_POS], seg.sched_end), merged. Produce events already have rows from
        seg.first_row on, in order. CONTROLLER stops after a report that brings a slave outside the SyncStateSet to the
        confirm offset (sc[S_EXPAND] = its index; the caller adds it, as `ControllerReference._progress` does, and
        goes on). Returns nothing: the carried scalars are in `sc`, outputs in the *_out / w_* buffers with their
        counts in `sc`. `orow` is scratch of at least one slot per entry of the leader's log from the commit point
        up, per due event, plus one."""
        log_len, fetched, alive, ctl = reps.log_len, reps.fetched, reps.alive, reps.ctl
        lead_runs, lead_app = lead.runs, lead.append_us
        cur_t, commit, hw = sc[S_CUR_T], sc[S_COMMIT], sc[S_HW]
        lead_n, cum_n, ep_n = sc[S_LEAD_N], sc[S_CUM_N], sc[S_EP_N]
        i_s, i_r, s_hi, r_hi = sc[S_POS], sc[S_SCHED_POS], seg.stream_end, seg.sched_end
        li, lb, srv_ok, l_ok, k = seg.leader, seg.leader_broker, seg.takes, seg.leader_reachable, seg.need
        usable_ok, commits, epoch, inc = seg.usable, seg.commits, seg.epoch, seg.incarnation
        answer_us, window, blocked, refusal = seg.answer_us, seg.window_us, seg.blocked, seg.refusal
        all_ack, hw_moves = seg.all_ack, seg.hw_moves
        controller = rule == _CONTROLLER
        if controller:
            by_point = all_ack or k > 1  # acks wait for a point (else at append)
            vis_at_append = not all_ack
        else:
            by_point = rule == _DLEDGER or k > 0  # not ASYNC_MASTER
            vis_at_append = rule == _CLASSIC
        ack_at_append = not by_point
        row = seg.first_row
        appended, n_rows, n_unav, expand = 0, 0, 0, -1
        # offset -> row of the messages in the leader's log from the commit point up (R1, rule 4 visibility)
        leo0 = log_len[li] if li >= 0 else 0
        base = min(commit, leo0)
        room = max(leo0 - base, 0) + (s_hi - i_s) + (r_hi - i_r) + 1
        if len(orow) < room:
            raise ValueError("group_steady: orow is shorter than the leader's uncommitted log and the due events")
        orow[:room] = -1
        t0 = min(s_key[i_s] if i_s < s_hi else INF, sched_key[i_r] if i_r < r_hi else INF) // KEY
        if by_point and li >= 0:
            for r in range(seg.pending_n):
                if base <= po[r] < leo0 and pe[r] >= 0 and in_runs(lead_runs, pe[r], po[r]):
                    orow[po[r] - base] = r
                # already below the commit point: answered at the next event (the controller's master only while
                # it serves: `ControllerReplay` settles nothing for a master the clients do not reach)
                if 0 <= po[r] < commit and state[r] == _WAITING and tb[r] == lb and tep[r] == epoch and \
                        tinc[r] == inc and t0 <= _ack_limit(arrive[r], dead[r], answer_us) and \
                        (commits or not controller):
                    transition(state, r, _ACKED)
                    ack[r] = t0
        closed = 0
        prev_leo, prev_hw = -1, -1
        while True:
            kt = s_key[i_s] if i_s < s_hi else INF
            kr = sched_key[i_r] if i_r < r_hi else INF
            if kt == INF and kr == INF:
                break
            trace = kt <= kr  # trace events first on equal keys
            t = (kt if trace else kr) // KEY
            if t > cur_t:  # ------------------------------------------ close the instant cur_t (its end state)
                leo_c = log_len[li] if li >= 0 else 0
                # R6: the consumer-visible point (the controller's confirm offset with allAckInSyncStateSet, B.7)
                hw_c = commit if rule == _DLEDGER else (hw if controller and all_ack else leo_c)
                n_rows = timeline_row(row_out, n_rows, closed, cur_t, leo_c, hw_c, prev_leo, prev_hw, window, True)
                prev_leo, prev_hw = leo_c, hw_c
                closed += 1
                stall = INF  # R7: the oldest entry still waiting for its commit, once its timeout passed
                if not blocked and by_point and commit < leo_c:
                    stall = lead_app[commit] + answer_us
                n_unav = close_instant(sc, S_AV_HAS, cur_t, blocked, stall, unav_out, n_unav)
                cur_t = t
            reporter = -1
            if trace:
                j = i_s
                i_s += 1
                if s_code[j] == C_REPLICATE:  # -------------------------------------- SPEC §3.2 rule 5: a report
                    b = s_rep[j]
                    if not l_ok or b < 0 or b == li or not alive[b]:
                        continue  # a down/isolated follower, the leader itself, or an unreachable leader (§2.2)
                    sc[S_REPL_BYTES] += _replicate(t, b, s_upto[j], li, reps, lead, writes)
                    reporter = b
                else:  # ------------------------------------------------------------ a message arrives (produce)
                    r = row
                    row += 1
                    if not srv_ok:
                        transition(state, r, _FAILED)
                        err[r] = refusal  # R2 (§3.5: refused before append)
                        continue
                    _append(r, t, li, lb, epoch, inc, size[r], pe, po, tb, tinc, tep, reps, lead, lead_n, cum_n, ep_n,
                            writes)
                    lead_n, cum_n, ep_n = lead_n + 1, cum_n + 1, ep_n + 1
                    appended += 1
                    _on_append(r, t, vis_at_append, ack_at_append, usable_ok, answer_us, state, err, ack, vis,
                               arrive, dead)
                    orow[po[r] - base] = r
            else:  # ------------------------------------------------------ a scheduled arrival (DLedger retry, C2)
                r = sched_row[i_r]
                i_r += 1
                if not srv_ok:
                    transition(state, r, _FAILED)
                    err[r] = refusal  # R2
                    continue
                _append(r, t, li, lb, epoch, inc, size[r], pe, po, tb, tinc, tep, reps, lead, lead_n, cum_n, ep_n,
                        writes)
                lead_n, cum_n, ep_n, appended = lead_n + 1, cum_n + 1, ep_n + 1, appended + 1
                _on_append(r, t, vis_at_append, ack_at_append, usable_ok, answer_us, state, err, ack, vis, arrive, dead)
                orow[po[r] - base] = r
            # ------------- the points after a report or an append (rule 4 / DLedger rule 2 / §3.5 `_recompute_hw`)
            if controller:
                # the confirm offset never decreases in an epoch; without allAck only a rejoin reads it here, so
                # it is brought up to date there and at the segment's end (its running maximum is the same)
                if hw_moves and (all_ack or (reporter >= 0 and (ctl[reporter] & IN_SSS) == 0)):
                    h = _view_min(li, ctl, log_len, fetched)
                    if h > hw:
                        if all_ack:
                            _settle(hw, h, base, orow, t, True, False, lb, epoch, inc, answer_us, state, ack, vis,
                                    tb, tep, tinc, arrive, dead)
                        hw = h
                if by_point and commits:
                    c = hw if all_ack else _point(rule, k, li, log_len, fetched, buf)
                    if c > commit:
                        _settle(commit, c, base, orow, t, False, True, lb, epoch, inc, answer_us, state, ack, vis,
                                tb, tep, tinc, arrive, dead)
                        commit = c
                if reporter >= 0 and (ctl[reporter] & IN_SSS) == 0 and log_len[reporter] >= hw:
                    expand = reporter  # the slave rejoins the SyncStateSet: the caller adds it
                    break
            elif by_point and commits:
                c = _point(rule, k, li, log_len, fetched, buf)
                if c > commit:
                    _settle(commit, c, base, orow, t, rule == _DLEDGER, True, lb, epoch, inc, answer_us, state, ack,
                            vis, tb, tep, tinc, arrive, dead)  # DLedger rule 4: consumers see committed entries
                    commit = c
        if controller and hw_moves:
            hw = max(hw, _view_min(li, ctl, log_len, fetched))
        sc[S_CUR_T], sc[S_COMMIT], sc[S_HW], sc[S_ROW], sc[S_EXPAND] = cur_t, commit, hw, row, expand
        sc[S_LEAD_N], sc[S_CUM_N], sc[S_EP_N], sc[S_POS], sc[S_SCHED_POS] = lead_n, cum_n, ep_n, i_s, i_r
        sc[S_APPENDED], sc[S_NROWS], sc[S_NUNAV] = appended, n_rows, n_unav

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
