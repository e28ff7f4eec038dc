"""The sweep's estimates (pipelines/sweep_job.py): Wilson score and Student t intervals against hand-computed values.

z = 1.959964 (95 %). Wilson 0/10: upper = z² / (n + z²) = 0.27753; 5/10: 0.5 ± (z / (1 + z²/n)) ·
sqrt(0.025 + z²/400) = 0.5 ± 0.26340. t interval of [1, 2, 3, 4]: 2.5 ± t(0.975, 3) · s / 2 = 2.5 ± 3.182446 ·
1.290994 / 2 = 2.5 ± 2.054262.
"""

from __future__ import annotations

import pytest

from pipelines.sweep_job import PolicySweep, SeedOutcome, t_interval, wilson_interval


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


def test_policy_sweep_row():
    outcomes = [SeedOutcome(seed, f"t{seed}", f"r{seed}", 100, acked, lost, acked / 100)
                for seed, acked, lost in ((0, 100, 0), (1, 90, 3), (2, 95, 1), (3, 100, 0))]
    row = PolicySweep("kafka:acks=1", outcomes).row()
    assert row["seeds"] == 4 and row["seeds_with_loss"] == 2 and row["p_loss"] == 0.5
    assert row["mean_acked_lost"] == 1.0 and row["mean_availability"] == pytest.approx(0.9625)
    assert row["p_loss_low"] < 0.5 < row["p_loss_high"]
    assert 0.0 <= row["acked_lost_low"] < 1.0 < row["acked_lost_high"]
    assert row["availability_high"] <= 1.0


@pytest.mark.parametrize(("args", "message"), [
    (["--seeds", "0"], "--seeds must be at least 1"),
    (["--seeds", "2", "--scale", "0"], "--scale must be a number > 0"),
    (["--seeds", "2", "--first-seed", "-1"], "--first-seed must be >= 0"),
])
def test_bad_sweep_arguments_exit_2_before_any_work(args, message, capsys):
    from pipelines.cli import main

    assert main(["sweep", "--scenario", "k2-acks1-leader-crash", "--policy", "kafka-acks1", *args]) == 2
    assert message in capsys.readouterr().err
