"""The trace quality gate: every validity rule of SPEC §2.3, as a Great Expectations suite over Spark.

How a rule is checked: `annotate()` adds one boolean column per rule to the events, computed by the rules' one
definition, `expectations.trace_rules.TraceRules` (Arrow, numpy), in `mapInArrow` tasks that see each broker's
rows in (ts_us, SPEC §2.2 same-instant kind order, file, row) order; one Spark job counts each rule's flagged
rows and keeps the first ones in file/row order, and the GX suite holds one expectation per rule asserting that
its count is 0. A small trace (a CSV, or Parquet of at most `LOCAL_ROWS` events) has the same columns computed
on the driver instead, by one `TraceRules` pass over the trace read whole into Arrow, in the same order: below
that size the Spark tasks' shuffle, sort and Python workers cost several times the rules themselves, and the
report is the same either way (tests/expectations/test_trace_gate_paths.py). The quarantine split uses the very
same columns. Fatal rules are GX severity `critical`, quarantine rules `warning`; the column checks (missing
column, wrong type) are GX expectations over the columns' types that run first, since nothing else can be
computed without the columns.

Broker state, as the replay sees it (SPEC §2.2): every broker starts up and not isolated; crash, power_loss,
disk_loss and shutdown take it down, restart brings it back; isolate cuts it off until heal (a crash does not
end an isolation: the network is not the process). A replicate report's "earlier reports" are the reports of
the same broker since its last restart that the replay applies (reports quarantined for arriving while the
broker is down or isolated do not count).

Rows are located by `_file` and `_row` (1-based data row within the file; a CSV header is not counted), which
`storage.trace_loader.read_events_spark(..., with_location=True)` provides; DataFrames without them get
nulls ("where known").
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from expectations import runner
from expectations.trace_rules import (  # the rules' one definition (SPEC §2.3), re-exported for the gate's users
    FATAL,
    QUARANTINE,
    ROW_RULES,
    RULES,
    RULES_BY_NAME,
    SCHEMA_RULES,
    Rule,
)
from schemas.errors import BadInput
from schemas.trace import EVENT_COLUMNS, Kind, Manifest, TraceFiles

if TYPE_CHECKING:
    from storage.trace_loader import TraceDigest

SUITE = "trace_gate"
EVENT_NAMES: tuple[str, ...] = tuple(n for n, _ in EVENT_COLUMNS)
LOCATION = ("_file", "_row")
#: How many offending rows a rule keeps in the report (GX returns at most 200).
FIRST_ROWS = runner.PARTIAL_ROWS
#: A Parquet trace of at most this many events (2**20) has its rule columns computed on the driver: one
#: `TraceRules` pass over one Arrow table, without the shuffle, the sort and the Python workers of the Spark tasks,
#: which cost more than the rules below this size (about half the time at 1 M events). It costs the driver's
#: Python about 250 bytes per event at its peak (0.27 GB more at 1 M events), so larger traces stay in Spark
#: tasks, where the driver's memory does not bound them.
LOCAL_ROWS = 1 << 20


def short_lived_gate(trace: str | Path) -> bool:
    """Whether a process that runs the gate alone on `trace` (`replab validate`) may start its JVM on HotSpot's C1
    compiler only (`storage.session.get_spark(short_lived=True)`): a trace of at most LOCAL_ROWS events has its
    rules computed on the driver and leaves the JVM a few small queries and commits, over before C2's code pays off.
    Counted before Spark starts
    (`storage.trace_loader.rows_before_start`). A trace that cannot be read is not: the gate reports it."""
    from storage.trace_loader import rows_before_start

    rows = rows_before_start(trace)
    return rows is not None and rows <= LOCAL_ROWS


_SPARK_TYPE_NAMES = {"int64": "bigint", "int32": "int", "string": "string"}  # Spark simpleString


@dataclass
class RuleOutcome:
    rule: str
    severity: str
    description: str
    count: int
    #: The first offending rows in (file, row) order: the event columns plus _file/_row where known.
    first_rows: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "severity": self.severity, "description": self.description,
                "count": self.count, "first_rows": self.first_rows}


@dataclass
class TraceRuleReport:
    """What the trace gate found: per rule, how many rows break it and the first of them (file/row)."""

    trace_id: str
    duration_us: int
    brokers: tuple[int, ...]
    outcomes: list[RuleOutcome]
    #: GX's results (JSON dicts): the schema validation, then the rule validation when it ran.
    gx_results: list[dict[str, Any]]
    #: The events with their rule columns (not persisted: a lineage); None when the columns themselves are bad.
    annotated: Any = None
    #: The annotated rows that break at least one rule, usually few or none (persisted when Spark tasks computed
    #: them; on the driver path, a small frame built from Arrow).
    violations: Any = None
    #: Where the rule columns were computed: "spark" (tasks) or "driver" (a small trace, `LOCAL_ROWS`).
    checked_on: str = "spark"

    @property
    def counts(self) -> dict[str, int]:
        return {o.rule: o.count for o in self.outcomes}

    @property
    def fatal_count(self) -> int:
        return sum(o.count for o in self.outcomes if o.severity == FATAL)

    @property
    def quarantine_count(self) -> int:
        return sum(o.count for o in self.outcomes if o.severity == QUARANTINE)

    @property
    def success(self) -> bool:
        """No fatal rule broken (quarantined rows do not stop a replay)."""
        return self.fatal_count == 0

    def first_fatal(self) -> tuple[RuleOutcome, dict[str, Any] | None] | None:
        """The fatal violation a user should fix first: the earliest row (file, row), then rule order."""
        best, best_key = None, None
        for order, o in enumerate(self.outcomes):
            if o.severity != FATAL or o.count == 0:
                continue
            row = o.first_rows[0] if o.first_rows else None
            key = (row is None, (row or {}).get("_file") or "", (row or {}).get("_row") or math.inf, order)
            if best_key is None or key < best_key:
                best, best_key = (o, row), key
        return best

    def detail(self, outcome: RuleOutcome, row: dict[str, Any] | None) -> str:
        if row is None:
            return outcome.description
        ctx = {n: None for n in (*EVENT_NAMES, "_first_file", "_first_row", "_prev_max_upto_us", "detail")}
        ctx.update(row)
        ctx.update(duration_us=self.duration_us, brokers=", ".join(map(str, self.brokers)))
        return RULES_BY_NAME[outcome.rule].detail.format(**ctx)

    def to_bad_input(self, report_path: str | Path | None = None) -> BadInput:
        found = self.first_fatal()
        if found is None:
            raise ValueError("no fatal violation to report")
        outcome, row = found
        message = self.detail(outcome, row)
        others = self.fatal_count - 1
        if others > 0:
            message += f" ({others} more row(s) break fatal rules of SPEC §2.3)"
        if report_path is not None:
            message += f"; report: {report_path}"
        return BadInput(message, file=(row or {}).get("_file"), row=(row or {}).get("_row"), rule=outcome.rule)

    def quarantine_rows(self, run_id: str | None = None):
        """Rows for the `quarantine` table: the raw row as JSON, rule, severity, file and row."""
        from pyspark.sql import functions as F

        if self.violations is None:
            raise ValueError("no annotated events (the column checks failed)")
        parts = []
        for rule in ROW_RULES:
            if rule.severity != QUARANTINE:
                continue
            parts.append(self.violations.where(F.col(rule.column)).select(
                F.lit(run_id).cast("string").alias("run_id"), F.lit(self.trace_id).alias("trace_id"),
                F.col("_file").alias("file"), F.col("_row").alias("row"),
                F.to_json(F.struct(*EVENT_NAMES), {"ignoreNullFields": "false"}).alias("raw"),
                F.lit(rule.name).alias("rule"), F.lit(rule.severity).alias("severity")))
        out = parts[0]
        for p in parts[1:]:
            out = out.unionByName(p)
        return out

    def clean_events(self):
        """The events the replay uses: every row minus the quarantined ones, with the SPEC §2.1 columns."""
        from pyspark.sql import functions as F

        if not self.success:
            raise ValueError("the trace breaks fatal rules; there are no clean events")
        return self.annotated.where(~F.col("_quarantined")).select(*EVENT_NAMES)

    def as_dict(self) -> dict[str, Any]:
        return {"trace_id": self.trace_id, "success": self.success, "fatal_count": self.fatal_count,
                "quarantine_count": self.quarantine_count, "rules": [o.as_dict() for o in self.outcomes]}

    def release(self) -> None:
        if self.violations is not None:
            self.violations.unpersist()


# ----------------------------------------------------------------------------------------------- annotation
def _kind_order():
    from pyspark.sql import functions as F

    pairs = []
    for k in Kind:
        pairs += [F.lit(k.label), F.lit(int(k))]
    return F.create_map(*pairs)[F.col("kind")]


#: What `annotate` adds to the events (and `_file`/`_row`), (name, Spark type): one boolean per row rule,
#: `_prev_max_upto_us`, and `_quarantined` (some quarantine rule broken).
ANNOTATION: tuple[tuple[str, str], ...] = (*((r.column, "boolean") for r in ROW_RULES),
                                           ("_prev_max_upto_us", "bigint"), ("_quarantined", "boolean"))


def _annotation_columns(verdict) -> tuple[list[Any], list[str]]:
    """The arrays and names of ANNOTATION for one chunk's `ChunkVerdict`."""
    import pyarrow as pa

    columns = [*[pa.array(verdict.flags[r.name]) for r in ROW_RULES],
               pa.array(verdict.prev_max_upto, pa.int64(), mask=~verdict.has_prev_max_upto),
               pa.array(verdict.quarantine)]
    return columns, [name for name, _ in ANNOTATION]


def _annotated_schema(events_df):
    """The schema of `annotate`'s output: the events' columns, then ANNOTATION (a StructType built here: the
    JVM's DDL parser costs a cold session about half a second)."""
    from pyspark.sql import types as T

    spark_type = {"boolean": T.BooleanType(), "bigint": T.LongType()}
    return T.StructType([*events_df.schema.fields, *[T.StructField(n, spark_type[t]) for n, t in ANNOTATION]])


def _rule_flags(manifest: Manifest):
    """The mapInArrow function of `annotate`: each task's rows through one `TraceRules` (the rules' one
    definition, expectations/trace_rules.py), its state carried over the task's Arrow batches."""
    import pyarrow as pa

    def flags(batches):
        from expectations.trace_rules import TraceRules

        rules = TraceRules(manifest)
        for batch in batches:
            columns, names = _annotation_columns(rules.check(pa.Table.from_batches([batch])))
            yield pa.RecordBatch.from_arrays([*batch.columns, *columns], names=[*batch.schema.names, *names])

    return flags


def annotate(events_df, manifest: Manifest):
    """The events plus one boolean column per rule of ROW_RULES (true = the row breaks it), `_quarantined`,
    and `_prev_max_upto_us` (what an `upto-decreasing` row is reported with).

    The rules are `expectations.trace_rules.TraceRules`, run by `mapInArrow`: one shuffle puts every broker's
    rows in one task, sorted by (ts_us, SPEC §2.2 same-instant kind order, file, row), and every produce row of
    a msg_id in one task, in (file, row) order (msg_id uniqueness is trace-wide, its first occurrence the earliest
    row; no other rule carries state across produce rows). Produce rows are hashed by msg_id over the tasks: in one
    task they were most of the gate at 10 M events (one core busy for 23 s, the other idle).
    """
    from pyspark.sql import functions as F

    df = events_df
    if "_file" not in df.columns:
        df = df.withColumn("_file", F.lit(None).cast("string"))
    if "_row" not in df.columns:
        df = df.withColumn("_row", F.lit(None).cast("long"))
    df = df.select(*EVENT_NAMES, "_file", "_row")
    is_produce = F.coalesce(F.col("kind") == Kind.PRODUCE.label, F.lit(False))
    # Produce rows under keys -2 … -(parts + 1) by msg_id; a row without broker is its own broker -1, as TraceRules
    # groups it.
    parts = max(1, int(df.sparkSession.conf.get("spark.sql.shuffle.partitions")))
    task = F.when(is_produce, -2 - F.pmod(F.xxhash64("msg_id"), F.lit(parts))).otherwise(
        F.coalesce(F.col("broker"), F.lit(-1)))
    ordered = (df.repartition(parts, task)
               .sortWithinPartitions(F.when(~is_produce, F.col("ts_us")).asc_nulls_first(),
                                     F.when(~is_produce, _kind_order()).asc_nulls_first(),
                                     F.col("_file").asc_nulls_first(), "_row", "upto_us"))
    return ordered.mapInArrow(_rule_flags(manifest), _annotated_schema(df))


def first_occurrences(events_df, msg_ids: Sequence[int]) -> dict[int, tuple[str | None, int | None]]:
    """The (file, row) of each msg_id's first produce row: what a `msg-id-duplicate` row is reported with."""
    from pyspark.sql import functions as F

    if not msg_ids or "_row" not in events_df.columns:
        return {}
    first = (events_df.where((F.col("kind") == Kind.PRODUCE.label) & F.col("msg_id").isin(*msg_ids))
             .groupBy("msg_id").agg(F.min(F.struct(F.col("_file"), F.col("_row"))).alias("at")).collect())
    return {r["msg_id"]: (r["at"]["_file"], r["at"]["_row"]) for r in first}


# ----------------------------------------------------------------------------------------------- GX suites
#: Columns a rule's offending rows are reported with.
REPORT_COLUMNS: tuple[str, ...] = (*LOCATION, *EVENT_NAMES, "_first_file", "_first_row", "_prev_max_upto_us")
MISSING = "missing"


def column_types(events_df) -> dict[str, str]:
    """The Spark type of each SPEC §2.1 column as GX sees it (`missing` when absent)."""
    present = {f.name: f.dataType.simpleString() for f in events_df.schema.fields}
    return {name: present.get(name, MISSING) for name, _ in EVENT_COLUMNS}


def schema_expectations() -> list[Any]:
    """One expectation per column of SPEC §2.1: present, with its type (over a one-row frame of the types)."""
    import great_expectations as gx

    return [gx.expectations.ExpectColumnValuesToBeInSet(
        column=name, value_set=[_SPARK_TYPE_NAMES[str(typ)]], description=f"column {name} is {typ} (SPEC §2.1)",
        meta={"rule": "column-type", "column": name}) for name, typ in EVENT_COLUMNS]


def rule_expectations() -> list[Any]:
    """One expectation per row rule: no row breaks it (over a one-row frame of the offending-row counts)."""
    import great_expectations as gx

    return [
        gx.expectations.ExpectColumnValuesToBeBetween(
            column=rule.name, min_value=0, max_value=0,
            description=f"[{rule.name}] no row may break: {rule.description} (SPEC §2.3, {rule.severity})",
            meta={"rule": rule.name, "severity": rule.severity, "spec": "§2.3"},
            severity="critical" if rule.severity == FATAL else "warning",
        )
        for rule in ROW_RULES
    ]


def _schema_outcomes(types: dict[str, str], schema_result: dict[str, Any]) -> list[RuleOutcome]:
    """Missing columns and wrong types (GX decides; the message names the column and both types)."""
    missing, wrong = [], []
    for res in schema_result.get("results", []):
        if res.get("success"):
            continue
        col = res["expectation_config"]["meta"]["column"]
        expected = res["expectation_config"]["kwargs"]["value_set"][0]
        if types[col] == MISSING:
            missing.append({"detail": f"missing column '{col}'"})
        else:
            wrong.append({"detail": f"column '{col}' has type {types[col]}, expected {expected}"})
    return [RuleOutcome("column-missing", FATAL, RULES_BY_NAME["column-missing"].description, len(missing),
                        missing[:FIRST_ROWS]),
            RuleOutcome("column-type", FATAL, RULES_BY_NAME["column-type"].description, len(wrong),
                        wrong[:FIRST_ROWS])]


def rule_counts(violations) -> tuple[dict[str, int], dict[str, list[dict[str, Any]]]]:
    """Exact offending-row count of every row rule and its first rows in (file, row) order: one Spark job."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    rule = F.explode(F.array(*[F.when(F.col(r.column), F.lit(r.name)) for r in ROW_RULES])).alias("_rule")
    by_rule = Window.partitionBy("_rule")
    order = by_rule.orderBy(F.col("_file").asc_nulls_first(), "_row", "ts_us")
    columns = [c for c in REPORT_COLUMNS if c not in ("_first_file", "_first_row")]
    first = (violations.select(*columns, rule).where(F.col("_rule").isNotNull())
             .withColumn("_count", F.count(F.lit(1)).over(by_rule))
             .withColumn("_rank", F.row_number().over(order))
             .where(F.col("_rank") <= FIRST_ROWS).collect())
    counts = {r.name: 0 for r in ROW_RULES}
    rows: dict[str, list[dict[str, Any]]] = {r.name: [] for r in ROW_RULES}
    for r in sorted(first, key=lambda r: (r["_rule"], r["_rank"])):
        counts[r["_rule"]] = int(r["_count"])
        rows[r["_rule"]].append({c: r[c] for c in columns} | {"_first_file": None, "_first_row": None})
    return counts, rows


def _flag_rules(events_df, manifest: Manifest):
    """The annotated events, the persisted rows that break some rule, and each rule's count and first rows."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    annotated = annotate(events_df, manifest)
    flagged = F.lit(False)
    for rule in ROW_RULES:
        flagged = flagged | F.col(rule.column)
    violations = annotated.where(flagged).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        counts, rows = rule_counts(violations)
    except BaseException:
        violations.unpersist()
        raise
    return annotated, violations, counts, rows


def _flag_rules_located(events_df, located, manifest: Manifest):
    """`_flag_rules` on the driver, for a trace read whole into Arrow (`read_events_located`: the rows of
    `events_df`, located alike, in (file, row) order): one `TraceRules` pass over the one table takes each
    broker's rows in (ts_us, kind order, file, row) order and the produce rows in (file, row) order, as the
    Spark tasks do. The rows that break some rule become a small DataFrame (`violations`); `annotated` is
    `events_df` joined with them (rule columns false elsewhere, `_prev_max_upto_us` null)."""
    import numpy as np
    import pyarrow as pa
    from pyspark.sql import functions as F

    from expectations.trace_rules import TraceRules

    verdict = TraceRules(manifest).check(located)
    columns, names = _annotation_columns(verdict)
    events = events_df.select(*EVENT_NAMES, *LOCATION)
    flagged = np.flatnonzero(verdict.fatal | verdict.quarantine)
    if len(flagged):
        rows_of = _plain_files(located.take(flagged).select([*EVENT_NAMES, *LOCATION]))
        bad = pa.Table.from_arrays([*rows_of.columns, *[c.take(flagged) for c in columns]],
                                   names=[*rows_of.column_names, *names])
        violations = events_df.sparkSession.createDataFrame(bad, _annotated_schema(events))
        marks = violations.select(*LOCATION, *names)
        annotated = events.join(F.broadcast(marks), on=list(LOCATION), how="left").select(
            *EVENT_NAMES, *LOCATION,
            *[F.coalesce(F.col(r.column), F.lit(False)).alias(r.column) for r in ROW_RULES],
            "_prev_max_upto_us", F.coalesce(F.col("_quarantined"), F.lit(False)).alias("_quarantined"))
    else:  # the usual case: no row breaks a rule, and no Spark work is needed to say so
        annotated = events.select(*EVENT_NAMES, *LOCATION, *[
            (F.lit(None).cast(t) if n == "_prev_max_upto_us" else F.lit(False)).alias(n) for n, t in ANNOTATION])
        violations = annotated.where(F.lit(False))
    counts = {r.name: int(verdict.counts[r.name]) for r in ROW_RULES}
    rows = {}
    for rule in ROW_RULES:
        first = np.flatnonzero(verdict.flags[rule.name])[:FIRST_ROWS]
        prev = columns[names.index("_prev_max_upto_us")].take(first)
        taken = located.take(first).select([*LOCATION, *EVENT_NAMES]).to_pylist()
        rows[rule.name] = [row | {"_prev_max_upto_us": p, "_first_file": None, "_first_row": None}
                           for row, p in zip(taken, prev.to_pylist(), strict=True)]
    return annotated, violations, counts, rows


def _plain_files(table):
    """`table` with its dictionary-encoded `_file` (`read_events_located`) as plain strings, as Spark has it."""
    import pyarrow as pa

    return table.set_column(table.schema.get_field_index("_file"), "_file", table["_file"].cast(pa.string()))


def first_occurrences_located(located, msg_ids: Sequence[int]) -> dict[int, tuple[str | None, int | None]]:
    """`first_occurrences` over a `read_events_located` table (rows in (file, row) order)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    produce = pc.fill_null(pc.equal(located["kind"], Kind.PRODUCE.label), False)
    mine = pc.and_(produce, pc.fill_null(pc.is_in(located["msg_id"], pa.array(msg_ids, pa.int64())), False))
    first: dict[int, tuple[str | None, int | None]] = {}
    for r in located.take(np.flatnonzero(mine.to_numpy(zero_copy_only=False))).select(
            ["msg_id", *LOCATION]).to_pylist():
        first.setdefault(r["msg_id"], (r["_file"], r["_row"]))
    return first


def check_trace_rules(spark, events_df, manifest: Manifest, *, located=None) -> TraceRuleReport:
    """Run every rule of SPEC §2.3 on `events_df` (the SPEC §2.1 columns, optionally `_file`/`_row`).

    Raises nothing for bad data: the report says what broke (see `TraceRuleReport.to_bad_input`). The
    rows that break a rule stay persisted for the quarantine split; `release()` frees them.

    `located`: the same events in Arrow on the driver (`storage.trace_loader.read_events_located`, the rows of
    `events_df` with its `_file`/`_row`); the rule columns are then computed there, in one `TraceRules` pass,
    instead of in Spark tasks (`_flag_rules_located`: same rules, same order, same report).

    The rule columns are computed in one pass over the events; the rows flagged by some rule (normally none)
    are persisted, and one Spark job counts each rule's rows and keeps the first ones. GX then asserts, one
    expectation per rule, that each count is 0 (on a one-row pandas frame: GX over Spark resolved several
    Spark jobs per expectation, which cost minutes per trace on two cores). The column checks are GX
    expectations over a one-row frame of the columns' types; they run in a thread of their own while Spark
    computes the rule columns (the driver mostly waits on the JVM then; GX's validations take 0.2-1 s each),
    and their verdict comes first: with a bad column no row rule is reported, and whatever the Spark query made
    of the bad columns (an error, or counts) is dropped.
    """
    import pandas as pd

    types = column_types(events_df)
    with ThreadPoolExecutor(1, thread_name_prefix="replab-trace-gate") as pool:
        schema_check = pool.submit(runner.validate, pd.DataFrame({k: [v] for k, v in types.items()}),
                                   suite_name=SUITE, target="events_schema", expectations=schema_expectations())
        try:
            flagged: tuple | BaseException = (_flag_rules(events_df, manifest) if located is None
                                              else _flag_rules_located(events_df, located, manifest))
        except Exception as exc:  # bad columns make Spark fail; the column checks decide below what it means
            flagged = exc
        try:
            schema_result = schema_check.result()
        except BaseException:
            if not isinstance(flagged, BaseException):
                flagged[1].unpersist()
            raise
    outcomes = _schema_outcomes(types, schema_result)
    report = TraceRuleReport(manifest.trace_id, manifest.duration_us, manifest.broker_ids, outcomes,
                             [schema_result], checked_on="spark" if located is None else "driver")
    if any(o.count for o in outcomes):
        if not isinstance(flagged, BaseException):
            flagged[1].unpersist()
        outcomes += [RuleOutcome(r.name, r.severity, r.description, 0) for r in ROW_RULES]
        return report
    if isinstance(flagged, BaseException):
        raise flagged
    annotated, violations, counts, rows = flagged
    duplicates = rows["msg-id-duplicate"]
    if duplicates:  # where each reported duplicate's msg_id was first produced (on failure only)
        ids = sorted({r["msg_id"] for r in duplicates})
        first = first_occurrences(events_df, ids) if located is None else first_occurrences_located(located, ids)
        for r in duplicates:
            r["_first_file"], r["_first_row"] = first.get(r["msg_id"], (None, None))
    result = runner.validate(pd.DataFrame({name: [n] for name, n in counts.items()}), suite_name=SUITE,
                             target="events", expectations=rule_expectations())
    for res in result.get("results", []):  # the exact count and first rows beside GX's verdict, for the report
        name = res["expectation_config"]["meta"]["rule"]
        res.setdefault("result", {}).update(offending_count=counts[name], offending_rows=rows[name])
    for rule in ROW_RULES:
        outcomes.append(RuleOutcome(rule.name, rule.severity, rule.description, counts[rule.name],
                                    rows[rule.name]))
    report.gx_results.append(result)
    report.annotated, report.violations = annotated, violations
    return report


# ----------------------------------------------------------------------------------------------- the gate
@dataclass
class GateResult:
    """One gate run: success (no fatal rule broken), counts, where its report is."""

    suite: str
    trace_id: str
    success: bool
    evaluated: int
    successful: int
    unexpected_rows: int
    quarantined: int
    report_json: Path | None
    report_html: Path | None
    report: TraceRuleReport | None = None
    #: The clean events' digest when the gate held the trace on the driver and quarantined nothing (the clean
    #: events are then the whole trace); None otherwise: the replay asks Spark.
    digest: TraceDigest | None = None


def _statistics(results: Sequence[dict[str, Any]]) -> tuple[int, int]:
    evaluated = sum(r.get("statistics", {}).get("evaluated_expectations", 0) for r in results)
    successful = sum(r.get("statistics", {}).get("successful_expectations", 0) for r in results)
    return evaluated, successful


def _payload(report: TraceRuleReport | None, *, trace_id: str, run_ids: Sequence[str], message: str | None,
             trace_path: str) -> dict[str, Any]:
    return {
        "suite": SUITE, "trace_id": trace_id, "trace": trace_path, "run_ids": list(run_ids) or None,
        "checked_on": report.checked_on if report is not None else None,
        "created_at": dt.datetime.now(dt.UTC).isoformat(),
        "success": report.success if report is not None else False,
        "message": message,
        "rules": [o.as_dict() for o in report.outcomes] if report is not None else [],
        "validations": report.gx_results if report is not None else [],
    }


def run_trace_gate(spark, trace: str | Path | TraceFiles, lakehouse=None, trace_id: str | None = None,
                   run_ids: Sequence[str] = (), *, reports_root: str | Path | None = None,
                   defer_validations: bool = False, local_rows: int = LOCAL_ROWS):
    """Validate a trace directory before a replay (SPEC §7).

    Returns `(clean_events_df, GateResult)`: the events minus quarantined rows (SPEC §2.1 columns). A fatal
    rule raises BadInput (exit 2) naming file, row and rule, after writing the report files but nothing to
    any table. Otherwise the quarantined rows replace this trace's rows in `quarantine` and the gate run lands
    in `validations` (one row per run id, or one trace-level row; `defer_validations`: with the lakehouse's
    next validations write, e.g. the output gate's, in one commit). `lakehouse`: a `storage.lakehouse.
    Lakehouse`, a root path, or None (no tables; reports under `reports_root` if given). A CSV trace, or a
    Parquet trace of at most `local_rows` events, is checked on the driver (`LOCAL_ROWS`).
    """
    from expectations.report import report_dir, write_report
    from storage.lakehouse import Lakehouse
    from storage.trace_loader import event_rows, locate, read_events_located, read_events_spark, trace_digest

    # Opened without creating tables: a refused trace must not add a table version anywhere (SPEC §2.3).
    lh = Lakehouse(lakehouse, spark=spark, create=False) if isinstance(lakehouse, str | Path) else lakehouse
    root = Path(reports_root) if reports_root is not None else (lh.reports_root if lh is not None else None)
    trace_path = str(trace.root if isinstance(trace, TraceFiles) else trace)

    def save(report: TraceRuleReport | None, tid: str, message: str | None):
        if root is None:
            return None
        return write_report(report_dir(root, SUITE, tid, None), _payload(
            report, trace_id=tid, run_ids=run_ids, message=message, trace_path=trace_path))

    try:
        tf = trace if isinstance(trace, TraceFiles) else locate(trace)
        # A CSV trace is read on the driver in any case (storage.trace_loader).
        local = local_rows > 0 and (tf.is_csv or event_rows(tf) <= local_rows)
        located = read_events_located(tf) if local else None
        manifest, events = read_events_spark(spark, tf, with_location=True, located=located)
    except BadInput as exc:
        # Format errors (layout, manifest, columns, types, kinds) are fatal rules too: keep a report of them.
        paths = save(None, trace_id or Path(trace_path).name, str(exc))
        if paths is not None:
            raise BadInput(exc.reason + f"; report: {paths.html_path}", file=exc.file, row=exc.row,
                           rule=exc.rule) from exc
        raise
    tid = trace_id or manifest.trace_id
    report = check_trace_rules(spark, events, manifest, located=located)
    digest = trace_digest(located) if located is not None and report.success and not report.quarantine_count \
        else None
    del located  # the replay needs only the Spark frame and the digest
    report.trace_id = tid
    evaluated, successful = _statistics(report.gx_results)
    unexpected = report.fatal_count + report.quarantine_count
    if not report.success:
        paths = save(report, tid, None)
        error = report.to_bad_input(paths.html_path if paths is not None else None)
        report.release()
        raise error
    paths = save(report, tid, None)
    if lh is not None:
        # A trace gate run replaces the trace's quarantined rows; with none now and none before, that commit
        # would change nothing, so it is skipped (asking does not create the table: the replay creates it with
        # its other tables, in one pass).
        if report.quarantine_count or lh.has_rows("quarantine", "trace_id", tid):
            lh.replace_rows("quarantine", "trace_id", [tid], report.quarantine_rows())
        lh.record_validations([
            {"run_id": run_id, "trace_id": tid, "suite": SUITE, "target": trace_path, "success": True,
             "evaluated": evaluated, "successful": successful, "unexpected_rows": unexpected,
             "report_path": str(paths.html_path) if paths is not None else None}
            for run_id in (list(run_ids) or [None])
        ], defer=defer_validations)
    if report.quarantine_count:
        clean = report.clean_events()
    else:
        clean = events.select(*EVENT_NAMES)
        report.release()
    result = GateResult(SUITE, tid, True, evaluated, successful, unexpected, report.quarantine_count,
                        paths.json_path if paths is not None else None,
                        paths.html_path if paths is not None else None, report, digest)
    return clean, result


__all__ = ["FATAL", "QUARANTINE", "ROW_RULES", "RULES", "RULES_BY_NAME", "SCHEMA_RULES", "Rule", "annotate",
           "check_trace_rules", "run_trace_gate"]
