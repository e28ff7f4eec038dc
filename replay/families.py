"""The policy families this version of replab replays, by name: the one list of them.

Each family package names its replay interfaces (`INTERFACES` in `replay/kafka/family.py` and
`replay/rocketmq/family.py`); both are imported here the same way, so the dependency is written where it is used.
(`replay.policies.FAMILIES` is the other table by family name: each family's policy class.)
"""

from __future__ import annotations

from typing import Any

from replay.events import PartitionEvents
from replay.family import Family
from replay.kafka import family as kafka
from replay.policies import Policy
from replay.rocketmq import family as rocketmq
from schemas.errors import ReplabError
from schemas.trace import Manifest

#: family name (`Policy.family`) -> its replay interface
INTERFACES: dict[str, Family] = {f.name: f for f in (*kafka.INTERFACES, *rocketmq.INTERFACES)}


def family_of(policy: Policy) -> Family:
    try:
        return INTERFACES[policy.family]
    except KeyError:
        raise ReplabError(f"family {policy.family} cannot be replayed by this version of replab") from None


def engine_context(policy: Policy, manifest: Manifest, control: PartitionEvents) -> dict[str, Any]:
    """Keyword arguments a unit's engines (`Family.kernel`, `Family.reference`) take from the whole trace, for
    families whose units depend on more than their own events (RocketMQ's route clock, SPEC §3.7 R-5; Kafka's
    leaders of every partition for P_b, K-6); {} else."""
    ctx = getattr(family_of(policy), "engine_context", None)
    return ctx(policy, manifest, control) if ctx is not None else {}
