"""The durability output gate: one GX validation of a durability run's estimates, before they are written.

- exactly one row per (policy, metric);
- every interval is ordered (low ≤ estimate ≤ high) and non-negative; probabilities lie in [0, 1];
- a bounded row (no sampled episode lost anything) has an estimate of 0 and a finite upper end;
- the effective sample size is ≥ 0 and the largest weight's share in [0, 1].

A failure raises GateFailed (exit 3) after writing the report under `_reports/durability_gate/<id>/` and a
`validations` row, like the sweep's gate (`expectations.sweep_gate`).
"""

from __future__ import annotations

import math
from typing import Any

from expectations import runner
from expectations.sweep_gate import SweepGateReport, publish_gate_report, report_of

SUITE = "durability_gate"
INDEX = ["policy", "metric"]
PROBABILITIES = frozenset({"p_loss_per_year"})

CHECKS: dict[str, str] = {
    "c_unordered": "low <= estimate <= high",
    "c_negative": "figures are >= 0",
    "c_probability_range": "a probability lies in [0, 1]",
    "c_bound_not_finite": "a bounded row has estimate 0 and a finite upper end",
    "c_ess_range": "effective sample size >= 0 and largest weight share in [0, 1]",
}


def frame(rows: list[dict[str, Any]]):
    import pandas as pd

    df = pd.DataFrame(rows)
    est, low, high = (df[c].astype("float") for c in ("estimate", "low", "high"))
    out = df[INDEX].copy()
    tol = 1e-12
    out["c_unordered"] = ((low > est * (1 + tol) + tol) | (est > high * (1 + tol) + tol)).astype(int)
    out["c_negative"] = ((low < 0) | (est < 0)).astype(int)
    prob = df["metric"].isin(PROBABILITIES)
    out["c_probability_range"] = (prob & ((high > 1) | (low < 0))).astype(int)
    bounded = df["bounded"].astype(bool)
    out["c_bound_not_finite"] = (bounded & df["metric"].eq("p_loss_per_year")
                                 & ((est != 0) | high.map(lambda v: not math.isfinite(v)))).astype(int)
    ess, share = df["loss_ess"].astype("float").fillna(0), df["largest_weight_share"].astype("float").fillna(0)
    out["c_ess_range"] = ((ess < 0) | (share < 0) | (share > 1 + tol)).astype(int)
    return out


def check_estimates(rows: list[dict[str, Any]], *, policies: int, metrics: int) -> SweepGateReport:
    import great_expectations as gx

    df = frame(rows)
    expectations = [
        gx.expectations.ExpectTableRowCountToEqual(value=policies * metrics,
                                                   description="one row per policy and metric"),
        gx.expectations.ExpectCompoundColumnsToBeUnique(column_list=INDEX, description="no (policy, metric) twice"),
        *[gx.expectations.ExpectColumnValuesToBeBetween(column=c, min_value=0, max_value=0, description=text,
                                                        meta={"check": c}) for c, text in CHECKS.items()],
    ]
    result = runner.validate(df, suite_name=SUITE, target="durability_estimates", expectations=expectations,
                             result_format=runner.summary_format(INDEX))
    return report_of(result)


def run_durability_gate(rows: list[dict[str, Any]], *, durability_id: str, policies: int, metrics: int,
                        lakehouse=None) -> SweepGateReport:
    report = check_estimates(rows, policies=policies, metrics=metrics)
    return publish_gate_report(report, suite=SUITE, key=durability_id, target="durability_estimates",
                               what="durability", lakehouse=lakehouse)
