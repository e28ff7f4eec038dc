"""Unavailability from message outcomes (SPEC §12.2), the one definition the testbed applies to both sides."""

from __future__ import annotations

import numpy as np
import pandas as pd

from testbed.compare import (
    UNAVAILABLE_AFTER_MS,
    in_replay_units,
    outcome_unavailability,
    summary_local,
    unavailable_seconds,
)

S = 1_000_000


def outcomes(rows, run_id="r"):
    """rows: (msg_id, partition, produce_s, status, ack_s or None)."""
    frame = pd.DataFrame(rows, columns=["msg_id", "partition", "produce_us", "status", "ack_us"])
    frame["produce_us"] = (frame["produce_us"] * S).astype("int64")
    frame["ack_us"] = [np.nan if a is None else a * S for a in frame["ack_us"]]
    frame["fate"] = "committed"
    frame["error"] = None
    if run_id is not None:
        frame.insert(0, "run_id", run_id)
    return frame


def spans(frame, duration_s=20):
    got = outcome_unavailability(frame, duration_s * S)
    return [(int(p), s / S, e / S) for p, s, e in zip(got["partition"], got["start_us"], got["end_us"], strict=True)]


def test_fast_failures_count_until_the_next_produce_acknowledged_in_time():
    # A dead master answers at once: each failed send is short, but the queue takes nothing for 4 s.
    rows = [(0, 0, 0.0, "acked", 0.01), (1, 0, 1.0, "failed", None), (2, 0, 2.0, "failed", None),
            (3, 0, 3.0, "failed", None), (4, 0, 5.0, "acked", 5.02), (5, 0, 6.0, "acked", 6.01)]
    assert spans(outcomes(rows)) == [(0, 1.0, 5.0)]


def test_a_slow_acknowledgement_counts_until_it_arrives_and_a_timely_one_does_not():
    slow = UNAVAILABLE_AFTER_MS / 1000
    rows = [(0, 1, 1.0, "acked", 1.0 + slow), (1, 1, 4.0, "acked", 4.0 + slow + 0.5),
            (2, 1, 5.0, "acked", 9.0), (3, 1, 10.0, "acked", 10.1)]
    assert spans(outcomes(rows)) == [(1, 4.0, 9.0)]


def test_pending_and_trailing_failures_run_to_the_end_and_partitions_are_apart():
    rows = [(0, 0, 1.0, "acked", 1.1), (1, 0, 18.0, "pending", None), (2, 1, 2.0, "failed", None),
            (3, 2, 2.0, "acked", 2.1)]
    assert spans(outcomes(rows)) == [(0, 18.0, 20.0), (1, 2.0, 20.0)]
    assert unavailable_seconds(outcome_unavailability(outcomes(rows), 20 * S), 20 * S) == 20.0


def test_both_sides_are_measured_alike_with_or_without_a_run_id():
    # The slow acknowledgement at 4 s does not end the failure's interval: the next timely produce (6 s) does.
    rows = [(0, 0, 0.5, "failed", None), (1, 0, 1.0, "acked", 4.0), (2, 3, 0.0, "acked", 0.2),
            (3, 0, 6.0, "acked", 6.1)]
    predicted, observed = outcomes(rows, run_id=None), outcomes(rows)
    assert spans(predicted) == spans(observed) == [(0, 0.5, 6.0)]
    a = summary_local(predicted, outcome_unavailability(predicted, 20 * S), 20 * S)
    b = summary_local(observed, outcome_unavailability(observed, 20 * S), 20 * S)
    assert a == b and a["unavailable_partition_seconds"] == 5.5


def test_observed_queues_are_summed_in_the_replays_units():
    # Two queues of one RocketMQ group, which the replay judges as one unit (its partition 0): the group was
    # unavailable from 1 s to 5 s, whichever queue a send went to.
    observed = outcomes([(0, 7, 1.0, "failed", None), (1, 8, 2.0, "failed", None), (2, 7, 5.0, "acked", 5.1),
                         (3, 8, 6.0, "acked", 6.1)])
    predicted = outcomes([(m, 0, 0.0, "acked", 0.1) for m in range(4)], run_id=None)
    assert spans(observed) == [(7, 1.0, 5.0), (8, 2.0, 6.0)]
    assert spans(in_replay_units(observed, predicted)) == [(0, 1.0, 5.0)]
