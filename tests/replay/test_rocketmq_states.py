"""The message state machine of the RocketMQ families: one table of legal transitions (`VALID_PREVIOUS_STATES`),
checked by the reference's `set_state`, the kernels' compiled `transition` and their Python `set_state` alike."""

import numpy as np
import pytest

from replay.rocketmq.kernels.common import set_state
from replay.rocketmq.kernels.steady import transition
from replay.rocketmq.reference.state import VALID_PREVIOUS_STATES, MsgState, check_transition
from replay.shared.states import IllegalTransition

LEGAL = [(p, n) for n in MsgState for p in MsgState if p in VALID_PREVIOUS_STATES[n]]
ILLEGAL = [(p, n) for n in MsgState for p in MsgState if p not in VALID_PREVIOUS_STATES[n]]


def test_acked_and_failed_are_final_and_only_a_waiting_message_is_acknowledged():
    for final in (MsgState.ACKED, MsgState.FAILED):
        assert not any(final in VALID_PREVIOUS_STATES[n] for n in MsgState)
    assert VALID_PREVIOUS_STATES[MsgState.ACKED] == {MsgState.WAITING}
    assert MsgState.NEW not in VALID_PREVIOUS_STATES[MsgState.ACKED]  # an ack needs an append


@pytest.mark.parametrize(("previous", "new"), LEGAL)
def test_every_checker_allows_a_legal_transition(previous, new):
    check_transition(previous, new)
    state = np.array([previous], dtype=np.int8)
    transition(state, 0, int(new))
    assert state[0] == new
    state = np.array([previous, previous], dtype=np.int8)
    set_state(state, np.array([1]), new)
    assert state.tolist() == [previous, new]


@pytest.mark.parametrize(("previous", "new"), ILLEGAL)
def test_every_checker_refuses_an_illegal_transition(previous, new):
    with pytest.raises(IllegalTransition):
        check_transition(previous, new)
    state = np.array([previous], dtype=np.int8)
    with pytest.raises(IllegalTransition):
        transition(state, 0, int(new))
    with pytest.raises(IllegalTransition):
        set_state(state, np.array([0]), new)
    assert state[0] == previous
