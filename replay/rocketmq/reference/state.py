"""The RocketMQ reference interpreter's state: log entries, brokers, messages, and the helpers its roles share."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from replay.policies import Policy
from replay.shared import states as shared_states
from schemas.outcomes import NULL_US, Error, Status
from schemas.units import MS


class MsgState(IntEnum):
    """A message's state between its produce event and its outcome (`Msg.state`; the kernels' pending `state`
    column holds the same codes)."""

    WAITING = 0  # appended by the broker that took it, waiting for its answer (R1)
    ACKED = 1
    FAILED = 2
    NEW = 3  # produced, not yet arrived at a broker (a DLedger retry scheduled for later, C2)


#: The legal transitions, held in one place (as Kafka's `PartitionStateMachine` holds `validPreviousStates`): the
#: states a message may be in when it enters each state. A message waits from its append (the kernels give a
#: produce row its waiting state at its arrival, and its append keeps it); it is refused before its append (R2) or
#: fails waiting (R1); only a waiting message is acknowledged. ACKED and FAILED are final.
VALID_PREVIOUS_STATES: dict[MsgState, frozenset[MsgState]] = {
    MsgState.NEW: frozenset(),
    MsgState.WAITING: frozenset({MsgState.NEW, MsgState.WAITING}),
    MsgState.ACKED: frozenset({MsgState.WAITING}),
    MsgState.FAILED: frozenset({MsgState.NEW, MsgState.WAITING}),
}


def check_transition(previous: int, new: int) -> None:
    """Raise unless a message may move from `previous` to `new` (`VALID_PREVIOUS_STATES`)."""
    shared_states.check_transition(VALID_PREVIOUS_STATES, MsgState, previous, new)


def legal_transitions() -> list[list[bool]]:
    """`VALID_PREVIOUS_STATES` as a table for compiled code: [new][previous], in `MsgState`'s order."""
    return shared_states.legal_transitions(VALID_PREVIOUS_STATES, MsgState)


@dataclass
class Entry:
    epoch: int  # epoch of the leader (master incarnation) that appended it
    msg_id: int
    append_us: int  # when that leader appended it (SPEC §3.2 rule 5: copies keep it)
    size: int


@dataclass
class Broker:
    id: int
    up: bool = True
    isolated: bool = False
    incarnation: int = 0  # bumped at every stop
    log: list[Entry] = field(default_factory=list)
    written_us: list[int] = field(default_factory=list)  # when each entry was written on this broker
    durable: int = 0  # prefix known to be on disk
    fetched: int = 0  # the leader's view of this broker's log end (R4)
    lcu: int = 0  # last time it was caught up (SPEC §3.2 rule 5, §3.5)

    @property
    def alive(self) -> bool:
        return self.up and not self.isolated


@dataclass
class Msg:
    msg_id: int
    produce_us: int
    size: int
    deadline_us: int
    payload: dict
    state: MsgState = MsgState.NEW
    status: Status = Status.PENDING
    error: Error = Error.NONE
    ack_us: int = NULL_US
    visible_us: int = NULL_US
    positions: list[tuple[int, int]] = field(default_factory=list)
    taker: tuple[int, int, int] | None = None  # (broker, its incarnation, epoch) that appended it (R1)


def set_state(msg: Msg, new: MsgState) -> None:
    """The one place the reference moves a message between states, checked against `VALID_PREVIOUS_STATES`."""
    check_transition(msg.state, new)
    msg.state = new


def common_prefix(a: list[Entry], b: list[Entry]) -> int:
    """Entries two logs share: same (epoch, msg) at every offset (leader-epoch truncation)."""
    n = 0
    while n < min(len(a), len(b)) and (a[n].epoch, a[n].msg_id) == (b[n].epoch, b[n].msg_id):
        n += 1
    return n


@dataclass
class ZombieMaster:
    """An isolated master replaced by the controller that clients still write to (SPEC §3.2 rule 10, C7)."""

    broker: int
    epoch: int
    view: tuple[int, ...]
    hw: int
    ack: int  # its in_sync_replicas ack point when replaced: its slaves' copies are not counted after that


def next_poll(p: Policy, t: int, phase_us: int) -> int:
    """SPEC §3.7 R-1: the first route poll at or after t. Polls run every route_refresh_ms from the trace's
    route-poll phase (SPEC §2 route_poll_phase_us); the route at 0 is the initial one, so a poll at 0 teaches
    clients nothing and the first after it does."""
    r = p.route_refresh_ms * MS
    k = 0 if t <= phase_us else -(-(t - phase_us) // r)
    at = phase_us + k * r
    return at if at > 0 else r


def last_epoch(log: list[Entry]) -> int:
    return log[-1].epoch if log else -1
