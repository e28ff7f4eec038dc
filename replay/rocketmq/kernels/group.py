"""The replay of one RocketMQ broker group, family-independent: chunked `advance()`, control points, instants,
the end of the trace (SPEC §4.1). Families subclass it (`classic`, `dledger`,
`controller`)."""

from __future__ import annotations

import heapq

import numpy as np

from replay.events import PartitionEvents
from replay.policies import (
    DLedgerPolicy,
    FlushMode,
    Policy,
)
from replay.results import FinalView, PartitionResult, StateRow, merge_intervals
from replay.rocketmq.control import (
    INF,
    KEY,
    STOPS,
    RouteClock,
    control_plane,
    key_of,
    unpack_delay,
)
from replay.rocketmq.kernels.common import (
    ACKED,
    C_PRODUCE,
    C_REPLICATE,
    FAILED,
    NONE,
    PENDING_COLS,
    SEGMENT_MAX,
)
from replay.rocketmq.kernels.flush import FlushState
from replay.rocketmq.kernels.logs import GroupLogs
from replay.rocketmq.kernels.messages import COPY_ROW, GroupMessages, fold_copies
from replay.rocketmq.kernels.steady import stream_columns
from replay.shared.kernels.arrays import (
    Grow,
    Table,
    Timeline,
    is_ascending,
    member_index,
    merge_order,
    reserve,
    reserve_rows,
    runs_array,
    take_or,
)
from replay.shared.kernels.judge import judge
from replay.shared.kernels.records import all_records, record_table
from schemas.outcomes import Error
from schemas.trace import Kind
from schemas.units import MS, S


class GroupReplay(GroupMessages, GroupLogs):
    """Chunked replay of one broker group: `advance()` time chunks in order, then `finish()`."""

    answer_error = Error.FLUSH_SLAVE_TIMEOUT
    SEGMENT_MAX = SEGMENT_MAX

    def __init__(self, policy: Policy, unit: int, members: tuple[int, ...], duration_us: int,
                 window_us: int = S, clock: RouteClock | None = None) -> None:
        self.p = policy
        self.unit = unit
        self.order = tuple(members)
        self.ix = {b: i for i, b in enumerate(self.order)}
        self.duration_us = duration_us
        n = len(self.order)
        self.cp = control_plane(policy, self.order, hooks=self, clock=clock)
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
        self.pend = Table(PENDING_COLS)
        self.payload_keys: tuple[str, ...] | None = None
        self.sched_key = np.zeros(0, dtype=np.int64)  # scheduled arrivals (DLedger retries)
        self.sched_row = np.zeros(0, dtype=np.int64)
        self.room = 0  # messages the current chunk may append (`advance`)
        self.recs = record_table()  # settled messages, handed over from `pend` (`_compact`); payload columns added
        self.replication_bytes = 0
        self.cur_t = 0
        self.timeline = Timeline(window_us)
        self.handlers: dict = {}  # engine-derived event -> its handler (t, arg)
        self.s_key = np.zeros(1, dtype=np.int64) + INF
        self.s_pos = 0
        self.s_pidx = np.zeros(1, dtype=np.int64) - 1
        self.p_msg = self.p_size = np.zeros(0, dtype=np.int64)
        self.p_pay: dict[str, np.ndarray] = {}
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

    def _state_row(self, t: int, leo: int | None = None, hw: int | None = None) -> StateRow:
        raise NotImplementedError

    def _blocked(self) -> bool:
        raise NotImplementedError

    def _ack_point_now(self, s: int) -> int | None:
        """The serving broker's ack point now (None = every append is acked at once)."""
        raise NotImplementedError

    def _quiet(self, t: int, what: str) -> bool:
        """Whether the derived event `what` at t, with no control event before it, would change nothing but the
        schedule (`_skip`): the segment then runs on past it, with the same outcome."""
        return False

    def _skip(self, t: int, what: str, arg: int) -> None:
        """A quiet derived event's effect on the schedule (the next one of its kind)."""
        raise NotImplementedError

    # ==================================================================================== API
    def advance(self, events: PartitionEvents, until_us: int) -> None:
        """Apply every event of the chunk (all with ts_us < until_us) and every derived event before until_us."""
        ev = events
        rep_ix = member_index(ev.broker_id, np.array(self.order, dtype=np.int64))  # each broker event's replica
        known = rep_ix >= 0
        bk, bts, bb, bu, bi = (ev.broker_kind[known], ev.broker_ts[known], ev.broker_id[known],
                               ev.broker_upto[known], rep_ix[known])
        ctrl = bk < C_REPLICATE
        c_key = key_of(bts[ctrl], bk[ctrl].astype(np.int64))
        c_kind, c_b = bk[ctrl], bb[ctrl]
        rep = bk == C_REPLICATE
        # produce events: failed routing settles at once, delayed arrivals are scheduled, the rest stream
        payload = getattr(ev, "payload", None) or {}
        self._add_payload_keys(payload)
        # room for every message this chunk may settle and append: the records and the leader's log grow once, not
        # by doubling copies (a copy and fresh pages each time: a tenth of rocketmq-controller-allack's CPU)
        part = payload.get("part", np.zeros(len(ev.produce_ts), dtype=np.int64))
        delay, copies = unpack_delay(payload.get("delay", np.zeros(len(ev.produce_ts), dtype=np.int64)))
        n_copies = int(sum(int(((copies >> k) & 1).sum()) for k in range(int(copies.max(initial=0)).bit_length())))
        self.room = room = self.pend.n + len(ev.produce_ts) + n_copies
        reserve_rows(self.recs, room)
        for log in (self.lead_app, self.lead_cum, *self.epochs.get(self.cp.epoch, (0,))[1:]):
            reserve(log, room)
        unrouted = part < 0
        if unrouted.any():
            self._settle_unrouted(ev, payload, unrouted)
        later = (delay > 0) & ~unrouted
        if later.any():
            self._schedule_arrivals(ev, payload, later, delay)
        if n_copies:
            self._schedule_copies(ev, payload, copies)
        copy_now = (copies & 1) == 1  # C3: a copy appended at the produce instant streams as the produce event
        now = (~unrouted & ~later) | copy_now
        p_ts = ev.produce_ts[now]
        r_key, p_key = key_of(bts[rep], C_REPLICATE), key_of(p_ts, C_PRODUCE)
        s_key = np.concatenate([r_key, p_key])
        # both sources come time-ordered: a linear merge (stable, replications first on equal keys)
        order = merge_order(r_key, p_key) if is_ascending(r_key) and is_ascending(p_key) else \
            np.argsort(s_key, kind="stable")
        nrep = len(r_key)
        # the streamed produce events' own columns, read through s_pidx (one column per stream event would be a
        # copy and fresh pages per payload column)
        self.p_msg, self.p_size = ev.produce_msg[now], ev.produce_size[now]
        self.p_pay = {k: np.asarray(payload[k][now], dtype=np.int64) if k in payload
                      else np.full(len(p_ts), NONE, dtype=np.int64) for k in self.payload_keys}
        if copy_now.any():
            self.p_pay["delay"] = np.where(copy_now[now], COPY_ROW, self.p_pay["delay"])
        (self.s_key, self.s_code, self.s_broker, self.s_rep, self.s_upto, self.s_pidx) = stream_columns(
            order, nrep, r_key, p_key, bb[rep], bu[rep], bi[rep])
        self.s_pos = 0
        until_key = key_of(until_us, 0)
        ci = 0
        while True:
            ck = int(c_key[ci]) if ci < len(c_key) else INF
            dk = min(self.heap[0][0] if self.heap else INF, self.cp.next_key())
            k = min(ck, dk, until_key)
            if k < min(ck, until_key, self.cp.next_key()) and self._quiet(k // KEY, self.heap[0][2]):
                # a derived event that would change nothing ends no segment: the next one is scheduled instead
                _, _, what, arg = heapq.heappop(self.heap)
                self._skip(k // KEY, what, arg)
                continue
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

    def _produced(self, pidx: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """msg, size and payload of the streamed produce events `pidx` (s_pidx values; NONE, 0 and NONE where NONE)."""
        return (take_or(self.p_msg, pidx, NONE), take_or(self.p_size, pidx, 0),
                {k: take_or(v, pidx, NONE) for k, v in self.p_pay.items()})

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
        records = fold_copies(all_records(self.pend, self.recs, self.payload_keys or (), int(ACKED),
                                          int(FAILED)).sorted_by_msg_id())
        result = PartitionResult(self.unit, judge(records, view), rows, merge_intervals(self.timeline.unavail),
                                 replication_bytes)
        result.view = view  # type: ignore[attr-defined]
        return result

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
