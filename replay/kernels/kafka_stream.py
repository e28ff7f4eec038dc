"""The `kafka` kernel's event stream (SPEC §2.2): a chunk's replicate and produce events merged in order for the
compiled loop (`kafka_steady.steady`), and the cheap scan that tells a control point whether deadlines are due."""

from __future__ import annotations

import numpy as np

from replay.kernels._arrays import compiled
from replay.kernels.kafka_steady import C_PRODUCE, C_REPLICATE, INF, MsgState

_APPENDED = int(MsgState.APPENDED)  # numba reads module globals as compile-time constants


@compiled
def merge_stream(b_ts, b_kind, b_rep, b_upto, p_ts, p_msg, p_size, p_pid, p_part, p_keyid):
    """The chunk's stream events in SPEC §2.2 order, as key = ts·16 + kind: the reports of the partition's
    replicas (`b_rep` >= 0) and the produce events, both already sorted by time (`PartitionEvents`), merged; a
    sentinel key INF ends the arrays. Returns (key, code, replica, upto, msg, size, pid, part, keyid)."""
    nr = 0
    for j in range(len(b_ts)):
        if b_kind[j] == C_REPLICATE and b_rep[j] >= 0:
            nr += 1
    n = nr + len(p_ts)
    # No fill first: every row is written below in all nine columns (a chunk's length, so the fill cost showed)
    key, code, rep, upto, msg = (np.empty(n + 1, dtype=np.int64), np.empty(n + 1, dtype=np.int64),
                                 np.empty(n + 1, dtype=np.int64), np.empty(n + 1, dtype=np.int64),
                                 np.empty(n + 1, dtype=np.int64))
    size, pid, part, keyid = (np.empty(n + 1, dtype=np.int64), np.empty(n + 1, dtype=np.int64),
                              np.empty(n + 1, dtype=np.int64), np.empty(n + 1, dtype=np.int64))
    i, k, last = 0, 0, -1
    for o in range(n):
        while i < len(b_ts) and not (b_kind[i] == C_REPLICATE and b_rep[i] >= 0):
            i += 1
        kb = b_ts[i] * 16 + C_REPLICATE if i < len(b_ts) else INF
        kp = p_ts[k] * 16 + C_PRODUCE if k < len(p_ts) else INF
        if kb < kp:  # a replica's report: no message
            key[o], code[o], rep[o], upto[o], msg[o], size[o] = kb, C_REPLICATE, b_rep[i], b_upto[i], -1, 0
            pid[o], part[o], keyid[o] = -1, -1, -1
            i += 1
        else:  # a produce event: no replica
            key[o], code[o], rep[o], upto[o], msg[o], size[o] = kp, C_PRODUCE, -1, 0, p_msg[k], p_size[k]
            pid[o], part[o], keyid[o] = p_pid[k], p_part[k], p_keyid[k]
            k += 1
        if key[o] < last:
            raise ValueError("stream events out of time order")
        last = key[o]
    key[n], code[n], rep[n], upto[n], msg[n], size[n], pid[n], part[n], keyid[n] = INF, 0, -1, 0, -1, 0, -1, -1, -1
    return key, code, rep, upto, msg, size, pid, part, keyid


@compiled
def any_due(state, dead, n, t):
    """Whether a pending message's delivery deadline passed before t (a cheap test before the vectorized pass)."""
    for r in range(n):  # noqa: SIM110 (a loop numba compiles, not a generator)
        if state[r] <= _APPENDED and dead[r] < t:
            return True
    return False
