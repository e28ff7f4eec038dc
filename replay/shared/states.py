"""A message's state machine, shared by both families: each family's reference holds its `MsgState` enum and its
`VALID_PREVIOUS_STATES` table (as Kafka's `PartitionStateMachine` holds `validPreviousStates`); these helpers check
a transition against such a table and lay it out for compiled code."""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum


class IllegalTransition(AssertionError):
    """A message moved between two states that `VALID_PREVIOUS_STATES` does not link: a defect of the replay."""


def check_transition(table: Mapping[IntEnum, frozenset], states: type[IntEnum], previous: int, new: int) -> None:
    """Raise unless a message may move from `previous` to `new` under `table` (`VALID_PREVIOUS_STATES`)."""
    if states(previous) not in table[states(new)]:
        raise IllegalTransition(f"{states(previous).name} -> {states(new).name}")


def legal_transitions(table: Mapping[IntEnum, frozenset], states: type[IntEnum]) -> list[list[bool]]:
    """`table` for compiled code: [new][previous], both in the enum's order, is whether the move is legal."""
    return [[states(p) in table[states(n)] for p in sorted(states)] for n in sorted(states)]
