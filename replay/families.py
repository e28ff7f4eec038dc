"""What the replay needs to know about each policy family, behind one small interface.

The Spark job and the local driver only route, group and call engines; everything family-specific is here:
how a policy lays its replay units (Kafka partitions, RocketMQ broker groups) over the brokers, how a message
is routed to a unit, and which engines replay a unit. Policies whose `routing_key` is equal route every message
identically, so they share one shuffle and are evaluated inside the same group (SPEC §10).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from replay.events import PartitionEvents
from replay.policies import KafkaPolicy, Policy
from replay.results import PartitionResult
from replay.routing import kafka_assignment, kafka_route
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
    #: group after max_wait_ack_ms); None = 0 for every message. Engines read it as the produce payload "delay",
    #: and `partition` as payload "part" (a unit's engine emits the outcome of a send that failed in routing).
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
        """A chunked replay: `.advance(events, until_us)`, `.finish() -> PartitionResult` (replay/kernels)."""
        ...


class KafkaFamily:
    name = "kafka"

    def layout(self, policy: KafkaPolicy, manifest: Manifest) -> Layout:
        assignment = kafka_assignment(policy.partitions, policy.replication_factor, manifest.broker_ids,
                                      policy.assignment)
        used = {b for replicas in assignment for b in replicas}
        return Layout(tuple(range(policy.partitions)), dict(enumerate(assignment)), len(used),
                      float(policy.replication_factor))

    def routing_key(self, policy: KafkaPolicy) -> Hashable:
        return ("kafka", policy.partitions)

    def partition_count(self, policy: KafkaPolicy, layout: Layout) -> int:
        return policy.partitions

    def partitions_of(self, policy: KafkaPolicy, layout: Layout, unit: int) -> range:
        return range(unit, unit + 1)

    def min_insync_replicas(self, policy: KafkaPolicy) -> int | None:
        return policy.effective_min_isr

    def route(self, policy: KafkaPolicy, manifest: Manifest, layout: Layout, control: PartitionEvents,
              produce: RouteInput) -> RouteOutput:
        part = kafka_route(produce.keys_arrow(), produce.msg_rank, policy.partitions)
        return RouteOutput(part, part)

    def reference(self, policy: KafkaPolicy, unit: int, replicas: tuple[int, ...], events: PartitionEvents,
                  duration_us: int) -> PartitionResult:
        from replay.reference.kafka import replay_partition

        return replay_partition(policy, unit, replicas, events, duration_us)

    def kernel(self, policy: KafkaPolicy, unit: int, replicas: tuple[int, ...], duration_us: int) -> Any:
        from replay.kernels.kafka import KafkaPartitionReplay

        return KafkaPartitionReplay(policy, unit, replicas, duration_us)


_FAMILIES: dict[str, Family] = {"kafka": KafkaFamily()}


def register(family: Family) -> None:
    _FAMILIES[family.name] = family


def family_of(policy: Policy) -> Family:
    if policy.family not in _FAMILIES:
        _load_optional_families()
    try:
        return _FAMILIES[policy.family]
    except KeyError:
        from schemas.errors import ReplabError

        raise ReplabError(f"family {policy.family} cannot be replayed by this version of replab") from None


def _load_optional_families() -> None:
    # RocketMQ-style families register themselves when their module exists.
    import importlib

    for module in ("replay.rocketmq_families",):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise


EngineFactory = Callable[[Policy, int, tuple[int, ...], int], Any]
