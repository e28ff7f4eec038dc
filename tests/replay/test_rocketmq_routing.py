"""RocketMQ routing (SPEC §3.3 rules 1-3): the key selector, and policies that share a routing key route alike."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, given, settings

from replay.events import split_trace_table
from replay.families import family_of
from replay.family import RouteInput
from replay.local import control_events, msg_rank
from replay.policies import parse_policy
from replay.rocketmq.routing import java_hash_mod

from .strategies import group_traces


def test_java_hash_selector():
    # Java: "K".hashCode() = 75; "Aa" and "BB" collide at 2112; "polygenelubricants" hashes to Integer.MIN_VALUE,
    # where abs(h) % n would be negative and SelectMessageQueueByHash's abs(h % n) is not.
    keys = ["K", "K", "Aa", "BB", "hello", "polygenelubricants", "polygenelubricants"]
    count = np.array([8, 4, 7, 7, 10, 8, 7])
    # Java: Integer.MIN_VALUE % 8 == 0 and Integer.MIN_VALUE % 7 == -2 (truncated remainder), abs -> 2
    assert java_hash_mod(keys, count).tolist() == [3, 3, 2112 % 7, 2112 % 7, 99162322 % 10, 0, 2]


def test_presets_that_route_alike_share_a_routing_key():
    key = {p: family_of(parse_policy(p)).routing_key(parse_policy(p)) for p in (
        "rocketmq-async", "rocketmq-sync", "rocketmq-sync-syncflush", "rocketmq5-sync-default", "rocketmq-ordered",
        "rocketmq-controller", "rocketmq-controller-allack", "dledger-3", "dledger-5")}
    assert key["rocketmq-async"] == key["rocketmq-sync"] == key["rocketmq-sync-syncflush"] == \
        key["rocketmq5-sync-default"] != key["rocketmq-ordered"]
    # SPEC §3.7 C-2: a refusal below min_insync_replicas is retried on another group (C9), so min_insync_replicas
    # and the housekeeping that shrinks the SyncStateSet route once min_insync_replicas is above 1
    assert key["rocketmq-controller"] != key["rocketmq-controller-allack"]  # the allack preset has min ISR 2

    def controller_key(extra: str):
        policy = parse_policy(f"rocketmq-controller:{extra}")
        return family_of(policy).routing_key(policy)

    assert controller_key("all_ack_in_sync_state_set=true,ha_housekeeping_interval_ms=5000") == \
        key["rocketmq-controller"]
    assert controller_key("min_insync_replicas=2") != controller_key(
        "min_insync_replicas=2,ha_housekeeping_interval_ms=5000")
    assert key["dledger-3"] != key["dledger-5"]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(group_traces())
def test_equal_routing_keys_route_every_message_alike(trace):
    manifest, table = trace
    produce, broker_events = split_trace_table(table)
    batch = RouteInput(produce["ts_us"], msg_rank(produce["msg_id"]), pa.array(list(produce["key"]), pa.string()))
    pairs = [("rocketmq:slaves_per_master=0", "rocketmq:slaves_per_master=0,broker_role=SYNC_MASTER,flush=sync"),
             ("rocketmq-controller:slaves_per_master=0",
              "rocketmq-controller:slaves_per_master=0,all_ack_in_sync_state_set=true,in_sync_replicas=2"),
             ("dledger:group_size=1", "dledger:group_size=1,flush=sync,flush_interval_ms=null")]
    for a, b in pairs:
        routes = []
        for text in (a, b):
            policy = parse_policy(text)
            fam = family_of(policy)
            out = fam.route(policy, manifest, fam.layout(policy, manifest), control_events(broker_events), batch)
            routes.append((out.unit.tolist(), out.partition.tolist(), out.delay_us.tolist()))
        assert fam.routing_key(parse_policy(a)) == fam.routing_key(parse_policy(b))
        assert routes[0] == routes[1]
