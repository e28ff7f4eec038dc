"""Constants shared by the modules of the RocketMQ kernels (`replay/rocketmq/kernels/kernel.py`)."""

from __future__ import annotations

from enum import IntEnum

import numpy as np

from schemas.trace import Kind

C_REPLICATE, C_PRODUCE = int(Kind.REPLICATE), int(Kind.PRODUCE)


class MsgState(IntEnum):
    """A pending message's state (the `state` column): waiting for its answer, answered, or not yet arrived
    (a DLedger retry scheduled for later, C2)."""

    WAITING = 0
    ACKED = 1
    FAILED = 2
    PREARRIVE = 3


WAITING, ACKED, FAILED, PREARRIVE = MsgState

#: Trace events per steady segment at most (any split gives the same result, as a time chunk does).
SEGMENT_MAX = 1 << 15
PENDING_COLS = {
    "msg": np.int64, "prod": np.int64, "size": np.int64, "arrive": np.int64, "dead": np.int64, "state": np.int8,
    "err": np.int8, "pe": np.int64, "po": np.int64, "ack": np.int64, "vis": np.int64, "tb": np.int64,
    "tinc": np.int64, "tep": np.int64,
}
