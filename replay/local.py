"""Replay a small trace without Spark: route, split by partition, run an engine per partition.

Used by golden and differential tests and by the benchmark's reference figure. The Spark job does the same
routing with the same functions (`replay/routing.py`), over partitions of the cluster.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa

from replay.events import PartitionEvents, split_trace_table
from replay.policies import KafkaPolicy, Policy
from replay.results import PartitionResult
from replay.routing import kafka_assignment, kafka_route
from schemas.trace import Manifest

Engine = Callable[[Policy, int, tuple[int, ...], PartitionEvents, int], PartitionResult]


def msg_rank(msg_id: np.ndarray) -> np.ndarray:
    """Index of each message in msg_id order over the whole trace (SPEC §3.2 rule 1, §3.3 rule 2)."""
    order = np.argsort(msg_id, kind="stable")
    rank = np.empty(len(msg_id), dtype=np.int64)
    rank[order] = np.arange(len(msg_id))
    return rank


def kafka_layout(policy: KafkaPolicy, manifest: Manifest) -> list[tuple[int, ...]]:
    return kafka_assignment(policy.partitions, policy.replication_factor, manifest.broker_ids, policy.assignment)


def partition_events(policy: KafkaPolicy, table: pa.Table) -> dict[int, PartitionEvents]:
    produce, broker_events = split_trace_table(table)
    part = kafka_route(list(produce["key"]), msg_rank(produce["msg_id"]), policy.partitions)
    out = {}
    for p in range(policy.partitions):
        sel = part == p
        out[p] = PartitionEvents(produce["ts_us"][sel], produce["msg_id"][sel], produce["size_bytes"][sel],
                                 broker_events.broker_ts, broker_events.broker_kind, broker_events.broker_id,
                                 broker_events.broker_upto).sorted()
    return out


def replay_local(policy: Policy, manifest: Manifest, table: pa.Table, engine: str = "kernel") -> list[PartitionResult]:
    """Replay every partition of a trace with the reference interpreter or the vectorized kernel."""
    if not isinstance(policy, KafkaPolicy):
        raise NotImplementedError(f"local replay of family {policy.family}")
    if engine == "reference":
        from replay.reference.kafka import replay_partition
    else:
        from replay.kernels.kafka import replay_partition
    layout = kafka_layout(policy, manifest)
    events = partition_events(policy, table)
    return [replay_partition(policy, p, layout[p], events[p], manifest.duration_us) for p in range(policy.partitions)]
