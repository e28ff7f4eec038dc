"""The kernel's twin of `replay.kafka.pipeline.plan_requests` (SPEC §3.7 K-6): the same requests, compiled, with
one forward cursor per follower and one over the timeline instead of a search per request (every instant the
plan asks about is at or after the previous one)."""

from __future__ import annotations

import numpy as np

from replay.shared.kernels.arrays import compiled

_NEVER = np.iinfo(np.int64).max  # numba reads module globals as compile-time constants


@compiled
def plan_requests_compiled(prod, eng, ok, size, linger, rtt, turns, gap, batch, f_off, f_ts, f_upto, st_ts,
                           st_mask, st_led):
    n = len(prod)
    out = eng.copy()
    nrep = len(f_off) - 1
    cur = f_off[:nrep].copy()  # per follower: its first fetch after the last instant asked about
    row = np.zeros(1, dtype=np.int64)
    row[0] = -1
    turn = -_NEVER
    i = 0
    while i < n:
        if not ok[i]:
            i += 1
            continue
        s = max(prod[i], turn)
        j = i
        used = 0
        done = s
        while j < n and (j == i or prod[j] <= s):
            if ok[j]:
                if j > i and used + size[j] > batch:
                    break
                used += size[j]
                done = max(done, eng[j])
            j += 1
        cyc = _next(s, cur, row, f_off, f_ts, f_upto, st_ts, st_mask, st_led)
        if cyc != _NEVER:
            done = max(done, cyc)
        for k in range(i, j):
            if ok[k]:
                out[k] = done + linger + rtt
        i = j
        turn = done + gap
        if i < n and prod[i] <= done:
            for _ in range(turns - 1):
                x = _next(turn, cur, row, f_off, f_ts, f_upto, st_ts, st_mask, st_led)
                if x == _NEVER:
                    break
                turn = x + gap
    return out


@compiled(inline=True)
def _next(s, cur, row, f_off, f_ts, f_upto, st_ts, st_mask, st_led):
    r = row[0]
    while r + 1 < len(st_ts) and st_ts[r + 1] <= s:
        r += 1
    row[0] = r
    if r < 0 or not st_led[r]:
        return _NEVER
    mask = st_mask[r]
    done = s
    k = 0
    while (mask >> k) != 0:
        if (mask >> k) & 1:
            c = cur[k]
            while c < f_off[k + 1] and f_ts[c] <= s:
                c += 1
            cur[k] = c
            while c < f_off[k + 1] and f_upto[c] < s:
                c += 1
            if c == f_off[k + 1]:
                return _NEVER
            done = max(done, f_ts[c])
        k += 1
    return done
