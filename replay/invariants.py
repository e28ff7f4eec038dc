"""SPEC §9 invariants that depend on the trace, as pure functions (the output gate checks them on every replay).

"No acknowledged message lost under acks=all, min_insync_replicas ≥ 2, clean election, when at most one broker
of a partition's replicas is ever down at a time and no power loss." Whether a (policy, partition) is covered
is a question about the policy and the fault timeline only; `expectations/invariants.py` turns the answer into
an output-gate check over message_outcomes.
"""

from __future__ import annotations

from replay.events import PartitionEvents
from replay.policies import Acks, KafkaPolicy, Policy
from schemas.trace import STOP_KINDS, Kind


def policy_guarantees_durability(policy: Policy) -> bool:
    """acks=all, an effective min ISR of at least 2 and clean election (Kafka family only)."""
    return (isinstance(policy, KafkaPolicy) and policy.acks is Acks.ALL and policy.effective_min_isr >= 2
            and not policy.unclean_leader_election)


def at_most_one_replica_out(replicas: tuple[int, ...], control: PartitionEvents) -> bool:
    """True when no replica ever loses power and at most one replica is out at any instant.

    "Out" is down (any stop) or isolated: counting isolations too makes the covered set smaller, never wrong.
    Events of one instant apply in SPEC §2.2 order (stops and isolations before restarts and heals), so a
    broker that stops at the instant another comes back counts as overlapping it. `control` is the fault
    timeline, sorted (a few events per fault, so a plain loop).
    """
    down: set[int] = set()
    isolated: set[int] = set()
    members = set(replicas)
    for kind, broker in zip(control.broker_kind.tolist(), control.broker_id.tolist(), strict=True):
        if broker not in members:
            continue
        if kind == Kind.POWER_LOSS:
            return False
        if kind in STOP_KINDS:
            down.add(broker)
        elif kind == Kind.RESTART:
            down.discard(broker)
        elif kind == Kind.ISOLATE:
            isolated.add(broker)
        elif kind == Kind.HEAL:
            isolated.discard(broker)
        if len(down | isolated) > 1:
            return False
    return True


def durability_covered(policy: Policy, replicas_by_unit: dict[int, tuple[int, ...]],
                       control: PartitionEvents) -> list[int]:
    """The units (partitions) of `policy` on which the SPEC §9 durability invariant must hold."""
    if not policy_guarantees_durability(policy):
        return []
    return [u for u, replicas in replicas_by_unit.items() if at_most_one_replica_out(replicas, control)]
