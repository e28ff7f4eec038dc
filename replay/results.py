"""What a partition replay returns, shared by the reference interpreter and the kernels (SPEC §4.1-4.3).

A replay resolves each message's status, ack and visibility as it goes, and records where the message was
appended as `(leader_epoch, offset)` positions. Its fate can only be judged once the trace has ended (SPEC
§4.1: as if every broker came back and the policy's rules ran to the end), so the replay also returns a
`FinalView` and `judge()` turns positions into fate, readable_at_end and offset. Positions identify log entries
uniquely because a leader of epoch e appends at most one entry per offset (the log matching property that
leader-epoch truncation relies on, KIP-101/279).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from schemas.outcomes import NULL_US, Fate, Status

Runs = np.ndarray  # int64 array of shape (k, 3): rows of (epoch, start_offset, end_offset), in offset order


def empty_runs() -> Runs:
    return np.zeros((0, 3), dtype=np.int64)


@dataclass
class MessageRecords:
    """One row per message routed to the partition, in msg_id order once finished."""

    msg_id: np.ndarray  # int64
    produce_us: np.ndarray  # int64
    status: np.ndarray  # int8, schemas.outcomes.Status
    error: np.ndarray  # int8, schemas.outcomes.Error
    ack_us: np.ndarray  # int64, NULL_US when not acknowledged
    visible_us: np.ndarray  # int64, NULL_US when never visible
    pos_epoch: np.ndarray  # int64, epoch of the latest append, -1 if never appended
    pos_offset: np.ndarray  # int64, offset of the latest append, -1 if never appended
    #: Earlier appends of retried messages (rare): rows of (msg_id, epoch, offset).
    extra_positions: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), dtype=np.int64))
    #: Values carried from the produce events to the outputs (PartitionEvents.payload), aligned with msg_id.
    payload: dict[str, np.ndarray] | None = None

    @classmethod
    def empty(cls) -> MessageRecords:
        i64 = np.zeros(0, dtype=np.int64)
        i8 = np.zeros(0, dtype=np.int8)
        return cls(i64, i64, i8, i8, i64, i64, i64, i64)

    def __len__(self) -> int:
        return len(self.msg_id)

    def sorted_by_msg_id(self) -> MessageRecords:
        if np.all(self.msg_id[1:] >= self.msg_id[:-1]):  # usual: settled in produce order, msg_ids in time order
            return self
        order = np.argsort(self.msg_id, kind="stable")
        names = ("msg_id", "produce_us", "status", "error", "ack_us", "visible_us", "pos_epoch", "pos_offset")
        out = MessageRecords(*(getattr(self, n)[order] for n in names))
        out.extra_positions = self.extra_positions
        out.payload = None if self.payload is None else {k: v[order] for k, v in self.payload.items()}
        return out


@dataclass(frozen=True)
class FinalView:
    """The end of a partition's replay.

    `final_runs`: the log every consumer will eventually read (after the recovery of SPEC §4.1), or None if the
    partition never gets a leader again. `end_runs`/`end_high_watermark`/`end_serving_up`: what the broker
    serving clients held and exposed at duration_us (readable_at_end).
    """

    final_runs: Runs | None
    end_runs: Runs
    end_high_watermark: int
    end_serving_up: bool


def runs_contain(runs: Runs | None, epoch: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """Vectorized membership of positions (epoch, offset) in a log given as runs."""
    if runs is None or len(runs) == 0 or len(epoch) == 0:
        return np.zeros(len(epoch), dtype=bool)
    ends = runs[:, 2]
    idx = np.searchsorted(ends, offset, side="right")  # the run whose [start, end) may hold offset
    ok = (idx < len(runs)) & (offset >= 0)
    idx = np.minimum(idx, len(runs) - 1)
    return ok & (runs[idx, 1] <= offset) & (runs[idx, 0] == epoch)


@dataclass
class JudgedMessages:
    records: MessageRecords
    fate: np.ndarray  # int8, schemas.outcomes.Fate
    readable_at_end: np.ndarray  # bool
    offset: np.ndarray  # int64, NULL_US when not in the final log


def judge(records: MessageRecords, view: FinalView) -> JudgedMessages:
    """Fate, readable_at_end and final offset of every message (SPEC §4.1)."""
    in_final = runs_contain(view.final_runs, records.pos_epoch, records.pos_offset)
    offset = np.where(in_final, records.pos_offset, NULL_US)
    readable = runs_contain(view.end_runs, records.pos_epoch, records.pos_offset) & (
        records.pos_offset < view.end_high_watermark) & view.end_serving_up
    extra = records.extra_positions
    if len(extra):
        # A retried message may survive through an earlier copy (one held by a replica that was isolated).
        index = np.searchsorted(records.msg_id, extra[:, 0])
        extra_final = runs_contain(view.final_runs, extra[:, 1], extra[:, 2])
        extra_readable = runs_contain(view.end_runs, extra[:, 1], extra[:, 2]) & (
            extra[:, 2] < view.end_high_watermark) & view.end_serving_up
        for i, m in enumerate(index):  # rare rows: retries after a failover
            if extra_final[i] and not in_final[m]:
                in_final[m] = True
                offset[m] = extra[i, 2]
            readable[m] |= extra_readable[i]
    appended = records.pos_epoch >= 0
    fate = np.where(in_final, Fate.COMMITTED, np.where(appended, Fate.LOST, Fate.ABSENT)).astype(np.int8)
    return JudgedMessages(records, fate, readable, offset)


@dataclass(frozen=True)
class StateRow:
    """One row of the partition timeline (SPEC §4.2); leader None = offline; leo/hw None when offline."""

    ts_us: int
    leader: int | None
    leader_epoch: int
    isr: tuple[int, ...]
    log_end_offset: int | None
    high_watermark: int | None

    def control_key(self) -> tuple:
        return (self.leader, self.leader_epoch, self.isr)


def coalesce_states(rows: list[StateRow], window_us: int) -> list[StateRow]:
    """Keep every leader/epoch/ISR change and the last row of each window (SPEC §4.2 as replab stores it).

    `rows` is a full timeline: one row per instant at which the state changed. Storing every log-end change
    would mean a row per message; the last one of each metric window is what the windowed tables need.
    """
    out: list[StateRow] = []
    for i, row in enumerate(rows):
        control = i == 0 or row.control_key() != rows[i - 1].control_key()
        last_in_window = i + 1 == len(rows) or rows[i + 1].ts_us // window_us != row.ts_us // window_us
        if control or last_in_window:
            out.append(row)
    return out


def merge_intervals(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, non-overlapping, non-empty [start, end) intervals; touching intervals are joined."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


@dataclass
class PartitionResult:
    """Everything one (policy, partition) replay produces."""

    partition: int
    messages: JudgedMessages
    states: list[StateRow]
    unavailable: list[tuple[int, int]]
    replication_bytes: int


__all__ = [
    "NULL_US", "FinalView", "JudgedMessages", "MessageRecords", "PartitionResult", "Runs", "StateRow", "Status",
    "coalesce_states", "empty_runs", "judge", "merge_intervals", "runs_contain",
]
