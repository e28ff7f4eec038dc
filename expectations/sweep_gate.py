"""The sweep's output gate (SPEC §7 for sweeps): one GX validation of a sweep's results, before they are written.

The per-seed results are small (seeds × policies rows), so they are validated as one pandas frame:

- exactly one row per (seed, policy), and seeds × policies rows;
- a seed that passed the trace gate has every figure, one that broke a fatal rule has a rule count;
- produced = acked + failed + pending, acked_lost ≤ acked, availability in [0, 1];
- where per-window series were asked for, they sum to the run's acked_lost.

A failure raises GateFailed (exit 3) naming the check and the first (seed, policy) rows, after writing the
report under the lakehouse's `_reports/sweep_gate/<sweep_id>/` and a `validations` row.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from expectations import runner
from schemas.errors import GateFailed

SUITE = "sweep_gate"
INDEX = ["seed", "policy"]

#: check column -> what a row breaks when it is 1
CHECKS: dict[str, str] = {
    "c_figures_missing": "a seed that passed the trace gate has every run_summary figure",
    "c_fatal_without_rule": "a seed reported fatal names the rule it broke",
    "c_count_gap": "produced = acked + failed + pending",
    "c_lost_over_acked": "acked_lost <= acked",
    "c_availability_range": "availability in [0, 1]",
    "c_series_sum": "the per-window acked-lost series sums to acked_lost",
}


@dataclass
class SweepGateReport:
    success: bool
    failures: list[str]
    result: dict[str, Any]
    report_html: str | None = None


def frame(rows):
    """The results with one 0/1 column per check (pandas)."""
    import pandas as pd

    df = pd.DataFrame(rows)
    ok = df["status"] == "ok"
    produced, acked = df["produced"].astype("float"), df["acked"].astype("float")
    gap = produced - acked - df["failed"].astype("float") - df["pending"].astype("float")
    series_sum = df["loss_series"].map(lambda s: None if s is None else float(sum(s)))
    out = df[INDEX].copy()
    out["c_figures_missing"] = (ok & df["produced"].isna()).astype(int)
    out["c_fatal_without_rule"] = (~ok & (df["gate_fatal_rows"].fillna(0) <= 0)).astype(int)
    out["c_count_gap"] = (ok & (gap != 0)).astype(int)
    out["c_lost_over_acked"] = (ok & (df["acked_lost"].astype("float") > acked)).astype(int)
    avail = df["availability"].astype("float")
    out["c_availability_range"] = (ok & avail.notna() & ((avail < 0) | (avail > 1))).astype(int)
    out["c_series_sum"] = (ok & series_sum.notna() & (series_sum != df["acked_lost"].astype("float"))).astype(int)
    return out


def check_sweep_results(rows, *, seeds: int, policies: int) -> SweepGateReport:
    import great_expectations as gx

    df = frame(rows)
    expectations = [
        gx.expectations.ExpectTableRowCountToEqual(value=seeds * policies,
                                                   description="one row per seed and policy"),
        gx.expectations.ExpectCompoundColumnsToBeUnique(column_list=INDEX, description="no (seed, policy) twice"),
        *[gx.expectations.ExpectColumnValuesToBeBetween(column=c, min_value=0, max_value=0, description=text,
                                                        meta={"check": c})
          for c, text in CHECKS.items()],
    ]
    result = runner.validate(df, suite_name=SUITE, target="sweep_results", expectations=expectations,
                             result_format=runner.summary_format(INDEX))
    return report_of(result)


def report_of(result: dict[str, Any]) -> SweepGateReport:
    """A job-level gate's verdict from its GX result: one line per failed expectation, with a few offending rows."""
    failures = []
    for res in runner.failed_results(result):
        cfg = res.get("expectation_config", {})
        rows_out = runner.offending_rows(res, limit=5)
        failures.append(f"{cfg.get('description') or cfg.get('type')}: {runner.unexpected_count(res)} rows"
                        + (f", e.g. {rows_out}" if rows_out else ""))
    return SweepGateReport(not failures, failures, result)


def run_sweep_gate(rows, *, sweep_id: str, seeds: int, policies: int, lakehouse=None) -> SweepGateReport:
    """Check, write the report and the `validations` row (trace_id = the sweep id), raise GateFailed on failure."""
    report = check_sweep_results(rows, seeds=seeds, policies=policies)
    return publish_gate_report(report, suite=SUITE, key=sweep_id, target="sweep_results", what="sweep",
                               lakehouse=lakehouse)


def publish_gate_report(report: SweepGateReport, *, suite: str, key: str, target: str, what: str,
                        lakehouse=None) -> SweepGateReport:
    """A job-level gate's outcome (sweep, durability): its report under `_reports/<suite>/<key>/` and a
    `validations` row (trace_id = `key`) when there is a lakehouse; GateFailed (exit 3) when it failed."""
    from expectations.report import report_dir, write_report

    if lakehouse is not None:
        payload = {"suite": suite, "trace_id": key, "run_ids": [], "success": report.success,
                   "created_at": dt.datetime.now(dt.UTC).isoformat(),
                   "message": "; ".join(report.failures) or None, "validations": [report.result]}
        paths = write_report(report_dir(lakehouse.reports_root, suite, key, None), payload)
        report.report_html = str(paths.html_path)
        stats = report.result.get("statistics", {})
        lakehouse.record_validations([{
            "run_id": None, "trace_id": key, "suite": suite, "target": target,
            "success": report.success, "evaluated": stats.get("evaluated_expectations", 0),
            "successful": stats.get("successful_expectations", 0),
            "unexpected_rows": None, "report_path": report.report_html}])
    if not report.success:
        raise GateFailed(f"{what} {key}: " + "; ".join(report.failures), report_path=report.report_html)
    return report
