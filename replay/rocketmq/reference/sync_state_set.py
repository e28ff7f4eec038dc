"""Part of the `rocketmq-controller` reference (`controller.py`): the SyncStateSet and its confirm offset (SPEC
§3.5): slaves leave it when they fall behind or their HA connection closes (SPEC §3.7 C-1), rejoin once caught
up; the high watermark is its minimum."""

from __future__ import annotations

from replay.rocketmq.control import C_CHECK
from schemas.trace import Kind
from schemas.units import MS


class ControllerSyncStateSet:
    """Part of `controller.ControllerReference`, which holds the state these methods use."""

    # ----- SyncStateSet and confirm offset (SPEC §3.5, §3.7 C-1)
    def _recompute_hw(self, t: int) -> None:
        """The high watermark (confirm offset) is the SyncStateSet minimum; it never decreases in an epoch."""
        m = self.master
        if m is None or self.blocked or not self.rep[m].up:
            return
        view = self._view(m)
        cand = min(len(self.rep[b].log) if b == m else self.rep[b].fetched for b in view)
        if cand > self.hw:
            if self.p.all_ack_in_sync_state_set:
                self._mark_visible(t, self.rep[m], self.hw, cand)
            self.hw = cand
        if not self.virtual:
            self._ack_upto(t, m, self.epoch, self._ack_point(m))

    def _progress(self, t: int, b: int) -> None:
        self._recompute_hw(t)
        if b not in self.sss and self.rep[b].fetched >= self.hw:
            self.sss = self._in_order([*self.sss, b])  # a slave rejoins once it reaches the confirm offset
            self._recompute_hw(t)

    def _on_check(self, t: int, _: int) -> None:
        """SPEC §3.5: a slave not caught up for ha_max_time_slave_not_catchup_ms leaves the SyncStateSet; checked
        by a master that is up and reachable 3000 ms after start, then every check_sync_state_set_period_ms
        (SPEC §3.7 C-1, `ReplicasManager`)."""
        period = self.p.check_sync_state_set_period_ms * MS
        if t + period <= self.duration_us:
            self._push(t + period, C_CHECK, "check")
        m = self.master
        if m is None or self.blocked or not self.rep[m].alive:
            return
        leo = len(self.rep[m].log)
        for f in list(self.sss):
            r = self.rep[f]
            if f != m and t - r.lcu > self.p.ha_max_time_slave_not_catchup_ms * MS and r.fetched < leo:
                self.sss.remove(f)
        self._recompute_hw(t)

    def _connection_lost(self, t: int, b: int, kind: Kind, was_iso: bool) -> None:
        """SPEC §3.7 C-1 (`AutoSwitchHAService.removeConnection`): a slave whose HA connection closes leaves the
        SyncStateSet at once: at its crash or shutdown; after a power loss, disk loss or isolation, when the
        master's housekeeping closes the silent connection ha_housekeeping_interval_ms later
        (`MessageStoreConfig.haHousekeepingInterval`), unless the catch-up check removed it first. A master that
        cannot reach the controller (isolated) changes nothing."""
        m = self.master
        if m is None or b == m or self.blocked or not self.rep[m].alive or b not in self.sss:
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
        if m is not None and b != m and not self.blocked and self.rep[m].alive and b in self.sss:
            self._shrink(t, b)

    def _shrink(self, t: int, b: int) -> None:
        self.sss.remove(b)
        self._recompute_hw(t)  # the confirm offset may move past what only b lacked
