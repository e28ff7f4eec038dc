"""The policy families this version of replab replays, by name: the one list of them.

Each family package names its replay interfaces (`INTERFACES` in `replay/kafka/family.py` and
`replay/rocketmq/family.py`); both are imported here the same way, so the dependency is written where it is used.
(`replay.policies.FAMILIES` is the other table by family name: each family's policy class.)
"""

from __future__ import annotations

from replay.family import Family
from replay.kafka import family as kafka
from replay.policies import Policy
from replay.rocketmq import family as rocketmq
from schemas.errors import ReplabError

#: family name (`Policy.family`) -> its replay interface
INTERFACES: dict[str, Family] = {f.name: f for f in (*kafka.INTERFACES, *rocketmq.INTERFACES)}


def family_of(policy: Policy) -> Family:
    try:
        return INTERFACES[policy.family]
    except KeyError:
        raise ReplabError(f"family {policy.family} cannot be replayed by this version of replab") from None
