"""Constants and log helpers shared by the modules of the `kafka` kernel (`replay/kafka/kernels/kernel.py`)."""

from __future__ import annotations

import numpy as np

from replay.kafka.kernels.steady import C_CLIENT, C_FENCE, C_RETRY, C_TICK, CODES_PER_INSTANT, Pending
from replay.kafka.reference.state import MsgState, legal_transitions
from replay.shared.states import IllegalTransition
from schemas.trace import Kind

# Position of an event within its instant (SPEC §2.2): `steady` defines the codes.
C_REPLICATE, C_PRODUCE = int(Kind.REPLICATE), int(Kind.PRODUCE)
__all__ = ["C_CLIENT", "C_FENCE", "C_RETRY", "C_TICK"]
WAITING, REFUSED, APPENDED, ACKED, FAILED = (MsgState.WAITING, MsgState.REFUSED, MsgState.APPENDED, MsgState.ACKED,
                                            MsgState.FAILED)
#: The pending messages' columns, in the order of `steady.Pending`'s fields (the reference's `Msg` names).
PENDING_COLS = {
    "msg_id": np.int64, "produce_us": np.int64, "size": np.int64, "deadline_us": np.int64, "state": np.int8,
    "error": np.int8, "refused_us": np.int64, "refusals": np.int64, "epoch": np.int64, "offset": np.int64,
    "request_us": np.int64, "ack_us": np.int64, "visible_us": np.int64,
    # carried untouched to the outputs (PartitionEvents.payload)
    "pid": np.int64, "part": np.int64, "keyid": np.int64,
}
assert tuple(PENDING_COLS) == Pending._fields  # the table's columns are the compiled record's fields
PAYLOAD = ("pid", "part", "keyid")
#: Earlier appends of retried messages, in the order they were made: a retried message appended again keeps its
#: earlier (epoch, offset) for judging its fate, as a copy may survive (`Msg.positions` in
#: replay/kafka/reference/interpreter.py).
EXTRA_COLS = {"msg_id": np.int64, "epoch": np.int64, "offset": np.int64}
COMPACT_AT = 32768  # pending messages from which a stretch hands the settled ones over


def key(ts, code):
    """Events sort by ts, then by their position within the instant (SPEC §2.2)."""
    return ts * CODES_PER_INSTANT + code


_LEGAL = np.array(legal_transitions(), dtype=bool)  # [new - NEW, previous - NEW], `VALID_PREVIOUS_STATES`


def set_state(state: np.ndarray, rows: np.ndarray, new: MsgState) -> None:
    """Pending rows enter state `new`: the kernel's Python code checks each message's transition against
    `VALID_PREVIOUS_STATES` here, as its compiled code does in `steady.transition`."""
    previous = state[rows].astype(np.intp) - MsgState.NEW
    if not _LEGAL[int(new) - MsgState.NEW, previous].all():
        raise IllegalTransition(f"a message state transition to {new.name} VALID_PREVIOUS_STATES does not allow")
    state[rows] = new
