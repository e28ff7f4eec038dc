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
from replay.kernels._arrays import Grow, Table, due_segment
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
INF = np.iinfo(np.int64).max // 64
# Position of an event within its instant (SPEC §2.2): trace kinds 0-8, then derived events.
C_REPLICATE, C_PRODUCE = int(Kind.REPLICATE), int(Kind.PRODUCE)
C_FENCE, C_TICK, C_CLIENT, C_RETRY = 9, 10, 11, 12
WAITING, REFUSED, APPENDED, ACKED, FAILED = range(5)
_PENDING_COLS = {
    "msg": np.int64, "prod": np.int64, "size": np.int64, "dead": np.int64, "state": np.int8, "err": np.int8,
    "anchor": np.int64, "pe": np.int64, "po": np.int64, "req": np.int64, "ack": np.int64, "vis": np.int64,
    # carried untouched to the outputs (PartitionEvents.payload)
    "pid": np.int64, "part": np.int64, "keyid": np.int64,
}
PAYLOAD = ("pid", "part", "keyid")


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
        self.pend_dur: list[list[list[int]]] = [[] for _ in range(n)]  # [durable_at_us, length] buckets
        self.epochs: dict[int, tuple[int, Grow, Grow]] = {0: (0, Grow(), Grow())}  # epoch -> (start, app, size)
        # Rule 2: the first replica leads; the ISR starts as all replicas.
        self.leader = self.order[0]
        self.epoch = 0
        self.isr: list[int] = list(self.order)
        self.elr: list[int] = []
        self.hw = 0
        self.iso_view: tuple[int, ...] | None = None
        self.down_pub: tuple[int, int] | None = None
        self.lead_app = Grow()
        self.lead_cum = Grow(np.zeros(1, dtype=np.int64))
        self.target = self.order[0]
        self.zombie: dict | None = None
        self.heap: list[tuple[int, int, str, int]] = []
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
        known = np.isin(ev.broker_id, np.array(self.order, dtype=np.int64))
        bk, bts, bb, bu = ev.broker_kind[known], ev.broker_ts[known], ev.broker_id[known], ev.broker_upto[known]
        ctrl = bk < C_REPLICATE
        c_key = _key(bts[ctrl], bk[ctrl].astype(np.int64))
        c_kind, c_b = bk[ctrl], bb[ctrl]
        rep = bk == C_REPLICATE
        s_key = np.concatenate([_key(bts[rep], C_REPLICATE), _key(ev.produce_ts, C_PRODUCE)])
        order = np.argsort(s_key, kind="stable")
        self.s_key = s_key[order]
        nrep = int(rep.sum())
        is_rep = order < nrep
        self.s_code = np.where(is_rep, C_REPLICATE, C_PRODUCE)
        pidx = np.where(is_rep, 0, order - nrep)
        ridx = np.where(is_rep, order, 0)
        self.s_broker = np.where(is_rep, bb[rep][ridx] if nrep else 0, -1)
        self.s_upto = np.where(is_rep, bu[rep][ridx] if nrep else 0, 0)
        self.s_msg = np.where(is_rep, -1, ev.produce_msg[pidx] if len(ev.produce_msg) else 0)
        self.s_size = np.where(is_rep, 0, ev.produce_size[pidx] if len(ev.produce_size) else 0)
        self.s_payload = {}
        for name in PAYLOAD:
            col = (ev.payload or {}).get(name)
            self.s_payload[name] = np.where(is_rep, -1, col[pidx] if col is not None and len(col) else -1)
        self.s_pos = 0
        # a sentinel at the end keeps index arithmetic valid when a chunk has no stream events
        self.s_key = np.append(self.s_key, INF)
        for name in ("s_code", "s_broker", "s_upto", "s_msg", "s_size"):
            setattr(self, name, np.append(getattr(self, name), 0))
        self.s_payload = {k: np.append(v, -1) for k, v in self.s_payload.items()}
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
                getattr(self, "_on_" + what)(t, arg)
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
        return self.p.strict_min_isr and size < self.p.min_insync_replicas

    def _is_zombie_target(self) -> bool:
        return self.zombie is not None and self.target == self.zombie["broker"]

    def _serving(self) -> int:
        t = self.target
        if t < 0 or not self.up[self.ix[t]] or self.must_register[self.ix[t]]:
            return -1  # a restarted broker serves nothing until its new incarnation registers
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
    def _durable_at(self, written: np.ndarray) -> np.ndarray:
        if self.p.flush is FlushMode.SYNC:
            return written
        if self.p.flush_interval_ms is None:
            period, expire = OS_WRITEBACK_PERIOD_MS * MS, OS_WRITEBACK_EXPIRE_MS * MS
            return -(-(written + expire) // period) * period
        period = self.p.flush_interval_ms * MS
        return -(-written // period) * period

    def _wrote(self, i: int, written: np.ndarray, lengths: np.ndarray) -> None:
        """Record that replica i's log reached lengths[j] at written[j] (for power-loss durability)."""
        if len(written) == 0:
            return
        if self.p.flush is FlushMode.SYNC:
            self.flushed_all[i] = max(self.flushed_all[i], int(lengths[-1]))
            return
        d = self._durable_at(written)
        last = np.flatnonzero(np.append(d[1:] != d[:-1], True))  # last write of every durability bucket
        buckets = self.pend_dur[i]
        for dd, ln in zip(d[last].tolist(), lengths[last].tolist(), strict=True):
            if buckets and buckets[-1][0] == dd:
                buckets[-1][1] = max(buckets[-1][1], ln)
            else:
                buckets.append([dd, ln])
        if len(buckets) > 64:  # fold buckets that are surely on disk by now
            now = int(written[-1])
            keep = [bk for bk in buckets if bk[0] >= now]
            for bk in buckets:
                if bk[0] < now:
                    self.flushed_all[i] = max(self.flushed_all[i], bk[1])
            self.pend_dur[i] = keep

    def _truncate(self, i: int, length: int) -> None:
        length = min(length, int(self.log_len[i]))
        self.log_len[i] = length
        self.runs[i] = _prefix_runs(self.runs[i], length)
        self.flushed_all[i] = min(self.flushed_all[i], length)
        self.fetched[i] = min(self.fetched[i], length)
        for bk in self.pend_dur[i]:
            bk[1] = min(bk[1], length)

    # ================================================================================== stream segments
    def _stream(self, limit_key: int) -> None:
        """Process produce/replicate events and scheduled retries with keys below `limit_key`."""
        while True:
            due = due_segment(self.s_key, self.s_pos, self.sched_key, limit_key)
            if due is None:
                return
            keys, is_tr, ti, si, shi = due
            seg = {
                "key": keys,
                "code": np.where(is_tr, self.s_code[ti], C_RETRY),
                "broker": np.where(is_tr, self.s_broker[ti], -1),
                "upto": np.where(is_tr, self.s_upto[ti], 0),
                "msg": np.where(is_tr, self.s_msg[ti], -1),
                "size": np.where(is_tr, self.s_size[ti], 0),
                "row": np.where(is_tr, -1, self.sched_row[si] if shi else -1),
                **{k: np.where(is_tr, v[ti], -1) for k, v in self.s_payload.items()},
            }
            self._segment(seg, is_tr)
            # loop: an ISR expansion may have cut the segment or scheduled retries before limit_key

    def _segment(self, seg: dict, is_tr: np.ndarray) -> None:
        """One steady segment: consumes its events, all of them unless an ISR expansion cuts it short."""
        key, code = seg["key"], seg["code"]
        ts = key // 16
        n = len(key)
        srv = self._serving()
        ldr = self.leader
        li = self.ix[ldr] if ldr >= 0 else -1
        l_ok = ldr >= 0 and self._eligible(ldr)
        l_up = ldr >= 0 and bool(self.up[li]) and not self.must_register[li]
        refusing = srv >= 0 and self._refusing()
        accepting = srv >= 0 and not refusing
        is_arr = code != C_REPLICATE
        is_new = code == C_PRODUCE
        acks0 = self.acks is Acks.ZERO
        # acks=0 is never refused (rule 3 is for acks=all); every arrival is appended when a broker serves.
        appended = is_arr & (srv >= 0) & (accepting | acks0)
        to_leader = srv >= 0 and srv == ldr
        leo0 = int(self.log_len[li]) if li >= 0 else 0
        leo_after = leo0 + np.cumsum(appended) if to_leader else np.full(n, leo0, dtype=np.int64)
        # ----- follower reports (rule 5)
        rep_valid = (code == C_REPLICATE) & l_ok
        if rep_valid.any():
            rb = seg["broker"]
            ok_b = np.array([b != ldr and self._eligible(b) for b in self.order], dtype=bool)
            bi = np.full(len(rb), -1, dtype=np.int64)  # replica index of each report's broker (few replicas)
            for i, b in enumerate(self.order):
                bi[rb == b] = i
            rep_valid &= (bi >= 0) & ok_b[np.maximum(bi, 0)]
        lead_app = self.lead_app.view
        if to_leader and appended.any():
            lead_app = np.concatenate([lead_app, ts[appended]])
        view = self._view()
        frozen = self._frozen(len(view))
        cand = leo_after.copy()
        follower = {}
        expand_at = n
        expand_b = -1
        for b in self.order:
            if b == ldr:
                continue
            i = self.ix[b]
            idx = np.flatnonzero(rep_valid & (seg["broker"] == b))
            if len(idx):
                count = np.minimum(np.searchsorted(lead_app, seg["upto"][idx], side="right"), leo_after[idx])
                new_len = np.maximum.accumulate(np.maximum(count, self.log_len[i]))
                caught = new_len == leo_after[idx]
                lcu = np.maximum.accumulate(np.maximum(np.where(caught, ts[idx], seg["upto"][idx]), self.lcu[i]))
                follower[b] = (idx, new_len, lcu)
                pos = np.searchsorted(idx, np.arange(n), side="right") - 1
                series = np.where(pos >= 0, new_len[np.maximum(pos, 0)], self.fetched[i])
            else:
                series = None
            if b in view and l_up and not frozen:
                cand = np.minimum(cand, series if series is not None else self.fetched[i])
        if l_up and not frozen:
            hw = np.maximum(self.hw, cand)
        else:
            hw = np.full(n, self.hw, dtype=np.int64)
        # ----- ISR expansion (rule 7) cuts the segment after the report that triggers it
        for b, (idx, new_len, _) in follower.items():
            if b in self.isr:
                continue
            hit = np.flatnonzero(new_len >= hw[idx])
            if len(hit) and idx[hit[0]] < expand_at:
                expand_at, expand_b = int(idx[hit[0]]), b
        m = n if expand_b < 0 else expand_at + 1
        if m < n:
            ts, code, is_arr, is_new, appended = ts[:m], code[:m], is_arr[:m], is_new[:m], appended[:m]
            leo_after, hw = leo_after[:m], hw[:m]
            seg = {k: v[:m] for k, v in seg.items()}
        self._commit_segment(seg, ts, srv, ldr, refusing, is_arr, is_new, appended, to_leader, leo_after, hw,
                             {b: (idx[idx < m], nl[idx < m], lc[idx < m]) for b, (idx, nl, lc) in follower.items()})
        # The consumed events leave the queues *before* any handler below reads or edits them: a retry consumed
        # here (refused again, rule 3) must be rescheduled by `_reschedule_pool` after the expansion, not
        # mistaken for one still due, and `_resolve_deadlines` may filter the retry queue.
        took_tr = int(is_tr[:m].sum())
        self.s_pos += took_tr
        self.sched_key = self.sched_key[m - took_tr:]
        self.sched_row = self.sched_row[m - took_tr:]
        if expand_b >= 0:
            self._resolve_deadlines(int(ts[-1]))  # deadlines before the expansion saw the state before it
            self._expand(int(ts[-1]), expand_b)
            self._reschedule_pool(int(ts[-1]))

    def _commit_segment(self, seg, ts, srv, ldr, refusing, is_arr, is_new, appended, to_leader, leo_after, hw,
                        follower) -> None:
        if len(ts) == 0:
            return
        self._clock(int(ts[0]))  # the instant open before this segment ends with the state before it
        acks0 = self.acks is Acks.ZERO
        # ----- arrivals: new messages get rows; retries reuse theirs
        rows = seg["row"].copy()
        if is_new.any():
            new_ts = ts[is_new]
            k = len(new_ts)
            created = self.pend.append(
                msg=seg["msg"][is_new], prod=new_ts, size=seg["size"][is_new],
                dead=new_ts + self.p.delivery_timeout_ms * MS, state=np.full(k, WAITING, np.int8),
                err=np.zeros(k, np.int8), anchor=new_ts, pe=np.full(k, -1), po=np.full(k, -1),
                req=np.full(k, INF), ack=np.full(k, NULL_US), vis=np.full(k, NULL_US),
                **{name: seg[name][is_new] for name in PAYLOAD},
            )
            rows[is_new] = created
        arr_rows = rows[is_arr]
        arr_ts = ts[is_arr]
        arr_app = appended[is_arr]
        st, anchor = self.pend.cols["state"], self.pend.cols["anchor"]
        if acks0:
            st[arr_rows] = ACKED
            self.pend.cols["ack"][arr_rows] = arr_ts
        elif srv < 0:
            st[arr_rows] = WAITING
        elif refusing:
            st[arr_rows] = REFUSED  # NotEnoughReplicas; the retry grid continues from here
            anchor[arr_rows] = arr_ts
        # ----- appends to the serving broker
        if arr_app.any():
            a_rows, a_ts = arr_rows[arr_app], arr_ts[arr_app]
            si = self.ix[srv]
            epoch = self._serving_epoch()
            start_off = int(self.log_len[si])
            offsets = start_off + np.arange(len(a_rows))
            self._move_positions(a_rows)
            self.pend.cols["pe"][a_rows] = epoch
            self.pend.cols["po"][a_rows] = offsets
            self._append_entries(si, epoch, a_ts, self.pend.cols["size"][a_rows], offsets)
            if not acks0:
                st[a_rows] = APPENDED
                self.pend.cols["req"][a_rows] = a_ts
                if self.acks is Acks.ONE:
                    st[a_rows] = ACKED
                    self.pend.cols["ack"][a_rows] = a_ts
            if self._is_zombie_target() and srv == self.zombie["broker"] and self.zombie["view"] == (srv,) \
                    and not self._frozen(1):
                # A zombie whose ISR was itself alone commits on its own (rule 10).
                self.zombie["hw"] = int(self.log_len[si])
                vis = self.pend.cols["vis"]
                vis[a_rows] = np.where(vis[a_rows] == NULL_US, a_ts, vis[a_rows])
                if self.acks is Acks.ALL:
                    st[a_rows] = ACKED
                    self.pend.cols["ack"][a_rows] = a_ts
        # ----- follower copies (rule 5)
        for b, (idx, new_len, lcu) in follower.items():
            if not len(idx):
                continue
            i = self.ix[b]
            grew = np.flatnonzero(np.diff(np.concatenate([[self.log_len[i]], new_len])) > 0)
            final = int(new_len[-1])
            if final > self.log_len[i]:
                cum = self.lead_cum.view
                self.replication_bytes += int(cum[final] - cum[int(self.log_len[i])])
                self.runs[i] = _prefix_runs(self.runs[self.ix[ldr]], final)
                self._wrote(i, ts[idx[grew]], new_len[grew])
            self.log_len[i] = final
            self.fetched[i] = final
            self.lcu[i] = int(lcu[-1])
        # ----- high watermark: acks and visibility (rules 4, 12)
        old_hw = self.hw
        self.hw = int(hw[-1])
        if ldr >= 0 and self.hw > old_hw:
            self._settle_by_series(ts, hw, old_hw, ldr, acks=to_leader)
        self._instants(ts, hw, leo_after, srv, refusing)

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
        self._wrote(si, app_ts, offsets + 1)
        if self.order[si] == self.leader:
            self.lead_app.extend(app_ts)
            self.lead_cum.extend(self.lead_cum.view[-1] + np.cumsum(sizes))

    def _move_positions(self, rows: np.ndarray) -> None:
        """A message appended again keeps its earlier position for judging fate (a copy may survive)."""
        pe, po, msg = self.pend.cols["pe"], self.pend.cols["po"], self.pend.cols["msg"]
        had = rows[pe[rows] >= 0]
        for r in had:
            self.extra.append((int(msg[r]), int(pe[r]), int(po[r])))

    def _settle_by_series(self, ts, hw, old_hw, ldr, acks: bool) -> None:
        """Messages in the leader's log between the old and the new high watermark: commit times from the series."""
        n = self.pend.n
        if n == 0:
            return
        pe, po = self.pend["pe"], self.pend["po"]
        cand = np.flatnonzero((po >= old_hw) & (po < hw[-1]) & (pe >= 0))
        if len(cand) == 0:
            return
        runs = _runs_array(self.runs[self.ix[ldr]])
        cand = cand[runs_contain(runs, pe[cand], po[cand])]
        at = np.searchsorted(hw, po[cand], side="right")
        when = ts[np.minimum(at, len(ts) - 1)]
        vis = self.pend.cols["vis"]
        vis[cand] = np.where(vis[cand] == NULL_US, when, vis[cand])
        if acks and self.acks is Acks.ALL:
            st = self.pend.cols["state"]
            ack_t = np.maximum(when, self.pend["req"][cand])
            ok = (st[cand] == APPENDED) & (ack_t <= self.pend["dead"][cand])
            rows = cand[ok]
            st[rows] = ACKED
            self.pend.cols["ack"][rows] = ack_t[ok]
        self._extra_visible(ldr, old_hw, int(hw[-1]), ts, hw)

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

    def _instants(self, ts, hw, leo_after, srv, refusing) -> None:
        """Close every instant of the segment but the last: timeline rows and availability (vectorized)."""
        last_of = np.flatnonzero(np.append(ts[1:] != ts[:-1], True))  # last event of each instant
        if len(last_of) > 1:
            closed = last_of[:-1]
            tc = ts[closed]
            ldr = self.leader
            if ldr >= 0 and self.up[self.ix[ldr]] and not self.must_register[self.ix[ldr]]:
                leo_i, hw_i = leo_after[closed], hw[closed]
                rows = [StateRow(int(tc[j]), ldr, self.epoch, tuple(self.isr), int(leo_i[j]), int(hw_i[j]))
                        for j in self._changed_instants(tc, leo_i, hw_i)]
            else:  # no leader serving: the state cannot change inside the segment
                rows = [self._state_row(int(tc[0]))]
            for row in rows:
                last = self.last_row
                if last is None or (row.leader, row.leader_epoch, row.isr, row.log_end_offset,
                                    row.high_watermark) != (last.leader, last.leader_epoch, last.isr,
                                                            last.log_end_offset, last.high_watermark):
                    self._emit_row(row)
            blocked, stall = self._stall_series(closed, hw, leo_after, srv, refusing)
            self._close_avail(int(tc[0]))
            if blocked:
                self.unavail.append((int(tc[0]), int(tc[-1])))
            else:
                lo, hi = np.maximum(tc[:-1], stall[:-1]), tc[1:]
                self.unavail.extend(zip(lo[lo < hi].tolist(), hi[lo < hi].tolist(), strict=True))
            self.av_prev = (int(tc[-1]), blocked, int(stall[-1]))
        self.cur_t = int(ts[-1])

    def _changed_instants(self, tc, leo_i, hw_i) -> np.ndarray:
        """Instants whose end state differs from the previous one; of the non-control ones only each window's last
        can survive coalescing. The first instant is always checked (it may close a control change)."""
        changed = np.flatnonzero((leo_i[1:] != leo_i[:-1]) | (hw_i[1:] != hw_i[:-1])) + 1
        if len(changed):
            win = tc[changed] // self.window_us
            changed = changed[np.append(win[1:] != win[:-1], True)]
        return np.concatenate([[0], changed])

    def _stall_series(self, closed, hw, leo_after, srv, refusing) -> tuple[bool, np.ndarray]:
        """Availability at each closed instant, as `_avail()` would compute it there."""
        k = len(closed)
        if srv < 0 or (self.acks is Acks.ALL and refusing):
            return True, np.full(k, INF, dtype=np.int64)
        if self.acks is not Acks.ALL:
            return False, np.full(k, INF, dtype=np.int64)
        timeout = self.p.request_timeout_ms * MS
        if srv == self.leader:
            s_hw, s_leo = hw[closed], leo_after[closed]
            stall = np.full(k, INF, dtype=np.int64)
            waiting = s_hw < s_leo
            stall[waiting] = self.lead_app.view[s_hw[waiting]] + timeout
            return False, stall
        # a zombie: its high watermark only moves when it commits alone, and then nothing waits
        return False, np.full(k, self._avail()[1], dtype=np.int64)

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
        st = self.pend.cols["state"][: self.pend.n]
        due = (st <= APPENDED) & (self.pend["dead"] < t)
        if not due.any():
            return
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
        for d, ln in self.pend_dur[i]:
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
        self.pend_dur[i] = []
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
        self.pend_dur[i] = []
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
        self.pend_dur[i] = []
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
        if b == self.leader:
            self.iso_view = None
            self._recompute_hw(t)
        elif self.up[i] and self.leader >= 0:
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

    def _elect(self, t: int) -> None:
        cands = [b for b in self._in_order(self.isr) if self._eligible(b)]
        chosen, new_isr = (cands[0], self.isr) if cands else (-1, None)
        if chosen < 0 and self.p.eligible_leader_replicas:
            elr = [b for b in self._in_order(self.elr) if self._eligible(b)]
            if elr:
                chosen, new_isr = elr[0], [elr[0]]
                self.elr.remove(elr[0])
        if chosen < 0 and self.p.unclean_leader_election:
            up = [b for b in self.order if self._eligible(b)]
            if up:
                chosen, new_isr = up[0], [up[0]]
                self.elr = []
        old = self.leader
        if old >= 0 and self._can_be_zombie(old) and old == self.target and self.zombie is None:
            self.zombie = {"broker": old, "epoch": self.epoch, "view": self.iso_view or (old,), "hw": self.hw}
        if chosen < 0:
            self.leader = -1
            self.iso_view = None
            return
        self.isr = self._in_order(new_isr)
        self._set_leader(t, chosen)

    def _set_leader(self, t: int, n: int) -> None:
        self.leader = n
        self.epoch += 1
        self.iso_view = None
        self.down_pub = None
        self._zombie_stops(n)
        ni = self.ix[n]
        for i, b in enumerate(self.order):
            if b != n and not (self.zombie is not None and b == self.zombie["broker"]):
                self._truncate_to_leader(i)
            if b != n:
                self.fetched[i] = self.log_len[i]
                self.lcu[i] = t
        self._rebuild_leader_log()
        if self.p.eligible_leader_replicas and len(self.isr) >= self.min_isr:
            self.elr = []
        if self._frozen(len(self.isr)):
            self.hw = min(self.hw, int(self.log_len[ni]))
        else:
            self.hw = min(int(self.log_len[ni]) if b == n else int(self.fetched[self.ix[b]]) for b in self.isr)
        self._mark_visible(t, n, 0, self.hw)
        tgt = self.target
        if tgt < 0 or not self.up[self.ix[tgt]] or not self.iso[self.ix[tgt]]:
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

    def _reschedule_pool(self, t: int) -> None:
        """Refused messages retry every retry_backoff_ms (rule 3). While the serving broker refuses, those retries
        would be refused again on the same grid, so they are only materialized once it may not refuse."""
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
        b = self.p.retry_backoff_ms * MS
        anchor = self.pend["anchor"][rows]
        nxt = anchor + np.maximum(1, -(-(t - anchor) // b)) * b  # first retry at or after t on the grid
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
