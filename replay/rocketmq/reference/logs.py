"""Part of the group reference (`group.py`): the brokers' CommitLogs on disk: writes, truncation, what a power
or disk loss keeps (SPEC §2.2, §3.3 rule 6) and the flush rules that decide it (R3 in `interpreter.py`)."""

from __future__ import annotations

from replay.policies import OS_WRITEBACK_EXPIRE_MS, OS_WRITEBACK_PERIOD_MS, DLedgerPolicy, FlushMode
from replay.rocketmq.control import C_FLUSH
from replay.rocketmq.reference.state import Broker, Entry, common_prefix
from schemas.trace import Kind
from schemas.units import MS


class GroupReferenceLogs:
    """Part of `group.GroupReference`, which holds the state these methods use."""

    def _flush_mode(self) -> str:
        if self.p.flush is FlushMode.SYNC:
            return "sync"
        if self.p.flush_interval_ms is None:
            return "os"
        return "interval" if isinstance(self.p, DLedgerPolicy) else "least"

    def _durable_prefix(self, r: Broker, t: int) -> int:
        mode = self._flush_mode()
        if mode in ("sync",):
            return len(r.log)
        if mode == "least":
            return r.durable  # maintained by the flush ticks (a tick at t comes after the power loss)
        n = r.durable
        while n < len(r.log) and self._durable_at(r.written_us[n]) < t:
            n += 1
        return n

    def _durable_at(self, written: int) -> int:
        if self._flush_mode() == "os":
            period, expire = OS_WRITEBACK_PERIOD_MS * MS, OS_WRITEBACK_EXPIRE_MS * MS
            return -(-(written + expire) // period) * period
        period = self.p.flush_interval_ms * MS
        return -(-written // period) * period

    def _on_flush(self, t: int, _: int) -> None:
        """SPEC §3.3 flush: a tick flushes a broker's CommitLog when flush_least_bytes are dirty, or fully at the
        first tick at or after each multiple of flush_thorough_interval_ms (R3)."""
        period = self.p.flush_interval_ms * MS
        if t + period <= self.duration_us:
            self._push(t + period, C_FLUSH, "flush")
        thorough_us = self.p.flush_thorough_interval_ms * MS
        thorough = t // thorough_us > (t - period) // thorough_us
        for r in self.rep.values():
            if not r.up:
                continue
            dirty = sum(e.size for e in r.log[r.durable:])
            if dirty >= self.p.flush_least_bytes or thorough:
                r.durable = len(r.log)

    def _write(self, r: Broker, entries: list[Entry], t: int) -> None:
        r.log.extend(entries)
        r.written_us.extend([t] * len(entries))
        if self._flush_mode() == "sync":
            r.durable = len(r.log)

    def _truncate(self, r: Broker, length: int) -> None:
        del r.log[length:]
        del r.written_us[length:]
        r.durable = min(r.durable, length)
        r.fetched = min(r.fetched, length)

    def _lose_data(self, t: int, r: Broker, kind: Kind) -> None:
        """SPEC §2.2 / §3.3 rule 6: a crash keeps everything, power loss the durable prefix, disk loss nothing."""
        r.up = False
        r.incarnation += 1
        if kind is Kind.POWER_LOSS:
            self._truncate(r, self._durable_prefix(r, t))
        elif kind is Kind.DISK_LOSS:
            self._truncate(r, 0)
        r.durable = len(r.log)  # what is left is on disk (a shutdown flushes everything)

    def _adopt(self, t: int, r: Broker, source: Broker) -> None:
        """C1: the elected broker takes the best eligible log (as if it caught up from it)."""
        if source is r:
            return
        n = common_prefix(r.log, source.log)
        self._truncate(r, n)
        extra = source.log[n:]
        self._write(r, list(extra), t)
        self.replication_bytes += sum(e.size for e in extra)
