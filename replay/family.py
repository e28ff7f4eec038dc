"""What the replay needs to know about a policy family, behind one small interface (`Family`).

The Spark job and the local driver only route, group and call engines; everything family-specific sits behind
this protocol: how a policy lays its replay units (Kafka partitions, RocketMQ broker groups) over the brokers, how
a message is routed to a unit, and which engines replay a unit. Policies whose `routing_key` is equal route every
message identically, so they share one shuffle and are evaluated inside the same group (SPEC §10). The families
themselves are `replay/kafka/family.py` and `replay/rocketmq/family.py`; `replay/families.py` lists them.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from replay.events import PartitionEvents
from replay.policies import Policy
from replay.results import PartitionResult
from schemas.trace import Manifest


@dataclass(frozen=True)
class Layout:
    """How a policy places its replay units on the brokers."""

    units: tuple[int, ...]  # unit ids: Kafka partitions, RocketMQ broker groups
    replicas: dict[int, tuple[int, ...]]  # unit -> brokers, preferred leader (or master) first
    brokers_used: int  # brokers that host at least one replica (the policy's cost in brokers)
    replicas_per_message: float


@dataclass
class RouteInput:
    """Produce events to route (any subset of the trace, e.g. one Arrow batch)."""

    ts_us: np.ndarray  # int64
    msg_rank: np.ndarray  # int64: index of the message in msg_id order over the whole trace
    keys: list[str | None] | pa.Array  # message keys; None or "" = no key

    def keys_arrow(self) -> pa.Array:
        return self.keys if isinstance(self.keys, pa.Array | pa.ChunkedArray) else pa.array(self.keys, pa.string())

    def keys_list(self) -> list[str | None]:
        return self.keys.to_pylist() if isinstance(self.keys, pa.Array | pa.ChunkedArray) else list(self.keys)


@dataclass
class RouteOutput:
    unit: np.ndarray  # int32: the replay unit (group key of the shuffle)
    partition: np.ndarray  # int32: the partition or queue reported in message_outcomes; -1 = routing failed
    #: int64 µs from the produce to the message's arrival at `unit` (RocketMQ families: a DLedger retry at another
    #: group after max_wait_ack_ms, with the earlier attempts there whose entries stay packed in, C3); None = 0 for
    #: every message. Engines read it as the produce payload "delay", and `partition` as payload "part" (a unit's
    #: engine emits the outcome of a send that failed in routing).
    delay_us: np.ndarray | None = None


class Family(Protocol):
    name: str

    def layout(self, policy: Policy, manifest: Manifest) -> Layout: ...

    def routing_key(self, policy: Policy) -> Hashable: ...

    def partition_count(self, policy: Policy, layout: Layout) -> int:
        """Partitions (Kafka) or queues (RocketMQ) of the topic, numbered 0 … count−1 in the outputs."""
        ...

    def partitions_of(self, policy: Policy, layout: Layout, unit: int) -> range:
        """The partitions a unit's timeline and unavailability apply to (a RocketMQ group: all its queues)."""
        ...

    def min_insync_replicas(self, policy: Policy) -> int | None:
        """The effective minimum in-sync size (committed_offsets.under_min_isr); None if the family has none."""
        ...

    def route(self, policy: Policy, manifest: Manifest, layout: Layout, control: PartitionEvents,
              produce: RouteInput) -> RouteOutput: ...

    def reference(self, policy: Policy, unit: int, replicas: tuple[int, ...], events: PartitionEvents,
                  duration_us: int) -> PartitionResult: ...

    def kernel(self, policy: Policy, unit: int, replicas: tuple[int, ...], duration_us: int) -> Any:
        """A chunked replay: `.advance(events, until_us)`, `.finish() -> PartitionResult` (replay/<family>/kernels)."""
        ...
