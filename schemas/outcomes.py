"""Codes of per-message outcomes (SPEC §4.1), shared by the reference, the kernels and the Spark layer.

Kernels work on small integer codes; tables hold the labels.
"""

from __future__ import annotations

from enum import IntEnum

NULL_US = -1  # "no value" in int64 time/offset arrays (becomes SQL NULL in tables)


class Status(IntEnum):
    ACKED = 0
    FAILED = 1
    PENDING = 2

    @property
    def label(self) -> str:
        return self.name.lower()


class Fate(IntEnum):
    COMMITTED = 0  # consumers of its partition will read it
    LOST = 1  # appended, but no replica will ever serve it (truncated or destroyed)
    ABSENT = 2  # never appended

    @property
    def label(self) -> str:
        return self.name.lower()


class Error(IntEnum):
    """Why a message failed (SPEC §4.1 `error`); NONE for acked and pending messages."""

    NONE = 0
    NOT_ENOUGH_REPLICAS = 1
    REQUEST_TIMEOUT = 2
    DELIVERY_TIMEOUT = 3
    NO_LEADER = 4
    SLAVE_NOT_AVAILABLE = 5
    FLUSH_SLAVE_TIMEOUT = 6
    FLUSH_DISK_TIMEOUT = 7
    IN_SYNC_REPLICAS_NOT_ENOUGH = 8
    NO_ROUTE = 9
    OUT_OF_ORDER_SEQUENCE_NUMBER = 10  # the idempotent producer's fatal error (SPEC §3.7 K-8)

    @property
    def label(self) -> str | None:
        return None if self is Error.NONE else self.name.lower()


STATUS_LABELS = [s.label for s in Status]
FATE_LABELS = [f.label for f in Fate]
ERROR_LABELS = [e.label for e in Error]

#: The per-message counts of loss_metrics and run_summary (SPEC §4.3-§4.4), in table column order.
OUTCOME_COUNTS = ("acked", "failed", "pending", "acked_lost", "failed_committed", "stranded")


def outcome_flags() -> dict[str, object]:
    """OUTCOME_COUNTS as Spark boolean columns over message_outcomes' columns: the one definition of what each
    count counts (engine.metrics aggregates them; the output gate compares run_summary with them)."""
    from pyspark.sql import functions as F

    acked = F.col("status") == Status.ACKED.label
    failed = F.col("status") == Status.FAILED.label
    committed = F.col("fate") == Fate.COMMITTED.label
    return {"acked": acked, "failed": failed, "pending": F.col("status") == Status.PENDING.label,
            "acked_lost": acked & ~committed, "failed_committed": failed & committed,
            "stranded": acked & committed & ~F.col("readable_at_end")}
