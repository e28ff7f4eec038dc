"""The output gate (SPEC §7, §9): Great Expectations suites over a replay's DataFrames, run BEFORE any of the
run's tables is replaced ("validate before write", see `storage.lakehouse.Lakehouse.publish_runs`).

Expectations (targets are the run DataFrames; every target holds all runs of one replay invocation):
- message_outcomes: latency_us ≥ 0; one row per (run_id, msg_id); status and fate labels known.
- partition_states: high_watermark ≤ log_end_offset; the high watermark never decreases within a leader
  epoch (a window query: no row below the running max of the earlier rows of its run, partition and epoch).
- loss_metrics and run_summary: acked ≤ produced; acked_lost ≤ acked.
- summary vs windows: each run's summary totals equal the sums of its loss_metrics windows (produced, acked,
  failed, acked_lost, failed_committed, stranded, unavailable µs) and produced = acked + failed + pending.
- summary vs outcomes: each run's summary counts equal the counts of its message_outcomes rows (the replay derives
  both the summary and the windows from the figures its tasks computed, this compares them with the outcomes).
- every message has exactly one outcome: when the trace's produced msg_ids are given, no run misses one and
  no run has an outcome for a msg_id that was not produced (with the uniqueness above: a bijection).
- extra named checks (the SPEC §9 invariants, `expectations/invariants.py`): each is a DataFrame of offending
  rows (it should hold `run_id`) and must be empty; one over message outcomes gives its rows' condition too, and
  the screen below counts them.

How it runs: every check is a Spark query of its offending rows (normally none). One Spark job counts each
check's rows exactly and keeps its first 20; GX then asserts, one expectation per check, that every count is 0,
on a one-row pandas frame of the counts. GX over the Spark tables themselves resolved several Spark jobs per
expectation (minutes per replay on two cores); this way the gate costs one job beside the screen below (the two
run concurrently), and GX's JSON/HTML report still holds one result per expectation, with the offending rows
beside it.

The checks over every message outcome (latency, status, fate, uniqueness, coverage, summary vs outcomes, the
invariants that give a `screen` condition) are screened first by ONE aggregation of message_outcomes per run
(`message_screen`): the rows breaking the row rules and the summary's counts are counted, and each run's outcomes
are compared with the produced messages by count and by two sums of 64-bit hashes of msg_id (a multiset
fingerprint: a run with a missing, extra or repeated message has another count or, but for a chance of about
2^-128, other sums). Only a check its screen flags runs its exact query, which then decides and reports the rows;
a check the screen clears holds with 0 rows (its GX result says `screened`). The exact uniqueness and coverage
queries aggregate every outcome by msg_id and join it with the produced messages: at 1 M events × 16 policies they
took 14 s of a replay's tail, the screen about as long as one scan of the outcomes.

A failure raises `GateFailed` (exit 3) whose message names the failed expectations, the runs they concern and
the HTML report; the gate run lands in `validations` either way. Failures report up to 20 offending rows each,
with their key columns.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from expectations import runner
from schemas.errors import GateFailed
from schemas.outcomes import FATE_LABELS, OUTCOME_COUNTS, STATUS_LABELS, outcome_flags
from storage.session import adaptive_off

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
    """An extra check: `rows` (a DataFrame, or a function returning one) holds the offending rows.

    `screen`, for a check over message outcomes: a condition on a message_outcomes row (a Column) that holds for
    exactly the rows `rows` returns. The gate then counts them per run in its one aggregation of the outcomes
    (`message_screen`) and runs `rows` only if some run has one, instead of scanning the outcomes once more."""

    name: str
    rows: Any
    description: str = ""
    screen: Any = None

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


# ------------------------------------------------------------------------------------------------ checks
@dataclass(frozen=True)
class Check:
    """One expectation of the gate: its target, its description, and the Spark query of its offending rows."""

    target: str
    description: str
    rows: Callable[[], Any]  # -> DataFrame of offending rows (with run_id where the row belongs to a run)
    #: The `message_screen` column that clears this check when it is 0 for every run (then `rows` does not run);
    #: None: `rows` always runs.
    screen: str | None = None


def _where(df, condition, *columns: str):
    return lambda: df.where(condition).select(*columns)


def hw_decreases(partition_states):
    """Rows whose high watermark is below the running max of earlier rows of the same run, partition, epoch."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    earlier = (Window.partitionBy("run_id", "partition", "leader_epoch").orderBy("ts_us")
               .rowsBetween(Window.unboundedPreceding, -1))
    return (partition_states.select("run_id", "partition", "leader_epoch", "ts_us", "high_watermark",
                                    F.max("high_watermark").over(earlier).alias("prev_max_high_watermark"))
            .where(F.col("high_watermark") < F.col("prev_max_high_watermark")))


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


def _differing(both, pairs: Sequence[tuple[str, str]], keep: Sequence[str]):
    """The rows of `both` where some pair of columns differs, naming those pairs (`differing`)."""
    from pyspark.sql import functions as F

    differs = F.lit(False)
    for a, b in pairs:
        differs = differs | ~F.col(a).eqNullSafe(F.col(b))
    names = F.concat_ws("; ", *[F.when(~F.col(a).eqNullSafe(F.col(b)), F.lit(f"{a} vs {b}")) for a, b in pairs])
    return both.where(differs).select(*keep, names.alias("differing"), *[c for c in both.columns if c not in keep])


def summary_window_mismatches(run_summary, loss_metrics):
    """Runs whose totals differ from their windows, naming the totals that differ (`differing`)."""
    pairs = [(c, f"windows_{c}") for c in (*_WINDOW_TOTALS, "unavailable_us")]
    pairs.append(("produced", "acked_failed_pending"))
    return _differing(summary_vs_windows(run_summary, loss_metrics), pairs, ["run_id"])


#: run_summary's message counts, which message_outcomes' rows must add up to.
_SUMMARY_COUNTS = ("produced", *OUTCOME_COUNTS)


def _outcome_counts() -> list[Any]:
    """Per run: its outcome rows and OUTCOME_COUNTS of them, as `outcomes_<count>` (aggregate columns)."""
    from pyspark.sql import functions as F

    flags = outcome_flags()
    return [F.count(F.lit(1)).alias("outcomes_produced"),
            *[F.sum(flags[c].cast("long")).alias(f"outcomes_{c}") for c in OUTCOME_COUNTS]]


def summary_outcome_mismatches(run_summary, message_outcomes):
    """Runs whose run_summary counts differ from the counts of their message_outcomes rows (a run without any row
    counts 0), naming the counts that differ (`differing`)."""
    from pyspark.sql import functions as F

    counts = message_outcomes.groupBy("run_id").agg(*_outcome_counts())
    both = (run_summary.select("run_id", *_SUMMARY_COUNTS).join(counts, "run_id", "full_outer")
            .fillna(0, subset=[f"outcomes_{c}" for c in _SUMMARY_COUNTS]))
    both = both.select("run_id", *[F.col(c) for c in _SUMMARY_COUNTS],
                       *[F.col(f"outcomes_{c}") for c in _SUMMARY_COUNTS])
    return _differing(both, [(c, f"outcomes_{c}") for c in _SUMMARY_COUNTS], ["run_id"])


#: Up to this many runs, `outcome_keys` counts a message's distinct runs as the bits of a BIGINT mask.
MASK_RUNS = 63


def outcome_keys(message_outcomes, run_ids: Sequence[str] | None = None):
    """Per msg_id: rows (`_n`) and distinct runs (`_runs`). One aggregation serves uniqueness and coverage.

    Given the invocation's run ids (at most MASK_RUNS), each row sets its run's bit and the runs are the mask's
    bits: an aggregation each task can do before the shuffle. countDistinct first shuffles every (msg_id, run_id)
    (11.3 of the output gate's 51 task-seconds for 3.7 M outcomes of 16 runs). A row of a run not in `run_ids`
    counts in `_n` only."""
    from pyspark.sql import functions as F

    if run_ids is None or len(run_ids) > MASK_RUNS:
        return message_outcomes.groupBy("msg_id").agg(F.count(F.lit(1)).alias("_n"),
                                                     F.countDistinct("run_id").alias("_runs"))
    bits = F.create_map(*[x for i, r in enumerate(run_ids) for x in (F.lit(r), F.lit(1 << i).cast("long"))])
    return (message_outcomes.groupBy("msg_id")
            .agg(F.count(F.lit(1)).alias("_n"), F.bit_or(bits[F.col("run_id")]).alias("_mask"))
            .select("msg_id", "_n", F.coalesce(F.bit_count("_mask"), F.lit(0)).cast("long").alias("_runs")))


def duplicate_outcomes(message_outcomes, keys):
    """Every row of a (run, message) that has more than one outcome."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    suspect = keys.where(F.col("_n") > F.col("_runs")).select("msg_id")  # normally empty
    # Broadcast: the gate's query has a static plan, which would otherwise shuffle every outcome to join them with
    # nothing (3.7 M rows of 16 runs); the suspects are at most one msg_id per produced message.
    rows = message_outcomes.join(F.broadcast(suspect), "msg_id", "left_semi")
    per_run = Window.partitionBy("run_id", "msg_id")
    return (rows.withColumn("outcomes", F.count(F.lit(1)).over(per_run)).where(F.col("outcomes") > 1)
            .select("run_id", "msg_id", "outcomes", "status"))


def message_coverage(message_outcomes, produced_msg_ids, run_ids: Sequence[str], keys=None):
    """Rows (run_id, msg_id, problem) for a produced message without an outcome in a run, or an outcome of a
    message the trace does not produce.

    One aggregation of the outcomes by msg_id (a message is covered when all runs have it; duplicates within
    a run are the uniqueness check's business), then only the offending msg_ids (normally none) are looked up
    again to name the runs.
    """
    from pyspark.sql import functions as F

    keys = keys if keys is not None else outcome_keys(message_outcomes, run_ids)
    runs = F.array(*[F.lit(r) for r in run_ids])
    produced = produced_msg_ids.select("msg_id").distinct().withColumn("_produced", F.lit(True))
    offending = (produced.join(keys, "msg_id", "full_outer")
                 .where(F.col("_produced").isNull() | F.col("_runs").isNull() | (F.col("_runs") < len(run_ids)))
                 .select("msg_id", F.coalesce("_produced", F.lit(False)).alias("_produced")))
    # Offending is normally empty and at most one row per produced message: broadcast, so that the outcomes are not
    # shuffled to meet it (the gate's query has a static plan). A broadcast side cannot be the preserved side of an
    # outer join, hence the inner join, then the offending messages no run has (`_present` empty).
    found = (message_outcomes.select("run_id", "msg_id").join(F.broadcast(offending), "msg_id")
             .groupBy("msg_id", "_produced").agg(F.collect_set("run_id").alias("_found")))
    present = (offending.join(found, ["msg_id", "_produced"], "left")
               .select("msg_id", "_produced", F.coalesce("_found", F.array().cast("array<string>")).alias("_present")))
    return present.select(
        F.explode(F.when(F.col("_produced"), F.array_except(runs, F.col("_present"))).otherwise(F.col("_present")))
        .alias("run_id"), "msg_id",
        F.when(F.col("_produced"), F.lit("produced message without an outcome in this run"))
        .otherwise(F.lit("outcome of a message the trace does not produce")).alias("problem"))


def _negative_latency():
    from pyspark.sql import functions as F

    return F.col("latency_us") < 0


def _unknown_label(column: str, labels: Sequence[str]):
    from pyspark.sql import functions as F

    return ~F.coalesce(F.col(column).isin(*labels), F.lit(False))


#: The fingerprint's columns: the count and the sums of two 64-bit hashes of msg_id, each as its high and low 32
#: bits (each sum exact in a BIGINT up to 2^31 rows per run; a sum over DECIMAL(38,0) took twice as long).
_FINGERPRINT = ("_n", "_h1_hi", "_h1_lo", "_h2_hi", "_h2_lo")


def _fingerprint(msg_id) -> list[Any]:
    """`_FINGERPRINT` of the msg_ids: equal for two multisets of msg_ids that are equal, and for different ones only
    by a chance of about 2^-128 (two independent 64-bit hashes summed exactly)."""
    from pyspark.sql import functions as F

    out = [F.count(F.lit(1)).alias("_n")]
    for name, hashed in (("_h1", F.xxhash64(msg_id)), ("_h2", F.xxhash64(msg_id, F.lit(1)))):
        out += [F.sum(F.shiftrightunsigned(hashed, 32)).alias(f"{name}_hi"),
                F.sum(hashed.bitwiseAND(F.lit(0xFFFFFFFF))).alias(f"{name}_lo")]
    return out


#: The screen's columns and the checks they clear (`Check.screen`).
SCREEN_LATENCY, SCREEN_STATUS, SCREEN_FATE, SCREEN_MESSAGES, SCREEN_SUMMARY = (
    "negative_latency", "unknown_status", "unknown_fate", "unmatched_messages", "summary_counts_differ")


def screen_column(check: NamedCheck) -> str:
    """The screen column of an extra check that has a `screen` condition."""
    return f"invariant_{check.name}"


def message_screen(message_outcomes, run_ids: Sequence[str], produced_msg_ids=None, run_summary=None,
                   extra_checks: Sequence[NamedCheck] = ()):
    """One row per run (of `run_ids`, and of any other run_id the outcomes hold): the rows breaking the row rules
    (SCREEN_LATENCY, SCREEN_STATUS, SCREEN_FATE) and those of each extra check's `screen` (`screen_column`); given
    the produced msg_ids (distinct, as the trace gate leaves them), SCREEN_MESSAGES = 1 when the run's outcomes are
    not one per produced message by count and fingerprint (`_fingerprint`); given run_summary, SCREEN_SUMMARY = 1
    when its counts are not those of the run's outcomes (`summary_outcome_mismatches`). ONE aggregation of the
    outcomes, per run before the shuffle."""
    from pyspark.sql import functions as F

    from storage.session import local_frame

    spark = message_outcomes.sparkSession
    counted = [(SCREEN_LATENCY, _negative_latency()), (SCREEN_STATUS, _unknown_label("status", STATUS_LABELS)),
               (SCREEN_FATE, _unknown_label("fate", FATE_LABELS)),
               *[(screen_column(c), c.screen) for c in extra_checks if c.screen is not None]]
    per_run = message_outcomes.groupBy("run_id").agg(
        *[F.sum(F.coalesce(cond, F.lit(False)).cast("long")).alias(name) for name, cond in counted],
        *_fingerprint(F.col("msg_id")), *(_outcome_counts()[1:] if run_summary is not None else ()))
    runs = local_frame(spark, [(r,) for r in run_ids], "run_id STRING")
    out = runs.join(per_run, "run_id", "full_outer")
    screens = [F.coalesce(F.col(name), F.lit(0)).cast("long").alias(name) for name, _ in counted]
    if run_summary is not None:
        out = out.join(run_summary.select("run_id", *[F.col(c).alias(f"_summary_{c}") for c in _SUMMARY_COUNTS]),
                       "run_id", "left")
        same = F.lit(True)
        for c in _SUMMARY_COUNTS:  # a run without outcome rows counts 0 of each
            ours = F.coalesce(F.col("_n" if c == "produced" else f"outcomes_{c}"), F.lit(0))
            same &= F.coalesce(ours == F.col(f"_summary_{c}"), F.lit(False))
        screens.append(F.when(same, 0).otherwise(1).cast("long").alias(SCREEN_SUMMARY))
    if produced_msg_ids is None:
        return out.select("run_id", *screens)
    produced = produced_msg_ids.agg(*_fingerprint(F.col("msg_id"))).select(
        *[F.col(c).alias(f"_produced{c}") for c in _FINGERPRINT])
    matched = (F.col("run_id").isin(*run_ids) if run_ids else F.lit(False)) & (
        F.coalesce(F.col("_n"), F.lit(0)) == F.col("_produced_n"))
    for c in _FINGERPRINT[1:]:  # a sum of no rows is null, on both sides alike
        matched &= F.col(c).eqNullSafe(F.col(f"_produced{c}"))
    return out.crossJoin(produced).select("run_id", *screens,
                                          F.when(matched, 0).otherwise(1).cast("long").alias(SCREEN_MESSAGES))


def screen_flags(message_outcomes, run_ids: Sequence[str], produced_msg_ids=None,
                 run_summary=None, extra_checks: Sequence[NamedCheck] = ()) -> dict[str, bool]:
    """Which screen columns flag some run (one Spark job)."""
    from pyspark.sql import functions as F

    screen = message_screen(message_outcomes, run_ids, produced_msg_ids, run_summary, extra_checks)
    names = [c for c in screen.columns if c != "run_id"]
    row = screen.agg(*[F.max(c).alias(c) for c in names]).first()
    return {c: bool(row[c]) for c in names}


def gate_checks(outputs: RunOutputs, run_ids: Sequence[str], *, produced_msg_ids=None,
                extra_checks: Sequence[NamedCheck] = ()) -> list[Check]:
    """Every expectation of the output gate, in report order (module docstring)."""
    from functools import cache

    from pyspark.sql import functions as F

    mo, ps, lm, rs = outputs.message_outcomes, outputs.partition_states, outputs.loss_metrics, outputs.run_summary

    @cache
    def keys():  # only when the uniqueness or the coverage query runs; one plan, whose exchange Spark reuses
        return outcome_keys(mo, run_ids)

    messages = SCREEN_MESSAGES if produced_msg_ids is not None else None
    checks = [
        Check("message_outcomes", "latency >= 0", _where(mo, _negative_latency(), "run_id", "msg_id", "latency_us"),
              SCREEN_LATENCY),
        Check("message_outcomes", "at most one outcome per message and run", lambda: duplicate_outcomes(mo, keys()),
              messages),
        Check("message_outcomes", "status is acked, failed or pending", _where(
            mo, _unknown_label("status", STATUS_LABELS), "run_id", "msg_id", "status"), SCREEN_STATUS),
        Check("message_outcomes", "fate is committed, lost or absent", _where(
            mo, _unknown_label("fate", FATE_LABELS), "run_id", "msg_id", "fate"), SCREEN_FATE),
        Check("partition_states", "high_watermark <= log_end_offset", _where(
            ps, F.col("high_watermark") > F.col("log_end_offset"), "run_id", "partition", "ts_us",
            "high_watermark", "log_end_offset")),
        Check("partition_states.hw_monotonic", "high watermark never decreases within a leader epoch",
              lambda: hw_decreases(ps)),
    ]
    for name, df, keys_of in (("loss_metrics", lm, ("run_id", "partition", "window_start_us")),
                              ("run_summary", rs, ("run_id",))):
        checks += [
            Check(name, f"{name}: acked <= produced", _where(df, F.col("acked") > F.col("produced"), *keys_of,
                                                             "produced", "acked")),
            Check(name, f"{name}: acked_lost <= acked", _where(df, F.col("acked_lost") > F.col("acked"),
                                                               *keys_of, "acked", "acked_lost")),
        ]
    checks.append(Check("summary_vs_windows", "summary totals equal the sums of the windows, and produced = acked "
                        "+ failed + pending", lambda: summary_window_mismatches(rs, lm)))
    checks.append(Check("summary_vs_outcomes", "summary counts equal the counts of the run's message outcomes",
                        lambda: summary_outcome_mismatches(rs, mo), SCREEN_SUMMARY))
    if produced_msg_ids is not None:
        checks.append(Check("message_coverage", "every produced message has exactly one outcome per run",
                            lambda: message_coverage(mo, produced_msg_ids, run_ids, keys()), messages))
    for check in extra_checks:
        checks.append(Check(f"invariant.{check.name}", check.description or f"invariant {check.name} holds "
                            "(SPEC §9)", check.dataframe,
                            screen_column(check) if check.screen is not None else None))
    return checks


def violations_frame(spark, checks: Sequence[Check]):
    """All checks' offending rows in one frame: check index, run_id, the row as JSON."""
    from pyspark.sql import functions as F

    parts = []
    for i, check in enumerate(checks):
        df = check.rows()
        run = F.col("run_id").cast("string") if "run_id" in df.columns else F.lit(None).cast("string")
        parts.append(df.select(F.lit(i).alias("check"), run.alias("run_id"),
                               F.to_json(F.struct(*[F.col(f"`{c}`") for c in df.columns]),
                                         {"ignoreNullFields": "false"}).alias("row")))
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out


def offending(spark, checks: Sequence[Check]) -> tuple[list[int], list[list[dict[str, Any]]]]:
    """Exact offending-row count of every check and its first rows, in ONE Spark job (normally empty)."""
    import json

    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if not checks:
        return [], []
    by_check = Window.partitionBy("check")
    query = (violations_frame(spark, checks)
             .withColumn("_count", F.count(F.lit(1)).over(by_check))
             .withColumn("_rank", F.row_number().over(by_check.orderBy("run_id", "row")))
             .where(F.col("_rank") <= runner.PARTIAL_ROWS))
    # Adaptive execution runs each of the query's shuffles as a Spark job of its own: a three-message replay's gate
    # took 43 jobs, 25 with a static plan (the inputs' cache fills and one job). Measured wall time: about the same.
    with adaptive_off(spark):
        first = query.collect()
    counts, rows = [0] * len(checks), [[] for _ in checks]
    for r in sorted(first, key=lambda r: (r["check"], r["_rank"])):
        counts[r["check"]] = int(r["_count"])
        rows[r["check"]].append(json.loads(r["row"]))
    return counts, rows


def check_column(i: int, check: Check) -> str:
    return f"{i:02d} {check.target}: {check.description}"


def _expectations(checks: Sequence[Check]) -> list[Any]:
    import great_expectations as gx

    return [gx.expectations.ExpectColumnValuesToBeBetween(
        column=check_column(i, check), min_value=0, max_value=0,
        description=f"{check.target}: no row breaks \"{check.description}\"",
        meta={"target": check.target, "check": i, "expectation": check.description, "spec": "§7"})
        for i, check in enumerate(checks)]


def check_outputs(spark, outputs: RunOutputs, run_ids: Sequence[str], *, produced_msg_ids=None,
                  extra_checks: Sequence[NamedCheck] = ()) -> OutputGateReport:
    """Run every output expectation; no side effects (see `run_output_gate` for reports and tables)."""
    import pandas as pd

    checks = gate_checks(outputs, run_ids, produced_msg_ids=produced_msg_ids, extra_checks=extra_checks)
    unscreened = [i for i, c in enumerate(checks) if c.screen is None]
    # The screen and the checks it does not cover, as two concurrent jobs (Spark shares the cores between their
    # tasks: 4.8-6.1 s against 6.3-6.6 s one after the other in the demo); then the exact queries of the checks
    # the screen flags, normally none. A static plan for both: the screen is small aggregations and joins.
    with adaptive_off(spark), ThreadPoolExecutor(2, thread_name_prefix="replab-gate") as pool:
        screened = pool.submit(screen_flags, outputs.message_outcomes, run_ids, produced_msg_ids,
                               outputs.run_summary, extra_checks)
        found = pool.submit(offending, spark, [checks[i] for i in unscreened])
        flags, (counts_found, rows_found) = screened.result(), found.result()
    flagged = [i for i, c in enumerate(checks) if c.screen is not None and flags[c.screen]]
    if flagged:
        more = offending(spark, [checks[i] for i in flagged])
        counts_found, rows_found = counts_found + more[0], rows_found + more[1]
    queried = unscreened + flagged
    counts, rows = [0] * len(checks), [[] for _ in checks]
    for i, count, first in zip(queried, counts_found, rows_found, strict=True):
        counts[i], rows[i] = count, first
    frame = pd.DataFrame({check_column(i, c): [counts[i]] for i, c in enumerate(checks)})
    result = runner.validate(frame, suite_name=SUITE, target="run_outputs", expectations=_expectations(checks))
    for res in result.get("results", []):  # the exact count and first rows beside GX's verdict, for the report
        i = int(res["expectation_config"]["meta"]["check"])
        res.setdefault("result", {}).update(offending_count=counts[i], offending_rows=rows[i],
                                            screened=i not in queried)
    failures, failed_runs, attributed_all = [], set(), True
    for res in runner.failed_results(result):
        i = int(res["expectation_config"]["meta"]["check"])
        ids = {r.get("run_id") for r in rows[i] if r.get("run_id") is not None}
        attributed_all &= bool(ids)
        failed_runs |= ids
        failures.append(GateFailure(checks[i].target, checks[i].description, counts[i], tuple(sorted(ids)),
                                    tuple(rows[i])))
    if failures and not attributed_all:
        failed_runs |= set(run_ids)
    stats = result.get("statistics", {})
    return OutputGateReport(not failures, list(run_ids), sorted(failed_runs), failures, [result],
                            stats.get("evaluated_expectations", 0), stats.get("successful_expectations", 0),
                            sum(f.count for f in failures))


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
