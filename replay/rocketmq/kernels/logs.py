"""The RocketMQ kernels' logs: runs of (epoch, start, end) per broker, appends, truncation, adoption (C1), data loss."""

from __future__ import annotations

import numpy as np

from replay.shared.kernels.arrays import Grow, append_time_at, common_prefix, extend_runs, prefix_runs
from schemas.trace import Kind


class GroupLogs:
    """Part of `group.GroupReplay`: the brokers' logs as runs of epochs, the leader cache."""

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
        end = start_off + len(ts)
        extend_runs(self.runs[i], epoch, start_off, len(ts))
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
        """Append time of the entry at `offset` of broker b's log."""
        return append_time_at(self.runs[self.ix[b]], self.epochs, offset)

    def _lose_data(self, t: int, i: int, kind: Kind) -> None:
        """SPEC §2.2 / §3.3 rule 6: crash keeps everything, power loss the durable prefix, disk loss nothing."""
        if kind is Kind.POWER_LOSS:
            self._truncate(i, self.flush[i].durable(t))
        elif kind is Kind.DISK_LOSS:
            self._truncate(i, 0)
        self.flush[i].reset(int(self.log_len[i]), int(self.nbytes[i]), t)
        self.inc_end[i].append(t)
        self.incarnation[i] += 1
