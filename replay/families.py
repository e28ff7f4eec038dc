"""The policy families this version of replab replays, by name: the one list of them.

Each family package names its instances (`FAMILIES`: `replay/kafka/family.py`, `replay/rocketmq/family.py`); both
are imported here the same way, so the dependency is written where it is used.
"""

from __future__ import annotations

from replay.family import Family
from replay.kafka import family as kafka
from replay.policies import Policy
from replay.rocketmq import family as rocketmq
from schemas.errors import ReplabError

#: family name (`Policy.family`) -> its replay interface
FAMILIES: dict[str, Family] = {f.name: f for f in (*kafka.FAMILIES, *rocketmq.FAMILIES)}


def family_of(policy: Policy) -> Family:
    try:
        return FAMILIES[policy.family]
    except KeyError:
        raise ReplabError(f"family {policy.family} cannot be replayed by this version of replab") from None
