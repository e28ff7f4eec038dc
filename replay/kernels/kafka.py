"""Vectorized replay of the `kafka` family for one partition (SPEC §3.1-3.2, §4): the production engine.

The reference interpreter (`replay/reference/kafka.py`) applies one event at a time. This kernel splits the
timeline at *control points* (faults, fencing deadlines, ISR check ticks, client switches, ISR expansions)
and processes every steady segment between two of them with whole-array numpy operations: appends are a
cumulative count, a follower's log end after each report is a running maximum of `searchsorted` over the
leader's append times (rule 5), the high watermark is an element-wise minimum over the ISR (rule 4), commit and
visibility times are a `searchsorted` of offsets into that series, and stalls are read off the same arrays.
Control points, which are few, run small scalar handlers that mirror the reference rule by rule.

State lives in the object and is carried across calls to `advance()`, so a partition replays in time chunks
(bounded memory, streaming micro-batches) with exactly the result of one pass. Logs are held as runs of
`(leader_epoch, start, end)` per replica plus, per epoch, the append times and sizes of the entries that epoch's
leader appended (16 bytes per appended message); messages are kept only until their outcome is settled.
"""

from __future__ import annotations

import heapq

import numpy as np

from replay.events import PartitionEvents
from replay.kernels import kafka_steady as steady
from replay.kernels._arrays import Grow, Table, reserve, reserve_rows
from replay.kernels.kafka_steady import INF, AckCode, FlushCode, MsgState
from replay.policies import OS_WRITEBACK_EXPIRE_MS, OS_WRITEBACK_PERIOD_MS, Acks, FlushMode, KafkaPolicy
from replay.results import (
    FinalView,
    MessageRecords,
    PartitionResult,
    StateRow,
    judge,
    merge_intervals,
    runs_contain,
)
from schemas.outcomes import NULL_US, Error, Status
from schemas.trace import Kind

MS = 1000
# Position of an event within its instant (SPEC §2.2): trace kinds 0-8, then derived events.
C_REPLICATE, C_PRODUCE = int(Kind.REPLICATE), int(Kind.PRODUCE)
C_FENCE, C_TICK, C_CLIENT, C_RETRY = 9, 10, 11, 12
WAITING, REFUSED, APPENDED, ACKED, FAILED = (MsgState.WAITING, MsgState.REFUSED, MsgState.APPENDED, MsgState.ACKED,
                                            MsgState.FAILED)
_PENDING_COLS = {
    "msg": np.int64, "prod": np.int64, "size": np.int64, "dead": np.int64, "state": np.int8, "err": np.int8,
    "anchor": np.int64, "nref": np.int64, "pe": np.int64, "po": np.int64, "req": np.int64, "ack": np.int64,
    "vis": np.int64,
    # carried untouched to the outputs (PartitionEvents.payload)
    "pid": np.int64, "part": np.int64, "keyid": np.int64,
}
PAYLOAD = ("pid", "part", "keyid")
COMPACT_AT = 32768  # pending messages from which a stretch hands the settled ones over


def _key(ts, code):
    return ts * 16 + code


def _prefix_runs(runs: list[list[int]], length: int) -> list[list[int]]:
    out = []
    for e, s, end in runs:
        if s >= length:
            break
        out.append([e, s, min(end, length)])
    return out


def _common_prefix(a: list[list[int]], b: list[list[int]]) -> int:
    """Length of the prefix two logs share: same leader epoch at every offset (KIP-101/279)."""
    i = j = 0
    pos = 0
    while i < len(a) and j < len(b):
        ea, _, na = a[i]
        eb, _, nb = b[j]
        if ea != eb:
            return pos
        end = min(na, nb)
        pos = end
        if na == end:
            i += 1
        if nb == end:
            j += 1
    return pos


def _runs_array(runs: list[list[int]]) -> np.ndarray:
    return np.array(runs, dtype=np.int64).reshape(-1, 3)


class KafkaPartitionReplay:
    """Chunked, vectorized replay of one partition: `advance()` time chunks in order, then `finish()`."""

    def __init__(self, policy: KafkaPolicy, partition: int, replicas: tuple[int, ...], duration_us: int,
                 window_us: int = 1_000_000) -> None:
        self.p = policy
        self.partition = partition
        self.order = tuple(replicas)
        self.ix = {b: i for i, b in enumerate(self.order)}
        self.duration_us = duration_us
        self.window_us = window_us
        self.min_isr = policy.effective_min_isr
        self.session_us = policy.session_timeout_ms * MS
        self.acks = policy.acks
        n = len(self.order)
        self.up = np.ones(n, dtype=bool)
        self.iso = np.zeros(n, dtype=bool)
        self.unclean = np.zeros(n, dtype=bool)
        self.log_len = np.zeros(n, dtype=np.int64)
        self.fetched = np.zeros(n, dtype=np.int64)
        self.lcu = np.zeros(n, dtype=np.int64)
        self.unreach = np.full(n, -1, dtype=np.int64)
        self.iso_since = np.full(n, -1, dtype=np.int64)
        self.must_register = np.zeros(n, dtype=bool)
        self.flushed_all = np.zeros(n, dtype=np.int64)
        self.runs: list[list[list[int]]] = [[] for _ in range(n)]
        # per replica, writes not yet surely on disk: (durable_at_us, length) buckets (`steady.wrote`)
        self.dur_d = np.zeros((n, steady.DUR_CAP), dtype=np.int64)
        self.dur_len = np.zeros((n, steady.DUR_CAP), dtype=np.int64)
        self.dur_n = np.zeros(n, dtype=np.int64)
        if policy.flush is FlushMode.SYNC:
            self.flush = (int(FlushCode.SYNC), 1, 0)
        elif policy.flush_interval_ms is None:
            self.flush = (int(FlushCode.OS), OS_WRITEBACK_PERIOD_MS * MS, OS_WRITEBACK_EXPIRE_MS * MS)
        else:
            self.flush = (int(FlushCode.INTERVAL), policy.flush_interval_ms * MS, 0)
        self.epochs: dict[int, tuple[int, Grow, Grow]] = {0: (0, Grow(), Grow())}  # epoch -> (start, app, size)
        # Rule 2: the first replica leads; the ISR starts as all replicas.
        self.leader = self.order[0]
        self.epoch = 0
        self.isr: list[int] = list(self.order)
        self.elr: list[int] = []
        self.hw = 0
        self.epoch_start = 0  # the leader's log end when its epoch began (SPEC §3.7 K-5)
        self.iso_view: tuple[int, ...] | None = None
        self.down_pub: tuple[int, int] | None = None
        self.lead_app = Grow()
        self.lead_cum = Grow(np.zeros(1, dtype=np.int64))
        self.target = self.order[0]
        self.unaware = False  # the leader was elected while isolated and has not learned it yet (SPEC §3.7 K-3)
        self.last_leader = self.order[0]  # the last broker elected (SPEC §3.7 K-4)
        self.zombie: dict | None = None
        self.heap: list[tuple[int, int, str, int]] = []
        self.handlers = {"tick": self._on_tick, "fence": self._on_fence, "switch": self._on_switch,
                         "refresh": self._on_refresh}
        self.seq = 0
        self._push(0, C_TICK, "tick", 0)
        self.pend = Table(_PENDING_COLS)
        self.extra: list[tuple[int, int, int]] = []  # earlier appends of retried messages (msg, epoch, offset)
        self.sched_key = np.zeros(0, dtype=np.int64)  # scheduled NotEnoughReplicas retries
        self.sched_row = np.zeros(0, dtype=np.int64)
        self.done: list[MessageRecords] = []
        self.replication_bytes = 0
        # per-instant bookkeeping
        self.cur_t = 0
        self.last_row: StateRow | None = None
        self.row_cand: StateRow | None = None
        self.rows_out: list[StateRow] = []
        self.av_prev: tuple[int, bool, int] | None = None
        self.unavail: list[tuple[int, int]] = []
        self.finished = False

    # =========================================================================================== API
    def advance(self, events: PartitionEvents, until_us: int) -> None:
        """Apply every event of the chunk (all with ts_us < until_us) and every derived event before until_us."""
        ev = events
        rep_ix = np.full(len(ev.broker_id), -1, dtype=np.int64)  # replica index of each broker event's broker
        for i, b in enumerate(self.order):
            rep_ix[ev.broker_id == b] = i
        ctrl = (ev.broker_kind < C_REPLICATE) & (rep_ix >= 0)
        c_key = _key(ev.broker_ts[ctrl], ev.broker_kind[ctrl].astype(np.int64))
        c_kind, c_b = ev.broker_kind[ctrl], ev.broker_id[ctrl]
        none = np.full(len(ev.produce_ts), -1, dtype=np.int64)
        payload = [np.asarray((ev.payload or {}).get(name, none), dtype=np.int64) for name in PAYLOAD]
        (self.s_key, self.s_code, self.s_rep, self.s_upto, self.s_msg, self.s_size, *pay) = steady.merge_stream(
            ev.broker_ts, ev.broker_kind, rep_ix, ev.broker_upto, ev.produce_ts, ev.produce_msg, ev.produce_size,
            *payload)
        self.s_payload = dict(zip(PAYLOAD, pay, strict=True))
        self.s_pos = 0
        until_key = _key(until_us, 0)
        ci = 0
        while True:
            ck = int(c_key[ci]) if ci < len(c_key) else INF
            dk = self.heap[0][0] if self.heap else INF
            k = min(ck, dk, until_key)
            self._stream(k)
            if k == until_key:
                break
            t = k // 16
            self._resolve_deadlines(t)
            self._clock(t)
            if k == ck:
                self._trace_control(t, Kind(int(c_kind[ci])), int(c_b[ci]))
                ci += 1
            else:
                _, _, what, arg = heapq.heappop(self.heap)
                self.handlers[what](t, arg)
            self._reschedule_pool(t)

    def finish(self) -> PartitionResult:
        """End of trace: settle every message and judge fates (SPEC §4.1)."""
        self.finished = True
        if self.heap or self.s_pos < len(getattr(self, "s_key", ())) - 1:
            self.advance(PartitionEvents.empty(), self.duration_us + 1)
        self._resolve_deadlines(self.duration_us + 1)
        self._clock(INF)  # close the last instant
        self._close_avail(self.duration_us)
        if self.row_cand is not None:
            self.rows_out.append(self.row_cand)
            self.row_cand = None
        view = self._final_view()
        records = MessageRecords.concat([*self.done, self._records(np.ones(self.pend.n, dtype=bool))])
        records = records.sorted_by_msg_id()
        if self.extra:
            records.extra_positions = np.array(sorted(self.extra), dtype=np.int64).reshape(-1, 3)
        result = PartitionResult(self.partition, judge(records, view), self.rows_out,
                                 merge_intervals(self.unavail), self.replication_bytes)
        result.view = view  # type: ignore[attr-defined]
        return result

    # ======================================================================================= helpers
    def _push(self, t: int, code: int, what: str, arg: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (_key(t, code), self.seq, what, arg))

    def _in_order(self, brokers) -> list[int]:
        s = set(brokers)
        return [b for b in self.order if b in s]

    def _eligible(self, b: int) -> bool:
        i = self.ix[b]
        return bool(self.up[i] and not self.iso[i])

    def _can_be_zombie(self, b: int) -> bool:
        """Up, isolated and still the incarnation that led (SPEC §3.2 rule 10); as `Replica.can_be_zombie`."""
        i = self.ix[b]
        return bool(self.up[i] and self.iso[i] and not self.must_register[i])

    def _view(self) -> tuple[int, ...]:
        return self.iso_view if self.iso_view is not None else tuple(self.isr)

    def _frozen(self, size: int) -> bool:
        """strict_min_isr, against the effective min ISR (SPEC §3.7 K-1, as `KafkaReference._frozen`)."""
        return self.p.strict_min_isr and size < self.min_isr

    def _is_zombie_target(self) -> bool:
        return self.zombie is not None and self.target == self.zombie["broker"]

    def _serving(self) -> int:
        t = self.target
        if t < 0 or not self.up[self.ix[t]] or self.must_register[self.ix[t]]:
            return -1  # a restarted broker serves nothing until its new incarnation registers
        if t == self.leader and self.unaware:
            return -1  # NOT_LEADER_OR_FOLLOWER until it learns of its election (SPEC §3.7 K-3)
        if t == self.leader or self._is_zombie_target():
            return t
        return -1

    def _serving_hw(self) -> int:
        return self.zombie["hw"] if self._is_zombie_target() else self.hw

    def _serving_view_size(self) -> int:
        return len(self.zombie["view"]) if self._is_zombie_target() else len(self._view())

    def _serving_epoch(self) -> int:
        return self.zombie["epoch"] if self._is_zombie_target() else self.epoch

    def _refusing(self) -> bool:
        return self.acks is Acks.ALL and self._serving_view_size() < self.min_isr

    def _app_at(self, b: int, offset: int) -> int:
        """Append time of the entry at `offset` of broker b's log."""
        for e, s, end in self.runs[self.ix[b]]:
            if s <= offset < end:
                start, app, _ = self.epochs[e]
                return int(app.view[offset - start])
        raise IndexError(offset)

    # -------------------------------------------------------------------------------- durability
    def _wrote(self, i: int, t: int, length: int) -> None:
        """Replica i's log reached `length` at t (kept for a power loss, SPEC §3.1)."""
        steady.wrote(i, t, length, self.flushed_all, self.dur_d, self.dur_len, self.dur_n, *self.flush)

    def _truncate(self, i: int, length: int) -> None:
        length = min(length, int(self.log_len[i]))
        self.log_len[i] = length
        self.runs[i] = _prefix_runs(self.runs[i], length)
        self.flushed_all[i] = min(self.flushed_all[i], length)
        self.fetched[i] = min(self.fetched[i], length)
        np.minimum(self.dur_len[i], length, out=self.dur_len[i])

    # ================================================================================== steady stretches
    def _stream(self, limit_key: int) -> None:
        """Process produce/replicate events and scheduled retries with keys below `limit_key`."""
        while True:
            hi = int(np.searchsorted(self.s_key, limit_key, side="left"))
            shi = int(np.searchsorted(self.sched_key, limit_key, side="left"))
            if hi <= self.s_pos and shi == 0:
                return
            self._steady(hi, shi)
            # loop: an ISR expansion may have cut the stretch or scheduled retries before limit_key

    def _steady(self, hi: int, shi: int) -> None:
        """One steady stretch in compiled code (`kafka_steady.steady`), then its effects on the Python-held state."""
        due = hi - self.s_pos + shi
        ldr, srv = self.leader, self._serving()
        li = self.ix[ldr] if ldr >= 0 else -1
        si = self.ix[srv] if srv >= 0 else -1
        view = self._view()
        n = len(self.order)
        l_up = ldr >= 0 and bool(self.up[li]) and not self.must_register[li]
        zombie = srv >= 0 and self._is_zombie_target()
        refusing = srv >= 0 and self._refusing()
        acks = {Acks.ZERO: AckCode.ZERO, Acks.ONE: AckCode.ONE, Acks.ALL: AckCode.ALL}[self.acks]
        epoch = self._serving_epoch() if srv >= 0 else -1
        new_epoch = srv >= 0 and epoch not in self.epochs
        if srv >= 0:
            ep_start, ep_app, ep_size = (int(self.log_len[si]), Grow(), Grow()) if new_epoch else self.epochs[epoch]
        else:
            ep_start, ep_app, ep_size = 0, Grow(), Grow()
        cf = np.array([
            hi, shi, li, si, int(srv >= 0 and srv == ldr), int(srv >= 0), int(refusing), int(acks),
            int(ldr >= 0 and self._eligible(ldr)), int(l_up and not self.unaware and not self._frozen(len(view))),
            epoch, self.epoch_start, self.p.delivery_timeout_ms * MS, self.p.request_timeout_ms * MS, self.window_us,
            int(zombie), int(zombie and self.zombie["view"] == (srv,) and not self._frozen(1)),
            int(srv < 0 or refusing), int(l_up), *self.flush], dtype=np.int64)
        av = self.av_prev or (0, False, INF)
        sc = np.zeros(steady.N_SCALARS, dtype=np.int64)
        sc[[steady.S_HW, steady.S_ZHW, steady.S_ZSTALL, steady.S_CUR_T, steady.S_AV_HAS, steady.S_AV_T,
            steady.S_AV_BLOCKED, steady.S_AV_STALL, steady.S_LEAD_N, steady.S_CUM_N, steady.S_EP_N, steady.S_PEND_N,
            steady.S_POS]] = [
            self.hw, self.zombie["hw"] if zombie else 0, self._avail()[1] if zombie else INF, self.cur_t,
            int(self.av_prev is not None), av[0], int(av[1]), av[2], self.lead_app.n, self.lead_cum.n, ep_app.n,
            self.pend.n, self.s_pos]
        reserve_rows(self.pend, due)
        c = self.pend.cols
        in_view = np.array([b in view for b in self.order], dtype=bool)
        in_isr = np.array([b in self.isr for b in self.order], dtype=bool)
        ok_rep = np.array([b != ldr and self._eligible(b) for b in self.order], dtype=bool)
        lead_runs = _runs_array(self.runs[li]) if li >= 0 else np.zeros((0, 3), dtype=np.int64)
        rows = np.empty((due + 1, 3), dtype=np.int64)
        unav = np.empty((due + 1, 2), dtype=np.int64)
        extra = np.empty((due + 1, 3), dtype=np.int64)
        hw_ch = np.empty((due + 1, 2), dtype=np.int64)
        grow_from = self.log_len.copy()
        old_hw = self.hw
        p = self.s_payload
        steady.steady(sc, cf, self.s_key, self.s_code, self.s_rep, self.s_upto, self.s_msg, self.s_size, p["pid"],
                      p["part"], p["keyid"], self.sched_key, self.sched_row, c["msg"], c["prod"], c["size"],
                      c["dead"], c["state"], c["anchor"], c["nref"], c["pe"], c["po"], c["req"], c["ack"], c["vis"],
                      c["pid"], c["part"], c["keyid"], self.log_len, self.fetched, self.lcu, self.flushed_all,
                      self.dur_d, self.dur_len, self.dur_n, ok_rep, in_isr, in_view, lead_runs,
                      reserve(self.lead_app, due), reserve(self.lead_cum, due), reserve(ep_app, due),
                      reserve(ep_size, due), rows, unav, extra, hw_ch)
        # ----- the carried scalars and the growable arrays back
        self.hw, self.cur_t = int(sc[steady.S_HW]), int(sc[steady.S_CUR_T])
        if zombie:
            self.zombie["hw"] = int(sc[steady.S_ZHW])
        self.replication_bytes += int(sc[steady.S_REPL_BYTES])
        self.lead_app.n, self.lead_cum.n = int(sc[steady.S_LEAD_N]), int(sc[steady.S_CUM_N])
        ep_app.n = ep_size.n = int(sc[steady.S_EP_N])
        self.pend.n = int(sc[steady.S_PEND_N])
        self.s_pos = int(sc[steady.S_POS])
        took = int(sc[steady.S_SCHED_POS])
        self.sched_key, self.sched_row = self.sched_key[took:], self.sched_row[took:]
        # ----- logs as runs: the serving broker's appends (one epoch), then followers as prefixes of the leader's
        k = int(sc[steady.S_APPENDED])
        if k:
            if new_epoch:
                self.epochs[epoch] = (ep_start, ep_app, ep_size)
            start, runs = int(self.log_len[si]) - k, self.runs[si]
            assert self.epochs[epoch][0] + ep_app.n == start + k, "an epoch's leader appends contiguously"
            if runs and runs[-1][0] == epoch and runs[-1][2] == start:
                runs[-1][2] = start + k
            else:
                runs.append([epoch, start, start + k])
        for i in range(n):
            if i not in (li, si) and self.log_len[i] > grow_from[i]:
                self.runs[i] = _prefix_runs(self.runs[li], int(self.log_len[i]))
        nx = int(sc[steady.S_NEXTRA])
        if nx:
            self.extra.extend(map(tuple, extra[:nx].tolist()))
        nh = int(sc[steady.S_NHW])
        if nh and self.extra and ldr >= 0:
            self._extra_visible(ldr, old_hw, self.hw, hw_ch[:nh, 0], hw_ch[:nh, 1])
        # ----- closed instants: timeline rows and availability
        for t, leo, hw in (rows[: int(sc[steady.S_NROWS])].tolist()):
            row = StateRow(t, ldr, self.epoch, tuple(self.isr), leo, hw) if l_up else self._state_row(t)
            last = self.last_row
            if last is None or (row.leader, row.leader_epoch, row.isr, row.log_end_offset, row.high_watermark) != (
                    last.leader, last.leader_epoch, last.isr, last.log_end_offset, last.high_watermark):
                self._emit_row(row)
        self.unavail.extend(map(tuple, unav[: int(sc[steady.S_NUNAV])].tolist()))
        if sc[steady.S_AV_HAS]:
            self.av_prev = (int(sc[steady.S_AV_T]), bool(sc[steady.S_AV_BLOCKED]), int(sc[steady.S_AV_STALL]))
        if self.pend.n >= COMPACT_AT:
            self._compact()  # settled messages leave the pending table (it bounds the next stretch's scans)
        b = int(sc[steady.S_EXPAND])
        if b >= 0:  # rule 7: the report that brought b up to the high watermark ends the stretch
            t = self.cur_t
            self._resolve_deadlines(t)  # deadlines before the expansion saw the state before it
            self._expand(t, self.order[b])
            self._reschedule_pool(t)


    def _append_entries(self, si: int, epoch: int, app_ts: np.ndarray, sizes: np.ndarray,
                        offsets: np.ndarray) -> None:
        if epoch not in self.epochs:
            self.epochs[epoch] = (int(offsets[0]), Grow(), Grow())
        start, app, size = self.epochs[epoch]
        assert start + len(app) == offsets[0], "an epoch's leader appends contiguously"
        app.extend(app_ts)
        size.extend(sizes)
        runs = self.runs[si]
        end = int(offsets[-1]) + 1
        if runs and runs[-1][0] == epoch and runs[-1][2] == offsets[0]:
            runs[-1][2] = end
        else:
            runs.append([epoch, int(offsets[0]), end])
        self.log_len[si] = end
        self._wrote(si, int(app_ts[-1]), int(offsets[-1]) + 1)  # one instant: one durability bucket
        if self.order[si] == self.leader:
            self.lead_app.extend(app_ts)
            self.lead_cum.extend(self.lead_cum.view[-1] + np.cumsum(sizes))

    def _move_positions(self, rows: np.ndarray) -> None:
        """A message appended again keeps its earlier position for judging fate (a copy may survive)."""
        pe, po, msg = self.pend.cols["pe"], self.pend.cols["po"], self.pend.cols["msg"]
        had = rows[pe[rows] >= 0]
        for r in had:
            self.extra.append((int(msg[r]), int(pe[r]), int(po[r])))

    def _extra_visible(self, broker: int, lo: int, hi: int, ts=None, hw=None, t: int | None = None) -> None:
        """Visibility through an earlier copy of a retried message (rare)."""
        if not self.extra:
            return
        runs = _runs_array(self.runs[self.ix[broker]])
        msg_rows = {int(m): r for r, m in enumerate(self.pend["msg"])}
        for m, e, o in self.extra:
            r = msg_rows.get(m)
            if r is None or self.pend.cols["vis"][r] != NULL_US or not (lo <= o < hi):
                continue
            if runs_contain(runs, np.array([e]), np.array([o]))[0]:
                when = t if t is not None else int(ts[min(int(np.searchsorted(hw, o, side="right")), len(ts) - 1)])
                self.pend.cols["vis"][r] = when

    # ---------------------------------------------------------------------------- instants and records
    def _state_row(self, t: int, leo: int | None = None, hw: int | None = None) -> StateRow:
        ldr = self.leader
        if ldr < 0:
            return StateRow(t, None, self.epoch, tuple(self.isr), None, None)
        if (not self.up[self.ix[ldr]] or self.must_register[self.ix[ldr]]) and self.down_pub is not None:
            return StateRow(t, ldr, self.epoch, tuple(self.isr), *self.down_pub)
        return StateRow(t, ldr, self.epoch, tuple(self.isr), int(self.log_len[self.ix[ldr]]) if leo is None else leo,
                        self.hw if hw is None else hw)

    def _avail(self) -> tuple[bool, int]:
        srv = self._serving()
        if srv < 0:
            return True, INF
        if self.acks is not Acks.ALL:
            return False, INF
        if self._serving_view_size() < self.min_isr:
            return True, INF
        hw = self._serving_hw()
        if hw >= self.log_len[self.ix[srv]]:
            return False, INF
        return False, self._app_at(srv, hw) + self.p.request_timeout_ms * MS

    def _clock(self, t: int) -> None:
        """Moving to time t closes the current instant: record its end state."""
        if t > self.cur_t:
            self._end_instant(self.cur_t, self._state_row(self.cur_t), *self._avail())
            self.cur_t = t

    def _end_instant(self, t: int, row: StateRow, blocked: bool, stall_from: int) -> None:
        last = self.last_row
        if last is None or (row.leader, row.leader_epoch, row.isr, row.log_end_offset, row.high_watermark) != (
                last.leader, last.leader_epoch, last.isr, last.log_end_offset, last.high_watermark):
            self._emit_row(row)
        if self.av_prev is not None:
            self._close_avail(t)
        self.av_prev = (t, blocked, stall_from)

    def _emit_row(self, row: StateRow) -> None:
        """Coalesce as `replay.results.coalesce_states`: every control change and the last row of each window."""
        last = self.last_row
        control = last is None or row.control_key() != last.control_key()
        cand = self.row_cand
        if cand is not None and cand.ts_us // self.window_us != row.ts_us // self.window_us:
            self.rows_out.append(cand)
        self.row_cand = None
        if control:
            self.rows_out.append(row)
        else:
            self.row_cand = row
        self.last_row = row

    def _close_avail(self, t_end: int) -> None:
        t0, blocked, stall_from = self.av_prev
        if blocked:
            self.unavail.append((t0, t_end))
        elif stall_from < t_end:
            self.unavail.append((max(t0, stall_from), t_end))

    def _records(self, mask: np.ndarray) -> MessageRecords:
        c = self.pend
        st = c["state"][mask]
        status = np.where(st == ACKED, Status.ACKED, np.where(st == FAILED, Status.FAILED, Status.PENDING))
        rec = MessageRecords(
            c["msg"][mask].copy(), c["prod"][mask].copy(), status.astype(np.int8), c["err"][mask].copy(),
            c["ack"][mask].copy(), c["vis"][mask].copy(), c["pe"][mask].copy(), c["po"][mask].copy(),
        )
        rec.payload = {name: c[name][mask].copy() for name in PAYLOAD}
        return rec

    def drain_settled(self) -> list[MessageRecords]:
        """Messages whose outcome is settled (all but fate), handed over so a caller may spill them to disk."""
        out, self.done = self.done, []
        return out

    # =================================================================================== deadlines
    def _resolve_deadlines(self, t: int) -> None:
        """Messages whose delivery deadline passed (before t) fail; the error reflects the state then."""
        if self.acks is Acks.ZERO or self.pend.n == 0:
            return
        if not steady.any_due(self.pend.cols["state"], self.pend.cols["dead"], self.pend.n, t):
            return
        st = self.pend.cols["state"][: self.pend.n]
        due = (st <= APPENDED) & (self.pend["dead"] < t)
        rows = np.flatnonzero(due)
        srv = self._serving()
        other = Error.NOT_ENOUGH_REPLICAS if srv >= 0 and self._refusing() else Error.NO_LEADER
        err = np.where(st[rows] == APPENDED, Error.REQUEST_TIMEOUT, other).astype(np.int8)
        self.pend.cols["err"][rows] = err
        st[rows] = FAILED
        # drop their scheduled retries
        if len(self.sched_row):
            keep = ~np.isin(self.sched_row, rows)
            self.sched_key, self.sched_row = self.sched_key[keep], self.sched_row[keep]
        self._compact()

    def _compact(self) -> None:
        """Hand settled messages to the output: acknowledged or failed, and visible or held by no replica."""
        n = self.pend.n
        if n < 4096:
            return
        st, vis, pe, po = self.pend["state"], self.pend["vis"], self.pend["pe"], self.pend["po"]
        settled = (st >= ACKED) & (vis != NULL_US)
        maybe = (st >= ACKED) & (vis == NULL_US)
        if maybe.any():
            alive = np.zeros(n, dtype=bool)
            for runs in self.runs:
                alive |= runs_contain(_runs_array(runs), pe, po)
            settled |= maybe & ~alive
        if self.extra:  # retried messages keep their rows until the end (rare)
            settled &= ~np.isin(self.pend["msg"], np.array([m for m, _, _ in self.extra], dtype=np.int64))
        if settled.sum() < n // 2:
            return
        self.done.append(self._records(settled))
        remap = self.pend.keep(~settled)
        if len(self.sched_row):
            self.sched_row = remap[self.sched_row]
            ok = self.sched_row >= 0
            self.sched_key, self.sched_row = self.sched_key[ok], self.sched_row[ok]

    # ================================================================================ control points
    def _trace_control(self, t: int, kind: Kind, b: int) -> None:
        if kind in (Kind.CRASH, Kind.POWER_LOSS, Kind.DISK_LOSS):
            self._stop_unclean(t, b, kind)
        elif kind is Kind.SHUTDOWN:
            self._shutdown(t, b)
        elif kind is Kind.ISOLATE:
            self._isolate(t, b)
        elif kind is Kind.RESTART:
            self._restart(t, b)
        elif kind is Kind.HEAL:
            self._heal(t, b)

    def _became_unreachable(self, t: int, i: int) -> None:
        if self.unreach[i] < 0:
            self.unreach[i] = t
            self._push(t + self.session_us, C_FENCE, "fence", self.order[i])

    def _zombie_stops(self, b: int) -> None:
        if self.zombie is not None and self.zombie["broker"] == b:
            self.zombie = None

    def _durable_prefix(self, i: int, t: int) -> int:
        n = int(self.flushed_all[i])
        for d, ln in zip(self.dur_d[i, : self.dur_n[i]].tolist(), self.dur_len[i, : self.dur_n[i]].tolist(),
                         strict=True):
            if d < t:  # a flush tick at the very instant of the power loss comes after it (SPEC §2.2)
                n = max(n, ln)
        return min(n, int(self.log_len[i]))

    def _stop_unclean(self, t: int, b: int, kind: Kind) -> None:
        i = self.ix[b]
        if b == self.leader and self.down_pub is None:
            self.down_pub = (int(self.log_len[i]), self.hw)
        self.up[i] = False
        self.unclean[i] = True
        if kind is Kind.POWER_LOSS:
            self._truncate(i, self._durable_prefix(i, t))
        elif kind is Kind.DISK_LOSS:
            self._truncate(i, 0)
        self.flushed_all[i] = self.log_len[i]
        self.dur_n[i] = 0
        self._became_unreachable(t, i)
        self._zombie_stops(b)
        if b == self.target and self.leader >= 0 and self.leader != b:
            self._schedule_switch(t)

    def _shutdown(self, t: int, b: int) -> None:
        i = self.ix[b]
        if b == self.leader and self.down_pub is None:
            self.down_pub = (int(self.log_len[i]), self.hw)
        self.up[i] = False
        self.unclean[i] = False
        self.flushed_all[i] = self.log_len[i]
        self.dur_n[i] = 0
        self.unreach[i] = -1
        self._zombie_stops(b)
        self._leave_isr(b)
        if b == self.leader:
            self._elect(t)
        else:
            self._recompute_hw(t)
            if b == self.target and self.leader >= 0:
                self._schedule_switch(t)

    def _isolate(self, t: int, b: int) -> None:
        i = self.ix[b]
        self.iso[i] = True
        self.iso_since[i] = t
        if b == self.leader:
            self.iso_view = tuple(self.isr)
            if b == self.target:
                self._schedule_refresh(t)
        self._became_unreachable(t, i)

    def _restart(self, t: int, b: int) -> None:
        i = self.ix[b]
        self.up[i] = True
        self.flushed_all[i] = self.log_len[i]
        self.dur_n[i] = 0
        if self.iso[i]:
            self.must_register[i] = True
            return
        self._register(t, b)

    def _register(self, t: int, b: int) -> None:
        i = self.ix[b]
        self.must_register[i] = False
        if self.p.eligible_leader_replicas and self.unclean[i]:
            if b in self.isr:
                self.isr.remove(b)
                self._recompute_hw(t)
            if b in self.elr:
                self.elr.remove(b)
        if self.unreach[i] >= 0:
            self._fence(t, b)
        if self.leader < 0:
            self._elect(t)

    def _heal(self, t: int, b: int) -> None:
        i = self.ix[b]
        self.iso[i] = False
        self.iso_since[i] = -1
        self._zombie_stops(b)
        if self.up[i] and self.must_register[i]:
            self._register(t, b)
        elif self.up[i]:
            self.unreach[i] = -1
        if b == self.leader and self.unaware and self.up[i] and not self.must_register[i]:
            self.unaware = False  # SPEC §3.7 K-3: it learns of its election and leads from now
            self._lead(t)
        elif b == self.leader:
            self.iso_view = None
            self._recompute_hw(t)
        elif self.up[i] and self.leader >= 0 and not self.unaware:
            self._truncate_to_leader(i)
        if b == self.target and self.leader != b:
            self._schedule_switch(t)
        if self.leader < 0 and self.up[i]:
            self._elect(t)

    def _on_fence(self, t: int, b: int) -> None:
        i = self.ix[b]
        if self.unreach[i] < 0 or self.unreach[i] + self.session_us != t:
            return
        self._fence(t, b)

    def _fence(self, t: int, b: int) -> None:
        self.unreach[self.ix[b]] = -1
        self._leave_isr(b)
        if b == self.leader:
            self._elect(t)
        else:
            self._recompute_hw(t)

    def _leave_isr(self, b: int) -> None:
        if b not in self.isr:
            return
        if len(self.isr) == 1 and not self.p.eligible_leader_replicas:
            return
        self.isr.remove(b)
        self._maybe_elr(b)

    def _maybe_elr(self, b: int) -> None:
        if self.p.eligible_leader_replicas and len(self.isr) < self.min_isr and b not in self.elr:
            self.elr.append(b)

    def _electable(self, b: int) -> bool:
        """The controller's view (SPEC §3.7 K-3, as `KafkaReference._electable`): up, registered, and, if
        isolated, not yet fenced."""
        i = self.ix[b]
        if not self.up[i] or self.must_register[i]:
            return False
        return bool(not self.iso[i] or self.unreach[i] >= 0)

    def _elect(self, t: int) -> None:
        cands = [b for b in self._in_order(self.isr) if self._electable(b)]
        chosen, new_isr = (cands[0], self.isr) if cands else (-1, None)
        if chosen < 0 and self.p.eligible_leader_replicas:
            elr = [b for b in self._in_order(self.elr) if self._electable(b)]
            if elr:
                chosen, new_isr = elr[0], [elr[0]]
                self.elr.remove(elr[0])
        if chosen < 0 and self.p.eligible_leader_replicas and not self.p.unclean_leader_election \
                and not self.isr and not self.elr and self._electable(self.last_leader):
            chosen, new_isr = self.last_leader, [self.last_leader]  # SPEC §3.7 K-4, as the reference
        if chosen < 0 and self.p.unclean_leader_election:
            up = [b for b in self.order if self._electable(b)]
            if up:
                chosen, new_isr = up[0], [up[0]]
                self.elr = []
        old = self.leader
        if old >= 0 and self._can_be_zombie(old) and old == self.target and self.zombie is None \
                and not self.unaware:
            self.zombie = {"broker": old, "epoch": self.epoch, "view": self.iso_view or (old,), "hw": self.hw}
        self.unaware = False
        if chosen < 0:
            self.leader = -1
            self.iso_view = None
            return
        self.isr = self._in_order(new_isr)
        self._set_leader(t, chosen)

    def _clients_stay(self) -> bool:
        """As `KafkaReference._clients_stay`: only a zombie or a restarted unregistered old leader keeps them."""
        tgt = self.target
        if tgt < 0 or not self.up[self.ix[tgt]] or not self.iso[self.ix[tgt]]:
            return False
        return bool(self.must_register[self.ix[tgt]]) or self._is_zombie_target()

    def _set_leader(self, t: int, n: int) -> None:
        """The controller elects n; an isolated n learns of it only when it heals (SPEC §3.7 K-3)."""
        self.leader = n
        self.last_leader = n
        self.epoch += 1
        self.iso_view = None
        self.down_pub = None
        self._zombie_stops(n)
        if self.p.eligible_leader_replicas and len(self.isr) >= self.min_isr:
            self.elr = []
        ni = self.ix[n]
        if self.iso[ni]:
            self.unaware = True
            self.hw = min(self.hw, int(self.log_len[ni]))
            if not self._clients_stay():
                self._schedule_switch(t)
            return
        self._lead(t)

    def _lead(self, t: int) -> None:
        """The leader takes over: truncation (rule 9), followers caught up, the high watermark restarts."""
        n = self.leader
        ni = self.ix[n]
        self.epoch_start = int(self.log_len[ni])
        for i, b in enumerate(self.order):
            if b != n and not (self.zombie is not None and b == self.zombie["broker"]):
                self._truncate_to_leader(i)
            if b != n:
                self.fetched[i] = self.log_len[i]
                self.lcu[i] = t
        self._rebuild_leader_log()
        if self._frozen(len(self.isr)):
            self.hw = min(self.hw, int(self.log_len[ni]))
        else:
            self.hw = min(int(self.log_len[ni]) if b == n else int(self.fetched[self.ix[b]]) for b in self.isr)
        self._mark_visible(t, n, 0, self.hw)
        if not self._clients_stay():
            self._schedule_switch(t)
        self._ack_committed(t)  # as the reference: clients already on the new leader need no failover

    def _truncate_to_leader(self, i: int) -> None:
        ldr = self.leader
        if ldr < 0 or self.order[i] == ldr:
            return
        self._truncate(i, _common_prefix(self.runs[i], self.runs[self.ix[ldr]]))

    def _rebuild_leader_log(self) -> None:
        app, cum = [], [np.zeros(1, dtype=np.int64)]
        total = 0
        for e, s, end in self.runs[self.ix[self.leader]]:
            start, a, sz = self.epochs[e]
            app.append(a.view[s - start: end - start])
            c = np.cumsum(sz.view[s - start: end - start]) + total
            cum.append(c)
            total = int(c[-1]) if len(c) else total
        self.lead_app = Grow(np.concatenate(app) if app else np.zeros(0, dtype=np.int64))
        self.lead_cum = Grow(np.concatenate(cum))

    def _schedule_switch(self, t: int) -> None:
        self._push(t + self.p.client_failover_ms * MS, C_CLIENT, "switch", 0)

    def _schedule_refresh(self, t: int) -> None:
        self._push(t + self.p.metadata_max_age_ms * MS, C_CLIENT, "refresh", t)

    def _on_refresh(self, t: int, since: int) -> None:
        tgt = self.target
        if tgt < 0 or not self.iso[self.ix[tgt]] or self.iso_since[self.ix[tgt]] > since:
            return
        if self.leader != tgt:
            self._schedule_switch(t)
        else:
            self._schedule_refresh(t)

    def _on_tick(self, t: int, _: int) -> None:
        """Rule 6: ISR check tick."""
        period = self.p.replica_lag_time_max_ms * MS // 2
        if t + period <= self.duration_us:
            self._push(t + period, C_TICK, "tick", 0)
        ldr = self.leader
        if ldr < 0 or not self._eligible(ldr):
            return
        leo = int(self.log_len[self.ix[ldr]])
        for f in list(self.isr):
            i = self.ix[f]
            if f != ldr and t - self.lcu[i] > self.p.replica_lag_time_max_ms * MS and self.fetched[i] < leo:
                self.isr.remove(f)
                self._maybe_elr(f)
        self._recompute_hw(t)

    def _expand(self, t: int, b: int) -> None:
        """Rule 7, applied right after the report that brought b up to the high watermark."""
        self.isr = self._in_order([*self.isr, b])
        if b in self.elr:
            self.elr.remove(b)
        if self.p.eligible_leader_replicas and len(self.isr) >= self.min_isr:
            self.elr = []
        self._recompute_hw(t)

    def _recompute_hw(self, t: int) -> None:
        ldr = self.leader
        if ldr < 0 or not self.up[self.ix[ldr]] or self.must_register[self.ix[ldr]]:
            return
        view = self._view()
        if ldr not in view:
            return  # the leader just left the ISR (KIP-966 unclean restart); an election follows
        li = self.ix[ldr]
        if not self._frozen(len(view)):
            cand = min(int(self.log_len[li]) if b == ldr else int(self.fetched[self.ix[b]]) for b in view)
            if cand > self.hw:
                old = self.hw
                self.hw = cand
                self._mark_visible(t, ldr, old, cand)
        self._ack_committed(t)

    def _mark_visible(self, t: int, broker: int, lo: int, hi: int) -> None:
        if self.pend.n == 0 or hi <= lo:
            return
        pe, po = self.pend["pe"], self.pend["po"]
        vis = self.pend.cols["vis"]
        rows = np.flatnonzero((po >= lo) & (po < hi) & (vis[: self.pend.n] == NULL_US) & (pe >= 0))
        if len(rows):
            rows = rows[runs_contain(_runs_array(self.runs[self.ix[broker]]), pe[rows], po[rows])]
            vis[rows] = t
        self._extra_visible(broker, lo, hi, t=t)

    def _ack_committed(self, t: int) -> None:
        srv = self._serving()
        if srv < 0 or self.acks is Acks.ZERO or self.pend.n == 0:
            return
        st = self.pend.cols["state"]
        rows = np.flatnonzero((st[: self.pend.n] == APPENDED) & (self.pend["req"] <= t) & (self.pend["dead"] >= t))
        if not len(rows):
            return
        pe, po = self.pend["pe"][rows], self.pend["po"][rows]
        held = runs_contain(_runs_array(self.runs[self.ix[srv]]), pe, po)
        ok = held if self.acks is Acks.ONE else held & (po < self._serving_hw())
        st[rows[ok]] = ACKED
        self.pend.cols["ack"][rows[ok]] = t

    def _on_switch(self, t: int, _: int) -> None:
        """Clients reach the current leader and retry every unacknowledged message within its deadline (rule 8)."""
        self.target = self.leader
        self.zombie = None
        n = self.pend.n
        if n == 0:
            return
        st = self.pend.cols["state"]
        rows = np.flatnonzero((st[:n] <= APPENDED) & (self.pend["dead"] >= t))
        lazy = rows[st[rows] == REFUSED]
        if len(self.sched_row):
            lazy = lazy[~np.isin(lazy, self.sched_row)]
        self._skip_refused_retries(lazy, t)  # their retries before t were refused: they count (K-2)
        if len(self.sched_row):  # their pending retries are superseded by this attempt
            keep = ~np.isin(self.sched_row, rows)
            self.sched_key, self.sched_row = self.sched_key[keep], self.sched_row[keep]
        if not len(rows):
            return
        srv = self._serving()
        held = np.zeros(len(rows), dtype=bool)
        if srv >= 0:
            runs = _runs_array(self.runs[self.ix[srv]])
            held = runs_contain(runs, self.pend["pe"][rows], self.pend["po"][rows])
            if self.extra:
                self._promote_extra(rows, held, runs)
        hrows = rows[held]
        st[hrows] = APPENDED  # the idempotent retry finds its copy
        self.pend.cols["req"][hrows] = t
        retry = rows[~held]
        retry = retry[np.argsort(self.pend["msg"][retry], kind="stable")]
        self._attempt_now(t, retry)
        self._ack_committed(t)

    def _promote_extra(self, rows, held, runs) -> None:
        """A retried message whose earlier copy the new leader holds: that copy becomes its position."""
        by_msg = {}
        for m, e, o in self.extra:
            by_msg.setdefault(m, []).append((e, o))
        msgs = self.pend["msg"]
        for j, r in enumerate(rows):
            if held[j] or int(msgs[r]) not in by_msg:
                continue
            for e, o in by_msg[int(msgs[r])]:
                if runs_contain(runs, np.array([e]), np.array([o]))[0]:
                    cur = (int(msgs[r]), int(self.pend["pe"][r]), int(self.pend["po"][r]))
                    self.extra.remove((int(msgs[r]), e, o))
                    self.extra.append(cur)
                    self.pend.cols["pe"][r], self.pend.cols["po"][r] = e, o
                    held[j] = True
                    break

    def _attempt_now(self, t: int, rows: np.ndarray) -> None:
        """Attempts at a control instant (the switch), in msg_id order."""
        if not len(rows):
            return
        srv = self._serving()
        st = self.pend.cols["state"]
        if srv < 0:
            st[rows] = WAITING
            return
        if self._refusing():
            st[rows] = REFUSED
            self.pend.cols["anchor"][rows] = t
            self.pend.cols["nref"][rows] += 1
            return
        si = self.ix[srv]
        epoch = self._serving_epoch()
        offsets = int(self.log_len[si]) + np.arange(len(rows))
        self._move_positions(rows)
        self.pend.cols["pe"][rows] = epoch
        self.pend.cols["po"][rows] = offsets
        self._append_entries(si, epoch, np.full(len(rows), t, dtype=np.int64), self.pend["size"][rows], offsets)
        st[rows] = APPENDED
        self.pend.cols["req"][rows] = t
        if self.acks is Acks.ONE:
            st[rows] = ACKED
            self.pend.cols["ack"][rows] = t
        if self._is_zombie_target():
            self._zombie_commit(t)
        else:
            self._recompute_hw(t)

    def _zombie_commit(self, t: int) -> None:
        z = self.zombie
        if z["view"] == (z["broker"],) and not self._frozen(1):
            n = int(self.log_len[self.ix[z["broker"]]])
            self._mark_visible(t, z["broker"], z["hw"], n)
            z["hw"] = n
        self._ack_committed(t)

    def _retry_delay_us(self, n: np.ndarray) -> np.ndarray:
        """Wait before the n-th retry of a refused message (SPEC §3.7 K-2, as `KafkaReference._retry_backoff_us`):
        min(retry_backoff_max_ms, retry_backoff_ms × 2^(n−1)), computed without overflow."""
        base, cap = self.p.retry_backoff_ms * MS, self.p.retry_backoff_max_ms * MS
        doublings = 0  # the first exponent at which the backoff reaches the cap
        while base << doublings < cap:
            doublings += 1
        e = n - 1
        return np.where(e >= doublings, cap, base << np.minimum(e, doublings))

    def _skip_refused_retries(self, rows: np.ndarray, t: int) -> np.ndarray:
        """Rows refused while the serving broker kept refusing: their retries strictly before t were refused too
        (not materialized, see `_reschedule_pool`). Advances each row's last refusal (`anchor`) and refusal count
        (`nref`) over them and returns its next retry time, the first at or after t (SPEC §3.7 K-2)."""
        if not len(rows):
            return np.zeros(0, dtype=np.int64)
        cap = self.p.retry_backoff_max_ms * MS
        anchor, nref = self.pend["anchor"][rows].copy(), self.pend["nref"][rows].copy()
        nxt = anchor + self._retry_delay_us(nref)
        while True:
            behind = nxt < t
            if not behind.any():
                break
            delay = self._retry_delay_us(nref + 1)
            at_cap = behind & (delay >= cap)
            if at_cap.any():  # constant steps from here: jump over all but the last one before t
                k = (t - nxt[at_cap] - 1) // cap  # further retries strictly before t after nxt
                anchor[at_cap] = nxt[at_cap] + k * cap
                nref[at_cap] += 1 + k
                nxt[at_cap] = anchor[at_cap] + cap
            step = behind & ~at_cap
            anchor[step] = nxt[step]
            nref[step] += 1
            nxt[step] = anchor[step] + delay[step]
        self.pend.cols["anchor"][rows] = anchor
        self.pend.cols["nref"][rows] = nref
        return nxt

    def _reschedule_pool(self, t: int) -> None:
        """Refused messages retry after an exponential backoff (rule 3, SPEC §3.7 K-2). While the serving broker
        refuses, those retries would be refused again, so they are only materialized once it may not refuse."""
        if self.acks is not Acks.ALL or self.pend.n == 0:
            return
        if self._serving() >= 0 and self._refusing():
            return
        st = self.pend["state"]
        rows = np.flatnonzero(st == REFUSED)
        if len(self.sched_row):
            rows = rows[~np.isin(rows, self.sched_row)]
        if not len(rows):
            return
        nxt = self._skip_refused_retries(rows, t)
        ok = nxt <= self.pend["dead"][rows]
        all_keys = np.concatenate([self.sched_key, _key(nxt[ok], C_RETRY)])
        all_rows = np.concatenate([self.sched_row, rows[ok]])
        order = np.lexsort((self.pend["msg"][all_rows], all_keys))  # same instant: msg_id order
        self.sched_key, self.sched_row = all_keys[order], all_rows[order]

    # ---------------------------------------------------------------------------------- end of trace
    def _final_view(self) -> FinalView:
        srv = self._serving()
        if srv < 0:
            end_runs, end_hw, end_up = np.zeros((0, 3), dtype=np.int64), 0, False
        else:
            end_runs, end_hw, end_up = _runs_array(self.runs[self.ix[srv]]), self._serving_hw(), True
        # SPEC §4.1: every down broker restarts and every isolation heals, then the rules run to the end.
        saved = (self.heap, self.pend, self.extra, self.cur_t)
        self.heap, self.pend = [], Table(_PENDING_COLS)
        t = self.duration_us
        for b in sorted(self.order):
            if not self.up[self.ix[b]]:
                self._restart(t, b)
        for b in sorted(self.order):
            if self.iso[self.ix[b]]:
                self._heal(t, b)
        if self.leader >= 0:
            for i in range(len(self.order)):
                self._truncate_to_leader(i)
        final_runs = None if self.leader < 0 else _runs_array(self.runs[self.ix[self.leader]])
        self.heap, self.pend, self.extra, self.cur_t = saved
        return FinalView(final_runs, end_runs, end_hw, end_up)


def replay_partition(policy: KafkaPolicy, partition: int, replicas: tuple[int, ...], events: PartitionEvents,
                     duration_us: int) -> PartitionResult:
    """Kernel replay of one partition in one pass."""
    replay = KafkaPartitionReplay(policy, partition, replicas, duration_us)
    replay.advance(events, duration_us + 1)
    return replay.finish()
