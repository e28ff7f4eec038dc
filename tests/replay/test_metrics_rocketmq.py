"""RocketMQ user metrics (replay/metrics_rocketmq.py) on hand-made arrays and on the R1 ordered golden run."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipelines.trace_loader import read_events_arrow
from replay.local import replay_local
from replay.metrics_rocketmq import (
    KeyOrder,
    failed_committed_by_error,
    key_order,
    rocketmq_metrics,
    send_statuses,
    stranded_by_partition,
)
from replay.policies import parse_policy
from schemas.outcomes import Error, Fate, Status

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


def test_key_order_counts_switches_in_produce_order():
    # key a: queues 1, 1, 2, 1 (2 switches; the last two messages follow a switch); key b: queue 3 twice;
    # unkeyed and unrouted messages are ignored; order is by produce order, not array order.
    key = np.array(["a", "b", "a", None, "a", "b", "a", "c"], dtype=object)
    order = np.array([1, 2, 3, 4, 6, 7, 5, 8])
    part = np.array([1, 3, 1, 0, 1, 3, 2, -1])
    assert key_order(key, order, part) == KeyOrder(keys=2, keys_split=1, queue_switches=2, messages_after_switch=2)
    assert key_order(key, order, part, include=np.array([1, 1, 1, 1, 1, 1, 0, 1], bool)) == KeyOrder(2, 0, 0, 0)
    ids = np.array([0, 1, 0, -1, 0, 1, 0, 2])  # the same with key ids
    assert key_order(ids, order, part) == KeyOrder(2, 1, 2, 2)


def test_statuses_indeterminate_and_stranded():
    status = np.array([Status.ACKED, Status.FAILED, Status.FAILED, Status.ACKED, Status.PENDING, Status.FAILED])
    error = np.array([Error.NONE, Error.FLUSH_SLAVE_TIMEOUT, Error.SLAVE_NOT_AVAILABLE, Error.NONE, Error.NONE,
                      Error.NO_ROUTE])
    fate = np.array([Fate.COMMITTED, Fate.COMMITTED, Fate.LOST, Fate.COMMITTED, Fate.ABSENT, Fate.ABSENT])
    readable = np.array([True, True, False, False, False, False])
    part = np.array([0, 1, 2, 5, 0, -1])
    counts = send_statuses(status, error)
    assert (counts["SEND_OK"], counts["FLUSH_SLAVE_TIMEOUT"], counts["SLAVE_NOT_AVAILABLE"], counts["NO_ROUTE"],
            counts["PENDING"], counts["FLUSH_DISK_TIMEOUT"]) == (2, 1, 1, 1, 1, 0)
    assert failed_committed_by_error(status, error, fate) == {"flush_slave_timeout": 1}
    assert stranded_by_partition(status, fate, readable, part) == {5: 1}


def test_r1_ordered_key_moves_between_queues():
    """Reference E R1: key K goes to queue 3, then (route without group a) to queue 7, then back to 3."""
    manifest, table = read_events_arrow(SCENARIOS / "r1-async-master-crash")
    results = replay_local(parse_policy("rocketmq-ordered"), manifest, table, engine="kernel")
    cols = {name: [] for name in ("msg", "part", "status", "error", "fate", "readable")}
    for r in results:
        rec = r.messages.records
        cols["msg"] += rec.msg_id.tolist()
        cols["part"] += rec.payload["part"].tolist()
        cols["status"] += rec.status.tolist()
        cols["error"] += rec.error.tolist()
        cols["fate"] += r.messages.fate.tolist()
        cols["readable"] += r.messages.readable_at_end.tolist()
    keys = {2: "K", 5: "K", 10: "K", 13: "K"}
    key = np.array([keys.get(m) for m in cols["msg"]], dtype=object)
    metrics = rocketmq_metrics(key, np.array(cols["msg"]), np.array(cols["part"]), np.array(cols["status"]),
                               np.array(cols["error"]), np.array(cols["fate"]), np.array(cols["readable"]))
    # m5 (K) failed with no_route and is absent: K's committed messages are m2 (q3), m10 (q7), m13 (q3)
    assert (metrics["ordered_keys"], metrics["ordered_keys_split"], metrics["ordered_queue_switches"],
            metrics["ordered_messages_after_switch"]) == (1, 1, 2, 2)
    assert metrics["status_send_ok"] == 12 and metrics["status_no_route"] == 1 and metrics["stranded"] == 0
