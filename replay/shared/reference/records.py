"""What both reference interpreters hand the judgement and the outputs (SPEC §4.1-4.3): a log as runs of one
epoch, every message's outcome fields as `MessageRecords`, and the unit's unavailable intervals."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

import numpy as np

from replay.results import MessageRecords, merge_intervals


class LogEntry(Protocol):
    epoch: int


class Message(Protocol):
    msg_id: int
    produce_us: int
    status: int
    error: int
    ack_us: int
    visible_us: int
    positions: list[tuple[int, int]]  # (epoch, offset) of every append, the latest last


def epoch_runs(log: Iterable[LogEntry]) -> np.ndarray:
    """The log as rows (epoch, first offset, end offset) of consecutive entries of one epoch."""
    out: list[list[int]] = []
    for offset, entry in enumerate(log):
        if out and out[-1][0] == entry.epoch:
            out[-1][2] = offset + 1
        else:
            out.append([entry.epoch, offset, offset + 1])
    return np.array(out, dtype=np.int64).reshape(-1, 3)


def message_records(msgs: Mapping[int, Message]) -> tuple[list[Message], MessageRecords]:
    """The messages in msg_id order and their records, each at its latest append ((-1, -1): never appended)."""
    ordered = [msgs[k] for k in sorted(msgs)]
    last = [m.positions[-1] if m.positions else (-1, -1) for m in ordered]
    return ordered, MessageRecords(
        np.array([m.msg_id for m in ordered], dtype=np.int64),
        np.array([m.produce_us for m in ordered], dtype=np.int64),
        np.array([m.status for m in ordered], dtype=np.int8),
        np.array([m.error for m in ordered], dtype=np.int8),
        np.array([m.ack_us for m in ordered], dtype=np.int64),
        np.array([m.visible_us for m in ordered], dtype=np.int64),
        np.array([p[0] for p in last], dtype=np.int64),
        np.array([p[1] for p in last], dtype=np.int64),
    )


def unavailable_intervals(avail: list[tuple[int, bool, int | None]], duration_us: int) -> list[tuple[int, int]]:
    """The unit's unavailable intervals from its state after each instant, (instant, no broker serves clients or
    they are refused, from when requests time out or None), each state holding until the next instant's."""
    out = []
    for j, (t, blocked, stall_from) in enumerate(avail):
        end = avail[j + 1][0] if j + 1 < len(avail) else duration_us
        if blocked:
            out.append((t, end))
        elif stall_from is not None:
            out.append((max(t, stall_from), end))
    return merge_intervals(out)
