"""The `kafka` family behind `replay/family.py`'s interface: replay unit = partition (SPEC §3.2)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from replay.events import PartitionEvents
from replay.family import Layout, RouteInput, RouteOutput
from replay.kafka.leadership import cached_leadership
from replay.kafka.pipeline import Leadership
from replay.kafka.routing import kafka_assignment, kafka_route
from replay.policies import Acks, KafkaPolicy
from replay.results import PartitionResult
from schemas.trace import DEFAULT_CLIENT_ROUND_TRIP_US, Manifest


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

    def engine_context(self, policy: KafkaPolicy, manifest: Manifest, control: PartitionEvents) -> dict[str, Any]:
        """What a partition's engines need beyond its own events (`replay/families.py` `engine_context`): who leads
        every partition over the trace, for P_b (only where it counts: acks=all with partitions_per_request set),
        and the clients' round trip (SPEC §3.7 K-6, K-7)."""
        leaders = None
        if policy.acks is Acks.ALL and policy.partitions_per_request is not None:
            replicas = kafka_assignment(policy.partitions, policy.replication_factor, manifest.broker_ids,
                                        policy.assignment)
            leaders = cached_leadership(policy, replicas, control, manifest.duration_us)
        return {"leadership": leaders, "round_trip_us": manifest.client_round_trip_us}

    def reference(self, policy: KafkaPolicy, unit: int, replicas: tuple[int, ...], events: PartitionEvents,
                  duration_us: int, leadership: Leadership | None = None,
                  round_trip_us: int = DEFAULT_CLIENT_ROUND_TRIP_US) -> PartitionResult:
        from replay.kafka.reference.interpreter import replay_partition

        return replay_partition(policy, unit, replicas, events, duration_us, leadership, round_trip_us)

    def kernel(self, policy: KafkaPolicy, unit: int, replicas: tuple[int, ...], duration_us: int,
               leadership: Leadership | None = None,
               round_trip_us: int = DEFAULT_CLIENT_ROUND_TRIP_US) -> Any:
        from replay.kafka.kernels.kernel import KafkaPartitionReplay

        return KafkaPartitionReplay(policy, unit, replicas, duration_us, leadership=leadership,
                                    round_trip_us=round_trip_us)


#: The family's replay interface (what `replay/families.py` lists).
INTERFACES: tuple[KafkaFamily, ...] = (KafkaFamily(),)
