"""Run Great Expectations 1.x suites on Spark DataFrames, one way for both gates (SPEC §7).

One ephemeral GX context per process (suites are code in this package, not a stored GX project), a Spark
datasource with one DataFrame asset per validated target, progress bars off (they would go to the CLI's
stderr). Each expectation carries its own result format: UnexpectedRowsExpectation needs COMPLETE to return
its (at most 200) offending rows; map expectations use SUMMARY with index columns so that a failure names
the rows (run_id, partition, msg_id, ...), never the whole list. GX applies one result format per
validation run, so a target is validated either with query expectations (`ROWS_FORMAT`) or with map
expectations (`summary_format(...)`), not both.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

_LOCK = threading.Lock()
_CONTEXT: Any = None

#: Offending rows kept per expectation in results and reports (GX's own cap for query results is 200).
PARTIAL_ROWS = 20


def context():
    """The process's GX context (ephemeral: nothing is written outside the lakehouse's reports)."""
    global _CONTEXT
    with _LOCK:
        if _CONTEXT is None:
            import great_expectations as gx
            from great_expectations.data_context.types.base import ProgressBarsConfig

            ctx = gx.get_context(mode="ephemeral")
            ctx.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
            ctx.data_sources.add_spark(name="replab")
            # Small frames the gates computed with Spark (counts of offending rows) are validated with pandas:
            # GX on Spark costs several Spark jobs per expectation, even over a one-row frame.
            ctx.data_sources.add_pandas(name="replab_pandas")
            _CONTEXT = ctx
        return _CONTEXT


def summary_format(index_columns: Sequence[str] = ()) -> dict[str, Any]:
    """Result format of map expectations: counts plus a few offending rows named by `index_columns`."""
    fmt: dict[str, Any] = {"result_format": "SUMMARY", "partial_unexpected_count": PARTIAL_ROWS}
    if index_columns:
        fmt["unexpected_index_column_names"] = list(index_columns)
    return fmt


#: Result format for UnexpectedRowsExpectation: COMPLETE is what returns its rows (GX caps them at 200).
ROWS_FORMAT: dict[str, Any] = {"result_format": "COMPLETE"}


def unexpected_rows(query: str, *, description: str, meta: dict[str, Any] | None = None,
                    severity: str = "critical"):
    """An UnexpectedRowsExpectation: fails when `query` over {batch} returns rows; reports the rows."""
    import great_expectations as gx

    return gx.expectations.UnexpectedRowsExpectation(
        unexpected_rows_query=query, description=description, meta=meta or {}, severity=severity)


def validate(df, *, suite_name: str, target: str, expectations: Sequence[Any],
             result_format: dict[str, Any] | None = None) -> dict[str, Any]:
    """Validate one DataFrame (Spark, or a small pandas frame) against `expectations`; returns GX's result as a
    JSON-ready dict.

    `target` names the asset (e.g. "message_outcomes"); the suite is rebuilt on every call so that a suite's
    code is the only definition of it (pass new expectation objects each time: GX gives them ids).
    """
    import great_expectations as gx
    import pandas as pd

    ctx = context()
    name = f"{suite_name}.{target}"
    with _LOCK:
        source = ctx.data_sources.get("replab_pandas" if isinstance(df, pd.DataFrame) else "replab")
        try:
            asset = source.get_asset(name)
        except LookupError:
            asset = source.add_dataframe_asset(name=name)
        try:
            batch_def = asset.get_batch_definition("whole")
        except KeyError:
            batch_def = asset.add_batch_definition_whole_dataframe("whole")
        suite = gx.ExpectationSuite(name=name, expectations=list(expectations))
        suite = ctx.suites.add_or_update(suite)
        vd = ctx.validation_definitions.add_or_update(gx.ValidationDefinition(name=name, data=batch_def,
                                                                              suite=suite))
    result = vd.run(batch_parameters={"dataframe": df}, result_format=result_format or summary_format())
    out = result.to_json_dict()
    out["target"] = target
    return out


def failed_results(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in result.get("results", []) if not r.get("success")]


def unexpected_count(expectation_result: dict[str, Any]) -> int:
    """Offending rows of one expectation result (map expectations and UnexpectedRowsExpectation alike)."""
    res = expectation_result.get("result") or {}
    if res.get("offending_count") is not None:  # a count computed by Spark and asserted by GX (the gates)
        return int(res["offending_count"])
    if "unexpected_count" in res and res["unexpected_count"] is not None:
        return int(res["unexpected_count"])
    observed = res.get("observed_value")
    if expectation_result.get("expectation_config", {}).get("type") == "unexpected_rows_expectation":
        return int(observed or 0)
    return 0 if expectation_result.get("success") else 1


def offending_rows(expectation_result: dict[str, Any], limit: int = PARTIAL_ROWS) -> list[dict[str, Any]]:
    res = expectation_result.get("result") or {}
    rows = res.get("offending_rows")
    if rows is None:
        rows = (res.get("details") or {}).get("unexpected_rows")
    if rows is None:
        rows = res.get("partial_unexpected_index_list") or [
            {"value": v} for v in (res.get("partial_unexpected_list") or [])]
    return list(rows)[:limit]
