"""Policy strings: parsing, canonical form, presets and errors (SPEC §3)."""

from __future__ import annotations

import pytest

from replay.policies import (
    Acks,
    Controller,
    KafkaPolicy,
    all_presets,
    parse_policy,
    presets,
    run_id,
)
from schemas.errors import BadInput


def test_defaults_are_the_spec_defaults():
    p = parse_policy("kafka")
    assert isinstance(p, KafkaPolicy)
    assert (p.acks, p.min_insync_replicas, p.replication_factor, p.replica_lag_time_max_ms) == (Acks.ALL, 1, 3, 30000)
    assert p.session_timeout_ms == 9000 and p.delivery_timeout_ms == 120000 and p.partitions == 12
    assert parse_policy("kafka:controller=zookeeper").session_timeout_ms == 18000


def test_canonical_form_is_order_independent_and_drops_defaults():
    a = parse_policy("kafka:unclean_leader_election=true,acks=1,replication_factor=3")
    b = parse_policy("kafka:acks=1, unclean_leader_election=TRUE")
    assert a == b and a.canonical() == b.canonical() == "kafka:acks=1,unclean_leader_election=true"
    assert parse_policy(a.canonical()) == a


def test_preset_with_override():
    p = parse_policy("kafka-durable:controller=zookeeper")
    assert p.min_insync_replicas == 2 and p.controller is Controller.ZOOKEEPER
    assert p == parse_policy("kafka-zk")


def test_every_preset_parses_and_roundtrips():
    assert len(presets()) >= 10
    for preset, policy in all_presets():
        assert parse_policy(policy.canonical()) == policy, preset.name


@pytest.mark.parametrize(("text", "needle"), [
    ("kafka:acks=2", "acks must be one of 0, 1, all"),
    ("kafka:min_insync_replicas=0", "out of range"),
    ("kafka:bogus=1", "unknown parameter 'bogus'"),
    ("kafka:acks", "expected param=value"),
    ("kafka:acks=1,acks=all", "given twice"),
    ("zookeeper", "unknown family or preset"),
    ("kafka:unclean_leader_election=yes", "must be true or false"),
    ("kafka:partitions=twelve", "must be an integer"),
])
def test_errors_list_what_is_valid(text, needle):
    with pytest.raises(BadInput, match=needle) as err:
        parse_policy(text)
    assert err.value.exit_code == 2


def test_run_id_is_deterministic_and_distinct():
    a, b = parse_policy("kafka:acks=1"), parse_policy("kafka")
    assert run_id("t", a, "1") == run_id("t", parse_policy("kafka-acks1"), "1")
    assert len({run_id("t", a, "1"), run_id("t", b, "1"), run_id("u", a, "1"), run_id("t", a, "2")}) == 4


def test_every_policy_family_has_a_replay_interface():
    from replay.families import INTERFACES, family_of
    from replay.policies import FAMILIES

    assert set(INTERFACES) == set(FAMILIES)
    for name, cls in FAMILIES.items():
        assert family_of(cls()).name == name
