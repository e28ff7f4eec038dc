"""The compiled steady path of the `kafka` kernel (SPEC §3.1-3.2): one event at a time between control points.

Between two control points (faults, fencing deadlines, ISR check ticks, client switches, ISR expansions) the
partition's leader, ISR, serving broker and refusal do not change. `steady` applies the produce and replicate
events and the scheduled NotEnoughReplicas retries of such a stretch in (ts, kind) order as the reference
interpreter would (`KafkaReference._produce`, `_attempt`, `_append`, `_replicate`, `_recompute_hw`), with the
carried state in arrays, and returns to Python at the end of the stretch or right after the report that expands
the ISR (rule 7, a control change). It also closes the instants it passes (timeline rows, availability), and
passes the ISR check ticks (rule 6) that would change nothing (`tick_idle`): in steady state that is every tick,
so a partition's stretch is not cut every replica_lag_time_max_ms / 2 of trace.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np

from replay.kafka.reference.state import CLIENT, FENCE, ISR_CHECK, RETRY
from replay.shared.kernels.arrays import close_instant, compiled, in_runs, timeline_row
from schemas.outcomes import NULL_US, Error
from schemas.trace import Kind

INF = np.iinfo(np.int64).max // 64
C_REPLICATE, C_PRODUCE = int(Kind.REPLICATE), int(Kind.PRODUCE)
# An event's position within its instant (SPEC §2.2): trace kinds first, then the derived events in the
# reference's order (`replay/kafka/reference/state.py`). A sort key is ts * CODES_PER_INSTANT + code.
C_DERIVED = max(int(k) for k in Kind) + 1
C_FENCE, C_TICK, C_CLIENT, C_RETRY = (C_DERIVED + FENCE, C_DERIVED + ISR_CHECK, C_DERIVED + CLIENT,
                                      C_DERIVED + RETRY)
CODES_PER_INSTANT = 16
assert C_RETRY < CODES_PER_INSTANT
DUR_CAP = 128  # durability buckets per replica before the ones surely on disk are folded


class MsgState(IntEnum):
    """A pending message's state (as the reference's `Msg.state`)."""

    WAITING = 0  # no broker serves clients: retried at the next client switch
    REFUSED = 1  # NotEnoughReplicas (rule 3), a retry is due after the backoff
    APPENDED = 2  # in the serving broker's log, waiting for the high watermark (acks=all)
    ACKED = 3
    FAILED = 4


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
_WAITING, _REFUSED, _APPENDED, _ACKED = (int(MsgState.WAITING), int(MsgState.REFUSED), int(MsgState.APPENDED),
                                         int(MsgState.ACKED))
_SYNC, _OS = int(FlushCode.SYNC), int(FlushCode.OS)
_NO_ERROR = int(Error.NONE)
_ZERO, _ONE, _ALL = int(AckCode.ZERO), int(AckCode.ONE), int(AckCode.ALL)

# Indices of the carried scalars in `sc` (read and written back by `steady`).
(S_HW, S_ZHW, S_ZSTALL, S_CUR_T, S_REPL_BYTES, S_AV_HAS, S_AV_T, S_AV_BLOCKED, S_AV_STALL, S_LEAD_N, S_CUM_N,
 S_EP_N, S_PEND_N, S_POS, S_SCHED_POS, S_APPENDED, S_EXPAND, S_NROWS, S_NUNAV, S_NEXTRA, S_NHW, S_TICK) = range(22)
N_SCALARS = 22
assert (S_AV_T, S_AV_BLOCKED, S_AV_STALL) == (S_AV_HAS + 1, S_AV_HAS + 2, S_AV_HAS + 3)  # `close_instant`
# Indices of the per-stretch constants in `cf`.
(F_S_HI, F_SCHED_HI, F_LI, F_SI, F_SRV_LEADER, F_SRV_OK, F_REFUSING, F_ACKS, F_L_OK, F_HW_MOVES, F_EPOCH,
 F_EPOCH_START, F_DELIVERY, F_TIMEOUT, F_WINDOW, F_ZOMBIE, F_ZOMBIE_ALONE, F_BLOCKED, F_SERIES, F_FLUSH,
 F_PERIOD, F_EXPIRE, F_LIMIT, F_LAG, F_TICK_PERIOD, F_DURATION, F_COMPACT_AT) = range(27)
N_CONSTANTS = 27
#: Columns of `steady`'s output buffers: timeline rows (`arrays.timeline_row`: t, log end, high watermark, window
#: end), unavailability intervals, earlier copies (msg, epoch, offset), high watermark moves (t, value).
OUTPUT_WIDTHS = (4, 2, 3, 2)


@compiled(inline=True)
def durable_at(t, flush, period, expire):
    """When an entry written at t is on disk (as `KafkaReference._durable_at`)."""
    if flush == _SYNC:
        return t
    if flush == _OS:
        return -(-(t + expire) // period) * period
    return -(-t // period) * period


@compiled(inline=True)
def wrote(i, t, length, flushed_all, dur_d, dur_len, dur_n, flush, period, expire):
    """Replica i's log reached `length` at time t: keep it per durability bucket for a power loss (SPEC §3.1)."""
    if flush == _SYNC:
        flushed_all[i] = max(flushed_all[i], length)
        return
    n = dur_n[i]
    # the last bucket, if t falls in it (most writes): its flush tick is the first at or after t (+ expiry)
    if n > 0 and dur_d[i, n - 1] - period < t + (expire if flush == _OS else 0) <= dur_d[i, n - 1]:
        dur_len[i, n - 1] = max(dur_len[i, n - 1], length)
        return
    d = durable_at(t, flush, period, expire)
    if n == dur_d.shape[1]:  # fold the buckets surely on disk by now: a later power loss keeps them
        k = 0
        for j in range(n):
            if dur_d[i, j] < t:
                flushed_all[i] = max(flushed_all[i], dur_len[i, j])
            else:
                dur_d[i, k], dur_len[i, k] = dur_d[i, j], dur_len[i, j]
                k += 1
        n = k
    dur_d[i, n], dur_len[i, n] = d, length
    dur_n[i] = n + 1


@compiled(counted=False)
def tick_idle(t, lag, l_ok, hw_moves, li, hw, serving_hw, acks, srv_ok, refusing, in_isr, in_view, log_len, fetched,
              lcu, state, dead, req, po, pend_n):
    """Whether the ISR check tick at t would change nothing: `KafkaControl._on_tick` (rule 6, then rule 4's
    recomputation and its acknowledgements) and what every control point does around it (`_resolve_deadlines`,
    `_reschedule_pool`). Errs on the side of False: the tick then runs in Python, as any control point."""
    if l_ok:  # the tick only checks the ISR under an eligible leader
        leo = log_len[li]
        cand = leo
        for b in range(len(log_len)):
            if b == li:
                continue
            if in_isr[b] and t - lcu[b] > lag and fetched[b] < leo:
                return False  # rule 6: b leaves the ISR
            if in_view[b]:
                cand = min(cand, fetched[b])
        if hw_moves and in_view[li] and cand > hw:
            return False  # rule 4: the high watermark would move
    for r in range(pend_n):
        s = state[r]
        if s > _APPENDED:
            continue
        if acks != _ZERO and dead[r] < t:
            return False  # a delivery deadline passed: the message fails
        if s == _REFUSED and acks == _ALL and not (srv_ok and refusing):
            return False  # a NotEnoughReplicas retry may be due (rule 3)
        if s == _APPENDED and srv_ok and acks != _ZERO and req[r] <= t and (acks == _ONE or po[r] < serving_hw):
            return False  # an acknowledgement may be due (rule 12)
    return True


@compiled(counted=False)
def steady(sc, cf, s_key, s_src, b_rep, b_upto, p_msg, p_size, p_pid, p_part, p_keyid, sched_key, sched_row,
           msg, prod, size, dead, state, err, anchor, nref, pe, po, req, ack, vis, pid, part, keyid,
           log_len, fetched, lcu, flushed_all, dur_d, dur_len, dur_n, ok_rep, in_isr, in_view, lead_runs,
           lead_app, lead_cum, ep_app, ep_size, row_out, unav_out, extra_out, hw_out, orow):
    """Apply the due stream events of one steady stretch (see the module docstring). Returns nothing: the
    carried scalars are in `sc`, outputs in the *_out buffers with their counts in `sc`. The stream is (s_key,
    s_src) of `stream.merge_stream`: s_src points into the reports' (b_) or the produce events' (p_) columns.
    `orow` is scratch of at least one slot per entry of the leader's log from the high watermark up, per due event,
    plus one."""
    hw, zhw, zstall, cur_t = sc[S_HW], sc[S_ZHW], sc[S_ZSTALL], sc[S_CUR_T]
    lead_n, cum_n, ep_n, pend_n = sc[S_LEAD_N], sc[S_CUM_N], sc[S_EP_N], sc[S_PEND_N]
    i_s, i_r = sc[S_POS], sc[S_SCHED_POS]
    s_hi, r_hi = cf[F_S_HI], cf[F_SCHED_HI]
    li, si = cf[F_LI], cf[F_SI]
    srv_leader, srv_ok, refusing, acks = cf[F_SRV_LEADER] == 1, cf[F_SRV_OK] == 1, cf[F_REFUSING] == 1, cf[F_ACKS]
    l_ok, hw_moves, epoch, epoch_start = cf[F_L_OK] == 1, cf[F_HW_MOVES] == 1, cf[F_EPOCH], cf[F_EPOCH_START]
    delivery, timeout, window = cf[F_DELIVERY], cf[F_TIMEOUT], cf[F_WINDOW]
    zombie, zombie_alone, blocked, series = cf[F_ZOMBIE] == 1, cf[F_ZOMBIE_ALONE] == 1, cf[F_BLOCKED] == 1, \
        cf[F_SERIES] == 1
    flush, period, expire = cf[F_FLUSH], cf[F_PERIOD], cf[F_EXPIRE]
    limit, lag, tick_period, duration = cf[F_LIMIT], cf[F_LAG], cf[F_TICK_PERIOD], cf[F_DURATION]
    compact_at = cf[F_COMPACT_AT]
    tick = sc[S_TICK]
    n_rep = log_len.shape[0]
    appends = 0  # acks=0 is never refused (rule 3 is for acks=all): every arrival is appended when served
    takes = srv_ok and (not refusing or acks == _ZERO)
    # offset -> pending row, for the leader's log from the high watermark up (rules 4, 12)
    base = min(hw, log_len[li]) if li >= 0 else 0  # a leader may hold less than the high watermark (rule 9)
    room = (log_len[li] - base if li >= 0 else 0) + (s_hi - i_s) + (r_hi - i_r) + 1
    if len(orow) < room:
        raise ValueError("steady: orow holds fewer slots than the leader's unsettled log and the due events")
    orow[:room] = -1
    if li >= 0:
        for r in range(pend_n):
            o = po[r]
            if pe[r] >= 0 and hw <= o < log_len[li] and in_runs(lead_runs, pe[r], o):
                orow[o - base] = r
    n_rows, n_unav, n_extra, n_hw = 0, 0, 0, 0
    closed = 0
    prev_leo, prev_hw = -1, -1
    expand = -1
    while True:
        kt = s_key[i_s] if i_s < s_hi else INF
        kr = sched_key[i_r] if i_r < r_hi else INF
        kc = tick if tick < limit else INF  # the next ISR check tick, if before the end of the stretch
        if kt == INF and kr == INF and kc == INF:
            break
        at_tick = kc < kt and kc < kr
        if at_tick and (pend_n >= compact_at or not tick_idle(
                kc // CODES_PER_INSTANT, lag, l_ok, hw_moves, li, hw, zhw if zombie else hw, acks, srv_ok, refusing,
                in_isr, in_view, log_len, fetched, lcu, state, dead, req, po, pend_n)):
            break  # a control point, its handler in Python (or the pending table to compact, which bounds scans)
        trace = not at_tick and kt <= kr  # trace events first on equal keys
        arrival = True
        t = (kc if at_tick else kt if trace else kr) // CODES_PER_INSTANT
        if t > cur_t:  # ------------------------------------------ close the instant cur_t (its end state)
            leo_c = log_len[li] if li >= 0 else 0
            n_rows = timeline_row(row_out, n_rows, closed, cur_t, leo_c, hw, prev_leo, prev_hw, window, series)
            prev_leo, prev_hw = leo_c, hw
            closed += 1
            stall = INF
            if not blocked and acks == _ALL:
                if srv_leader:
                    if hw < log_len[li]:
                        stall = lead_app[hw] + timeout  # the oldest entry waiting for the high watermark
                elif zhw < log_len[si]:
                    stall = zstall
            n_unav = close_instant(sc, S_AV_HAS, cur_t, blocked, stall, unav_out, n_unav)
            cur_t = t
        if at_tick:  # ------------------------------- rule 6: an idle ISR check tick; the next one is due
            tick = kc + tick_period * CODES_PER_INSTANT if t + tick_period <= duration else INF
            continue
        if trace:
            j = s_src[i_s]
            i_s += 1
            if j < 0:  # ------------------------------------------------------------------ rule 5: a report
                j = -1 - j
                b = b_rep[j]
                if not l_ok or b < 0 or not ok_rep[b]:
                    continue  # a down/isolated follower, the leader itself, or an unreachable leader (§2.2)
                leo = log_len[li]
                old = log_len[b]
                # The count of the leader's entries appended by upto, if above the follower's log end (a report
                # never shrinks a follower's log): append times never decrease in a log, so a scan from the log
                # end finds it in time proportional to the entries it copies.
                new_len = old
                while new_len < min(leo, lead_n) and lead_app[new_len] <= b_upto[j]:
                    new_len += 1
                if new_len > old:
                    sc[S_REPL_BYTES] += lead_cum[new_len] - lead_cum[old]
                    wrote(b, t, new_len, flushed_all, dur_d, dur_len, dur_n, flush, period, expire)
                log_len[b] = new_len
                fetched[b] = new_len
                lcu[b] = max(lcu[b], t if new_len == leo else b_upto[j])
                arrival = False
                if not in_isr[b]:
                    expand = b  # checked against the high watermark below
            else:  # -------------------------------------------------------- rules 3-4: a new message
                r = pend_n
                pend_n += 1
                # Every column of the new row is written: its slots are unset (`arrays._grown`) or stale (a
                # compaction, `records.hand_over`)
                msg[r], prod[r], size[r], dead[r] = p_msg[j], t, p_size[j], t + delivery
                state[r], err[r], anchor[r], nref[r], pe[r], po[r] = _WAITING, _NO_ERROR, t, 0, -1, -1
                req[r], ack[r], vis[r] = INF, NULL_US, NULL_US
                pid[r], part[r], keyid[r] = p_pid[j], p_part[j], p_keyid[j]
        else:  # --------------------------------------------------------- a NotEnoughReplicas retry (rule 3)
            r = sched_row[i_r]
            i_r += 1
        if arrival:  # ------------------------------------------------------------ an attempt (rules 3-4)
            if acks == _ZERO:
                state[r], ack[r] = _ACKED, t  # counted as sent when it leaves (rule 4)
            elif not srv_ok:
                state[r] = _WAITING
            elif refusing:
                state[r], anchor[r] = _REFUSED, t
                nref[r] += 1
            if takes:
                off = log_len[si]
                if pe[r] >= 0:  # appended again: the earlier copy may survive, it is judged too
                    extra_out[n_extra, 0], extra_out[n_extra, 1], extra_out[n_extra, 2] = msg[r], pe[r], po[r]
                    n_extra += 1
                pe[r], po[r] = epoch, off
                ep_app[ep_n], ep_size[ep_n] = t, size[r]
                ep_n += 1
                appends += 1
                log_len[si] = off + 1
                wrote(si, t, off + 1, flushed_all, dur_d, dur_len, dur_n, flush, period, expire)
                if srv_leader:
                    lead_app[lead_n] = t
                    lead_n += 1
                    lead_cum[cum_n] = lead_cum[cum_n - 1] + size[r]
                    cum_n += 1
                    orow[off - base] = r
                if acks != _ZERO:
                    state[r], req[r] = _APPENDED, t
                    if acks == _ONE:
                        state[r], ack[r] = _ACKED, t
                if zombie:
                    if zombie_alone:  # a zombie whose ISR was itself alone commits on its own (rule 10)
                        zhw = off + 1
                        if vis[r] == NULL_US:
                            vis[r] = t
                        if acks == _ALL:
                            state[r], ack[r] = _ACKED, t
                    elif off == zhw:
                        zstall = t + timeout
        if hw_moves:  # ------------------------------------ rule 4: high watermark = min log end over the ISR
            cand = log_len[li]
            for b in range(n_rep):
                if in_view[b] and b != li:
                    cand = min(cand, fetched[b])
            if cand > hw:
                for o in range(hw, cand):  # rule 12 visibility; acks=all requests held by the leader
                    r = orow[o - base]
                    if r < 0:
                        continue
                    if vis[r] == NULL_US:
                        vis[r] = t
                    if srv_leader and acks == _ALL:
                        ack_t = max(t, req[r])
                        if state[r] == _APPENDED and ack_t <= dead[r]:
                            state[r], ack[r] = _ACKED, ack_t
                hw_out[n_hw, 0], hw_out[n_hw, 1] = t, cand
                n_hw += 1
                hw = cand
        if expand >= 0:
            # Rule 7 with SPEC §3.7 K-5: rejoin once the log end reaches the high watermark and the epoch start.
            if log_len[expand] >= hw and log_len[expand] >= epoch_start:
                break
            expand = -1
    sc[S_HW], sc[S_ZHW], sc[S_ZSTALL], sc[S_CUR_T] = hw, zhw, zstall, cur_t
    sc[S_LEAD_N], sc[S_CUM_N], sc[S_EP_N], sc[S_PEND_N] = lead_n, cum_n, ep_n, pend_n
    sc[S_POS], sc[S_SCHED_POS], sc[S_APPENDED], sc[S_EXPAND] = i_s, i_r, appends, expand
    sc[S_NROWS], sc[S_NUNAV], sc[S_NEXTRA], sc[S_NHW], sc[S_TICK] = n_rows, n_unav, n_extra, n_hw, tick
