"""What a replay driven by a stream must know about the policies (pure; no Spark).

A stream replay routes a message only once every fault that routing could read for it has arrived (the fault
timeline is then the events seen so far, and routing is exact). How far past a send routing looks is a property
of the family's routing rules, so it lives here, next to them:

- Kafka (SPEC §3.2 rule 1): keyed by murmur2, unkeyed by msg_id order; no fault is read.
- RocketMQ classic and controller mode (SPEC §3.3 rules 1-3, §3.5, `replay/rocketmq/control.py` C4, C7, C8):
  the route of a send at t is the NameServer state at the last poll before t, or at t itself (C8), and every
  failover attempt happens at t: nothing after the instant t is read.
- DLedger (SPEC §3.4 rules 1-2, C2, C5): an attempt at a group that cannot reach a majority during
  [attempt, attempt + max_wait_ack_ms] fails at its end and is retried then, while the retry is before the
  delivery deadline (send + delivery_timeout_ms): routing reads faults up to delivery_timeout_ms +
  max_wait_ack_ms after the send.
"""

from __future__ import annotations

from replay.policies import DLedgerPolicy, KafkaPolicy, Policy
from schemas.units import MS


def reads_fault_timeline(policy: Policy) -> bool:
    """Whether routing a message depends on the faults (liveness-aware routing), not only on the message."""
    return not isinstance(policy, KafkaPolicy)


def routing_horizon_us(policy: Policy) -> int:
    """How far after a send (µs) routing may read the fault timeline; 0 = faults up to the send's instant."""
    if isinstance(policy, DLedgerPolicy):
        return (policy.delivery_timeout_ms + policy.max_wait_ack_ms) * MS
    return 0
