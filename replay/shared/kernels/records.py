"""A kernel's settled messages, handed over from its pending table to its records (SPEC §4.1), shared by both
families: `hand_over_settled` as compaction goes, `all_records` at the end of the trace. Both tables are
`arrays.Table`s; the records' columns are RECORD_BASE, the payload columns, then status and error."""

from __future__ import annotations

import numpy as np

from replay.results import MessageRecords
from replay.shared.kernels.arrays import Table, compiled, reserve_rows, runs_array
from replay.shared.kernels.judge import held as held_by
from schemas.outcomes import NULL_US, Status

_ST_ACKED, _ST_FAILED, _ST_PENDING = int(Status.ACKED), int(Status.FAILED), int(Status.PENDING)
#: The records' int64 columns taken from the pending columns of the same name, before the payload columns.
RECORD_BASE = ("msg_id", "produce_us", "ack_us", "visible_us", "epoch", "offset")


def record_table(payload: tuple[str, ...] = ()) -> Table:
    return Table({**{name: np.int64 for name in (*RECORD_BASE, *payload)}, "status": np.int8, "error": np.int8})


@compiled
def settled_rows(n, state, vis, epoch, offset, runs, starts, pinned, acked, failed):
    """Which of a kernel's first n pending rows are settled: answered (state `acked` or `failed`), and visible or
    held by no replica (replica i's log is runs[starts[i]:starts[i + 1]]: one not yet visible may still become
    so), unless pinned. Returns the flags and their count."""
    out = np.zeros(n, dtype=np.bool_)
    count = 0
    for r in range(n):
        if (state[r] != acked and state[r] != failed) or pinned[r]:
            continue
        held = False
        if vis[r] == NULL_US:
            for i in range(len(starts) - 1):
                held = held or held_by(runs[starts[i]: starts[i + 1]], epoch[r], offset[r])
        if not held:
            out[r] = True
            count += 1
    return out, count


@compiled
def hand_over(settled, n, p64, p8, take_from, r64, r8, r_n, acked, failed):
    """Move a kernel's pending rows flagged in settled[:n] to its records from row r_n on and compact the other
    rows to the table's front in order, in place: one gather per column, where numpy's boolean gathers and the
    records' concatenation at the end made a copy each. p64: the pending table's int64 columns, r64[c] taken from
    p64[take_from[c]]; p8: its (state, err), r8: the records' (status, err), status ACKED for state `acked`, FAILED
    for `failed`, else PENDING. Returns the old -> new row map (-1 for a row handed over)."""
    remap = np.empty(n, dtype=np.int64)
    moved, kept = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    m = k = 0
    for r in range(n):
        if settled[r]:
            remap[r] = -1
            moved[m] = r
            m += 1
        else:
            remap[r] = k
            kept[k] = r
            k += 1
    for c in range(len(r64)):
        src, dst = p64[take_from[c]], r64[c]
        for j in range(m):
            dst[r_n + j] = src[moved[j]]
    state, err, status, r_err = p8[0], p8[1], r8[0], r8[1]
    for j in range(m):
        s = state[moved[j]]
        status[r_n + j] = _ST_ACKED if s == acked else _ST_FAILED if s == failed else _ST_PENDING
        r_err[r_n + j] = err[moved[j]]
    for c in range(len(p64)):  # kept[j] >= j: a forward pass moves each row once
        col = p64[c]
        for j in range(k):
            col[j] = col[kept[j]]
    for c in range(len(p8)):
        col8 = p8[c]
        for j in range(k):
            col8[j] = col8[kept[j]]
    return remap


def settled_mask(pend: Table, runs: list[list[list[int]]], pinned: np.ndarray | None, acked: int, failed: int
                 ) -> tuple[np.ndarray, int]:
    """`settled_rows` over the pending table, the replicas' logs given as runs."""
    n, c = pend.n, pend.cols
    logs = [runs_array(r) for r in runs]
    return settled_rows(n, c["state"], c["visible_us"], c["epoch"], c["offset"], np.concatenate(logs),
                        np.cumsum([0, *(len(r) for r in logs)]), np.zeros(n, dtype=bool) if pinned is None else pinned,
                        acked, failed)


def hand_over_settled(pend: Table, recs: Table, settled: np.ndarray, payload: tuple[str, ...], acked: int,
                      failed: int) -> np.ndarray:
    """Move the pending rows flagged in `settled` to the records (`hand_over`); returns the old -> new row map."""
    k = int(np.count_nonzero(settled))
    reserve_rows(recs, k)
    p64 = [name for name, t in pend.dtypes.items() if t is np.int64]
    take = (*RECORD_BASE, *payload)
    remap = hand_over(settled, pend.n, tuple(pend.cols[c] for c in p64), (pend.cols["state"], pend.cols["error"]),
                      np.array([p64.index(c) for c in take], dtype=np.int64), tuple(recs.cols[c] for c in take),
                      (recs.cols["status"], recs.cols["error"]), recs.n, acked, failed)
    recs.n += k
    pend.n -= k
    return remap


def all_records(pend: Table, recs: Table, payload: tuple[str, ...], acked: int, failed: int) -> MessageRecords:
    """Every message's record at the end of the trace: the settled ones, then what is still pending. The arrays
    are views of the records' columns."""
    hand_over_settled(pend, recs, np.ones(pend.n, dtype=bool), payload, acked, failed)
    rec = MessageRecords(recs["msg_id"], recs["produce_us"], recs["status"], recs["error"], recs["ack_us"],
                         recs["visible_us"], recs["epoch"], recs["offset"])
    rec.payload = {k: recs[k] for k in payload}
    return rec
