"""What a testbed run does (SPEC §12): the scenario's produce events and faults, the broker settings its
policies share, and one topic per policy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from replay.policies import KafkaPolicy, Policy
from schemas.errors import BadInput
from schemas.trace import Broker, Kind
from testbed.cluster import BrokerSettings

#: SPEC §12: crash, restart, shutdown, isolate and heal are injected; the rest needs a filesystem that drops
#: unsynced writes, which this testbed does not have.
SUPPORTED_FAULTS = (Kind.CRASH, Kind.RESTART, Kind.SHUTDOWN, Kind.ISOLATE, Kind.HEAL)


@dataclass
class Schedule:
    """What to do: the scenario's produce events and faults (its replicate events are the cluster's business)."""

    scenario: str
    trace_id: str
    brokers: tuple[Broker, ...]
    duration_us: int
    produce: pa.Table  # ts_us, msg_id, key, size_bytes, producer_id in time order
    faults: list[tuple[int, Kind, int]]  # (ts_us, kind, broker) in SPEC §2.2 order
    #: the scenario's follower fetch cadence, given to the real followers (replica.fetch.wait.max.ms)
    fetch_ms: int
    generator: dict[str, Any]


def schedule_from_scenario(spec: str, seed: int = 0) -> Schedule:
    from generators.generate import build_plan, chunk_table
    from generators.library import resolve_scenario

    scenario = resolve_scenario(spec)
    plan = build_plan(scenario, seed, 1.0)
    tables = [chunk_table(plan, c)[0] for c in range(plan.n_chunks)]
    events = pa.concat_tables(tables)
    produce = events.filter(pa.compute.equal(events["kind"], "produce")).select(
        ["ts_us", "msg_id", "key", "size_bytes", "producer_id"])
    faults = [(int(t), Kind(int(k)), int(b))
              for t, k, b in zip(plan.fault_ts_us, plan.fault_kind, plan.fault_broker, strict=True)]
    for _, kind, _ in faults:
        if kind not in SUPPORTED_FAULTS:
            raise BadInput(f"the testbed injects crash, restart, shutdown, isolate and heal; {kind.label} needs a "
                           f"filesystem that drops unsynced writes (out of scope, SPEC §12)",
                           file=f"scenario {scenario.name}", rule="testbed-fault")
    fetch_ms = max(1, round(scenario.replication.default.fetch_interval_ms))
    return Schedule(scenario.name, f"{scenario.name}-recorded-s{seed}", tuple(scenario.brokers), plan.duration_us,
                    produce, faults, fetch_ms, {"scenario": scenario.name, "seed": seed, "testbed": True})


def broker_settings(policies: list[Policy], fetch_ms: int) -> BrokerSettings:
    """The cluster-level settings the policies share; policies that differ there need separate runs."""
    for i, p in enumerate(policies):
        if not isinstance(p, KafkaPolicy):
            raise BadInput(f"--policy #{i + 1} ({p.canonical()}): the testbed runs Kafka policies only "
                           f"(RocketMQ follows, SPEC §12)", rule="testbed-policy")
        if p.controller.value != "kraft":
            raise BadInput(f"--policy #{i + 1} ({p.canonical()}): the testbed cluster runs KRaft, not ZooKeeper",
                           rule="testbed-policy")
    settings = {BrokerSettings(p.replica_lag_time_max_ms, p.session_timeout_ms, p.eligible_leader_replicas, fetch_ms)
                for p in policies}
    if len(settings) > 1:
        raise BadInput("the policies of one testbed run share one cluster, so they must agree on "
                       "replica_lag_time_max_ms, controller and eligible_leader_replicas; run them separately",
                       rule="testbed-policy")
    return settings.pop()


TOPIC_PREFIX = "replab-p"


def topic_of(index: int) -> str:
    return f"{TOPIC_PREFIX}{index}"

