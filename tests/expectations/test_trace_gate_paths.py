"""The trace gate's two ways of computing the rule columns give the same report (expectations/trace_gate.py):
in Spark tasks (`annotate`: shuffle, sort, mapInArrow) and on the driver for a small trace (`_flag_rules_located`:
one `TraceRules` pass over the trace read whole into Arrow). Same counts, same first rows in (file, row) order,
same violations, same annotation, same clean events; and the paths Spark names by URI read as plain paths."""

from __future__ import annotations

import itertools
import json
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from expectations.trace_gate import ANNOTATION, LOCAL_ROWS, ROW_RULES, check_trace_rules, run_trace_gate
from schemas.errors import BadInput
from schemas.trace import EVENT_ARROW_SCHEMA, KIND_LABELS
from storage.lakehouse import Lakehouse
from storage.trace_loader import locate, read_events_located, read_events_spark

pytestmark = pytest.mark.spark

DURATION_US = 1_000
BROKERS = (0, 1, 2)
#: A folder name Spark's URIs percent-encode (space, '%', non-ASCII) or keep ('+').
ODD_DIR = "trace a+b%41 é"


def write_trace(root: Path, files: list[list[dict]]) -> Path:
    """A Parquet trace of `files` (each a list of rows), one events file per list, named in order."""
    (root / "events").mkdir(parents=True)
    (root / "manifest.json").write_text(json.dumps({
        "format": "replab-trace", "version": 1, "trace_id": "paths-test",
        "brokers": [{"id": b, "rack": f"r{b}"} for b in BROKERS], "duration_us": DURATION_US,
        "seed": None, "generator": None}))
    for i, rows in enumerate(files):
        pq.write_table(pa.Table.from_pylist(rows, schema=EVENT_ARROW_SCHEMA), root / "events" / f"part {i}.parquet")
    return root


def _row(draw) -> dict:
    kind = draw(st.sampled_from(KIND_LABELS))
    ts = draw(st.one_of(st.integers(0, 60), st.sampled_from([-1, DURATION_US, DURATION_US + 1])))
    row = {"ts_us": ts, "kind": kind}
    if kind == "produce":
        row |= {"msg_id": draw(st.one_of(st.none(), st.integers(1, 6))),
                "size_bytes": draw(st.sampled_from([None, -1, 0, 10])), "producer_id": 0,
                "broker": draw(st.sampled_from([None, None, None, 1]))}
    else:
        row["broker"] = draw(st.sampled_from([*BROKERS, *BROKERS, 7, None]))
        if kind == "replicate":
            row["upto_us"] = draw(st.one_of(st.none(), st.integers(0, 70)))
    return row


@st.composite
def traces(draw) -> list[list[dict]]:
    rows = [_row(draw) for _ in range(draw(st.integers(0, 40)))]
    cuts = sorted(draw(st.lists(st.integers(0, len(rows)), max_size=2)))
    bounds = [0, *cuts, len(rows)]
    return [rows[a:b] for a, b in itertools.pairwise(bounds)]


def _sorted(rows) -> list[tuple]:
    return sorted((tuple(r) for r in rows), key=repr)


def assert_same_reports(spark, trace: Path) -> None:
    tf = locate(trace)
    located = read_events_located(tf)
    manifest, events = read_events_spark(spark, tf, with_location=True)
    in_spark = check_trace_rules(spark, events, manifest)
    on_driver = check_trace_rules(spark, events, manifest, located=located)
    try:
        assert (in_spark.checked_on, on_driver.checked_on) == ("spark", "driver")
        assert [o.as_dict() for o in on_driver.outcomes] == [o.as_dict() for o in in_spark.outcomes]
        assert _sorted(on_driver.violations.collect()) == _sorted(in_spark.violations.collect())
        marks = ["_file", "_row", *[n for n, _ in ANNOTATION if n != "_prev_max_upto_us"]]
        assert (_sorted(on_driver.annotated.select(*marks).collect())
                == _sorted(in_spark.annotated.select(*marks).collect()))
        if in_spark.success:
            assert _sorted(on_driver.clean_events().collect()) == _sorted(in_spark.clean_events().collect())
    finally:
        in_spark.release()
        on_driver.release()


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(files=traces())
def test_driver_and_spark_tasks_give_the_same_report(spark, files):
    with tempfile.TemporaryDirectory() as tmp:
        assert_same_reports(spark, write_trace(Path(tmp) / ODD_DIR, files))


def test_every_rule_is_reported_alike_on_both_paths(spark, tmp_path):
    """A fixed trace that breaks every row rule at least once, over two files (the randomized cases above may
    miss some rule)."""
    from tests.expectations.test_trace_rules import ROWS

    names = [f.name for f in EVENT_ARROW_SCHEMA]
    rows = [dict(zip(names, r, strict=True)) for r in ROWS if r[1] in KIND_LABELS]  # the loader refuses others
    trace = write_trace(tmp_path / ODD_DIR, [rows[:11], rows[11:]])
    assert_same_reports(spark, trace)
    manifest, events = read_events_spark(spark, locate(trace), with_location=True)
    report = check_trace_rules(spark, events, manifest, located=read_events_located(locate(trace)))
    assert {r.name for r in ROW_RULES if not report.counts[r.name]} == {"kind-unknown"}
    dup = next(o for o in report.outcomes if o.rule == "msg-id-duplicate")
    assert [(r["_file"], r["_row"], r["_first_file"], r["_first_row"]) for r in dup.first_rows] == [
        (str(trace / "events" / "part 1.parquet"), 1, str(trace / "events" / "part 0.parquet"), 11),
        (str(trace / "events" / "part 1.parquet"), 6, str(trace / "events" / "part 0.parquet"), 1)]
    report.release()


def test_unknown_kinds_are_refused_by_the_loader_on_both_paths(spark, tmp_path):
    trace = write_trace(tmp_path / ODD_DIR, [[{"ts_us": 0, "kind": "produce", "msg_id": 1, "size_bytes": 1,
                                               "producer_id": 0}, {"ts_us": 1, "kind": "explode", "broker": 0}]])
    for local_rows in (LOCAL_ROWS, 0):
        with pytest.raises(BadInput) as info:
            run_trace_gate(spark, trace, None, local_rows=local_rows)
        assert info.value.rule == "kind-unknown" and info.value.row == 2
        assert info.value.file == str(trace / "events" / "part 0.parquet")  # a plain path, not a URI


@pytest.fixture(scope="module")
def lakehouse(spark, tmp_path_factory) -> Lakehouse:
    return Lakehouse(tmp_path_factory.mktemp("paths") / "lh", spark)


@pytest.mark.parametrize("local_rows", [LOCAL_ROWS, 0], ids=["driver", "spark"])
def test_gate_checks_small_traces_on_the_driver_and_the_rest_in_spark(spark, tmp_path, lakehouse, local_rows):
    """`local_rows` decides; both land the same quarantine rows (plain file paths) and the same clean events
    (each run replaces the trace's quarantine rows)."""
    produce = {"kind": "produce", "size_bytes": 10, "producer_id": 0}
    trace = write_trace(tmp_path / ODD_DIR, [
        [{"ts_us": 0, "msg_id": 1, **produce}, {"ts_us": 10, "kind": "crash", "broker": 1}],
        [{"ts_us": 20, "kind": "replicate", "broker": 1, "upto_us": 5},     # quarantined: broker 1 is down
         {"ts_us": 30, "kind": "restart", "broker": 1}, {"ts_us": 40, "msg_id": 2, **produce}]])
    clean, result = run_trace_gate(spark, trace, lakehouse, run_ids=["r"], local_rows=local_rows)
    assert result.report.checked_on == ("driver" if local_rows else "spark")
    assert json.loads(result.report_json.read_text())["checked_on"] == result.report.checked_on
    assert result.quarantined == 1
    assert [(r.file, r.row, r.rule) for r in lakehouse.read("quarantine").collect()] == [
        (str(trace / "events" / "part 1.parquet"), 1, "replicate-while-unavailable")]
    assert sorted(r.ts_us for r in clean.collect()) == [0, 10, 30, 40]
    result.report.release()
    # a trace over the limit goes to Spark tasks
    _, larger = run_trace_gate(spark, trace, None, local_rows=4)
    assert larger.report.checked_on == "spark" and larger.quarantined == 1
    larger.report.release()


def test_a_gate_that_held_the_trace_digests_it_as_spark_would_read_its_clean_events(spark, tmp_path):
    """`GateResult.digest` (the driver path, nothing quarantined) holds what the replay's driver would otherwise
    ask Spark for: the fault timeline and the produce rows' msg_id range and count. The Spark path, and a gate
    that quarantined rows (its clean events are not the trace), give none."""
    from pyspark.sql import functions as F

    from engine.replay import control_timeline, produce_counts
    from storage.trace_loader import ProduceStats

    produce = {"kind": "produce", "size_bytes": 10, "producer_id": 0}
    faults = [{"ts_us": 10, "kind": "crash", "broker": 1}, {"ts_us": 12, "kind": "isolate", "broker": 2},
              {"ts_us": 30, "kind": "restart", "broker": 1}, {"ts_us": 35, "kind": "heal", "broker": 2}]
    cases = {  # msg_ids with a gap (ranked by a sort), then a trace without produce rows
        "gaps": ([[{"ts_us": 0, "msg_id": 9, **produce}, *faults[:2]],
                  [{"ts_us": 20, "kind": "replicate", "broker": 0, "upto_us": 5}, *faults[2:],
                   {"ts_us": 40, "msg_id": 5, **produce}, {"ts_us": 45, "msg_id": 7, **produce}]],
                 ProduceStats(5, 9, 3)),
        "faults only": ([faults], ProduceStats(None, None, 0)),
    }
    for name, (files, stats) in cases.items():
        trace = write_trace(tmp_path / name / ODD_DIR, files)
        clean, result = run_trace_gate(spark, trace, None, local_rows=LOCAL_ROWS)
        assert result.digest is not None and result.digest.produce == stats
        assert result.digest.produce.dense == (stats.n == 0)
        assert produce_counts(clean.where(F.col("kind") == "produce")) == stats
        held, asked = control_timeline(clean, result.digest), control_timeline(clean)
        assert held.broker_ts.tolist() == asked.broker_ts.tolist() == [10, 12, 30, 35]
        assert held.broker_kind.tolist() == asked.broker_kind.tolist() == [0, 4, 5, 6]
        assert held.broker_id.tolist() == asked.broker_id.tolist() == [1, 2, 1, 2]
        result.report.release()
        _, in_spark = run_trace_gate(spark, trace, None, local_rows=0)
        assert in_spark.digest is None
    quarantining = write_trace(tmp_path / "quarantining", [[{"ts_us": 0, "msg_id": 1, **produce}, faults[0],
                                                          {"ts_us": 20, "kind": "replicate", "broker": 1,
                                                           "upto_us": 5}]])
    _, result = run_trace_gate(spark, quarantining, None, local_rows=LOCAL_ROWS)
    assert result.quarantined == 1 and result.digest is None
    result.report.release()
