"""The `rocketmq-controller` family's kernel (SPEC §3.5): steady segments in compiled code (`stretch`),
except while a replaced master that clients still reach takes writes (a zombie, C7): its own log and frozen ack
point, as numpy series (`series`)."""

from __future__ import annotations

import heapq

import numpy as np

from replay.policies import (
    FIRST_SYNC_STATE_CHECK_MS,
    RocketMQControllerPolicy,
)
from replay.results import StateRow
from replay.rocketmq.control import (
    C_CHECK,
    INF,
    RouteClock,
    key_of,
)
from replay.rocketmq.kernels.controller_effects import ControllerEffects
from replay.rocketmq.kernels.group import GroupReplay
from replay.rocketmq.kernels.series import SeriesSegments, kth_largest_series
from replay.rocketmq.kernels.steady import CommitRule
from replay.rocketmq.kernels.stretch import SteadyRule, SteadySegments
from replay.shared.kernels.arrays import (
    runs_array,
)
from schemas.outcomes import Error
from schemas.units import MS, S


class ControllerReplay(ControllerEffects, SteadySegments, SeriesSegments, GroupReplay):
    """SPEC §3.5: Kafka-like SyncStateSet with RocketMQ acks, controller detection and C1/C7."""

    def __init__(self, policy: RocketMQControllerPolicy, unit: int, members: tuple[int, ...], duration_us: int,
                 window_us: int = S, clock: RouteClock | None = None) -> None:
        super().__init__(policy, unit, members, duration_us, window_us, clock)
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

    # ==================================================================================== steady segments
    def _stream(self, limit_key: int) -> None:
        srv = self._serving()
        if srv is not None and self._is_zombie(srv):
            SeriesSegments._stream(self, limit_key)
        else:
            SteadySegments._stream(self, limit_key)

    def _steady_rule(self) -> SteadyRule:
        """The compiled segment's rule while the master (or nobody) serves: `ControllerReference._arrive`,
        `_recompute_hw` and `_progress`."""
        ldr = self._data_leader()
        srv = self._serving()
        serves = srv is not None and srv == ldr
        refusing = srv is not None and self._refusing(srv)
        point = self._ack_point_now(ldr) if serves else None
        return SteadyRule(ldr, serves and not refusing, ldr is not None and bool(self.cp.alive(ldr)),
                          CommitRule.CONTROLLER, self.k, True, serves, self.hw if point is None else point,
                          refusal=Error.NO_LEADER if srv is None else Error.IN_SYNC_REPLICAS_NOT_ENOUGH, hw=self.hw,
                          hw_moves=ldr is not None and bool(self.cp.up[ldr]), all_ack=self.all_ack,
                          view=self._view(ldr) if ldr is not None else (), sss=tuple(self.sss))

    def _steady_done(self, commit: int, hw: int, expand: int | None) -> None:
        self.hw = hw
        if expand is not None:
            self._rejoin(self.cur_t, expand)

    def _rejoin(self, t: int, b: int) -> None:
        """`ControllerReference._progress`: a slave rejoins once it reaches the confirm offset."""
        self._resolve(t)
        self.sss = self._in_order([*self.sss, b])
        self._recompute_hw(t)

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
                ack = kth_largest_series(stack, self.k)
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
        self._rejoin(t, self._pending_expand)

    def _on_arrivals(self, s: int, rows: np.ndarray, ts: np.ndarray) -> None:
        c = self.pend.cols
        if not self.all_ack:
            c["visible_us"][rows] = ts  # B.7: the confirm offset is the master's max offset
        if self._is_zombie(s):
            z = self.zombie
            n = int(self.log_len[self.ix[s]])
            if z["view"] == (s,):
                if self.all_ack:
                    c["visible_us"][rows] = ts
                z["hw"] = n
            point = self._ack_point_now(s)
            if point is None:
                self._ack_rows(rows, ts)
            else:
                ok = c["offset"][rows] < point
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

    def _next_check(self, t: int) -> None:
        period = self.p.check_sync_state_set_period_ms * MS
        if t + period <= self.duration_us:
            self._push(t + period, C_CHECK, "check", 0)

    def _quiet(self, t: int, what: str) -> bool:
        """Whether the SyncStateSet check at t, with only produce and replicate events before it, would change
        nothing (`_on_check`). A check every 5 s ended a compiled segment: on `chaos` most of the segments.
        Sufficient, not necessary: the last time a slave was caught up (`lcu`) never decreases, so one caught up
        within ha_max_time_slave_not_catchup_ms of t now is not removed at t; the confirm offset and the acks are
        kept up to date by the compiled loop while the master serves (`steady.group_steady`), not
        otherwise, so a check under a master the clients do not reach runs."""
        if what != "check":
            return False
        m = self.master
        if m is None or self.blocked or not self.cp.alive(m):
            return True  # the check returns at once
        if self._serving() != m:
            return False
        # a slave outside the set that is up and reachable may rejoin before t, with the lcu it has then
        return not any(self._not_caught_up(i, t) for i, b in enumerate(self.order)
                       if b != m and (b in self.sss or self.cp.alive(b)))

    def _not_caught_up(self, i: int, t: int) -> bool:
        """SPEC §3.5: replica i was last caught up more than ha_max_time_slave_not_catchup_ms before t."""
        return t - int(self.lcu[i]) > self.p.ha_max_time_slave_not_catchup_ms * MS

    def _skip(self, t: int, what: str, arg: int) -> None:
        self._next_check(t)

    def _on_check(self, t: int, _: int) -> None:
        """SPEC §3.5: a slave not caught up for ha_max_time_slave_not_catchup_ms leaves the SyncStateSet."""
        self._next_check(t)
        m = self.master
        if m is None or self.blocked or not self.cp.alive(m):
            return
        leo = int(self.log_len[self.ix[m]])
        removed = False
        for f in list(self.sss):
            i = self.ix[f]
            if f != m and self._not_caught_up(i, t) and self.fetched[i] < leo:
                self.sss.remove(f)
                removed = True
        if removed or self._serving() != m:  # else the compiled loop kept both up to date (`_quiet`)
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

    def _end_view(self):
        srv = self._serving()
        if srv is None:
            return runs_array([]), 0, False
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
