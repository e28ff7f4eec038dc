"""Constants shared by the modules of the RocketMQ kernels (`replay/rocketmq/kernels/kernel.py`)."""

from __future__ import annotations

import numpy as np

from replay.rocketmq.kernels.steady import NONE, Pending
from replay.rocketmq.reference.state import MsgState, legal_transitions
from replay.shared.states import IllegalTransition
from schemas.trace import Kind

C_REPLICATE, C_PRODUCE = int(Kind.REPLICATE), int(Kind.PRODUCE)
__all__ = ["NONE"]  # no replica, broker, row or epoch: `steady.NONE`, for the kernels' Python code too


WAITING, ACKED, FAILED, NEW = MsgState.WAITING, MsgState.ACKED, MsgState.FAILED, MsgState.NEW

#: Trace events per steady segment at most (any split gives the same result, as a time chunk does).
SEGMENT_MAX = 1 << 15
#: The pending messages' columns, in the order of `steady.Pending`'s fields (the reference's `Msg` names).
PENDING_COLS = {
    "msg_id": np.int64, "produce_us": np.int64, "size": np.int64, "arrive_us": np.int64, "deadline_us": np.int64,
    "state": np.int8, "error": np.int8, "epoch": np.int64, "offset": np.int64, "ack_us": np.int64,
    "visible_us": np.int64, "taker_broker": np.int64, "taker_incarnation": np.int64, "taker_epoch": np.int64,
}
assert tuple(PENDING_COLS) == Pending._fields  # the table's columns are the compiled record's fields


_LEGAL = np.array(legal_transitions(), dtype=bool)  # [new, previous], `VALID_PREVIOUS_STATES`


def set_state(state: np.ndarray, rows: np.ndarray, new: MsgState) -> None:
    """Pending rows enter state `new`: the kernels' Python code checks each message's transition against
    `VALID_PREVIOUS_STATES` here, as their compiled code does in `steady.transition`."""
    if not _LEGAL[int(new), state[rows].astype(np.intp)].all():
        raise IllegalTransition(f"a message state transition to {new.name} VALID_PREVIOUS_STATES does not allow")
    state[rows] = new
