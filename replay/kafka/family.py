"""The `kafka` family behind `replay/family.py`'s interface: replay unit = partition (SPEC §3.2)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from replay.events import PartitionEvents
from replay.family import Layout, RouteInput, RouteOutput
from replay.kafka.routing import kafka_assignment, kafka_route
from replay.policies import KafkaPolicy
from replay.results import PartitionResult
from schemas.trace import Manifest


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
        from replay.kafka.reference.interpreter import replay_partition

        return replay_partition(policy, unit, replicas, events, duration_us)

    def kernel(self, policy: KafkaPolicy, unit: int, replicas: tuple[int, ...], duration_us: int) -> Any:
        from replay.kafka.kernels.kernel import KafkaPartitionReplay

        return KafkaPartitionReplay(policy, unit, replicas, duration_us)


#: The family's replay interface (what `replay/families.py` lists).
INTERFACES: tuple[KafkaFamily, ...] = (KafkaFamily(),)
