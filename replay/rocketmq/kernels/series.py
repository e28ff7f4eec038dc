"""Steady segments of the `rocketmq-controller` kernel while a zombie (a replaced master that clients still reach,
C7) takes writes, as whole-array numpy operations (the other segments run in compiled code, `stretch`;
the differential suites hold both to the reference): a follower's log end
after each report is a running maximum of `searchsorted` over the leader's append times (SPEC §3.2 rule 5),
commit points are element-wise minimum / k-th largest values over the members' series, ack and visibility times
are `searchsorted`s of offsets into those series."""

from __future__ import annotations

import numpy as np

from replay.results import runs_contain
from replay.rocketmq.control import (
    C_ARRIVE,
    INF,
    KEY,
)
from replay.rocketmq.kernels.common import (
    C_PRODUCE,
    C_REPLICATE,
    FAILED,
    NONE,
    WAITING,
    set_state,
)
from replay.shared.kernels.arrays import (
    due_segment,
    forward_fill,
    joined_intervals,
    kth_largest_columns,
    prefix_runs,
    runs_array,
)
from schemas.outcomes import NULL_US, Error
from schemas.units import MS


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


def kth_largest_series(stack: np.ndarray, k: int) -> np.ndarray:
    """Element-wise k-th largest over the rows of `stack` (k ≥ 1); 0 where there are fewer rows."""
    m = stack.shape[0]
    if k > m:
        return np.zeros(stack.shape[1], dtype=np.int64)
    if k == 1:
        return stack.max(axis=0)
    if k == m:
        return stack.min(axis=0)
    return kth_largest_columns(np.ascontiguousarray(stack, dtype=np.int64), k)



class SeriesSegments:
    """Part of `controller.ControllerReplay`, which holds the state these methods use."""

    def _series(self, ctx: dict) -> dict:
        """Commit series of a segment: `ack` (ack point after each event, None = ack at append), `vis`
        (visibility point, None = at append), `hw` (timeline high watermark), `cut` (events consumed)."""
        raise NotImplementedError

    def _commit_series(self, ctx: dict, out: dict) -> None:
        """Carry the segment's final commit state."""

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
                msg, size, pay = self._produced(self.s_pidx[sl])
                self.s_pos += self._segment({
                    "key": self.s_key[sl], "code": self.s_code[sl], "broker": self.s_broker[sl],
                    "upto": self.s_upto[sl], "msg": msg, "size": size,
                    "row": np.full(hi - self.s_pos, NONE, dtype=np.int64), "pay": pay,
                })
                self._compact()  # keeps the pending table (and the scans over it) at about a segment's size
                continue
            due = due_segment(self.s_key, self.s_pos, self.sched_key, limit_key)
            if due is None:
                return
            keys, is_tr, ti, si, shi = due
            msg, size, pay = self._produced(np.where(is_tr, self.s_pidx[ti], NONE))
            seg = {
                "key": keys,
                "code": np.where(is_tr, self.s_code[ti], C_ARRIVE),
                "broker": np.where(is_tr, self.s_broker[ti], NONE),
                "upto": np.where(is_tr, self.s_upto[ti], 0),
                "msg": msg, "size": size,
                "row": np.where(is_tr, NONE, self.sched_row[si] if shi else NONE),
                "pay": pay,
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
        li = self.ix[ldr] if ldr is not None else NONE
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
            set_state(st, arr_rows, FAILED)
            self.pend.cols["error"][arr_rows] = Error.NO_LEADER  # R2
        elif refusing:
            set_state(st, arr_rows, FAILED)
            # R2: refused before append. SPEC §3.7 C-2: refusals the faults decide were retried on another group by
            # routing (`rocketmq.control` C9), so this is a send's last attempt or a set only replication shrank
            self.pend.cols["error"][arr_rows] = Error.IN_SYNC_REPLICAS_NOT_ENOUGH
        elif len(arr_rows):
            si = self.ix[srv]
            epoch = self._epoch_of(srv)
            offsets = self._append_entries(si, epoch, arr_ts, self.pend["size"][arr_rows])
            c = self.pend.cols
            c["epoch"][arr_rows], c["offset"][arr_rows] = epoch, offsets
            c["taker_broker"][arr_rows], c["taker_epoch"][arr_rows] = srv, epoch
            c["taker_incarnation"][arr_rows] = self.incarnation[si]
            set_state(st, arr_rows, WAITING)
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
                offset = self.pend["offset"][rows]
                rows, offset = rows[offset < ack[-1]], offset[offset < ack[-1]]
                if len(rows):
                    at = np.searchsorted(ack, offset, side="right")
                    self._ack_rows(rows, ts[np.minimum(at, len(ts) - 1)])
        if vis is not None and len(vis) and vis[-1] > out.get("vis0", 0):
            lo = out.get("vis0", 0)
            offset, epoch = self.pend["offset"], self.pend["epoch"]
            v = self.pend.cols["visible_us"]
            cand = np.flatnonzero((offset >= lo) & (offset < vis[-1]) & (v[:n] == NULL_US) & (epoch >= 0))
            if len(cand):
                cand = cand[runs_contain(runs_array(self.runs[li]), epoch[cand], offset[cand])]
                at = np.searchsorted(vis, offset[cand], side="right")
                v[cand] = ts[np.minimum(at, len(ts) - 1)]

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
                tl.unavail.extend(joined_intervals(lo[lo < hi], hi[lo < hi]))
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

    def _cut(self, t: int, out: dict) -> None:
        pass
