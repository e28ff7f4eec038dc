"""The output gate (SPEC §7, §9): Great Expectations suites over a replay's DataFrames, run BEFORE any of the
run's tables is replaced ("validate before write", see `pipelines.lakehouse.Lakehouse.publish_runs`).

Expectations (targets are the run DataFrames; every target holds all runs of one replay invocation):
- message_outcomes: latency_us ≥ 0; one row per (run_id, msg_id); status and fate labels known.
- partition_states: high_watermark ≤ log_end_offset; the high watermark never decreases within a leader
  epoch (a window query: no row below the running max of the earlier rows of its run, partition and epoch).
- loss_metrics and run_summary: acked ≤ produced; acked_lost ≤ acked.
- summary vs windows: each run's summary totals equal the sums of its loss_metrics windows (produced, acked,
  failed, acked_lost, failed_committed, stranded, unavailable µs) and produced = acked + failed + pending.
- every message has exactly one outcome: when the trace's produced msg_ids are given, no run misses one and
  no run has an outcome for a msg_id that was not produced (with the uniqueness above: a bijection).
- extra named checks (the SPEC §9 invariants of `replay/invariants.py`): each is a DataFrame of offending
  rows (it should hold `run_id`) and must be empty.

A failure raises `GateFailed` (exit 3) whose message names the failed expectations, the runs they concern and
the HTML report; the gate run lands in `validations` either way. Map expectations report up to 20 offending
rows by their key columns; query expectations up to 20 full rows.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from expectations import runner
from schemas.errors import GateFailed
from schemas.outcomes import FATE_LABELS, STATUS_LABELS

SUITE = "output_gate"


@dataclass
class RunOutputs:
    """A replay invocation's DataFrames (all runs together), in the schemas of `schemas/tables.py`."""

    message_outcomes: Any
    partition_states: Any
    loss_metrics: Any
    run_summary: Any


@dataclass(frozen=True)
class NamedCheck:
    """An extra check: `rows` (a DataFrame, or a function returning one) holds the offending rows."""

    name: str
    rows: Any
    description: str = ""

    def dataframe(self):
        return self.rows() if callable(self.rows) else self.rows


@dataclass(frozen=True)
class GateFailure:
    """One failed expectation: where, what, how many rows, and the runs its reported rows belong to."""

    target: str
    expectation: str
    count: int
    run_ids: tuple[str, ...]
    #: The first offending rows (key columns for map expectations, whole rows for queries).
    rows: tuple[Any, ...] = ()


@dataclass
class OutputGateReport:
    success: bool
    run_ids: list[str]
    failed_run_ids: list[str]
    failures: list[GateFailure]
    gx_results: list[dict[str, Any]]
    evaluated: int = 0
    successful: int = 0
    unexpected_rows: int = 0
    report_json: Path | None = None
    report_html: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def message(self) -> str:
        shown = "; ".join(f"{f.target}: {f.expectation} ({f.count} offending row(s))" for f in self.failures[:5])
        more = f"; and {len(self.failures) - 5} more" if len(self.failures) > 5 else ""
        runs = ", ".join(self.failed_run_ids) or "?"
        return f"output gate failed for run(s) {runs}: {shown}{more} (SPEC §7)"


# ------------------------------------------------------------------------------------------------ suites
def _outcome_expectations() -> list[Any]:
    import great_expectations as gx

    return [
        gx.expectations.ExpectColumnValuesToBeBetween(column="latency_us", min_value=0,
                                                      description="latency >= 0"),
        gx.expectations.ExpectCompoundColumnsToBeUnique(column_list=["run_id", "msg_id"],
                                                        description="at most one outcome per message and run"),
        gx.expectations.ExpectColumnValuesToBeInSet(column="status", value_set=STATUS_LABELS,
                                                    description="status is acked, failed or pending"),
        gx.expectations.ExpectColumnValuesToBeInSet(column="fate", value_set=FATE_LABELS,
                                                    description="fate is committed, lost or absent"),
    ]


def _state_expectations() -> list[Any]:
    import great_expectations as gx

    return [gx.expectations.ExpectColumnPairValuesAToBeGreaterThanB(
        column_A="log_end_offset", column_B="high_watermark", or_equal=True,
        ignore_row_if="either_value_is_missing", description="high_watermark <= log_end_offset")]


HW_QUERY = (
    "SELECT run_id, `partition`, leader_epoch, ts_us, high_watermark, prev_max_high_watermark FROM ("
    " SELECT run_id, `partition`, leader_epoch, ts_us, high_watermark,"
    " MAX(high_watermark) OVER (PARTITION BY run_id, `partition`, leader_epoch ORDER BY ts_us"
    " ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_max_high_watermark FROM {batch})"
    " WHERE high_watermark < prev_max_high_watermark ORDER BY run_id, `partition`, ts_us")


def _hw_expectations() -> list[Any]:
    return [runner.unexpected_rows(HW_QUERY, description="high watermark never decreases within a leader epoch")]


def _count_expectations(what: str) -> list[Any]:
    import great_expectations as gx

    return [
        gx.expectations.ExpectColumnPairValuesAToBeGreaterThanB(
            column_A="produced", column_B="acked", or_equal=True, description=f"{what}: acked <= produced"),
        gx.expectations.ExpectColumnPairValuesAToBeGreaterThanB(
            column_A="acked", column_B="acked_lost", or_equal=True, description=f"{what}: acked_lost <= acked"),
    ]


_WINDOW_TOTALS = ("produced", "acked", "failed", "acked_lost", "failed_committed", "stranded")


def summary_vs_windows(run_summary, loss_metrics):
    """Each run's summary totals beside the sums of its windows (one row per run)."""
    from pyspark.sql import functions as F

    sums = loss_metrics.groupBy("run_id").agg(
        *[F.sum(c).cast("long").alias(f"windows_{c}") for c in _WINDOW_TOTALS],
        F.sum("unavailable_us").cast("long").alias("windows_unavailable_us"))
    out = run_summary.select(
        "run_id", *_WINDOW_TOTALS, "pending",
        F.round(F.col("unavailable_partition_seconds") * 1e6).cast("long").alias("unavailable_us"),
        (F.col("acked") + F.col("failed") + F.col("pending")).alias("acked_failed_pending"),
    ).join(sums, "run_id", "left")
    return out.fillna(0, subset=[f"windows_{c}" for c in (*_WINDOW_TOTALS, "unavailable_us")])


def _summary_window_expectations() -> list[Any]:
    # One query for all totals (not one pair expectation per total): GX resolves several Spark jobs per
    # expectation, and the offending rows name the totals that differ anyway.
    pairs = [(c, f"windows_{c}") for c in (*_WINDOW_TOTALS, "unavailable_us")]
    pairs.append(("produced", "acked_failed_pending"))
    differs = [f"{a} <> {b}" for a, b in pairs]
    names = ", ".join(f"IF({a} <> {b}, '{a} vs {b}', NULL)" for a, b in pairs)
    query = (f"SELECT run_id, concat_ws('; ', {names}) AS differing, * EXCEPT (run_id) FROM {{batch}} "
             f"WHERE {' OR '.join(differs)} ORDER BY run_id")
    return [runner.unexpected_rows(query, description="summary totals equal the sums of the windows, and "
                                                      "produced = acked + failed + pending")]


def message_coverage(message_outcomes, produced_msg_ids, run_ids: Sequence[str]):
    """Rows (run_id, msg_id, problem) for a produced message without an outcome in a run, or an outcome of a
    message the trace does not produce.

    One aggregation of the outcomes by msg_id (a message is covered when all runs have it; duplicates within
    a run are the uniqueness expectation's business), then only the offending msg_ids (normally none) are
    looked up again to name the runs.
    """
    from pyspark.sql import functions as F

    runs = F.array(*[F.lit(r) for r in run_ids])
    counts = message_outcomes.groupBy("msg_id").agg(F.count(F.lit(1)).alias("_n"))
    produced = produced_msg_ids.select("msg_id").distinct().withColumn("_produced", F.lit(True))
    offending = (produced.join(counts, "msg_id", "full_outer")
                 .where(F.col("_produced").isNull() | F.col("_n").isNull() | (F.col("_n") < len(run_ids)))
                 .select("msg_id", F.coalesce("_produced", F.lit(False)).alias("_produced")))
    # No broadcast hint: offending is normally empty and AQE then broadcasts it, but it may be large.
    present = (offending.join(message_outcomes.select("run_id", "msg_id"), "msg_id", "left")
               .groupBy("msg_id", "_produced").agg(F.collect_set("run_id").alias("_present")))
    return present.select(
        F.explode(F.when(F.col("_produced"), F.array_except(runs, F.col("_present"))).otherwise(F.col("_present")))
        .alias("run_id"), "msg_id",
        F.when(F.col("_produced"), F.lit("produced message without an outcome in this run"))
        .otherwise(F.lit("outcome of a message the trace does not produce")).alias("problem"))


def _rows_check(description: str) -> list[Any]:
    return [runner.unexpected_rows("SELECT * FROM {batch} ORDER BY 1", description=description)]


# ------------------------------------------------------------------------------------------------ the gate
def check_outputs(spark, outputs: RunOutputs, run_ids: Sequence[str], *, produced_msg_ids=None,
                  extra_checks: Sequence[NamedCheck] = ()) -> OutputGateReport:
    """Run every output expectation; no side effects (see `run_output_gate` for reports and tables)."""
    targets: list[tuple[str, Any, Callable[[], list[Any]], dict[str, Any]]] = [
        ("message_outcomes", outputs.message_outcomes, _outcome_expectations,
         runner.summary_format(["run_id", "msg_id"])),
        ("partition_states", outputs.partition_states, _state_expectations,
         runner.summary_format(["run_id", "partition", "ts_us"])),
        ("partition_states.hw_monotonic", outputs.partition_states, _hw_expectations, runner.ROWS_FORMAT),
        ("loss_metrics", outputs.loss_metrics, lambda: _count_expectations("loss_metrics"),
         runner.summary_format(["run_id", "partition", "window_start_us"])),
        ("run_summary", outputs.run_summary, lambda: _count_expectations("run_summary"),
         runner.summary_format(["run_id"])),
        ("summary_vs_windows", summary_vs_windows(outputs.run_summary, outputs.loss_metrics),
         _summary_window_expectations, runner.ROWS_FORMAT),
    ]
    if produced_msg_ids is not None:
        targets.append(("message_coverage", message_coverage(outputs.message_outcomes, produced_msg_ids, run_ids),
                        lambda: _rows_check("every produced message has exactly one outcome per run"),
                        runner.ROWS_FORMAT))
    for check in extra_checks:
        targets.append((f"invariant.{check.name}", check.dataframe(),
                        lambda c=check: _rows_check(c.description or f"invariant {c.name} holds (SPEC §9)"),
                        runner.ROWS_FORMAT))

    results, failures, failed_runs = [], [], set()
    attributed_all = True
    for target, df, expectations, fmt in targets:
        result = runner.validate(df, suite_name=SUITE, target=target, expectations=expectations(),
                                 result_format=fmt)
        results.append(result)
        for res in runner.failed_results(result):
            cfg = res.get("expectation_config", {})
            rows = runner.offending_rows(res)
            ids = {r.get("run_id") for r in rows if isinstance(r, dict) and r.get("run_id") is not None}
            if not ids:
                attributed_all = False
            failed_runs |= ids
            failures.append(GateFailure(target, cfg.get("description") or cfg.get("type", "?"),
                                        runner.unexpected_count(res), tuple(sorted(ids)), tuple(rows)))
    if failures and not attributed_all:
        failed_runs |= set(run_ids)
    evaluated = sum(r.get("statistics", {}).get("evaluated_expectations", 0) for r in results)
    successful = sum(r.get("statistics", {}).get("successful_expectations", 0) for r in results)
    return OutputGateReport(not failures, list(run_ids), sorted(failed_runs), failures, results, evaluated,
                            successful, sum(f.count for f in failures))


def run_output_gate(spark, outputs: RunOutputs, *, trace_id: str, run_ids: Sequence[str], lakehouse=None,
                    produced_msg_ids=None, extra_checks: Sequence[NamedCheck] = (),
                    reports_root: str | Path | None = None) -> OutputGateReport:
    """Check a replay's outputs; write the report and the `validations` rows; raise GateFailed on failure.

    Call it before writing any run table (Lakehouse.publish_runs does): on failure the tables keep their
    previous versions.
    """
    from expectations.report import report_dir, write_report

    report = check_outputs(spark, outputs, run_ids, produced_msg_ids=produced_msg_ids, extra_checks=extra_checks)
    root = Path(reports_root) if reports_root is not None else (
        lakehouse.reports_root if lakehouse is not None else None)
    if root is not None:
        run_part = run_ids[0] if len(run_ids) == 1 else f"{len(run_ids)}-runs-{'-'.join(sorted(run_ids))}"
        payload = {
            "suite": SUITE, "trace_id": trace_id, "run_ids": list(run_ids), "success": report.success,
            "failed_run_ids": report.failed_run_ids, "created_at": dt.datetime.now(dt.UTC).isoformat(),
            "message": None if report.success else report.message(), "validations": report.gx_results,
        }
        paths = write_report(report_dir(root, SUITE, trace_id, run_part), payload)
        report.report_json, report.report_html = paths.json_path, paths.html_path
    if lakehouse is not None:
        lakehouse.record_validations([
            {"run_id": run_id, "trace_id": trace_id, "suite": SUITE, "target": "run outputs",
             "success": run_id not in report.failed_run_ids, "evaluated": report.evaluated,
             "successful": report.successful, "unexpected_rows": report.unexpected_rows,
             "report_path": str(report.report_html) if report.report_html else None}
            for run_id in run_ids
        ])
    if not report.success:
        raise GateFailed(report.message(), report_path=str(report.report_html) if report.report_html else None)
    return report
