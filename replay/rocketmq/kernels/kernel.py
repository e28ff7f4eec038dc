"""Replay of the RocketMQ families for one broker group (SPEC §3.3-3.5, §4): the production engine.

The reference interpreter (`replay/rocketmq/reference/`) applies one event at a time and documents the rules
(R1-R7 there, C1-C7 in `replay/rocketmq/control.py`). The kernels run the group's control plane
(`rocketmq.control.ControlPlane`, the one routing uses) at *control points* (faults, detections, elections,
client switches, SyncStateSet checks and expansions) in Python (`group.GroupReplay`). Between two of
them a *steady segment* runs:
- one compiled pass, one event at a time as the reference does (`steady.GROUP_STEADY`, one loop
  compiled per commit rule, called by `stretch.SteadySegments`);
- `rocketmq-controller` while a replaced master that clients still reach takes writes (a zombie, C7):
  whole-array numpy series (`series.SeriesSegments`), its own log and frozen ack point.
Broker statuses and client deadlines (R1, `messages`) and flush decisions (R3, `flush`) are
evaluated lazily: a status never changes the replicas' state, and a flush only matters at a power loss.

State lives in the object and is carried across `advance()` calls, so a group replays in time chunks (bounded
memory, streaming micro-batches) with exactly the result of one pass. Logs are held as runs of
`(epoch, start, end)` per broker plus, per epoch, the append times and cumulative sizes of the entries that
epoch's leader appended (`logs`); messages are kept only until their outcome is settled.

Modules: `group` (the family-independent replay), `messages`, `logs`,
`flush`, `steady` + `stretch` (compiled segments), `series` (numpy
segments of a zombie), one module per family (`classic`, `dledger`, `controller`).
"""

from __future__ import annotations

from replay.events import PartitionEvents
from replay.policies import Policy
from replay.results import PartitionResult
from replay.rocketmq.control import RouteClock
from replay.rocketmq.kernels.classic import ClassicReplay
from replay.rocketmq.kernels.controller import ControllerReplay
from replay.rocketmq.kernels.dledger import DLedgerReplay
from replay.rocketmq.kernels.group import GroupReplay

KERNELS = {"rocketmq": ClassicReplay, "dledger": DLedgerReplay, "rocketmq-controller": ControllerReplay}


def group_replay(policy: Policy, unit: int, members: tuple[int, ...], duration_us: int,
                 clock: RouteClock | None = None) -> GroupReplay:
    return KERNELS[policy.family](policy, unit, members, duration_us, clock=clock)


def replay_group(policy: Policy, unit: int, members: tuple[int, ...], events: PartitionEvents,
                 duration_us: int, clock: RouteClock | None = None) -> PartitionResult:
    """Kernel replay of one group in one pass."""
    replay = group_replay(policy, unit, members, duration_us, clock)
    replay.advance(events, duration_us + 1)
    return replay.finish()
