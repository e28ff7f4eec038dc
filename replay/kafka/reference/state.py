"""State of the `kafka` reference interpreter (`replay/kafka/reference/interpreter.py`): a replica's log and a message's
life, and the order of derived events."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from replay.shared import states as shared_states
from schemas.outcomes import NULL_US, Error, Status

# Derived events at the same instant apply after trace events, in this order (SPEC §2.2).
FENCE, ISR_CHECK, CLIENT, RETRY, DEADLINE = range(5)
#: Rule 6: the leader checks its ISR every replica_lag_time_max_ms / ISR_CHECKS_PER_LAG_TIME.
ISR_CHECKS_PER_LAG_TIME = 2


class MsgState(IntEnum):
    """A message's state between its produce event and its outcome (`Msg.state`; the kernel's pending `state`
    column holds the same codes). The order matters: the states up to APPENDED are unsettled."""

    NEW = -1  # produced, not yet attempted
    WAITING = 0  # no broker serves clients: retried at the next client switch (rule 8)
    REFUSED = 1  # NotEnoughReplicas (rule 3): a retry is due after the backoff
    APPENDED = 2  # in the serving broker's log, waiting for the acknowledgement (rule 4)
    ACKED = 3
    FAILED = 4  # its delivery deadline passed unacknowledged


_UNANSWERED = frozenset({MsgState.NEW, MsgState.WAITING, MsgState.REFUSED, MsgState.APPENDED})
#: The legal transitions, held in one place as Kafka's `PartitionStateMachine` holds `validPreviousStates`: the
#: states a message may be in when it enters each state. An attempt (`_attempt`, a client switch) may start from
#: any unsettled state; acks=0 acknowledges a new message as it leaves; an acknowledgement needs an append; a
#: deadline fails only a message not yet answered. ACKED and FAILED are final.
VALID_PREVIOUS_STATES: dict[MsgState, frozenset[MsgState]] = {
    MsgState.NEW: frozenset(),
    MsgState.WAITING: _UNANSWERED,
    MsgState.REFUSED: _UNANSWERED,
    MsgState.APPENDED: _UNANSWERED,
    MsgState.ACKED: frozenset({MsgState.NEW, MsgState.APPENDED}),
    MsgState.FAILED: _UNANSWERED - {MsgState.NEW},
}


def check_transition(previous: int, new: int) -> None:
    """Raise unless a message may move from `previous` to `new` (`VALID_PREVIOUS_STATES`)."""
    shared_states.check_transition(VALID_PREVIOUS_STATES, MsgState, previous, new)


def legal_transitions() -> list[list[bool]]:
    """`VALID_PREVIOUS_STATES` as a table for compiled code: [new][previous], in `MsgState`'s order."""
    return shared_states.legal_transitions(VALID_PREVIOUS_STATES, MsgState)


@dataclass
class Entry:
    epoch: int  # leader epoch in which it was appended
    msg_id: int
    append_us: int  # when the leader that took it from the client appended it (rule 5)
    size: int


@dataclass
class Replica:
    broker: int
    up: bool = True
    isolated: bool = False
    unclean_stop: bool = False  # last stop was crash, power_loss or disk_loss (KIP-966)
    log: list[Entry] = field(default_factory=list)
    written_us: list[int] = field(default_factory=list)  # when each entry was written on this broker
    flushed_all: int = 0  # prefix known to be on disk (clean shutdown, or what survived a power loss)
    fetched: int = 0  # the leader's view of this replica's log end
    lcu: int = 0  # last time it was caught up with the leader
    unreachable_since: int | None = None
    isolated_since: int | None = None
    must_register: bool = False  # restarted while isolated: the new incarnation registers when it heals
    visible_upto: int = 0  # prefix of this broker's log already announced visible while it served

    @property
    def eligible(self) -> bool:
        """Reachable: it fetches, and it can lead at once."""
        return self.up and not self.isolated

    @property
    def can_be_zombie(self) -> bool:
        """Still running the incarnation that led, cut off from the controller: it can go on answering clients
        (SPEC §3.2 rule 10). A broker that is down (crash, power loss, or a controlled shutdown while isolated)
        answers nothing, nor does a new incarnation that has not registered; such a replica is truncated at the
        election like any other (rule 9)."""
        return self.up and self.isolated and not self.must_register


@dataclass
class Msg:
    msg_id: int
    produce_us: int
    size: int
    deadline_us: int
    state: MsgState = MsgState.NEW
    status: Status = Status.PENDING
    error: Error = Error.NONE
    ack_us: int = NULL_US
    visible_us: int = NULL_US
    positions: list[tuple[int, int]] = field(default_factory=list)  # (epoch, offset) of every append
    request_us: int | None = None  # from when an ack for a held copy can reach the client
    retry_at: int | None = None  # the pending NotEnoughReplicas retry
    refusals: int = 0  # NotEnoughReplicas answers so far: the exponent of the next backoff (SPEC §3.7 K-2)


@dataclass
class Zombie:
    """A replaced leader that clients still write to (SPEC §3.2 rule 10)."""

    broker: int
    epoch: int
    view: tuple[int, ...]
    hw: int
