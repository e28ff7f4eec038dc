"""The kernel's twin of `replay.kafka.pipeline.plan_requests` (SPEC §3.7 K-6): the same requests, compiled, with
one forward cursor per follower over the partition's broker events and one over the timeline instead of a split
and a search per request (every instant the plan asks about is at or after the previous one)."""

from __future__ import annotations

import numpy as np

from replay.shared.kernels.arrays import compiled
from schemas.trace import Kind

_NEVER = np.iinfo(np.int64).max  # numba reads module globals as compile-time constants
_REPLICATE = int(Kind.REPLICATE)


@compiled
def plan_requests_compiled(prod, eng, ok, size, linger, rtt, tn_ts, tn, gap, slots, batch, reps, b_ts, b_kind, b_who,
                           b_upto, st_ts, st_mask, st_lead, st_live, st_from):
    n = len(prod)
    out = eng.copy()
    made_at = prod.copy()
    answers = np.zeros(slots, dtype=np.int64)  # the connection's last `slots` answers, a ring
    n_answers = 0
    cur = np.zeros(len(reps), dtype=np.int64)  # per follower: its fetch that answered the last instant asked
    row = np.zeros(1, dtype=np.int64)
    row[0] = -1
    step = 0  # the step of T in force at the last answer: answers come in time order
    turn = -_NEVER
    i = 0
    while i < n:
        if not ok[i]:
            i += 1
            continue
        s = max(prod[i], turn)
        # made when a slot freed: a round trip after the answer `slots` requests earlier, the oldest in the ring;
        # one no fetch of the trace gives never frees within it
        if n_answers < slots:
            made = prod[i]
        elif answers[n_answers % slots] == _NEVER:
            made = _NEVER
        else:
            made = max(prod[i], answers[n_answers % slots] + rtt)
            s = max(s, made)
        j = i
        used = 0
        done = s
        while j < n and (j == i or prod[j] <= made):
            if ok[j]:
                if j > i and used + size[j] > batch:
                    break
                used += size[j]
                done = max(done, eng[j])
                made_at[j] = made
            j += 1
        cyc = _NEVER
        if made != _NEVER:
            cyc = _next(s, cur, row, reps, b_ts, b_kind, b_who, b_upto, st_ts, st_mask, st_lead, st_live, st_from)
        if cyc != _NEVER:
            done = max(done, cyc)
        if made == _NEVER or done == _NEVER or (cyc == _NEVER and done == s):  # after the trace (`plan_requests`)
            for k in range(i, j):
                if ok[k]:
                    out[k] = _NEVER
            i = j
            turn = _next_turn(s, s, gap, rtt)
            answers[n_answers % slots] = _NEVER
            n_answers += 1
            if i < n:  # nor do those of the other turns' requests behind it on the connection
                while step + 1 < len(tn_ts) and tn_ts[step + 1] <= s:
                    step += 1
                for _ in range(tn[step] - 1):
                    answers[n_answers % slots] = _NEVER
                    n_answers += 1
            continue
        for k in range(i, j):
            if ok[k]:
                out[k] = done + linger + rtt
        i = j
        turn = _next_turn(s, done, gap, rtt)
        answers[n_answers % slots] = done
        n_answers += 1
        if i < n and prod[i] <= done:
            while step + 1 < len(tn_ts) and tn_ts[step + 1] <= done:
                step += 1
            for _ in range(tn[step] - 1):
                x = _next(turn, cur, row, reps, b_ts, b_kind, b_who, b_upto, st_ts, st_mask, st_lead, st_live, st_from)
                if x == _NEVER:
                    break
                turn = _next_turn(turn, x, gap, rtt)
                answers[n_answers % slots] = x
                n_answers += 1
    return out, made_at


@compiled(inline=True)
def _next_turn(read, answer, gap, rtt):
    """`replay.kafka.pipeline.next_turn`: after the answer (plus the round trip with one slot), and no earlier than
    a round trip after the read."""
    return max(answer + gap, read + rtt)


@compiled(inline=True)
def _next(s, cur, row, reps, b_ts, b_kind, b_who, b_upto, st_ts, st_mask, st_lead, st_live, st_from):
    """`replay.kafka.pipeline.next_cycle`: under the ISR in force at s, or the first later one (from its start)
    whose followers have all fetched past s before the ISR changes again; _NEVER beyond the trace."""
    r = row[0]
    while r + 1 < len(st_ts) and st_ts[r + 1] <= s:
        r += 1
    row[0] = r
    if r < 0:
        r = 0
    mine = st_lead[r]  # the leadership the request went to
    m = len(b_ts)
    while r < len(st_ts):
        ends = st_ts[r + 1] if r + 1 < len(st_ts) else _NEVER
        if st_live[r]:
            mask = st_mask[r]
            done = max(s, st_ts[r] if st_lead[r] == mine else max(st_ts[r], st_from[r]))
            k = 0
            while (mask >> k) != 0:
                if (mask >> k) & 1:
                    # the answer for a later instant is at or after this one's (it asks ts > s and upto ≥ s of a
                    # larger s), so the cursor only moves forward: linear over the whole plan
                    b = reps[k]
                    c = cur[k]
                    while c < m and (b_ts[c] <= s or b_kind[c] != _REPLICATE or b_who[c] != b or b_upto[c] < s):
                        c += 1
                    cur[k] = c
                    if c == m:
                        done = _NEVER
                        break
                    done = max(done, b_ts[c])
                k += 1
            if done != _NEVER and done < ends:
                return done
        r += 1
    return _NEVER


@compiled
def shift_acks_compiled(ack, produce, status, error, delay, duration, timeout, failed, pending, request_timeout):
    """SPEC §3.7 K-7 in one pass, in place: every acknowledgement `delay` later; one that comes after the
    delivery timeout fails (request_timeout) if that timeout runs out within the trace, any other after the
    trace's end is pending (`ClientPipeline.settle`)."""
    for r in range(len(ack)):
        if ack[r] < 0:
            continue
        a = ack[r] + delay
        if a - produce[r] > timeout and produce[r] + timeout <= duration:
            ack[r] = -1
            status[r] = failed
            error[r] = request_timeout
        elif a > duration:
            ack[r] = -1
            status[r] = pending
        else:
            ack[r] = a
