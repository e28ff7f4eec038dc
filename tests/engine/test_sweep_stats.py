"""The sweep's estimates (pipelines/sweep_estimates.py, scipy.stats): Wilson score, Student t, bootstrap and per-day
figures against hand-computed values.

z = 1.959964 (95 %). Wilson 0/10: upper = z² / (n + z²) = 0.27753; 5/10: 0.5 ± (z / (1 + z²/n)) ·
sqrt(0.025 + z²/400) = 0.5 ± 0.26340. t interval of [1, 2, 3, 4]: 2.5 ± t(0.975, 3) · s / 2 = 2.5 ± 3.182446 ·
1.290994 / 2 = 2.5 ± 2.054262.
"""

from __future__ import annotations

import pytest

from engine.sweep.estimates import bootstrap_median, estimate, per_day, t_interval, wilson_interval


@pytest.mark.parametrize(("k", "n", "low", "high"), [
    (0, 10, 0.0, 0.27753),
    (5, 10, 0.23659, 0.76341),
    (10, 10, 0.72247, 1.0),
    (1, 1, 0.20654, 1.0),
])
def test_wilson_interval(k, n, low, high):
    ci = wilson_interval(k, n)
    assert ci.estimate == k / n
    assert ci.low == pytest.approx(low, abs=1e-5) and ci.high == pytest.approx(high, abs=1e-5)


def test_wilson_needs_seeds():
    assert wilson_interval(0, 0).estimate is None
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_t_interval():
    ci = t_interval([1, 2, 3, 4])
    assert ci.estimate == 2.5
    assert ci.low == pytest.approx(2.5 - 2.054262, abs=1e-5) and ci.high == pytest.approx(2.5 + 2.054262, abs=1e-5)
    clipped = t_interval([0, 0, 0, 5], lower=0.0)
    assert clipped.low == 0.0 and clipped.estimate == 1.25
    assert t_interval([0.99, 1.0], upper=1.0).high == 1.0
    single = t_interval([7])
    assert (single.estimate, single.low, single.high) == (7.0, None, None)
    assert t_interval([]).estimate is None


def test_t_interval_without_spread_is_the_value():
    ci = t_interval([0, 0, 0])
    assert (ci.estimate, ci.low, ci.high) == (0.0, 0.0, 0.0)


def test_bootstrap_median():
    xs = [10.0, 12.0, 11.0, 50.0, 13.0, 12.5, 11.5, 10.5]
    ci = bootstrap_median(xs)
    assert ci.estimate == 11.75 and ci.method == "bootstrap"  # (11.5 + 12) / 2
    assert ci.low <= 11.75 <= ci.high and ci.low >= 10.0 and ci.high <= 50.0
    assert bootstrap_median(xs) == ci  # a fixed random state: a re-run prints the same interval
    assert bootstrap_median([5.0, 5.0]).low == 5.0
    assert bootstrap_median([3.0]).low is None


def test_per_day():
    """A 15 s trace: 5 760 traces a day; p = 0.01 per trace gives 1 − 0.99^5760 per day."""
    day = per_day(wilson_interval(1, 100), 15.0)
    assert day.estimate == pytest.approx(1 - 0.99 ** 5760)
    assert day.low == pytest.approx(1 - (1 - wilson_interval(1, 100).low) ** 5760)
    assert per_day(wilson_interval(0, 100), 15.0).estimate == 0.0


def test_estimate_of_a_policy():
    base = {"status": "ok", "ack_latency_p99_ms": 5.0, "unavailable_partition_seconds": 2.0, "brokers_used": 6,
            "replicas_per_message": 3.0, "replication_bytes": 1000}
    rows = [{**base, "seed": s, "acked_lost": lost, "availability": a}
            for s, lost, a in ((0, 0, 1.0), (1, 3, 0.9), (2, 1, 0.95), (3, 0, 1.0))]
    rows.append({"seed": 4, "status": "fatal", "acked_lost": None, "availability": None,
                 "ack_latency_p99_ms": None, "unavailable_partition_seconds": None, "replication_bytes": None})
    e = estimate("kafka:acks=1", "kafka-acks1", rows, duration_s=10.0)
    assert (e.seeds, e.fatal_seeds, e.seeds_with_loss) == (4, 1, 2)
    row = e.row()
    assert row["p_loss"] == 0.5 and row["mean_acked_lost"] == 1.0 and row["availability"] == pytest.approx(0.9625)
    assert row["p_loss_low"] < 0.5 < row["p_loss_high"]
    assert 0.0 <= row["mean_acked_lost_low"] < 1.0 < row["mean_acked_lost_high"]
    assert row["availability_high"] <= 1.0 and row["ack_p99_ms"] == 5.0 and row["unavailable_s"] == 2.0
    assert e.cost == (6.0, 3.0, 1000.0)


@pytest.mark.parametrize(("args", "message"), [
    (["--seeds", "0"], "--seeds must be at least 1"),
    (["--seeds", "2", "--scale", "0"], "--scale must be a number > 0"),
    (["--seeds", "2", "--first-seed", "-1"], "--first-seed must be >= 0"),
])
def test_bad_sweep_arguments_exit_2_before_any_work(args, message, capsys):
    from pipelines.cli import main

    assert main(["sweep", "--scenario", "k2-acks1-leader-crash", "--policy", "kafka-acks1", *args]) == 2
    assert message in capsys.readouterr().err
