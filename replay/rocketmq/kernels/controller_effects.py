"""The `rocketmq-controller` kernel's control effects on data (SPEC §3.5, §3.7 C-1, C7): SyncStateSet shrinks when
HA connections close, master replacement (zombies), unblocking a new master with the best eligible log."""

from __future__ import annotations

from replay.rocketmq.control import (
    C_CHECK,
    STOPS,
)
from replay.rocketmq.kernels.common import NONE
from schemas.trace import Kind
from schemas.units import MS


class ControllerEffects:
    """Part of `controller.ControllerReplay`, which holds the state these methods use."""

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
        # the control plane decides who is a zombie (C7, a restarted master is none); the kernel keeps its data
        if old is not None and self.cp.zombie == old and self.zombie is None:
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
            return (runs[-1][0] if runs else NONE, int(self.log_len[self.ix[b]]), -self.ix[b])

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
