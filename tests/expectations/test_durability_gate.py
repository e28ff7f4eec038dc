"""The durability output gate passes ordered, in-range estimates and refuses each broken rule by name."""

from __future__ import annotations

import pytest

from expectations.durability_gate import check_estimates


def _rows(**change):
    rows = [{"policy": p, "metric": m, "estimate": 0.1, "low": 0.05, "high": 0.2, "bounded": False, "loss_ess": 12.0,
             "largest_weight_share": 0.3} for p in ("a", "b") for m in ("p_loss_per_year", "nines")]
    rows[0].update(change)
    return rows


def test_good_estimates_pass():
    assert check_estimates(_rows(), policies=2, metrics=2).success


@pytest.mark.parametrize(("change", "rule"), [
    ({"low": 0.3}, "low <= estimate <= high"),
    ({"high": 1.5}, "a probability lies in [0, 1]"),
    ({"bounded": True}, "a bounded row has estimate 0"),
    ({"largest_weight_share": 1.5}, "largest weight share in [0, 1]"),
])
def test_each_broken_rule_is_named(change, rule):
    report = check_estimates(_rows(**change), policies=2, metrics=2)
    assert not report.success and any(rule in f for f in report.failures), report.failures


def test_a_missing_row_fails():
    assert not check_estimates(_rows()[1:], policies=2, metrics=2).success
