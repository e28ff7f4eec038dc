"""The compiled loop's test for an ISR check tick that changes nothing (`steady.tick_idle`): it may say no
when unsure (the tick then runs in Python), never yes when the tick would change something."""

import numpy as np

from replay.kafka.kernels.steady import AckCode, Flush, FlushCode, MsgState, Pending, Replicas, Stretch, tick_idle

T, LAG = 30_000_000, 10_000_000


def idle(state=(), dead=(), req=(), po=(), *, acks=AckCode.ALL, l_ok=True, hw_moves=True, hw=5, fetched=(5, 5, 5),
         lcu=(T, T, T), in_isr=(True, True, True), srv_ok=True, refusing=False) -> bool:
    """Leader 0 of three replicas with log end 5, every replica in the ISR (and the view)."""
    n = len(state)
    unused = np.zeros(n, dtype=np.int64)
    msgs = Pending(**{f: unused for f in Pending._fields})._replace(
        state=np.array(state, dtype=np.int8), deadline_us=np.array(dead, dtype=np.int64),
        request_us=np.array(req, dtype=np.int64), offset=np.array(po, dtype=np.int64))
    stretch = Stretch(
        stream_end=0, retry_end=0, leader=0, serving=0, serving_is_leader=True, serving_ok=srv_ok, refusing=refusing,
        acks=int(acks), leader_eligible=l_ok, hw_moves=hw_moves, epoch=0, epoch_start=0, delivery_timeout_us=0,
        request_timeout_us=0, window_us=1, zombie=False, zombie_alone=False, blocked=False, series=True,
        flush=Flush(int(FlushCode.SYNC), 1, 0), limit_key=0, replica_lag_us=LAG, tick_period_us=LAG // 2,
        duration_us=T, compact_at=1)
    replicas = Replicas(np.array([5, 5, 5], dtype=np.int64), np.array(fetched, dtype=np.int64),
                        np.array(lcu, dtype=np.int64), np.ones(3, dtype=bool), np.array(in_isr), np.ones(3, dtype=bool))
    return tick_idle(T, stretch, hw, hw, replicas, msgs, n)


def test_a_caught_up_partition_with_settled_messages_is_idle():
    assert idle()
    assert idle([MsgState.ACKED, MsgState.FAILED], [0, 0], [0, 0], [1, 2])  # settled rows are not looked at
    assert idle([MsgState.APPENDED], [T + 1], [T], [5])  # above the high watermark: no acknowledgement yet


def test_rule_6_a_lagging_follower_leaves_the_isr():
    lagging = dict(fetched=(5, 4, 5), lcu=(T, T - LAG - 1, T), hw=4)
    assert not idle(**lagging)
    assert idle(**{**lagging, "lcu": (T, T - LAG, T)})  # not lagging for more than the limit yet
    assert idle(**{**lagging, "in_isr": (True, False, True)})  # already out of the ISR
    assert idle(**{**lagging, "l_ok": False})  # no eligible leader: the tick checks nothing


def test_rule_4_a_high_watermark_that_would_move():
    assert not idle(hw=4)
    assert idle(hw=4, hw_moves=False)  # frozen, or the leader cannot advance it


def test_messages_a_control_point_would_settle_or_retry():
    assert not idle([MsgState.APPENDED], [T - 1], [0], [9])  # a delivery deadline passed
    assert idle([MsgState.ACKED], [T - 1], [0], [9])
    assert not idle([MsgState.REFUSED], [T + 1], [0], [-1])  # a retry may be scheduled (rule 3)
    assert idle([MsgState.REFUSED], [T + 1], [0], [-1], refusing=True)  # still refused: not materialized
    assert not idle([MsgState.APPENDED], [T + 1], [T], [4])  # under the high watermark: acknowledged now
    assert idle([MsgState.APPENDED], [T + 1], [T + 1], [4])  # requested after the tick
    assert not idle([MsgState.APPENDED], [T + 1], [T], [7], acks=AckCode.ONE)  # acks=1: held is enough
    assert idle([MsgState.WAITING], [T - 1], [0], [-1], acks=AckCode.ZERO)  # acks=0 has no deadlines
