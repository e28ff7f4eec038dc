"""Replay of the RocketMQ families for one broker group (SPEC §3.3-3.5, §4): the production engine.

The reference interpreter (`replay/reference/rocketmq.py`) applies one event at a time and documents the rules
(R1-R7 there, C1-C7 in `replay/rocketmq_control.py`). This kernel runs the group's control plane
(`rocketmq_control.ControlPlane`, the one routing uses) at *control points* (faults, detections, elections,
client switches, SyncStateSet checks and expansions) in Python. Between two of them a *steady segment* runs:
- `rocketmq` and `dledger`: one compiled pass, one event at a time as the reference does
  (`rocketmq_steady.group_steady`, called by `rocketmq_stretch.SteadySegments`);
- `rocketmq-controller`: whole-array numpy operations (`_segment`): a follower's log end after each report is a
  running maximum of `searchsorted` over the leader's append times (SPEC §3.2 rule 5), commit points are
  element-wise minimum / k-th largest values over the members' series, ack and visibility times are
  `searchsorted`s of offsets into those series.
Broker statuses and client deadlines (R1) and flush decisions (R3) are evaluated lazily: a status never
changes the replicas' state, and a flush only matters at a power loss.

State lives in the object and is carried across `advance()` calls, so a group replays in time chunks (bounded
memory, streaming micro-batches) with exactly the result of one pass. Logs are held as runs of
`(epoch, start, end)` per broker plus, per epoch, the append times and cumulative sizes of the entries that
epoch's leader appended; messages are kept only until their outcome is settled.
"""

from __future__ import annotations

import heapq
from enum import IntEnum

import numpy as np

from replay.events import PartitionEvents
from replay.kernels._arrays import (
    Grow,
    Table,
    Timeline,
    common_prefix,
    due_segment,
    forward_fill,
    is_ascending,
    kth_largest_columns,
    merge_order,
    prefix_runs,
    runs_array,
    take_or,
)
from replay.kernels.rocketmq_steady import CommitRule, stream_columns
from replay.kernels.rocketmq_stretch import SteadyRule, SteadySegments
from replay.policies import (
    FIRST_SYNC_STATE_CHECK_MS,
    OS_WRITEBACK_EXPIRE_MS,
    OS_WRITEBACK_PERIOD_MS,
    BrokerRole,
    DLedgerPolicy,
    FlushMode,
    Policy,
    Reconcile,
    RocketMQControllerPolicy,
    RocketMQPolicy,
)
from replay.results import FinalView, MessageRecords, PartitionResult, StateRow, judge, merge_intervals, runs_contain
from replay.rocketmq_control import (
    C_ARRIVE,
    C_CHECK,
    INF,
    KEY,
    STOPS,
    control_plane,
    key_of,
    majority,
)
from schemas.outcomes import NULL_US, Error, Status
from schemas.trace import Kind

MS = 1000
C_REPLICATE, C_PRODUCE = int(Kind.REPLICATE), int(Kind.PRODUCE)


class MsgState(IntEnum):
    """A pending message's state (the `state` column): waiting for its answer, answered, or not yet arrived
    (a DLedger retry scheduled for later, C2)."""

    WAITING = 0
    ACKED = 1
    FAILED = 2
    PREARRIVE = 3


WAITING, ACKED, FAILED, PREARRIVE = MsgState

#: Trace events per steady segment at most (any split gives the same result, as a time chunk does).
SEGMENT_MAX = 1 << 15
_COLS = {
    "msg": np.int64, "prod": np.int64, "size": np.int64, "arrive": np.int64, "dead": np.int64, "state": np.int8,
    "err": np.int8, "pe": np.int64, "po": np.int64, "ack": np.int64, "vis": np.int64, "tb": np.int64,
    "tinc": np.int64, "tep": np.int64,
}


def _count_upto(base: np.ndarray, new: np.ndarray, upto: np.ndarray) -> np.ndarray:
    """Entries of the log `base` then `new` (append times, ascending) appended at or before each `upto`."""
    count = np.searchsorted(base, upto, side="right")
    return np.where(count == len(base), len(base) + np.searchsorted(new, upto, side="right"), count)


def _at_offsets(base: np.ndarray, new: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """(`base` then `new`)[offsets] without the concatenation."""
    out = np.empty(len(offsets), dtype=np.int64)
    low = offsets < len(base)
    out[low] = base[offsets[low]]
    out[~low] = new[offsets[~low] - len(base)]
    return out


def _kth_largest(stack: np.ndarray, k: int) -> np.ndarray:
    """Element-wise k-th largest over the rows of `stack` (k ≥ 1); 0 where there are fewer rows."""
    m = stack.shape[0]
    if k > m:
        return np.zeros(stack.shape[1], dtype=np.int64)
    if k == 1:
        return stack.max(axis=0)
    if k == m:
        return stack.min(axis=0)
    return kth_largest_columns(np.ascontiguousarray(stack, dtype=np.int64), k)


class FlushState:
    """What one broker's disk holds (R3), with writes since the last materialization kept as history."""

    def __init__(self, mode: str, policy: Policy) -> None:
        self.mode = mode
        self.flushed = 0  # durable prefix (entries)
        self.flushed_bytes = 0
        self.base_len = 0  # log state before the first history entry
        self.base_bytes = 0
        if mode == "least":
            self.interval = policy.flush_interval_ms * MS
            self.thorough = policy.flush_thorough_interval_ms * MS
            self.least = policy.flush_least_bytes
        elif mode == "interval":
            self.interval = policy.flush_interval_ms * MS
        self.flush_t = -getattr(self, "interval", 1)  # every tick ≤ flush_t has been applied
        self.h_t, self.h_len, self.h_bytes = Grow(), Grow(), Grow()

    def write(self, ts: np.ndarray, lengths: np.ndarray, nbytes: np.ndarray) -> None:
        if len(ts) == 0:
            return
        if self.mode == "sync":
            self.flushed, self.flushed_bytes = int(lengths[-1]), int(nbytes[-1])
            self.base_len, self.base_bytes = self.flushed, self.flushed_bytes
            return
        self.h_t.extend(ts)
        self.h_len.extend(lengths)
        self.h_bytes.extend(nbytes)
        if len(self.h_t) > 8192:
            self.materialize(int(ts[-1]))

    def _fold(self, j: int) -> None:
        """History entries [0, j) are now the base."""
        if j <= 0:
            return
        self.base_len, self.base_bytes = int(self.h_len.view[j - 1]), int(self.h_bytes.view[j - 1])
        self.h_t, self.h_len, self.h_bytes = (Grow(g.view[j:].copy()) for g in (self.h_t, self.h_len, self.h_bytes))

    def materialize(self, t: int) -> None:
        """Apply every flush that happens before instant t (a tick at t comes after t's events)."""
        if self.mode == "sync" or (len(self.h_t) == 0 and self.base_bytes == self.flushed_bytes):
            return
        h_t, h_len, h_bytes = self.h_t.view, self.h_len.view, self.h_bytes.view
        if self.mode in ("interval", "os"):
            if self.mode == "interval":
                bound = ((t - 1) // self.interval) * self.interval  # writes up to the last tick before t
            else:
                period, expire = OS_WRITEBACK_PERIOD_MS * MS, OS_WRITEBACK_EXPIRE_MS * MS
                bound = ((t - 1) // period) * period - expire
            j = int(np.searchsorted(h_t, bound, side="right"))
            if j > 0:
                self._fold(j)
                self.flushed, self.flushed_bytes = self.base_len, self.base_bytes
            return
        interval, thorough = self.interval, self.thorough
        j = 0  # history entries [0, j) are folded into the base
        base_len, base_bytes = self.base_len, self.base_bytes
        while True:
            if base_bytes - self.flushed_bytes >= self.least:
                t_bytes = self.flush_t + interval
            else:
                jb = j + int(np.searchsorted(h_bytes[j:], self.flushed_bytes + self.least, side="left"))
                t_bytes = INF if jb >= len(h_t) else max(-(-int(h_t[jb]) // interval) * interval,
                                                          self.flush_t + interval)
            k = self.flush_t // thorough + 1
            tick = min(t_bytes, -(-(k * thorough) // interval) * interval)
            if tick >= t:
                last = ((t - 1) // interval) * interval
                if last > self.flush_t:
                    j = j + int(np.searchsorted(h_t[j:], last, side="right"))
                    self.flush_t = last
                break
            j = j + int(np.searchsorted(h_t[j:], tick, side="right"))
            if j > 0:
                base_len, base_bytes = int(h_len[j - 1]), int(h_bytes[j - 1])
            self.flushed, self.flushed_bytes = base_len, base_bytes
            self.flush_t = tick
        self.base_len, self.base_bytes = base_len, base_bytes
        if j > 0:
            self._fold(j)

    def durable(self, t: int) -> int:
        self.materialize(t)
        return self.flushed

    def truncate(self, length: int, nbytes: int) -> None:
        """The log was cut to `length` entries (`nbytes` bytes): the prefix keeps its write times."""
        self.flushed = min(self.flushed, length)
        self.flushed_bytes = min(self.flushed_bytes, nbytes)
        self.base_len, self.base_bytes = min(self.base_len, length), min(self.base_bytes, nbytes)
        if len(self.h_len):
            self.h_len = Grow(np.minimum(self.h_len.view, length))
            self.h_bytes = Grow(np.minimum(self.h_bytes.view, nbytes))

    def reset(self, length: int, nbytes: int, t: int) -> None:
        """Everything the broker holds is on disk (restart, shutdown, after a power loss)."""
        self.flushed = self.base_len = length
        self.flushed_bytes = self.base_bytes = nbytes
        self.h_t, self.h_len, self.h_bytes = Grow(), Grow(), Grow()
        if self.mode == "least":
            self.flush_t = max(self.flush_t, ((t - 1) // self.interval) * self.interval)


class GroupReplay:
    """Chunked replay of one broker group: `advance()` time chunks in order, then `finish()`."""

    answer_error = Error.FLUSH_SLAVE_TIMEOUT
    SEGMENT_MAX = SEGMENT_MAX

    def __init__(self, policy: Policy, unit: int, members: tuple[int, ...], duration_us: int,
                 window_us: int = 1_000_000) -> None:
        self.p = policy
        self.unit = unit
        self.order = tuple(members)
        self.ix = {b: i for i, b in enumerate(self.order)}
        self.duration_us = duration_us
        n = len(self.order)
        self.cp = control_plane(policy, self.order, hooks=self)
        self.log_len = np.zeros(n, dtype=np.int64)
        self.nbytes = np.zeros(n, dtype=np.int64)
        self.fetched = np.zeros(n, dtype=np.int64)
        self.lcu = np.zeros(n, dtype=np.int64)
        self.runs: list[list[list[int]]] = [[] for _ in range(n)]
        self.incarnation = np.zeros(n, dtype=np.int64)
        self.inc_end: list[list[int]] = [[] for _ in range(n)]  # stop time of every ended incarnation
        mode = self._flush_mode()
        self.flush = [FlushState(mode, policy) for _ in range(n)]
        self.epochs: dict[int, tuple[int, Grow, Grow]] = {}  # epoch -> (start offset, append times, cum sizes)
        self.lead_app = Grow()
        self.lead_cum = Grow(np.zeros(1, dtype=np.int64))
        self.lead_for_cache: int | None = None
        self.heap: list[tuple[int, int, str, int]] = []  # engine-derived events (SyncStateSet checks)
        self.seq = 0
        self.pend = Table(_COLS)
        self.payload_keys: tuple[str, ...] | None = None
        self.sched_key = np.zeros(0, dtype=np.int64)  # scheduled arrivals (DLedger retries)
        self.sched_row = np.zeros(0, dtype=np.int64)
        self.done: list[MessageRecords] = []
        self.replication_bytes = 0
        self.cur_t = 0
        self.timeline = Timeline(window_us)
        self.handlers: dict = {}  # engine-derived event -> its handler (t, arg)
        self.s_key = np.zeros(1, dtype=np.int64) + INF
        self.s_pos = 0
        self.segment_max = self.SEGMENT_MAX

    # ================================================================================== family hooks
    def _flush_mode(self) -> str:
        if self.p.flush is FlushMode.SYNC:
            return "sync"
        if self.p.flush_interval_ms is None:
            return "os"
        return "interval" if isinstance(self.p, DLedgerPolicy) else "least"

    def _answer_ms(self) -> int:
        return self.p.slave_timeout_ms

    def _data_leader(self) -> int | None:
        """The broker followers fetch from (None if none)."""
        raise NotImplementedError

    def _serving(self) -> int | None:
        """The broker that takes arriving messages now (None: they fail with `no_leader`)."""
        raise NotImplementedError

    def _refusing(self, s: int) -> bool:
        return False

    def _series(self, ctx: dict) -> dict:
        """Commit series of a segment: `ack` (ack point after each event, None = ack at append), `vis`
        (visibility point, None = at append), `hw` (timeline high watermark), `cut` (events consumed)."""
        raise NotImplementedError

    def _commit_series(self, ctx: dict, out: dict) -> None:
        """Carry the segment's final commit state."""

    def _state_row(self, t: int, leo: int | None = None, hw: int | None = None) -> StateRow:
        raise NotImplementedError

    def _blocked(self) -> bool:
        raise NotImplementedError

    def _ack_point_now(self, s: int) -> int | None:
        """The serving broker's ack point now (None = every append is acked at once)."""
        raise NotImplementedError

    def _on_arrivals(self, s: int, rows: np.ndarray, ts: np.ndarray) -> None:
        """Family decisions for messages appended at the serving broker (statuses at append)."""

    def _app_ext(self, ctx: dict) -> tuple[np.ndarray, np.ndarray]:
        """The serving leader's append times by offset: (its log before the segment, the segment's appends)."""
        app = self.lead_app.view
        extra = ctx["ts"][:0]
        if int(ctx["leo"][-1]) > len(app):
            arrivals = np.flatnonzero(np.diff(np.concatenate([[len(app)], ctx["leo"]])) > 0)
            extra = ctx["ts"][arrivals]
        return app, np.append(extra, INF)

    # ==================================================================================== API
    def advance(self, events: PartitionEvents, until_us: int) -> None:
        """Apply every event of the chunk (all with ts_us < until_us) and every derived event before until_us."""
        ev = events
        known = np.isin(ev.broker_id, np.array(self.order, dtype=np.int64))
        bk, bts, bb, bu = ev.broker_kind[known], ev.broker_ts[known], ev.broker_id[known], ev.broker_upto[known]
        ctrl = bk < C_REPLICATE
        c_key = key_of(bts[ctrl], bk[ctrl].astype(np.int64))
        c_kind, c_b = bk[ctrl], bb[ctrl]
        rep = bk == C_REPLICATE
        # produce events: failed routing settles at once, delayed arrivals are scheduled, the rest stream
        payload = getattr(ev, "payload", None) or {}
        self._add_payload_keys(payload)
        part = payload.get("part", np.zeros(len(ev.produce_ts), dtype=np.int64))
        delay = payload.get("delay", np.zeros(len(ev.produce_ts), dtype=np.int64))
        unrouted = part < 0
        if unrouted.any():
            self._settle_unrouted(ev, payload, unrouted)
        later = (delay > 0) & ~unrouted
        if later.any():
            self._schedule_arrivals(ev, payload, later, delay)
        now = ~unrouted & ~later
        p_ts = ev.produce_ts[now]
        r_key, p_key = key_of(bts[rep], C_REPLICATE), key_of(p_ts, C_PRODUCE)
        s_key = np.concatenate([r_key, p_key])
        # both sources come time-ordered: a linear merge (stable, replications first on equal keys)
        order = merge_order(r_key, p_key) if is_ascending(r_key) and is_ascending(p_key) else \
            np.argsort(s_key, kind="stable")
        nrep = len(r_key)
        pm, ps = ev.produce_msg[now], ev.produce_size[now]
        (self.s_key, self.s_code, self.s_broker, self.s_rep, self.s_upto, self.s_msg, self.s_size,
         s_pidx) = stream_columns(order, nrep, r_key, p_key, bb[rep], bu[rep], pm, ps,
                                  np.array(self.order, dtype=np.int64))
        self.s_pay = {k: take_or(np.asarray(payload[k][now], dtype=np.int64), s_pidx, -1) if k in payload
                      else np.full(len(s_pidx), -1, dtype=np.int64) for k in self.payload_keys}
        self.s_pos = 0
        until_key = key_of(until_us, 0)
        ci = 0
        while True:
            ck = int(c_key[ci]) if ci < len(c_key) else INF
            dk = min(self.heap[0][0] if self.heap else INF, self.cp.next_key())
            k = min(ck, dk, until_key)
            self._stream(k)
            if k == until_key:
                break
            t = k // KEY
            self._clock(t)
            self._control_point(t)
            if k == ck:
                self._trace_control(t, Kind(int(c_kind[ci])), int(c_b[ci]))
                ci += 1
            elif self.heap and self.heap[0][0] == k:
                _, _, what, arg = heapq.heappop(self.heap)
                self.handlers[what](t, arg)
            else:
                self.cp.pop()
            self._after_control(t)
        self._compact()

    def finish(self) -> PartitionResult:
        """End of trace: settle every message and judge fates (SPEC §4.1)."""
        if self.heap or self.cp.next_key() < INF or self.s_pos < len(self.s_key) - 1 or len(self.sched_key):
            self.advance(PartitionEvents.empty(), self.duration_us + 1)
        self._resolve(self.duration_us + 1)
        self._clock(INF)
        rows = self.timeline.finish(self.duration_us)
        end_runs, end_hw, end_up = self._end_view()
        replication_bytes = self.replication_bytes  # the recovery of SPEC §4.1 is hypothetical: not counted
        final = self._recover(self.duration_us)
        view = FinalView(None if final is None else runs_array(self.runs[self.ix[final]]), end_runs, end_hw, end_up)
        parts = [*self.done, self._records(np.ones(self.pend.n, dtype=bool))]
        for part in parts:  # every part carries every payload key
            part.payload = {k: part.payload.get(k, np.full(len(part), -1, dtype=np.int64))
                            for k in self.payload_keys or ()}
        records = MessageRecords.concat(parts)
        records = records.sorted_by_msg_id()
        result = PartitionResult(self.unit, judge(records, view), rows, merge_intervals(self.timeline.unavail),
                                 replication_bytes)
        result.view = view  # type: ignore[attr-defined]
        return result

    # ================================================================================= messages
    def _add_payload_keys(self, payload: dict) -> None:
        """Columns carried to the outputs untouched; a key first seen in a later chunk is -1 before it."""
        new = sorted(set(payload) - set(self.payload_keys or ()))
        if self.payload_keys is not None and not new:
            return
        self.payload_keys = tuple(self.payload_keys or ()) + tuple(new)
        for k in new:
            self.pend.dtypes[k] = np.int64
            self.pend.cols[k] = np.full(len(self.pend.cols["msg"]), -1, dtype=np.int64)

    def _new_rows(self, msg, prod, size, arrive, payload: dict, state) -> np.ndarray:
        # scalars broadcast into the table's columns (no per-column temporaries)
        cols = dict(msg=msg, prod=prod, size=size, arrive=arrive, dead=prod + self.p.delivery_timeout_ms * MS,
                    state=state, err=0, pe=-1, po=-1, ack=NULL_US, vis=NULL_US, tb=-1, tinc=0, tep=-1)
        for name in self.payload_keys or ():
            cols[name] = payload[name]
        return self.pend.append(**cols)

    def _settle_unrouted(self, ev: PartitionEvents, payload: dict, sel: np.ndarray) -> None:
        """SPEC §3.3 rule 3: no group took it: failed `no_route`, never appended."""
        k = int(sel.sum())
        rec = MessageRecords(ev.produce_msg[sel].copy(), ev.produce_ts[sel].copy(), np.full(k, Status.FAILED, np.int8),
                             np.full(k, Error.NO_ROUTE, np.int8), np.full(k, NULL_US), np.full(k, NULL_US),
                             np.full(k, -1), np.full(k, -1))
        rec.payload = {name: payload[name][sel].copy() for name in self.payload_keys or ()}
        self.done.append(rec)

    def _schedule_arrivals(self, ev: PartitionEvents, payload: dict, sel: np.ndarray, delay: np.ndarray) -> None:
        ts = ev.produce_ts[sel]
        rows = self._new_rows(ev.produce_msg[sel], ts, ev.produce_size[sel], ts + delay[sel],
                              {k: v[sel] for k, v in payload.items()}, PREARRIVE)
        keys = np.concatenate([self.sched_key, key_of(ts + delay[sel], C_ARRIVE)])
        all_rows = np.concatenate([self.sched_row, rows])
        order = np.lexsort((self.pend["msg"][all_rows], keys))  # same instant: msg_id order
        self.sched_key, self.sched_row = keys[order], all_rows[order]

    def _records(self, mask: np.ndarray) -> MessageRecords:
        c = self.pend
        st = c["state"][mask]
        status = np.where(st == ACKED, Status.ACKED, np.where(st == FAILED, Status.FAILED, Status.PENDING))
        rec = MessageRecords(c["msg"][mask].copy(), c["prod"][mask].copy(), status.astype(np.int8),
                             c["err"][mask].copy(), c["ack"][mask].copy(), c["vis"][mask].copy(),
                             c["pe"][mask].copy(), c["po"][mask].copy())
        rec.payload = {k: c[k][mask].copy() for k in self.payload_keys or ()}
        return rec

    def _limit(self, rows: np.ndarray) -> np.ndarray:
        """Last instant at which an ack still counts (R1): the broker's status or the client's deadline."""
        return np.minimum(self.pend["arrive"][rows] + self._answer_ms() * MS, self.pend["dead"][rows])

    def _ack_rows(self, rows: np.ndarray, when: np.ndarray) -> None:
        ok = when <= self._limit(rows)
        self.pend.cols["state"][rows[ok]] = ACKED
        self.pend.cols["ack"][rows[ok]] = when[ok]

    def _waiting_of(self, b: int, epoch: int) -> np.ndarray:
        """Rows waiting for an answer from broker b's current incarnation in `epoch`."""
        n = self.pend.n
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero((self.pend["state"] == WAITING) & (self.pend["tb"] == b) & (self.pend["tep"] == epoch)
                              & (self.pend["tinc"] == self.incarnation[self.ix[b]]))

    def _ack_upto(self, t: int, b: int, epoch: int, upto: int) -> None:
        rows = self._waiting_of(b, epoch)
        if len(rows):
            rows = rows[(self.pend["po"][rows] < upto) & self._held(b, rows)]
            self._ack_rows(rows, np.full(len(rows), t, dtype=np.int64))

    def _held(self, b: int, rows: np.ndarray) -> np.ndarray:
        return runs_contain(runs_array(self.runs[self.ix[b]]), self.pend["pe"][rows], self.pend["po"][rows])

    def _mark_visible(self, t: int, b: int, lo: int, hi: int) -> None:
        if self.pend.n == 0 or hi <= lo:
            return
        po, pe = self.pend["po"], self.pend["pe"]
        vis = self.pend.cols["vis"]
        rows = np.flatnonzero((po >= lo) & (po < hi) & (vis[: self.pend.n] == NULL_US) & (pe >= 0))
        if len(rows):
            rows = rows[self._held(b, rows)]
            vis[rows] = t

    def _resolve(self, t: int) -> None:
        """R1, lazily: waiting messages whose broker status or client deadline came before t fail."""
        n = self.pend.n
        if n == 0:
            return
        st = self.pend.cols["state"]
        rows = np.flatnonzero(st[:n] == WAITING)
        if not len(rows):
            return
        answer_at = self.pend["arrive"][rows] + self._answer_ms() * MS
        dead = self.pend["dead"][rows]
        tb, tinc = self.pend["tb"][rows], self.pend["tinc"][rows]
        end = np.full(len(rows), INF, dtype=np.int64)
        for i, b in enumerate(self.order):
            sel = tb == b
            if sel.any() and self.inc_end[i]:
                ends = np.array(self.inc_end[i], dtype=np.int64)
                inc = tinc[sel]
                end[sel] = np.where(inc < len(ends), ends[np.minimum(inc, len(ends) - 1)], INF)
        answered = (answer_at <= dead) & (end > answer_at)  # its incarnation still up at that instant
        fail_answer = answered & (answer_at < t)
        fail_dead = ~answered & (dead < t)
        err = self.pend.cols["err"]
        st[rows[fail_answer]] = FAILED
        err[rows[fail_answer]] = self.answer_error
        st[rows[fail_dead]] = FAILED
        err[rows[fail_dead]] = Error.DELIVERY_TIMEOUT
        if fail_answer.any() or fail_dead.any():
            self._compact()

    def _compact(self) -> None:
        """Hand settled messages to the output: answered, and visible or held by no broker."""
        n = self.pend.n
        if n < 4096:
            return
        st, vis, pe, po = self.pend["state"], self.pend["vis"], self.pend["pe"], self.pend["po"]
        answered = (st == ACKED) | (st == FAILED)
        settled = answered & (vis != NULL_US)
        maybe = answered & (vis == NULL_US)
        if maybe.any():
            alive = np.zeros(n, dtype=bool)
            for runs in self.runs:
                alive |= runs_contain(runs_array(runs), pe, po)
            settled |= maybe & ~alive
        if settled.sum() < n // 2:
            return
        self.done.append(self._records(settled))
        remap = self.pend.keep(~settled)
        if len(self.sched_row):
            self.sched_row = remap[self.sched_row]

    # ==================================================================================== logs
    def _cum_bytes(self, i: int, length: int) -> int:
        total = 0
        for e, s, end in self.runs[i]:
            if s >= length:
                break
            start, _, cum = self.epochs[e]
            total += int(cum.view[min(end, length) - start] - cum.view[s - start])
        return total

    def _append_entries(self, i: int, epoch: int, ts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        """Broker i (a leader) appends entries under `epoch`; returns their offsets."""
        start_off = int(self.log_len[i])
        offsets = start_off + np.arange(len(ts))
        if epoch not in self.epochs:
            self.epochs[epoch] = (start_off, Grow(), Grow(np.zeros(1, dtype=np.int64)))
        start, app, cum = self.epochs[epoch]
        assert start + len(app) == start_off, "an epoch's leader appends contiguously"
        app.extend(ts)
        cum.extend(cum.view[-1] + np.cumsum(sizes))
        runs = self.runs[i]
        end = start_off + len(ts)
        if runs and runs[-1][0] == epoch and runs[-1][2] == start_off:
            runs[-1][2] = end
        else:
            runs.append([epoch, start_off, end])
        new_bytes = self.nbytes[i] + np.cumsum(sizes)
        self.log_len[i] = end
        self.nbytes[i] = int(new_bytes[-1])
        self.flush[i].write(ts, offsets + 1, new_bytes)
        if self.order[i] == self.lead_for_cache:
            self.lead_app.extend(ts)
            self.lead_cum.extend(new_bytes)
        return offsets

    def _truncate(self, i: int, length: int) -> None:
        length = min(length, int(self.log_len[i]))
        if length == self.log_len[i]:
            return
        self.runs[i] = prefix_runs(self.runs[i], length)
        self.log_len[i] = length
        self.nbytes[i] = self._cum_bytes(i, length)
        self.fetched[i] = min(self.fetched[i], length)
        self.flush[i].truncate(length, int(self.nbytes[i]))
        if self.order[i] == self.lead_for_cache:
            self._rebuild_leader_cache()

    def _adopt(self, t: int, i: int, src: int) -> None:
        """C1: broker i takes broker src's log (as if it caught up from it before leading)."""
        if i == src:
            return
        n = common_prefix(self.runs[i], self.runs[src])
        self._truncate(i, n)
        total = int(self.log_len[src])
        if total > n:
            self.runs[i] = [list(r) for r in self.runs[src]]
            self.log_len[i] = total
            before = int(self.nbytes[i])
            self.nbytes[i] = self.nbytes[src]
            self.replication_bytes += int(self.nbytes[i]) - before
            self.flush[i].write(np.array([t]), np.array([total]), np.array([int(self.nbytes[i])]))
        if self.order[i] == self.lead_for_cache:
            self._rebuild_leader_cache()

    def _follow(self, i: int, leader: int) -> None:
        """Broker i keeps only the prefix it shares with leader's log."""
        self._truncate(i, common_prefix(self.runs[i], self.runs[self.ix[leader]]))

    def _rebuild_leader_cache(self) -> None:
        ldr = self._data_leader()
        self.lead_for_cache = ldr
        if ldr is None:
            self.lead_app, self.lead_cum = Grow(), Grow(np.zeros(1, dtype=np.int64))
            return
        app, cum = [], [np.zeros(1, dtype=np.int64)]
        total = 0
        for e, s, end in self.runs[self.ix[ldr]]:
            start, a, c = self.epochs[e]
            app.append(a.view[s - start: end - start])
            part = c.view[s - start + 1: end - start + 1] - c.view[s - start] + total
            cum.append(part)
            total = int(part[-1]) if len(part) else total
        self.lead_app = Grow(np.concatenate(app) if app else np.zeros(0, dtype=np.int64))
        self.lead_cum = Grow(np.concatenate(cum))

    def _app_at(self, b: int, offset: int) -> int:
        for e, s, end in self.runs[self.ix[b]]:
            if s <= offset < end:
                start, app, _ = self.epochs[e]
                return int(app.view[offset - start])
        raise IndexError(offset)

    def _lose_data(self, t: int, i: int, kind: Kind) -> None:
        """SPEC §2.2 / §3.3 rule 6: crash keeps everything, power loss the durable prefix, disk loss nothing."""
        if kind is Kind.POWER_LOSS:
            self._truncate(i, self.flush[i].durable(t))
        elif kind is Kind.DISK_LOSS:
            self._truncate(i, 0)
        self.flush[i].reset(int(self.log_len[i]), int(self.nbytes[i]), t)
        self.inc_end[i].append(t)
        self.incarnation[i] += 1

    # ================================================================================ stream segments
    def _stream(self, limit_key: int) -> None:
        """Process replicate/produce events and scheduled arrivals with keys below `limit_key`."""
        while True:
            if not len(self.sched_key) or self.sched_key[0] >= limit_key:
                # no scheduled arrival due: the segment is a slice of the trace stream (views, no merge)
                hi = int(np.searchsorted(self.s_key, limit_key, side="left"))
                if hi <= self.s_pos:
                    return
                # bounded: a SyncStateSet expansion cuts a segment, and the work past the cut is redone
                hi = min(hi, self.s_pos + self.segment_max)
                sl = slice(self.s_pos, hi)
                self.s_pos += self._segment({
                    "key": self.s_key[sl], "code": self.s_code[sl], "broker": self.s_broker[sl],
                    "upto": self.s_upto[sl], "msg": self.s_msg[sl], "size": self.s_size[sl],
                    "row": np.full(hi - self.s_pos, -1, dtype=np.int64),
                    "pay": {k: v[sl] for k, v in self.s_pay.items()},
                })
                self._compact()  # keeps the pending table (and the scans over it) at about a segment's size
                continue
            due = due_segment(self.s_key, self.s_pos, self.sched_key, limit_key)
            if due is None:
                return
            keys, is_tr, ti, si, shi = due
            seg = {
                "key": keys,
                "code": np.where(is_tr, self.s_code[ti], C_ARRIVE),
                "broker": np.where(is_tr, self.s_broker[ti], -1),
                "upto": np.where(is_tr, self.s_upto[ti], 0),
                "msg": np.where(is_tr, self.s_msg[ti], -1),
                "size": np.where(is_tr, self.s_size[ti], 0),
                "row": np.where(is_tr, -1, self.sched_row[si] if shi else -1),
                "pay": {k: np.where(is_tr, v[ti], -1) for k, v in self.s_pay.items()},
            }
            consumed = self._segment(seg)
            took_tr = int(is_tr[:consumed].sum())
            self.s_pos += took_tr
            took_sched = consumed - took_tr
            self.sched_key, self.sched_row = self.sched_key[took_sched:], self.sched_row[took_sched:]
            self._compact()

    def _segment(self, seg: dict) -> int:
        """One steady segment; returns how many events it consumed (fewer if a SyncStateSet expansion cuts it)."""
        key, code = seg["key"], seg["code"]
        ts = key // KEY
        n = len(key)
        ldr = self._data_leader()
        li = self.ix[ldr] if ldr is not None else -1
        l_ok = ldr is not None and self.cp.alive(ldr)
        srv = self._serving()
        refusing = srv is not None and self._refusing(srv)
        is_arr = code != C_REPLICATE
        appended = is_arr & (srv is not None) & (not refusing)
        to_leader = srv is not None and srv == ldr
        leo0 = int(self.log_len[li]) if li >= 0 else 0
        leo_after = leo0 + np.cumsum(appended) if to_leader else np.full(n, leo0, dtype=np.int64)
        # the leader's append times: its log so far, then this segment's appends (never concatenated: O(log))
        lead_app, new_app = self.lead_app.view, ts[appended] if to_leader else ts[:0]
        # ----- follower reports (SPEC §3.2 rule 5)
        fser: dict[int, np.ndarray] = {}
        follow: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        rep = (code == C_REPLICATE) & l_ok
        for b in self.order:
            if b == ldr:
                continue
            i = self.ix[b]
            idx = np.flatnonzero(rep & (seg["broker"] == b)) if self.cp.alive(b) else np.zeros(0, dtype=np.int64)
            if len(idx):
                count = np.minimum(_count_upto(lead_app, new_app, seg["upto"][idx]), leo_after[idx])
                new_len = np.maximum.accumulate(np.maximum(count, self.log_len[i]))
                caught = new_len == leo_after[idx]
                lcu = np.maximum.accumulate(np.maximum(np.where(caught, ts[idx], seg["upto"][idx]), self.lcu[i]))
                follow[b] = (idx, new_len, lcu)
                fser[b] = forward_fill(idx, new_len, n, int(self.fetched[i]))
            else:
                fser[b] = np.full(n, self.fetched[i], dtype=np.int64)
        ctx = {"ts": ts, "n": n, "ldr": ldr, "leo": leo_after, "fser": fser, "follow": follow, "srv": srv,
               "to_leader": to_leader}
        out = self._series(ctx)
        m = out["cut"]
        if m < n:
            ts, code, is_arr, appended, leo_after = ts[:m], code[:m], is_arr[:m], appended[:m], leo_after[:m]
            seg = {k: (v[:m] if k != "pay" else {kk: vv[:m] for kk, vv in v.items()}) for k, v in seg.items()}
            # per-event series are cut; `app_srv` is indexed by offset and stays whole
            out = {k: (v[:m] if isinstance(v, np.ndarray) and k != "app_srv" else v) for k, v in out.items()}
            follow = {b: (idx[idx < m], nl[idx < m], lc[idx < m]) for b, (idx, nl, lc) in follow.items()}
            ctx.update(ts=ts, n=m, leo=leo_after, follow=follow, fser={b: s[:m] for b, s in fser.items()})
        self._clock(int(ts[0]))
        # ----- arrivals: new messages get rows; scheduled ones have theirs
        rows = seg["row"].copy()
        is_new = code == C_PRODUCE
        if is_new.any():
            new_ts = ts[is_new]
            rows[is_new] = self._new_rows(seg["msg"][is_new], new_ts, seg["size"][is_new], new_ts,
                                          {k: v[is_new] for k, v in seg["pay"].items()}, WAITING)
        arr_rows, arr_ts = rows[is_arr], ts[is_arr]
        self.seg_append_ts = arr_ts if srv is not None and not refusing else arr_ts[:0]
        st = self.pend.cols["state"]
        if srv is None:
            st[arr_rows] = FAILED
            self.pend.cols["err"][arr_rows] = Error.NO_LEADER  # R2
        elif refusing:
            st[arr_rows] = FAILED
            # R2: refused before append. SPEC §3.7 C-2: refusals the faults decide were retried on another group by
            # routing (`rocketmq_control` C9), so this is a send's last attempt or a set only replication shrank
            self.pend.cols["err"][arr_rows] = Error.IN_SYNC_REPLICAS_NOT_ENOUGH
        elif len(arr_rows):
            si = self.ix[srv]
            epoch = self._epoch_of(srv)
            offsets = self._append_entries(si, epoch, arr_ts, self.pend["size"][arr_rows])
            c = self.pend.cols
            c["pe"][arr_rows], c["po"][arr_rows] = epoch, offsets
            c["tb"][arr_rows], c["tinc"][arr_rows], c["tep"][arr_rows] = srv, self.incarnation[si], epoch
            st[arr_rows] = WAITING
            self._on_arrivals(srv, arr_rows, arr_ts)
        # ----- follower copies
        for b, (idx, new_len, lcu) in follow.items():
            if not len(idx):
                continue
            i = self.ix[b]
            grew = np.flatnonzero(np.diff(np.concatenate([[self.log_len[i]], new_len])) > 0)
            final = int(new_len[-1])
            if final > self.log_len[i]:
                cum = self.lead_cum.view  # extended by this segment's appends (_append_entries)
                self.replication_bytes += int(cum[final] - cum[int(self.log_len[i])])
                self.runs[i] = prefix_runs(self.runs[li], final)
                self.flush[i].write(ts[idx[grew]], new_len[grew], cum[new_len[grew]])
                self.nbytes[i] = int(cum[final])
            self.log_len[i] = final
            self.fetched[i] = final
            self.lcu[i] = int(lcu[-1])
        # ----- acks and visibility from the commit series
        if to_leader or ldr is not None:
            self._settle_by_series(ts, out, ldr)
        self._commit_series(ctx, out)
        self.seg_ts = ts
        self._instants(ts, out, leo_after, srv, refusing)
        if out.get("expand") is not None:
            self._cut(int(ts[-1]), out)
        return m

    def _epoch_of(self, b: int) -> int:
        return self.cp.epoch

    def _settle_by_series(self, ts: np.ndarray, out: dict, ldr: int | None) -> None:
        """Messages of the leader's current epoch: ack and visibility times from the segment's series."""
        n = self.pend.n
        if n == 0 or ldr is None:
            return
        li = self.ix[ldr]
        ack, vis = out.get("ack"), out.get("vis")
        if ack is not None and len(ack):
            rows = self._waiting_of(ldr, self.cp.epoch)
            if len(rows):
                po = self.pend["po"][rows]
                rows, po = rows[po < ack[-1]], po[po < ack[-1]]
                if len(rows):
                    at = np.searchsorted(ack, po, side="right")
                    self._ack_rows(rows, ts[np.minimum(at, len(ts) - 1)])
        if vis is not None and len(vis) and vis[-1] > out.get("vis0", 0):
            lo = out.get("vis0", 0)
            po, pe = self.pend["po"], self.pend["pe"]
            v = self.pend.cols["vis"]
            cand = np.flatnonzero((po >= lo) & (po < vis[-1]) & (v[:n] == NULL_US) & (pe >= 0))
            if len(cand):
                cand = cand[runs_contain(runs_array(self.runs[li]), pe[cand], po[cand])]
                at = np.searchsorted(vis, po[cand], side="right")
                v[cand] = ts[np.minimum(at, len(ts) - 1)]

    # ============================================================================ instants and records
    def _avail(self) -> tuple[bool, int]:
        if self._blocked():
            return True, INF
        srv = self._serving()
        point = self._ack_point_now(srv)
        if point is None or point >= self.log_len[self.ix[srv]]:
            return False, INF
        return False, self._app_at(srv, point) + self._answer_ms() * MS

    def _clock(self, t: int) -> None:
        """Moving to time t closes the current instant: record its end state."""
        if t > self.cur_t:
            self.timeline.end_instant(self._state_row(self.cur_t), *self._avail())
            self.cur_t = t

    def _instants(self, ts, out, leo_after, srv, refusing) -> None:
        """Close every instant of the segment but the last: timeline rows and availability (vectorized)."""
        last_of = np.flatnonzero(np.append(ts[1:] != ts[:-1], True))
        if len(last_of) > 1:
            closed = last_of[:-1]
            tc = ts[closed]
            hw = out["hw"]
            leo_i = leo_after[closed]
            hw_i = hw[closed] if hw is not None else leo_i
            changed = np.flatnonzero((leo_i[1:] != leo_i[:-1]) | (hw_i[1:] != hw_i[:-1])) + 1
            if len(changed):
                win = tc[changed] // self.timeline.window_us
                changed = changed[np.append(win[1:] != win[:-1], True)]
            for j in np.concatenate([[0], changed]).astype(np.int64):
                self.timeline.offer(self._state_row(int(tc[j]), int(leo_i[j]), int(hw_i[j])))
            blocked = self._blocked()
            tl = self.timeline
            if tl.av_prev is not None:
                tl.close(int(tc[0]))
            if blocked:
                tl.unavail.append((int(tc[0]), int(tc[-1])))
                stall_last = INF
            else:
                stall = self._stall_series(closed, out, srv)
                lo, hi = np.maximum(tc[:-1], stall[:-1]), tc[1:]
                tl.unavail.extend(zip(lo[lo < hi].tolist(), hi[lo < hi].tolist(), strict=True))
                stall_last = int(stall[-1])
            tl.av_prev = (int(tc[-1]), blocked, stall_last)
        self.cur_t = int(ts[-1])

    def _stall_series(self, closed: np.ndarray, out: dict, srv: int) -> np.ndarray:
        """Stall start at each closed instant, as `_avail()` would compute it there."""
        k = len(closed)
        ack = out.get("ack")
        timeout = self._answer_ms() * MS
        if srv == self._data_leader() and out.get("acks_at_append") is False and ack is not None:
            a = ack[closed]
            leo = out["leo_srv"][closed]
            stall = np.full(k, INF, dtype=np.int64)
            waiting = a < leo
            if waiting.any():
                stall[waiting] = _at_offsets(*out["app_srv"], a[waiting]) + timeout
            return stall
        return np.full(k, self._avail()[1] if out.get("acks_at_append") is False else INF, dtype=np.int64)

    # ================================================================================ control points
    def _control_point(self, t: int) -> None:
        """Before a control event at t: settle statuses due before t, apply flushes due before t."""
        self._resolve(t)
        self._materialize_all(t)

    def _after_control(self, t: int) -> None:
        if self.lead_for_cache != self._data_leader():
            self._rebuild_leader_cache()

    def _materialize_all(self, t: int) -> None:
        for f in self.flush:
            f.materialize(t)

    def _trace_control(self, t: int, kind: Kind, b: int) -> None:
        i = self.ix[b]
        if kind in STOPS:
            if kind is Kind.SHUTDOWN:
                self.flush[i].reset(int(self.log_len[i]), int(self.nbytes[i]), t)
                self.inc_end[i].append(t)
                self.incarnation[i] += 1
            else:
                self._lose_data(t, i, kind)
        elif kind is Kind.RESTART:
            self.flush[i].reset(int(self.log_len[i]), int(self.nbytes[i]), t)
        self._before_cp(t, kind, b)
        self.cp.trace(t, kind, b)
        self._after_cp(t, kind, b)

    def _before_cp(self, t: int, kind: Kind, b: int) -> None:
        pass

    def _after_cp(self, t: int, kind: Kind, b: int) -> None:
        pass

    def _cut(self, t: int, out: dict) -> None:
        pass

    # hooks the control plane calls
    def on_leader_lost(self, t: int) -> None:
        pass

    def on_elect(self, t: int, new: int, eligible: tuple[int, ...]) -> None:
        pass

    def on_switch(self, t: int) -> None:
        pass

    def on_offline(self, t: int) -> None:
        pass

    # ================================================================================ end of trace
    def _end_view(self) -> tuple[np.ndarray, int, bool]:
        raise NotImplementedError

    def _recover(self, t: int) -> int | None:
        raise NotImplementedError


# ================================================================================ rocketmq (§3.3)
class ClassicReplay(SteadySegments, GroupReplay):
    """SPEC §3.3 master/slave; steady segments run in compiled code (`rocketmq_stretch`)."""

    def __init__(self, policy: RocketMQPolicy, unit: int, members: tuple[int, ...], duration_us: int,
                 window_us: int = 1_000_000) -> None:
        super().__init__(policy, unit, members, duration_us, window_us)
        self.master = members[0]
        self.slaves = members[1:]
        sync = policy.broker_role is BrokerRole.SYNC_MASTER and policy.in_sync_replicas > 1
        self.need = policy.in_sync_replicas - 1 if sync else 0
        self.lead_for_cache = self.master

    def _data_leader(self) -> int:
        return self.master

    def _serving(self) -> int | None:
        return self.master if self.cp.up[self.master] else None

    def _steady_rule(self) -> SteadyRule:
        m = self.master
        return SteadyRule(m, bool(self.cp.up[m]), bool(self.cp.alive(m)), CommitRule.CLASSIC, self.need,
                          self._usable() >= self.need, True,
                          self._coverage_now() if self.need else int(self.log_len[self.ix[m]]))

    def _usable(self) -> int:
        if self.cp.iso[self.master]:
            return 0
        return sum(1 for s in self.slaves if self.cp.alive(s))

    def _coverage_now(self) -> int:
        if self.need == 0:
            return int(self.log_len[0])
        ends = sorted((int(self.fetched[self.ix[s]]) for s in self.slaves), reverse=True)
        return ends[self.need - 1] if len(ends) >= self.need else 0

    def _on_arrivals(self, s: int, rows: np.ndarray, ts: np.ndarray) -> None:
        c = self.pend.cols
        c["vis"][rows] = ts  # rule 5: visibility is at the master's append
        if self.need == 0:
            c["state"][rows] = ACKED  # rule 4: ASYNC_MASTER
            c["ack"][rows] = ts
        elif self._usable() < self.need:
            c["state"][rows] = FAILED  # rule 4: SLAVE_NOT_AVAILABLE at once, stored on the master
            c["err"][rows] = Error.SLAVE_NOT_AVAILABLE

    def _blocked(self) -> bool:
        return not self.cp.up[self.master] or self._usable() < self.need

    def _ack_point_now(self, s: int) -> int | None:
        return None if self.need == 0 else self._coverage_now()

    def _state_row(self, t: int, leo: int | None = None, hw: int | None = None) -> StateRow:
        isr = (self.master, *([] if self.cp.iso[self.master] else [s for s in self.slaves if self.cp.alive(s)]))
        if not self.cp.up[self.master]:
            return StateRow(t, None, self.cp.epoch, isr, None, None)
        n = int(self.log_len[0]) if leo is None else leo
        return StateRow(t, self.master, self.cp.epoch, isr, n, n)

    def _after_cp(self, t: int, kind: Kind, b: int) -> None:
        if kind is not Kind.RESTART:
            return
        if b != self.master:
            self._follow(self.ix[b], self.master)
            self.fetched[self.ix[b]] = self.log_len[self.ix[b]]
            return
        self._reconcile(t, [s for s in self.slaves if self.cp.up[s]])

    def _reconcile(self, t: int, sources: list[int]) -> None:
        """Rule 6 (R5): the master's log is the truth; with `union` it first takes a longer slave log."""
        if self.p.reconcile is Reconcile.UNION:
            best = None
            m_len = int(self.log_len[0])
            for s in sources:
                i = self.ix[s]
                if self.log_len[i] > m_len and common_prefix(self.runs[i], self.runs[0]) == m_len and (
                        best is None or self.log_len[i] > self.log_len[self.ix[best]]):
                    best = s
            if best is not None:
                self._adopt(t, 0, self.ix[best])
                self._rebuild_leader_cache()
        for s in self.slaves:
            i = self.ix[s]
            self._follow(i, self.master)
            self.fetched[i] = self.log_len[i]

    def _end_view(self):
        for b in self.order:
            if self.cp.up[b]:
                i = self.ix[b]
                return runs_array(self.runs[i]), int(self.log_len[i]), True
        return np.zeros((0, 3), dtype=np.int64), 0, False

    def _recover(self, t: int) -> int:
        was_down = not self.cp.up[self.master]
        if was_down:
            self._reconcile(t, list(self.slaves))
        return self.master


# ================================================================================ dledger (§3.4)
class DLedgerReplay(SteadySegments, GroupReplay):
    """SPEC §3.4 Raft groups; steady segments run in compiled code (`rocketmq_stretch`)."""

    answer_error = Error.IN_SYNC_REPLICAS_NOT_ENOUGH

    def __init__(self, policy: DLedgerPolicy, unit: int, members: tuple[int, ...], duration_us: int,
                 window_us: int = 1_000_000) -> None:
        super().__init__(policy, unit, members, duration_us, window_us)
        self.q = majority(len(members))
        self.leader: int | None = members[0]
        self.commit = 0
        self.lead_for_cache = self.leader

    def _answer_ms(self) -> int:
        return self.p.max_wait_ack_ms

    def _data_leader(self) -> int | None:
        return self.leader

    def _serving(self) -> int | None:
        return self.leader if self.cp.writable() else None

    def _steady_rule(self) -> SteadyRule:
        ldr = self.leader
        up = ldr is not None and bool(self.cp.up[ldr])
        # an isolated leader commits only as a one-member group, its own majority (SPEC §3.7 R-4)
        commits = up and (not self.cp.iso[ldr] or self.q == 1)
        return SteadyRule(ldr, self._serving() is not None, ldr is not None and bool(self.cp.alive(ldr)),
                          CommitRule.DLEDGER, self.q, True, commits, self.commit)

    def _steady_done(self, commit: int) -> None:
        self.commit = commit

    def _blocked(self) -> bool:
        # R7: refusing (R-4: a leader without a reachable majority takes writes that cannot commit)
        return not self.cp.writable() or not self.cp.can_commit()

    def _ack_point_now(self, s: int) -> int | None:
        return self.commit

    def _state_row(self, t: int, leo: int | None = None, hw: int | None = None) -> StateRow:
        isr = tuple(b for b in self.order if self.cp.alive(b))
        if self.leader is None:
            return StateRow(t, None, self.cp.epoch, isr, None, None)
        return StateRow(t, self.leader, self.cp.epoch, isr,
                        int(self.log_len[self.ix[self.leader]]) if leo is None else leo,
                        self.commit if hw is None else hw)

    def on_leader_lost(self, t: int) -> None:
        self.leader = None

    def on_elect(self, t: int, new: int, voters: tuple[int, ...]) -> None:
        """Rule 3 with C1: the first voter leads with the best voter log (Raft order: last epoch, length)."""

        def rank(b):
            runs = self.runs[self.ix[b]]
            return (runs[-1][0] if runs else -1, int(self.log_len[self.ix[b]]), -self.ix[b])

        best = max(voters, key=rank)
        ni = self.ix[new]
        self._adopt(t, ni, self.ix[best])
        self.leader = new
        for i, b in enumerate(self.order):
            if b != new:
                self._follow(i, new)
            self.fetched[i] = self.log_len[i] if self.cp.alive(b) else 0  # R4
        self._rebuild_leader_cache()
        ends = sorted((int(self.log_len[ni]) if b == new else int(self.fetched[self.ix[b]]) for b in self.order),
                      reverse=True)
        self.commit = ends[self.q - 1]
        self._mark_visible(t, new, 0, self.commit)

    def _end_view(self):
        ldr = self.leader
        if ldr is None or not self.cp.up[ldr]:
            return np.zeros((0, 3), dtype=np.int64), 0, False
        return runs_array(self.runs[self.ix[ldr]]), self.commit, True

    def _recover(self, t: int) -> int:
        for b in self.order:
            self.cp.up[b], self.cp.iso[b] = True, False
        if self.leader is None:
            self._mark_visible = lambda *a: None  # type: ignore[method-assign]
            self.on_elect(t, self.order[0], self.order)
        return self.leader


# ===================================================================== rocketmq-controller (§3.5)
class ControllerReplay(GroupReplay):
    """SPEC §3.5: Kafka-like SyncStateSet with RocketMQ acks, controller detection and C1/C7."""

    def __init__(self, policy: RocketMQControllerPolicy, unit: int, members: tuple[int, ...], duration_us: int,
                 window_us: int = 1_000_000) -> None:
        super().__init__(policy, unit, members, duration_us, window_us)
        self.master: int | None = members[0]
        self.sss: list[int] = list(members)
        self.hw = 0
        self.iso_view: tuple[int, ...] | None = None
        self.zombie: dict | None = None
        self.blocked = False
        self.all_ack = policy.all_ack_in_sync_state_set
        self.k = policy.in_sync_replicas
        self.lead_for_cache = self.master
        self.housekeeping: dict[int, int] = {}  # slave -> when its silent HA connection is closed (C-1)
        self.handlers = {"check": self._on_check, "housekeeping": self._on_housekeeping}
        self._push(FIRST_SYNC_STATE_CHECK_MS * MS, C_CHECK, "check", 0)  # SPEC §3.7 C-1

    def _push(self, t: int, code: int, what: str, arg: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (key_of(t, code), self.seq, what, arg))

    def _in_order(self, brokers) -> list[int]:
        s = set(brokers)
        return [b for b in self.order if b in s]

    def _data_leader(self) -> int | None:
        return None if self.master is None or self.blocked else self.master

    def _is_zombie(self, b: int | None) -> bool:
        return self.zombie is not None and b == self.zombie["broker"]

    def _serving(self) -> int | None:
        """The broker the clients' route points to (R-1), if it takes writes."""
        tgt = self.cp.target
        if tgt is None or not self.cp.up[tgt]:
            return None
        if tgt == self.master and not self.blocked:
            return None if self.cp.reincarnated else tgt  # not before its new incarnation registers (C7)
        return tgt if self._is_zombie(tgt) else None

    def _view(self, b: int) -> tuple[int, ...]:
        if self._is_zombie(b):
            return self.zombie["view"]
        return self.iso_view if self.iso_view is not None else tuple(self.sss)

    def _refusing(self, s: int) -> bool:
        return len(self._view(s)) < self.p.min_insync_replicas

    def _epoch_of(self, b: int) -> int:
        return self.zombie["epoch"] if self._is_zombie(b) else self.cp.epoch

    def _ack_point_now(self, s: int) -> int | None:
        if self.all_ack:
            return self.zombie["hw"] if self._is_zombie(s) else self.hw
        if self.k <= 1:
            return None
        if self._is_zombie(s):
            return self.zombie["ack"]
        si = self.ix[s]
        ends = sorted((int(self.log_len[si]) if b == s else int(self.fetched[self.ix[b]]) for b in self.order),
                      reverse=True)
        return ends[self.k - 1] if self.k <= len(ends) else 0

    def _series(self, ctx: dict) -> dict:
        n, ldr = ctx["n"], ctx["ldr"]
        out: dict = {"cut": n}
        if ldr is not None and self.cp.up[ldr]:
            view = self._view(ldr)
            cand = np.min(np.stack([ctx["leo"] if b == ldr else ctx["fser"][b] for b in view]), axis=0)
            hw = np.maximum(self.hw, cand)
        else:
            hw = np.full(n, self.hw, dtype=np.int64)
        # expansion: an up, reachable slave rejoins at the first report that brings it to the confirm offset
        expand_at, expand_b = n, None
        for b, (idx, new_len, _) in ctx["follow"].items():
            if b in self.sss or not len(idx):
                continue
            hit = np.flatnonzero(new_len >= hw[idx])
            if len(hit) and idx[hit[0]] < expand_at:
                expand_at, expand_b = int(idx[hit[0]]), b
        if expand_b is not None:
            out["cut"] = expand_at + 1
            out["expand"] = expand_b
        out["hw_series"] = hw
        out["hw"] = hw if self.all_ack else None
        srv = ctx["srv"]
        if srv is not None and srv == ldr:
            if self.all_ack:
                ack = hw
            elif self.k <= 1:
                ack = None
            else:
                stack = np.stack([ctx["leo"] if b == ldr else ctx["fser"][b] for b in self.order])
                ack = _kth_largest(stack, self.k)
            out.update(ack=ack, acks_at_append=ack is None, leo_srv=ctx["leo"],
                       app_srv=self._app_ext(ctx))
        else:
            out.update(ack=None, acks_at_append=None)  # a zombie (or nobody) takes the arrivals
        out["vis"] = hw if self.all_ack else None
        out["vis0"] = self.hw
        return out

    def _commit_series(self, ctx: dict, out: dict) -> None:
        self.hw = int(out["hw_series"][-1])
        self._pending_expand = out.get("expand")

    def _cut(self, t: int, out: dict) -> None:
        b = self._pending_expand
        self._resolve(t)
        self.sss = self._in_order([*self.sss, b])  # a slave rejoins once it reaches the confirm offset
        self._recompute_hw(t)

    def _on_arrivals(self, s: int, rows: np.ndarray, ts: np.ndarray) -> None:
        c = self.pend.cols
        if not self.all_ack:
            c["vis"][rows] = ts  # B.7: the confirm offset is the master's max offset
        if self._is_zombie(s):
            z = self.zombie
            n = int(self.log_len[self.ix[s]])
            if z["view"] == (s,):
                if self.all_ack:
                    c["vis"][rows] = ts
                z["hw"] = n
            point = self._ack_point_now(s)
            if point is None:
                self._ack_rows(rows, ts)
            else:
                ok = c["po"][rows] < point
                self._ack_rows(rows[ok], ts[ok])
        elif not self.all_ack and self.k <= 1:
            self._ack_rows(rows, ts)

    def _stall_series(self, closed: np.ndarray, out: dict, srv: int) -> np.ndarray:
        if not self._is_zombie(srv):
            return super()._stall_series(closed, out, srv)
        # a zombie's log grows with the segment's arrivals; its ack point is frozen (or follows its log)
        point = self._ack_point_now(srv)
        k = len(closed)
        if point is None:
            return np.full(k, INF, dtype=np.int64)
        ts = self.seg_ts
        appended = self.seg_append_ts
        leo = int(self.log_len[self.ix[srv]]) - len(appended) + np.searchsorted(appended, ts[closed], side="right")
        stall = np.full(k, INF, dtype=np.int64)
        waiting = point < leo
        if waiting.any():
            stall[waiting] = self._app_at(srv, point) + self._answer_ms() * MS
        return stall

    def _recompute_hw(self, t: int) -> None:
        m = self.master
        if m is None or self.blocked or not self.cp.up[m]:
            return
        mi = self.ix[m]
        view = self._view(m)
        cand = min(int(self.log_len[mi]) if b == m else int(self.fetched[self.ix[b]]) for b in view)
        if cand > self.hw:
            if self.all_ack:
                self._mark_visible(t, m, self.hw, cand)
            self.hw = cand
        point = self._ack_point_now(m)
        if point is not None:
            self._ack_upto(t, m, self.cp.epoch, point)

    def _on_check(self, t: int, _: int) -> None:
        """SPEC §3.5: a slave not caught up for ha_max_time_slave_not_catchup_ms leaves the SyncStateSet."""
        period = self.p.check_sync_state_set_period_ms * MS
        if t + period <= self.duration_us:
            self._push(t + period, C_CHECK, "check", 0)
        m = self.master
        if m is None or self.blocked or not self.cp.alive(m):
            return
        leo = int(self.log_len[self.ix[m]])
        limit = self.p.ha_max_time_slave_not_catchup_ms * MS
        for f in list(self.sss):
            i = self.ix[f]
            if f != m and t - self.lcu[i] > limit and self.fetched[i] < leo:
                self.sss.remove(f)
        self._recompute_hw(t)

    def _blocked(self) -> bool:
        srv = self._serving()
        return srv is None or self._refusing(srv)

    def _state_row(self, t: int, leo: int | None = None, hw: int | None = None) -> StateRow:
        m = self.master
        shown = m if m is not None and self.cp.up[m] and not self.blocked else None
        if shown is None:
            return StateRow(t, None, self.cp.epoch, tuple(self.sss), None, None)
        n = int(self.log_len[self.ix[m]]) if leo is None else leo
        h = (self.hw if hw is None else hw) if self.all_ack else n
        return StateRow(t, shown, self.cp.epoch, tuple(self.sss), n, h)

    # ----- control (C7) data effects
    def _connection_lost(self, t: int, b: int, kind: Kind, was_iso: bool) -> None:
        """SPEC §3.7 C-1: a slave leaves the SyncStateSet when its HA connection closes (at once on crash or
        shutdown, after ha_housekeeping_interval_ms of silence otherwise), if the master reaches the controller."""
        m = self.master
        if m is None or b == m or self.blocked or not self.cp.alive(m) or b not in self.sss:
            return
        if kind in (Kind.CRASH, Kind.SHUTDOWN) and not was_iso:
            self.housekeeping.pop(b, None)
            self._shrink(t, b)
        elif b not in self.housekeeping:
            due = t + self.p.ha_housekeeping_interval_ms * MS
            self.housekeeping[b] = due
            self._push(due, C_CHECK, "housekeeping", b)

    def _on_housekeeping(self, t: int, b: int) -> None:
        if self.housekeeping.get(b) != t:
            return
        del self.housekeeping[b]
        m = self.master
        if m is not None and b != m and not self.blocked and self.cp.alive(m) and b in self.sss:
            self._shrink(t, b)

    def _shrink(self, t: int, b: int) -> None:
        self.sss.remove(b)
        self._recompute_hw(t)

    def _before_cp(self, t: int, kind: Kind, b: int) -> None:
        self._was_iso = self.cp.iso[b]
        self._healing_master = kind is Kind.HEAL and b == self.master and self.cp.up[b]
        if kind in STOPS and self._is_zombie(b):
            self.zombie = None
        elif kind is Kind.ISOLATE and b == self.master:
            self.iso_view = tuple(self.sss)
        elif kind is Kind.HEAL:
            if self._is_zombie(b):
                self.zombie = None
            if self._healing_master:
                self.iso_view = None  # the confirm offset is recomputed once the controller knows (_after_cp)
            elif self.cp.up[b] and self.master is not None and not self.blocked:
                self._follow(self.ix[b], self.master)  # an old master rejoins: epoch truncation

    def _after_cp(self, t: int, kind: Kind, b: int) -> None:
        if kind in (Kind.RESTART, Kind.HEAL):
            self.housekeeping.pop(b, None)
        elif kind in STOPS or kind is Kind.ISOLATE:
            self._connection_lost(t, b, kind, self._was_iso)
        if self._healing_master:
            self._recompute_hw(t)
        if kind in (Kind.RESTART, Kind.HEAL) and self.cp.alive(b) and self.master is not None and self.blocked \
                and b in self.sss:
            self._unblock(t)

    def on_elect(self, t: int, new: int, eligible: tuple[int, ...]) -> None:
        self._replace_master(t, new)

    def on_offline(self, t: int) -> None:
        self._replace_master(t, None)

    def _replace_master(self, t: int, new: int | None) -> None:
        old = self.master
        if old is not None and self.cp.up[old] and self.cp.iso[old] and old == self.cp.target and self.zombie is None:
            self.zombie = {"broker": old, "epoch": self.cp.epoch - (1 if new is not None else 0),
                           "view": self.iso_view or (old,), "hw": self.hw, "ack": 0}
            self.zombie["ack"] = self._zombie_ack_point(old)
        self.iso_view = None
        self.master = new
        if new is None:
            return
        self.blocked = True
        self._unblock(t)

    def _zombie_ack_point(self, old: int) -> int:
        """Its in_sync_replicas ack point when replaced (its slaves' copies are not counted after that)."""
        if self.all_ack or self.k <= 1:
            return 0
        oi = self.ix[old]
        ends = sorted((int(self.log_len[oi]) if b == old else int(self.fetched[self.ix[b]]) for b in self.order),
                      reverse=True)
        return ends[self.k - 1] if self.k <= len(ends) else 0

    def _unblock(self, t: int) -> None:
        m = self.master
        alive = [b for b in self.order if self.cp.alive(b)]
        pool = [b for b in alive if b in self.sss] or (alive if self.p.enable_elect_unclean_master else [])
        if not pool:
            return

        def rank(b):
            runs = self.runs[self.ix[b]]
            return (runs[-1][0] if runs else -1, int(self.log_len[self.ix[b]]), -self.ix[b])

        best = max(pool, key=rank)
        mi = self.ix[m]
        self._adopt(t, mi, self.ix[best])
        self.blocked = False
        for i, b in enumerate(self.order):
            if b != m and not self._is_zombie(b):
                self._follow(i, m)
            if b != m:
                self.fetched[i] = self.log_len[i]
                self.lcu[i] = t
        self.sss = [m]
        self.housekeeping.clear()
        self.hw = int(self.log_len[mi])
        self._rebuild_leader_cache()
        self._mark_visible(t, m, 0, self.hw)

    def on_switch(self, t: int) -> None:
        self.zombie = None

    def _end_view(self):
        srv = self._serving()
        if srv is None:
            return np.zeros((0, 3), dtype=np.int64), 0, False
        si = self.ix[srv]
        point = (self.zombie["hw"] if self._is_zombie(srv) else self.hw) if self.all_ack else int(self.log_len[si])
        return runs_array(self.runs[si]), point, True

    def _recover(self, t: int) -> int:
        m = self.master
        reelect = m is None or not self.cp.up[m]
        for b in self.order:
            self.cp.up[b], self.cp.iso[b] = True, False
        self.zombie = None
        self._mark_visible = lambda *a: None  # type: ignore[method-assign]
        if reelect:
            self.master = self.order[0]
            self.blocked = True
        if self.blocked:
            self._unblock(t)
        return self.master


KERNELS = {"rocketmq": ClassicReplay, "dledger": DLedgerReplay, "rocketmq-controller": ControllerReplay}


def group_replay(policy: Policy, unit: int, members: tuple[int, ...], duration_us: int) -> GroupReplay:
    return KERNELS[policy.family](policy, unit, members, duration_us)


def replay_group(policy: Policy, unit: int, members: tuple[int, ...], events: PartitionEvents,
                 duration_us: int) -> PartitionResult:
    """Kernel replay of one group in one pass."""
    replay = group_replay(policy, unit, members, duration_us)
    replay.advance(events, duration_us + 1)
    return replay.finish()
