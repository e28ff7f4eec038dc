"""Part of the group reference (`group.py`): the timeline rows per instant (R6), the unavailability (R7) and
the end-of-trace judgement (SPEC §4)."""

from __future__ import annotations

import copy

import numpy as np

from replay.results import FinalView, MessageRecords, PartitionResult, StateRow, judge
from replay.shared.reference.records import epoch_runs, message_records, unavailable_intervals
from schemas.units import MS


class GroupReferenceOutputs:
    """Part of `group.GroupReference`, which holds the state these methods use."""

    def _row(self, t: int, leader: int | None, isr: tuple[int, ...], hw: int | None) -> StateRow:
        if leader is None:
            return StateRow(t, None, self.epoch, isr, None, None)
        return StateRow(t, leader, self.epoch, isr, len(self.rep[leader].log), hw)

    def _end_instant(self, t: int) -> None:
        row = self._state_row(t)
        last = self.rows[-1] if self.rows else None
        if last is None or (row.leader, row.leader_epoch, row.isr, row.log_end_offset, row.high_watermark) != (
                last.leader, last.leader_epoch, last.isr, last.log_end_offset, last.high_watermark):
            self.rows.append(row)
        self.avail.append((t, *self._availability()))

    def _stall_from(self, b: int, commit: int, timeout_ms: int) -> int | None:
        log = self.rep[b].log
        return None if commit >= len(log) else log[commit].append_us + timeout_ms * MS

    def _unavailable_intervals(self) -> list[tuple[int, int]]:
        return unavailable_intervals(self.avail, self.duration_us)

    def _finish(self) -> PartitionResult:
        end_runs, end_hw, end_up = self._end_view()
        final = copy.deepcopy(self)
        final.virtual = True
        final.heap = []
        final_log = final._recover(self.duration_us)  # SPEC §4.1: every broker back, rules run to the end
        view = FinalView(None if final_log is None else epoch_runs(final_log), end_runs, end_hw, end_up)
        return PartitionResult(self.unit, judge(self._records(), view), self.rows, self._unavailable_intervals(),
                               self.replication_bytes)

    def _records(self) -> MessageRecords:
        msgs, rec = message_records(self.msgs)
        keys = sorted({k for m in msgs for k in m.payload})
        rec.payload = {k: np.array([m.payload.get(k, -1) for m in msgs], dtype=np.int64) for k in keys}
        # a message's earlier appends (C3: attempts appended and retried), in append order
        extra = [(m.msg_id, e, o) for m in msgs for e, o in m.positions[:-1]]
        rec.extra_positions = np.array(extra, dtype=np.int64).reshape(-1, 3)
        return rec
