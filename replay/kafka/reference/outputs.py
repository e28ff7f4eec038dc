"""The `kafka` reference interpreter's records: the partition's state rows and availability per instant, and the
end-of-trace recovery that judges every message's fate (SPEC §4.1-4.2)."""

from __future__ import annotations

import copy

import numpy as np

from replay.kafka.pipeline import plan_requests
from replay.policies import Acks
from replay.results import FinalView, MessageRecords, PartitionResult, StateRow, judge
from replay.shared.reference.records import epoch_runs, message_records, unavailable_intervals
from schemas.units import MS


class KafkaReferenceOutputs:
    """Part of `replay.kafka.reference.interpreter.KafkaReference`, which holds the state these methods use."""

    # ------------------------------------------------------------------------------ per-instant records
    def _end_instant(self, t: int) -> None:
        if self.virtual:
            return
        ldr = self.leader
        if ldr is None:
            row = StateRow(t, None, self.epoch, tuple(self.isr), None, None)
        elif (not self.rep[ldr].up or self.rep[ldr].must_register) and self.down_published is not None:
            leo, hw = self.down_published
            row = StateRow(t, ldr, self.epoch, tuple(self.isr), leo, hw)
        else:
            row = StateRow(t, ldr, self.epoch, tuple(self.isr), len(self.rep[ldr].log), self.hw)
        if not self.rows or (row.leader, row.leader_epoch, row.isr, row.log_end_offset, row.high_watermark) != (
                self.rows[-1].leader, self.rows[-1].leader_epoch, self.rows[-1].isr,
                self.rows[-1].log_end_offset, self.rows[-1].high_watermark):
            self.rows.append(row)
        self.avail.append((t, *self._availability()))

    def _availability(self) -> tuple[bool, int | None]:
        """(no up broker serves clients or acks=all is refused, time from which acks=all stalls)."""
        tgt = self._serving()
        if tgt is None:
            return True, None
        if self.p.acks is not Acks.ALL:
            return False, None
        if self._serving_view_size() < self.min_isr:
            return True, None
        # Stalled: the oldest entry still waiting for the high watermark has waited past request_timeout_ms.
        log, hw = self.rep[tgt].log, self._serving_hw()
        if hw >= len(log):
            return False, None
        return False, log[hw].append_us + self.p.request_timeout_ms * MS

    def _unavailable_intervals(self) -> list[tuple[int, int]]:
        return unavailable_intervals(self.avail, self.duration_us)

    # ---------------------------------------------------------------------------- end of trace (§4.1)
    def _finish(self) -> PartitionResult:
        end_view = self._end_view()
        final = copy.deepcopy(self)
        final.virtual = True
        final.heap = []
        t = self.duration_us
        for b in sorted(final.rep):  # SPEC §2.2: restarts, then heals, by broker id
            if not final.rep[b].up:
                final._restart(t, b)
        for b in sorted(final.rep):
            if final.rep[b].isolated:
                final._heal(t, b)
        if final.leader is not None:
            for r in final.rep.values():
                final._truncate_to_leader(r)
        final_runs = None if final.leader is None else epoch_runs(final.rep[final.leader].log)
        view = FinalView(final_runs, *end_view)
        records = self.client.apply(self._records(), self.rows, plan_requests)
        return PartitionResult(self.partition, judge(records, view), self.rows,
                               self._unavailable_intervals(), self.replication_bytes)

    def _end_view(self) -> tuple[np.ndarray, int, bool]:
        srv = self._serving()
        if srv is None:
            return epoch_runs([]), 0, False
        return epoch_runs(self.rep[srv].log), self._serving_hw(), True

    def _records(self) -> MessageRecords:
        msgs, rec = message_records(self.msgs)
        # earlier appends of retried messages: a copy of one may survive where the latest does not
        rec.extra_positions = np.array([(m.msg_id, e, o) for m in msgs for (e, o) in m.positions[:-1]],
                                       dtype=np.int64).reshape(-1, 3)
        return rec
