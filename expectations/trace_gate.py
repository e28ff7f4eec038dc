"""The trace quality gate: every validity rule of SPEC §2.3, as a Great Expectations suite over Spark.

How a rule is checked: `annotate()` adds one boolean column per rule to the events (row rules are plain
predicates; cross-row rules use window functions per broker over (ts_us, SPEC §2.2 same-instant kind order,
file, row)); one Spark job counts each rule's flagged rows and keeps the first ones in file/row order, and the
GX suite holds one expectation per rule asserting that its count is 0. So each rule has one definition (its
column), and the quarantine split uses the very same columns. Fatal rules are GX severity `critical`,
quarantine rules `warning`; the column checks (missing column, wrong type) are GX expectations over the
columns' types that run first, since nothing else can be computed without the columns.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from expectations import runner
from schemas.errors import BadInput
from schemas.trace import EVENT_COLUMNS, KIND_LABELS, STOP_KINDS, Kind, Manifest, TraceFiles

FATAL = "fatal"
QUARANTINE = "quarantine"
SUITE = "trace_gate"
EVENT_NAMES: tuple[str, ...] = tuple(n for n, _ in EVENT_COLUMNS)
LOCATION = ("_file", "_row")
#: How many offending rows a rule keeps in the report (GX returns at most 200).
FIRST_ROWS = runner.PARTIAL_ROWS


@dataclass(frozen=True)
class Rule:
    """One validity rule of SPEC §2.3. `detail` is formatted with the offending row (and `duration_us`,
    `brokers`) to say what exactly is wrong."""

    name: str
    severity: str
    description: str
    detail: str

    @property
    def column(self) -> str:
        return "r_" + self.name.replace("-", "_")


RULES: tuple[Rule, ...] = (
    Rule("column-missing", FATAL, "a column of SPEC §2.1 is missing", "{detail}"),
    Rule("column-type", FATAL, "a column has the wrong type", "{detail}"),
    Rule("kind-unknown", FATAL, "unknown kind", "kind {kind!r} (known: " + ", ".join(KIND_LABELS) + ")"),
    Rule("ts-out-of-range", FATAL, "ts_us outside [0, duration_us]",
         "{kind} at ts_us {ts_us} is outside [0, {duration_us}]"),
    Rule("broker-not-in-manifest", FATAL, "broker not in the manifest",
         "{kind} of broker {broker} (manifest brokers: {brokers})"),
    Rule("produce-without-msg-id", FATAL, "produce without msg_id", "produce at ts_us {ts_us} has no msg_id"),
    Rule("size-not-positive", FATAL, "produce with size_bytes <= 0",
         "produce msg_id {msg_id} has size_bytes {size_bytes}"),
    Rule("msg-id-duplicate", FATAL, "duplicate msg_id",
         "msg_id {msg_id} was already produced at {_first_file} row {_first_row}"),
    Rule("replicate-without-upto", FATAL, "replicate without upto_us",
         "replicate of broker {broker} at ts_us {ts_us} has no upto_us"),
    Rule("upto-after-ts", FATAL, "upto_us > ts_us", "replicate of broker {broker}: upto_us {upto_us} > ts_us {ts_us}"),
    Rule("restart-of-up-broker", FATAL, "restart of a broker that is up",
         "restart of broker {broker} at ts_us {ts_us}, which is up"),
    Rule("stop-of-down-broker", FATAL, "crash/power_loss/disk_loss/shutdown of a broker that is down",
         "{kind} of broker {broker} at ts_us {ts_us}, which is already down"),
    Rule("heal-of-unisolated-broker", FATAL, "heal of a broker that is not isolated",
         "heal of broker {broker} at ts_us {ts_us}, which is not isolated"),
    Rule("replicate-while-unavailable", QUARANTINE, "replicate for a broker that is down or isolated",
         "replicate of broker {broker} at ts_us {ts_us} while it is down or isolated"),
    Rule("upto-decreasing", QUARANTINE,
         "replicate whose upto_us is below an earlier report of the same broker since its last restart",
         "replicate of broker {broker} at ts_us {ts_us}: upto_us {upto_us} < {_prev_max_upto_us} reported before"),
)
RULES_BY_NAME = {r.name: r for r in RULES}
SCHEMA_RULES = ("column-missing", "column-type")
ROW_RULES: tuple[Rule, ...] = tuple(r for r in RULES if r.name not in SCHEMA_RULES)
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
    #: The annotated rows that break at least one rule (persisted; usually few or none).
    violations: Any = None

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


def annotate(events_df, manifest: Manifest):
    """The events plus one boolean column per rule of ROW_RULES (true = the row breaks it), `_quarantined`,
    and helper columns for messages (`_first_file`/`_first_row` of a duplicated msg_id, `_prev_max_upto_us`).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    df = events_df
    if "_file" not in df.columns:
        df = df.withColumn("_file", F.lit(None).cast("string"))
    if "_row" not in df.columns:
        df = df.withColumn("_row", F.lit(None).cast("long"))
    df = df.select(*EVENT_NAMES, "_file", "_row").withColumn("_kind_order", _kind_order())
    kind, ts, broker, upto = F.col("kind"), F.col("ts_us"), F.col("broker"), F.col("upto_us")
    is_produce, is_replicate = kind == Kind.PRODUCE.label, kind == Kind.REPLICATE.label
    stops = [k.label for k in STOP_KINDS]

    flags = {
        "kind-unknown": kind.isNull() | ~kind.isin(*KIND_LABELS),
        "ts-out-of-range": ts.isNull() | (ts < 0) | (ts > F.lit(manifest.duration_us)),
        "broker-not-in-manifest": kind.isNotNull() & ~is_produce & (
            broker.isNull() | ~broker.isin(*manifest.broker_ids)),
        "produce-without-msg-id": is_produce & F.col("msg_id").isNull(),
        "size-not-positive": is_produce & (F.col("size_bytes").isNull() | (F.col("size_bytes") <= 0)),
        "replicate-without-upto": is_replicate & upto.isNull(),
        "upto-after-ts": is_replicate & (upto > ts),
    }
    for name, cond in flags.items():
        df = df.withColumn(RULES_BY_NAME[name].column, F.coalesce(cond, F.lit(False)))

    # Produce rows: only msg_id uniqueness is cross-row. Broker rows: the broker state machine. Splitting keeps
    # the (large) produce side out of the per-broker sort.
    produce = df.where(F.coalesce(is_produce, F.lit(False)))
    by_msg = Window.partitionBy("msg_id").orderBy(F.col("_file").asc_nulls_first(), "_row", "ts_us")
    seen_before = F.col("msg_id").isNotNull() & (F.row_number().over(by_msg) > 1)
    produce = (produce
               .withColumn(RULES_BY_NAME["msg-id-duplicate"].column, seen_before)
               .withColumn("_first_file", F.when(seen_before, F.first("_file").over(by_msg)))
               .withColumn("_first_row", F.when(seen_before, F.first("_row").over(by_msg))))
    for name in ("restart-of-up-broker", "stop-of-down-broker", "heal-of-unisolated-broker",
                 "replicate-while-unavailable", "upto-decreasing"):
        produce = produce.withColumn(RULES_BY_NAME[name].column, F.lit(False))
    produce = produce.withColumn("_prev_max_upto_us", F.lit(None).cast("long"))

    brokers = df.where(~F.coalesce(is_produce, F.lit(False)))
    order = [F.col("ts_us"), F.col("_kind_order"), F.col("_file").asc_nulls_first(), F.col("_row"), upto]
    by_broker = Window.partitionBy("broker").orderBy(*order)
    before = by_broker.rowsBetween(Window.unboundedPreceding, -1)
    up_down = F.when(kind.isin(*stops), F.lit("down")).when(kind == Kind.RESTART.label, F.lit("up"))
    iso_heal = F.when(kind == Kind.ISOLATE.label, F.lit("isolated")).when(kind == Kind.HEAL.label, F.lit("healed"))
    brokers = (brokers
               .withColumn("_down", F.coalesce(F.last(up_down, ignorenulls=True).over(before) == "down",
                                               F.lit(False)))
               .withColumn("_isolated", F.coalesce(F.last(iso_heal, ignorenulls=True).over(before) == "isolated",
                                                   F.lit(False)))
               .withColumn("_incarnation", F.sum(F.when(kind == Kind.RESTART.label, 1).otherwise(0)).over(
                   by_broker.rowsBetween(Window.unboundedPreceding, Window.currentRow))))
    unavailable = is_replicate & (F.col("_down") | F.col("_isolated"))
    brokers = (brokers
               .withColumn(RULES_BY_NAME["restart-of-up-broker"].column,
                           (kind == Kind.RESTART.label) & ~F.col("_down"))
               .withColumn(RULES_BY_NAME["stop-of-down-broker"].column, kind.isin(*stops) & F.col("_down"))
               .withColumn(RULES_BY_NAME["heal-of-unisolated-broker"].column,
                           (kind == Kind.HEAL.label) & ~F.col("_isolated"))
               .withColumn(RULES_BY_NAME["replicate-while-unavailable"].column,
                           F.coalesce(unavailable, F.lit(False))))
    applied = is_replicate & ~F.col(RULES_BY_NAME["replicate-while-unavailable"].column)
    by_life = (Window.partitionBy("broker", "_incarnation").orderBy(*order)
               .rowsBetween(Window.unboundedPreceding, -1))
    brokers = brokers.withColumn("_prev_max_upto_us", F.max(F.when(applied, upto)).over(by_life))
    brokers = (brokers
               .withColumn(RULES_BY_NAME["upto-decreasing"].column,
                           F.coalesce(applied & (upto < F.col("_prev_max_upto_us")), F.lit(False)))
               .withColumn(RULES_BY_NAME["msg-id-duplicate"].column, F.lit(False))
               .withColumn("_first_file", F.lit(None).cast("string"))
               .withColumn("_first_row", F.lit(None).cast("long"))
               .drop("_down", "_isolated", "_incarnation"))

    out = produce.unionByName(brokers)
    quarantined = F.lit(False)
    for rule in ROW_RULES:
        if rule.severity == QUARANTINE:
            quarantined = quarantined | F.col(rule.column)
    return out.withColumn("_quarantined", quarantined).drop("_kind_order")


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
    first = (violations.select(*REPORT_COLUMNS, rule).where(F.col("_rule").isNotNull())
             .withColumn("_count", F.count(F.lit(1)).over(by_rule))
             .withColumn("_rank", F.row_number().over(order))
             .where(F.col("_rank") <= FIRST_ROWS).collect())
    counts = {r.name: 0 for r in ROW_RULES}
    rows: dict[str, list[dict[str, Any]]] = {r.name: [] for r in ROW_RULES}
    for r in sorted(first, key=lambda r: (r["_rule"], r["_rank"])):
        counts[r["_rule"]] = int(r["_count"])
        rows[r["_rule"]].append({c: r[c] for c in REPORT_COLUMNS})
    return counts, rows


def check_trace_rules(spark, events_df, manifest: Manifest) -> TraceRuleReport:
    """Run every rule of SPEC §2.3 on `events_df` (the SPEC §2.1 columns, optionally `_file`/`_row`).

    Raises nothing for bad data: the report says what broke (see `TraceRuleReport.to_bad_input`). The
    rows that break a rule stay persisted for the quarantine split; `release()` frees them.

    The rule columns are computed in one pass over the events; the rows flagged by some rule (normally none)
    are persisted, and one Spark job counts each rule's rows and keeps the first ones. GX then asserts, one
    expectation per rule, that each count is 0 (on a one-row pandas frame: GX over Spark resolved several
    Spark jobs per expectation, which cost minutes per trace on two cores). The column checks are GX
    expectations over a one-row frame of the columns' types.
    """
    import pandas as pd
    from pyspark import StorageLevel

    types = column_types(events_df)
    schema_result = runner.validate(pd.DataFrame({k: [v] for k, v in types.items()}), suite_name=SUITE,
                                    target="events_schema", expectations=schema_expectations())
    outcomes = _schema_outcomes(types, schema_result)
    report = TraceRuleReport(manifest.trace_id, manifest.duration_us, manifest.broker_ids, outcomes,
                             [schema_result])
    if any(o.count for o in outcomes):
        outcomes += [RuleOutcome(r.name, r.severity, r.description, 0) for r in ROW_RULES]
        return report

    from pyspark.sql import functions as F

    annotated = annotate(events_df, manifest)
    flagged = F.lit(False)
    for rule in ROW_RULES:
        flagged = flagged | F.col(rule.column)
    violations = annotated.where(flagged).persist(StorageLevel.MEMORY_AND_DISK)
    counts, rows = rule_counts(violations)
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


def _statistics(results: Sequence[dict[str, Any]]) -> tuple[int, int]:
    evaluated = sum(r.get("statistics", {}).get("evaluated_expectations", 0) for r in results)
    successful = sum(r.get("statistics", {}).get("successful_expectations", 0) for r in results)
    return evaluated, successful


def _payload(report: TraceRuleReport | None, *, trace_id: str, run_ids: Sequence[str], message: str | None,
             trace_path: str) -> dict[str, Any]:
    return {
        "suite": SUITE, "trace_id": trace_id, "trace": trace_path, "run_ids": list(run_ids) or None,
        "created_at": dt.datetime.now(dt.UTC).isoformat(),
        "success": report.success if report is not None else False,
        "message": message,
        "rules": [o.as_dict() for o in report.outcomes] if report is not None else [],
        "validations": report.gx_results if report is not None else [],
    }


def run_trace_gate(spark, trace: str | Path | TraceFiles, lakehouse=None, trace_id: str | None = None,
                   run_ids: Sequence[str] = (), *, reports_root: str | Path | None = None,
                   defer_validations: bool = False):
    """Validate a trace directory before a replay (SPEC §7).

    Returns `(clean_events_df, GateResult)`: the events minus quarantined rows (SPEC §2.1 columns). A fatal
    rule raises BadInput (exit 2) naming file, row and rule, after writing the report files but nothing to
    any table. Otherwise the quarantined rows replace this trace's rows in `quarantine` and the gate run lands
    in `validations` (one row per run id, or one trace-level row; `defer_validations`: with the lakehouse's
    next validations write, e.g. the output gate's, in one commit). `lakehouse`: a `storage.lakehouse.
    Lakehouse`, a root path, or None (no tables; reports under `reports_root` if given).
    """
    from expectations.report import report_dir, write_report
    from storage.lakehouse import Lakehouse
    from storage.trace_loader import locate, read_events_spark

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
        manifest, events = read_events_spark(spark, tf, with_location=True)
    except BadInput as exc:
        # Format errors (layout, manifest, columns, types, kinds) are fatal rules too: keep a report of them.
        paths = save(None, trace_id or Path(trace_path).name, str(exc))
        if paths is not None:
            raise BadInput(exc.reason + f"; report: {paths.html_path}", file=exc.file, row=exc.row,
                           rule=exc.rule) from exc
        raise
    tid = trace_id or manifest.trace_id
    report = check_trace_rules(spark, events, manifest)
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
        # would change nothing, so it is skipped (the table is still created on first use).
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
                        paths.html_path if paths is not None else None, report)
    return clean, result
