"""Reference interpreter of the RocketMQ families for one broker group (SPEC §3.1, §3.3-3.5, §4).

One loop over the group's time-ordered events, explicit state, every rule cited. Written for reading and for
differential tests, not for speed. The replay unit is a broker group: its CommitLog holds all its queues, so
offsets are CommitLog positions (entries) and flush decisions count the group's dirty bytes (SPEC §3.3).
Messages arrive as routed by `replay/rocketmq/control.py` (SPEC §3.3 rules 1-3): payload `part` = -1 marks a
send that failed in routing (`no_route`); payload `delay` is the time from the produce to the arrival here
(a DLedger retry after max_wait_ack_ms at a group without quorum), with the attempts made here before whose
entries stay in the log (C3: `control.unpack_delay`). The reference implements the control rules
(who leads, detection, elections, clients' target) on its own, independently of `replay/rocketmq/control.py`,
following the modelling choices C1-C9 documented there. Further choices, shared with the kernel:

R1 A request is answered only by the broker incarnation that took it: an ack when that leader's commit point
   passes the message (SYNC_MASTER: the need-th slave copy; DLedger: a majority; controller: in_sync_replicas
   copies or the whole SyncStateSet); a broker status (FLUSH_SLAVE_TIMEOUT, IN_SYNC_REPLICAS_NOT_ENOUGH) at
   arrival + slave_timeout_ms / max_wait_ack_ms if that incarnation is still up; otherwise the client gives up
   at produce + delivery_timeout_ms (`delivery_timeout`). At one instant: replication first (trace), then the
   broker's status, then the client's deadline. No retry inside a group (RocketMQ retries other groups, C2).
R2 A message that reaches a group that takes no writes (which routing did not predict: a controller group with
   no eligible SyncStateSet member) fails with `no_leader`; one refused before append (controller
   SyncStateSet below min_insync_replicas) fails with `in_sync_replicas_not_enough`. Both are `absent`.
   SPEC §3.7 C-2 (`SendMessageProcessor` answers IN_SYNC_REPLICAS_NOT_ENOUGH as SYSTEM_ERROR, which
   `DefaultMQProducerImpl` retries on another group at once): routing (`replay/rocketmq/control.py` C9) sends a
   refused send to another group when the faults alone put the SyncStateSet below min_insync_replicas, so a
   group sees a refusal only on a send's last attempt or when replication alone shrank its set.
R3 Flush (SPEC §3.1, §3.3): `rocketmq` and `rocketmq-controller` with flush=async flush a broker's CommitLog at
   ticks every flush_interval_ms from 0 when at least flush_least_bytes are dirty, and fully at the first tick
   at or after each multiple of flush_thorough_interval_ms; `dledger` flushes at every tick (a write is durable
   at the first tick at or after it); flush=sync is durable at write; flush_interval_ms=null means no fsync:
   the OS writes back pages older than 30000 ms every 5000 ms (as §3.2). A tick at the instant of a power loss
   comes after it. A down broker does not flush; a restart or shutdown leaves everything on disk.
R4 The leader's view of a follower (`fetched`) changes only when the follower reports or is truncated; at a
   leader change it is reset to the follower's log end (DLedger: for reachable members only; others count 0
   until they report). Commit points never decrease within an epoch.
R5 Classic: the master's epoch increments at each restart (a new incarnation). When the master restarts,
   `reconcile=union` first takes the longest log of an up slave that extends the master's; then every slave
   (up or down) keeps only its common prefix with the master (`master_wins` drops slave-only messages). A
   down slave's extra messages are not recovered. Readers use the master while it is up, else the first up
   slave in group order.
R6 Timeline (SPEC §4.2): leader = the broker taking writes for the group (null when it is down, or the group
   has none, or a controller master has no eligible log); isr = classic: the master and the slaves SYNC_MASTER
   can use (up, reachable, master reachable); dledger: the members up and reachable; controller: the
   SyncStateSet. log_end_offset = the leader's CommitLog entries; high_watermark = the consumer-visible point
   (classic: the log end; dledger: the commit index; controller: the SyncStateSet minimum with
   all_ack_in_sync_state_set, else the log end).
R7 Unavailability (SPEC §4.3): the group takes no writes (see R6), or refuses them (SYNC_MASTER without enough
   usable slaves, controller SyncStateSet below min_insync_replicas, DLedger without a reachable majority),
   or the oldest entry still waiting for its ack was appended more than slave_timeout_ms / max_wait_ack_ms ago.

The replay is split by role, as the Kafka reference is: `group.py` (the shared state and event loop, produce,
replication, answers), `logs.py` (the CommitLogs on disk, R3), `outputs.py` (rows, unavailability, judgement),
one module per family (`classic.py`, `dledger.py`, `controller.py` with `sync_state_set.py`) and `state.py` (the
types); this module picks the family's class.
"""

from __future__ import annotations

from replay.events import PartitionEvents
from replay.policies import Policy
from replay.results import PartitionResult
from replay.rocketmq.control import RouteClock
from replay.rocketmq.reference.classic import ClassicReference
from replay.rocketmq.reference.controller import ControllerReference
from replay.rocketmq.reference.dledger import DLedgerReference

REFERENCES = {"rocketmq": ClassicReference, "dledger": DLedgerReference, "rocketmq-controller": ControllerReference}


def replay_group(policy: Policy, unit: int, members: tuple[int, ...], events: PartitionEvents,
                 duration_us: int, clock: RouteClock | None = None) -> PartitionResult:
    """Reference replay of one broker group (SPEC §9); `clock`: the route polls' phase and R-5's refetches."""
    return REFERENCES[policy.family](policy, unit, members, duration_us, clock).run(events)
