"""The RocketMQ families behind `replay/families.py`'s interface: `rocketmq`, `dledger`, `rocketmq-controller`.

Replay unit = broker group (SPEC §3.3: the CommitLog is shared by the group's queues). `route()` returns, per
message, the group that replays it (`unit`), the queue reported in message_outcomes (`partition`, -1 when the
send failed in routing: `no_route`) and `delay_us`, the time from the produce to the arrival at that group (a
DLedger retry after max_wait_ack_ms, otherwise 0) with the earlier attempts there whose entries stay (C3,
`control.pack_delay`). Engines read `partition` and `delay_us` back from the produce payload keys `part` and
`delay`; see `replay/rocketmq/routing.py` for the routing rules and
`replay/rocketmq/control.py` for the modelling choices.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable
from typing import Any

import numpy as np
import pyarrow as pa

from replay.events import PartitionEvents
from replay.family import Layout, RouteInput, RouteOutput
from replay.policies import Policy
from replay.results import PartitionResult
from replay.rocketmq.control import RouteClock
from replay.rocketmq.routing import RouteModel, group_members, route_messages, route_model
from schemas.trace import Manifest

#: Payload keys the RocketMQ engines read (the Spark layer carries them from RouteOutput to PartitionEvents).
PART, DELAY = "part", "delay"


def _keys_list(keys) -> list[str | None]:
    if isinstance(keys, pa.ChunkedArray | pa.Array):
        return keys.to_pylist()
    return list(keys)


class RocketMQGroupFamily:
    """Shared by the three families: groups as units, liveness-aware routing, group engines."""

    name = ""

    def __init__(self) -> None:
        self._models: dict[tuple, RouteModel] = {}

    def layout(self, policy: Policy, manifest: Manifest) -> Layout:
        groups = group_members(policy, manifest)
        size = len(groups[0])
        return Layout(tuple(range(len(groups))), dict(enumerate(groups)), len(groups) * size, float(size))

    def partition_count(self, policy: Policy, layout: Layout) -> int:
        """Queues of the topic: groups × queues_per_group (SPEC §3.1), numbered group-major."""
        return len(layout.units) * policy.queues_per_group

    def partitions_of(self, policy: Policy, layout: Layout, unit: int) -> range:
        """The queues a group's timeline and unavailability apply to."""
        q = policy.queues_per_group
        return range(unit * q, (unit + 1) * q)

    def min_insync_replicas(self, policy: Policy) -> int | None:
        # Only controller mode refuses below a minimum (SPEC §3.5); classic and DLedger groups have none.
        return policy.min_insync_replicas if policy.family == "rocketmq-controller" else None

    def routing_key(self, policy: Policy) -> Hashable:
        # Exactly the parameters routing reads: policies equal on these route every message identically.
        common = ["queues_per_group", "route_refresh_ms", "retry_times_when_send_failed"]
        extra = {
            "rocketmq": ["groups", "slaves_per_master", "ordered"],
            "rocketmq-controller": ["groups", "slaves_per_master", "controller_heartbeat_timeout_ms",
                                    "controller_scan_ms"],
            "dledger": ["group_size", "delivery_timeout_ms", "heartbeat_ms",
                        "max_heartbeat_leak", "vote_delay_ms", "vote_wait_ms", "max_wait_ack_ms"],
        }[policy.family]
        if policy.family == "rocketmq-controller" and policy.min_insync_replicas > 1:
            extra = [*extra, "min_insync_replicas", "ha_housekeeping_interval_ms"]  # C-2 refusals are retried (C9)
        return (policy.family, *((f, getattr(policy, f)) for f in common + extra))

    def model(self, policy: Policy, manifest: Manifest, control: PartitionEvents) -> RouteModel:
        digest = hashlib.sha256()
        for arr in (control.broker_ts, control.broker_kind, control.broker_id):
            digest.update(np.ascontiguousarray(arr).tobytes())
        key = (self.routing_key(policy), manifest.trace_id, manifest.duration_us, manifest.broker_ids,
               manifest.route_poll_phase_us, digest.hexdigest())
        model = self._models.get(key)
        if model is None:
            if len(self._models) > 32:
                self._models.clear()
            model = self._models[key] = route_model(policy, manifest, control)
        return model

    def route(self, policy: Policy, manifest: Manifest, layout: Layout, control: PartitionEvents,
              produce: RouteInput) -> RouteOutput:
        model = self.model(policy, manifest, control)
        routed = route_messages(policy, model, produce.ts_us, produce.msg_rank, _keys_list(produce.keys))
        out = RouteOutput(routed.unit, routed.partition)
        out.delay_us = routed.delay_us  # RouteOutput.delay_us (replay/families.py)
        return out

    def engine_context(self, policy: Policy, manifest: Manifest, control: PartitionEvents) -> dict[str, Any]:
        """What a group's engines need from the whole trace (`replay/families.py` `engine_context`): the route
        clock, i.e. the manifest's route-poll phase and the refetches of an empty route that every group's state
        decides (SPEC §3.7 R-1, R-5)."""
        return {"clock": self.model(policy, manifest, control).clock}

    def reference(self, policy: Policy, unit: int, replicas: tuple[int, ...], events: PartitionEvents,
                  duration_us: int, clock: RouteClock | None = None) -> PartitionResult:
        from replay.rocketmq.reference.interpreter import replay_group

        return replay_group(policy, unit, replicas, events, duration_us, clock)

    def kernel(self, policy: Policy, unit: int, replicas: tuple[int, ...], duration_us: int,
               clock: RouteClock | None = None) -> Any:
        from replay.rocketmq.kernels.kernel import group_replay

        return group_replay(policy, unit, replicas, duration_us, clock)


class RocketMQFamily(RocketMQGroupFamily):
    name = "rocketmq"


class DLedgerFamily(RocketMQGroupFamily):
    name = "dledger"


class RocketMQControllerFamily(RocketMQGroupFamily):
    name = "rocketmq-controller"


#: The three families' replay interfaces (what `replay/families.py` lists).
INTERFACES: tuple[RocketMQGroupFamily, ...] = (RocketMQFamily(), DLedgerFamily(), RocketMQControllerFamily())
