"""The trace gate's row rules (expectations/trace_rules.py) flag the rows SPEC §2.3 says, hand-derived below:
through the Spark gate (expectations/trace_gate.py runs them in mapInArrow tasks after its shuffle and sort)
and chunk by chunk as the sweep runs them, with broker state carried over the chunk boundary."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from expectations.trace_gate import ROW_RULES, annotate, check_trace_rules
from expectations.trace_rules import TraceRules
from schemas.trace import EVENT_ARROW_SCHEMA, Broker, Manifest

pytestmark = pytest.mark.spark

DURATION_US = 1_000_000
MANIFEST = Manifest("rules-test", tuple(Broker(b, f"r{b}") for b in (0, 1, 2)), DURATION_US, None, None)

# (ts_us, kind, broker, msg_id, key, size_bytes, producer_id, upto_us); every rule broken at least once, and
# broker state carried over the chunk boundary (after row 12).
ROWS = [
    (0, "produce", None, 1, "k", 100, 0, None),
    (10, "replicate", 1, None, None, None, None, 5),
    (20, "crash", 0, None, None, None, None, None),
    (25, "replicate", 0, None, None, None, None, 15),        # replicate-while-unavailable
    (30, "restart", 0, None, None, None, None, None),
    (30, "restart", 0, None, None, None, None, None),        # restart-of-up-broker (same instant, later row)
    (40, "isolate", 2, None, None, None, None, None),
    (45, "replicate", 2, None, None, None, None, 30),        # replicate-while-unavailable
    (50, "heal", 2, None, None, None, None, None),
    (55, "replicate", 1, None, None, None, None, 3),         # upto-decreasing (5 before)
    (60, "produce", None, 2, None, 100, 0, None),
    (61, "produce", None, 2, None, 100, 0, None),            # msg-id-duplicate
    (70, "heal", 2, None, None, None, None, None),           # heal-of-unisolated-broker
    (80, "explode", 1, None, None, None, None, None),        # kind-unknown
    (90, "crash", 7, None, None, None, None, None),          # broker-not-in-manifest
    (DURATION_US + 1, "produce", None, 3, None, 100, 0, None),  # ts-out-of-range
    (100, "produce", None, None, None, 100, 0, None),         # produce-without-msg-id
    (110, "produce", None, 1, None, 0, 0, None),              # size-not-positive, msg-id-duplicate (chunk 1)
    (120, "replicate", 1, None, None, None, None, None),      # replicate-without-upto
    (130, "replicate", 1, None, None, None, None, 131),       # upto-after-ts
    (140, "power_loss", 1, None, None, None, None, None),
    (150, "shutdown", 1, None, None, None, None, None),       # stop-of-down-broker
    (160, "restart", 1, None, None, None, None, None),
    (170, "replicate", 1, None, None, None, None, 2),         # a new incarnation: not decreasing
]


#: 1-based row of ROWS -> the rules it breaks (from SPEC §2.3 by hand; every other row breaks none).
EXPECTED = {
    4: {"replicate-while-unavailable"}, 6: {"restart-of-up-broker"}, 8: {"replicate-while-unavailable"},
    10: {"upto-decreasing"}, 12: {"msg-id-duplicate"}, 13: {"heal-of-unisolated-broker"}, 14: {"kind-unknown"},
    15: {"broker-not-in-manifest"}, 16: {"ts-out-of-range"}, 17: {"produce-without-msg-id"},
    18: {"size-not-positive", "msg-id-duplicate"}, 19: {"replicate-without-upto"}, 20: {"upto-after-ts"},
    22: {"stop-of-down-broker"},
}


def _table(rows) -> pa.Table:
    cols = list(zip(*rows, strict=True))
    return pa.Table.from_arrays([pa.array(list(c), f.type) for c, f in zip(cols, EVENT_ARROW_SCHEMA, strict=True)],
                                schema=EVENT_ARROW_SCHEMA)


def test_arrow_rules_flag_the_rows_the_spark_gate_flags(spark):
    table = _table(ROWS).append_column("_row", pa.array(np.arange(1, len(ROWS) + 1), pa.int64()))
    events = spark.createDataFrame(table.to_pandas(types_mapper=pd_types()))
    report = check_trace_rules(spark, events.drop("_row"), MANIFEST)
    spark_counts = {o.rule: o.count for o in report.outcomes if o.rule in {r.name for r in ROW_RULES}}
    report.release()
    flagged = (annotate(events, MANIFEST).select("_row", *[r.column for r in ROW_RULES]).toPandas()
               .sort_values("_row"))
    assert flagged["_row"].tolist() == list(range(1, len(ROWS) + 1))
    spark_rules = {int(row["_row"]): {r.name for r in ROW_RULES if row[r.column]} for _, row in flagged.iterrows()}
    assert {row: rules for row, rules in spark_rules.items() if rules} == EXPECTED

    rules = TraceRules(MANIFEST)
    verdicts = [rules.check(_table(ROWS[:13])), rules.check(_table(ROWS[13:]))]
    assert rules.counts == spark_counts
    assert all(spark_counts.values())  # every rule is exercised
    assert rules.rows == len(ROWS)
    fatal = np.concatenate([v.fatal for v in verdicts])
    quarantine = np.concatenate([v.quarantine for v in verdicts])
    spark_fatal = np.zeros(len(ROWS), bool)
    spark_quarantine = np.zeros(len(ROWS), bool)
    for r in ROW_RULES:
        target = spark_fatal if r.severity == "fatal" else spark_quarantine
        target |= flagged[r.column].to_numpy(bool)
    assert fatal.tolist() == spark_fatal.tolist()
    for rule in ROW_RULES:
        chunked = np.concatenate([v.flags[rule.name] for v in verdicts])
        assert np.flatnonzero(chunked).tolist() == [row - 1 for row, rules in EXPECTED.items() if rule.name in rules]
    assert quarantine.tolist() == spark_quarantine.tolist()
    assert rules.fatal_rows == sum(c for n, c in spark_counts.items() if n not in
                                   ("replicate-while-unavailable", "upto-decreasing"))
    assert rules.quarantined_rows == 3


def pd_types():
    import pandas as pd

    mapping = {pa.int64(): pd.Int64Dtype(), pa.int32(): pd.Int32Dtype(), pa.string(): pd.StringDtype()}
    return mapping.get
