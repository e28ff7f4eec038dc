"""The trace gate (SPEC §2.3, §7, §11): every fatal rule refuses the trace with exit code 2, naming file, row
and rule, and no table gains a version; quarantine rules move rows to `quarantine` and the replay continues.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable

from expectations.trace_gate import FATAL, QUARANTINE, RULES, check_trace_rules, run_trace_gate
from pipelines.cli import main
from schemas.errors import BadInput
from schemas.tables import TABLES
from storage.lakehouse import Lakehouse
from storage.trace_loader import read_events_spark

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
HEADER = "ts_us,kind,broker,msg_id,key,size_bytes,producer_id,upto_us\n"
DURATION_US = 1_000_000


def make_trace(folder: Path, body: str, *, header: str = HEADER, trace_id: str = "gate-test") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").write_text(json.dumps({
        "format": "replab-trace", "version": 1, "trace_id": trace_id,
        "brokers": [{"id": b, "rack": f"r{b}"} for b in (0, 1, 2)], "duration_us": DURATION_US,
        "seed": None, "generator": None}))
    (folder / "events.csv").write_text(header + body)
    return folder


GOOD = ("0,produce,,1,k,100,0,\n"
        "10,replicate,1,,,,,5\n"
        "20,crash,0,,,,,\n"
        "30,restart,0,,,,,\n"
        "40,isolate,2,,,,,\n"
        "50,heal,2,,,,,\n"
        "60,produce,,2,,100,0,\n")

#: rule -> (CSV body whose LAST row breaks the rule, 1-based data row it names, text the message shows).
FATAL_CASES = {
    "column-type": (GOOD + "abc,produce,,3,,100,0,\n", 8, "not an integer"),
    "kind-unknown": (GOOD + "70,explode,1,,,,,\n", 8, "unknown kind 'explode'"),
    "broker-not-in-manifest": (GOOD + "70,crash,7,,,,,\n", 8, "crash of broker 7"),
    "ts-out-of-range": (GOOD + f"{DURATION_US + 1},produce,,3,,100,0,\n", 8, "outside [0, 1000000]"),
    "msg-id-duplicate": (GOOD + "70,produce,,2,,100,0,\n", 8, "msg_id 2 was already produced"),
    "produce-without-msg-id": (GOOD + "70,produce,,,,100,0,\n", 8, "has no msg_id"),
    "size-not-positive": (GOOD + "70,produce,,3,,0,0,\n", 8, "size_bytes 0"),
    "upto-after-ts": (GOOD + "70,replicate,1,,,,,71\n", 8, "upto_us 71 > ts_us 70"),
    "replicate-without-upto": (GOOD + "70,replicate,1,,,,,\n", 8, "has no upto_us"),
    "restart-of-up-broker": (GOOD + "70,restart,1,,,,,\n", 8, "restart of broker 1"),
    "stop-of-down-broker": (GOOD + "70,power_loss,1,,,,,\n80,shutdown,1,,,,,\n", 9, "shutdown of broker 1"),
    "heal-of-unisolated-broker": (GOOD + "70,heal,2,,,,,\n", 8, "heal of broker 2"),
}


def table_versions(root: Path) -> dict[str, int | None]:
    """Every table's Delta version, read with delta-rs (no Spark, independent of the writer)."""
    out = {}
    for name in TABLES:
        path = root / name
        out[name] = DeltaTable(str(path)).version() if (path / "_delta_log").is_dir() else None
    return out


@pytest.fixture(scope="module")
def populated_lakehouse(spark, tmp_path_factory) -> Path:
    """A lakehouse where every table has a version (created in one pass) and a passed gate of a trace with the
    same trace_id left rows in `validations` and `quarantine`: the rows a refused trace must not replace.
    (A replay published into it as well took a minute of a loaded worker and checked nothing more: a fatal trace
    must commit to no table, and any commit shows as a new version, empty table or not.)"""
    root = tmp_path_factory.mktemp("gate") / "lakehouse"
    lh = Lakehouse(root, spark)
    trace = make_trace(root.parent / "good", GOOD + "70,replicate,1,,,,,60\n65,replicate,1,,,,,4\n")
    _, result = run_trace_gate(spark, trace, lh, run_ids=["previous-run"])
    assert result.success and result.quarantined == 1
    assert lh.read("validations").count() == 1 and lh.read("quarantine").count() == 1
    assert None not in table_versions(root).values()
    result.report.release()
    return root


def test_fatal_rules_cover_spec_2_3():
    fatal = {r.name for r in RULES if r.severity == FATAL}
    assert set(FATAL_CASES) | {"column-missing"} == fatal
    assert {r.name for r in RULES if r.severity == QUARANTINE} == {"replicate-while-unavailable", "upto-decreasing"}


def test_good_trace_passes_every_rule(spark, tmp_path):
    manifest, events = read_events_spark(spark, make_trace(tmp_path, GOOD), with_location=True)
    report = check_trace_rules(spark, events, manifest)
    assert report.success and report.fatal_count == 0 and report.quarantine_count == 0
    assert set(report.counts) == {r.name for r in RULES}
    report.release()


@pytest.mark.parametrize("rule", sorted(FATAL_CASES))
def test_fatal_rule_exits_2_naming_file_row_rule_and_writes_nothing(spark, tmp_path, populated_lakehouse, rule,
                                                                   capsys):
    body, row, text = FATAL_CASES[rule]
    trace = make_trace(tmp_path / "trace", body)
    before = table_versions(populated_lakehouse)
    assert main(["validate", "--trace", str(trace), "--lakehouse", str(populated_lakehouse)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"{trace / 'events.csv'}, row {row}:" in err and f"[rule: {rule}]" in err and text in err, err
    assert table_versions(populated_lakehouse) == before
    report = Path(err.split("report: ")[1].split(" [rule")[0])
    assert report.is_file() and report.with_name("result.json").is_file()
    assert populated_lakehouse.resolve() in report.parents


def test_missing_column_exits_2_and_names_the_column(spark, tmp_path, populated_lakehouse, capsys):
    trace = make_trace(tmp_path / "trace", "0,produce,,1,,100,0\n",
                       header="ts_us,kind,broker,msg_id,key,size_bytes,producer_id\n")
    before = table_versions(populated_lakehouse)
    assert main(["validate", "--trace", str(trace), "--lakehouse", str(populated_lakehouse)]) == 2
    err = capsys.readouterr().err
    assert "missing column 'upto_us'" in err and "[rule: column-missing]" in err and "events.csv" in err
    assert table_versions(populated_lakehouse) == before


def test_fatal_rule_on_a_fresh_lakehouse_creates_no_table(spark, tmp_path):
    trace = make_trace(tmp_path / "trace", FATAL_CASES["restart-of-up-broker"][0])
    root = tmp_path / "fresh"
    with pytest.raises(BadInput) as info:
        run_trace_gate(spark, trace, root)
    assert info.value.exit_code == 2 and info.value.rule == "restart-of-up-broker" and info.value.row == 8
    assert table_versions(root) == dict.fromkeys(TABLES)
    assert list((root / "_reports").rglob("report.html"))  # the report is kept even so


def test_cli_process_exit_code_2(tmp_path):
    """The real entry point, in its own process: `python -m pipelines validate` exits 2 with one line."""
    trace = make_trace(tmp_path / "trace", FATAL_CASES["msg-id-duplicate"][0])
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "pipelines", "validate", "--trace", str(trace), "--lakehouse",
                          str(tmp_path / "lh")], capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert out.returncode == 2, out.stderr[-2000:]
    lines = [line for line in out.stderr.splitlines() if line.startswith("replab validate:")]
    assert len(lines) == 1 and "row 8" in lines[0] and "[rule: msg-id-duplicate]" in lines[0]


@pytest.mark.parametrize(("limit", "short_lived"), [(None, True), (7, True), (6, False)],
                         ids=["small", "at-the-limit", "over-the-limit"])
def test_validate_starts_a_short_lived_jvm_only_for_a_trace_the_driver_checks(tmp_path, monkeypatch, spark_start_spy,
                                                                               limit, short_lived):
    """`replab validate` starts its JVM on C1 only when the trace has at most `LOCAL_ROWS` events (counted before
    Spark starts); a trace that cannot be read is not short-lived, the gate reports it."""
    from expectations import trace_gate

    if limit is not None:
        monkeypatch.setattr(trace_gate, "LOCAL_ROWS", limit)
    trace = make_trace(tmp_path / "trace", GOOD)  # 7 events
    with pytest.raises(spark_start_spy.started):
        main(["validate", "--trace", str(trace), "--lakehouse", str(tmp_path / "lh")])
    assert spark_start_spy.asked == [short_lived]
    assert not trace_gate.short_lived_gate(tmp_path / "missing")


def test_counts_and_first_rows_per_rule(spark, tmp_path):
    body = (GOOD
            + "70,produce,,2,,100,0,\n"     # row 8: duplicate of row 7
            + "71,produce,,2,,100,0,\n"     # row 9: duplicate again
            + "72,restart,1,,,,,\n"         # row 10: broker 1 is up
            + "73,heal,1,,,,,\n")           # row 11: broker 1 is not isolated
    manifest, events = read_events_spark(spark, make_trace(tmp_path, body), with_location=True)
    report = check_trace_rules(spark, events, manifest)
    counts = {k: v for k, v in report.counts.items() if v}
    assert counts == {"msg-id-duplicate": 2, "restart-of-up-broker": 1, "heal-of-unisolated-broker": 1}
    dup = next(o for o in report.outcomes if o.rule == "msg-id-duplicate")
    assert [r["_row"] for r in dup.first_rows] == [8, 9]
    assert all(r["_first_row"] == 7 for r in dup.first_rows)
    error = report.to_bad_input()
    assert error.row == 8 and error.rule == "msg-id-duplicate"
    assert "(3 more row(s) break fatal rules" in str(error)
    report.release()


def test_same_instant_uses_spec_kind_order(spark, tmp_path):
    # restart listed before crash in the file, same ts: SPEC §2.2 applies crash first, so both are valid.
    body = "100,restart,0,,,,,\n100,crash,0,,,,,\n"
    manifest, events = read_events_spark(spark, make_trace(tmp_path, body), with_location=True)
    report = check_trace_rules(spark, events, manifest)
    assert report.success, report.counts
    report.release()


def test_dataframe_without_location_columns(spark):
    """Other code may hand the gate a plain DataFrame: rules still apply, file/row are null."""
    from schemas.trace import Broker, Manifest, event_spark_schema

    manifest = Manifest("plain", (Broker(0, "a"),), 1000)
    rows = [(0, "produce", None, 1, None, 10, 0, None), (5, "restart", 0, None, None, None, None, None)]
    report = check_trace_rules(spark, spark.createDataFrame(rows, event_spark_schema()), manifest)
    assert {k: v for k, v in report.counts.items() if v} == {"restart-of-up-broker": 1}
    error = report.to_bad_input()
    assert error.file is None and error.row is None and "restart of broker 0" in str(error)
    report.release()


def test_wrong_column_type_in_a_dataframe(spark):
    from schemas.trace import Broker, Manifest

    manifest = Manifest("plain", (Broker(0, "a"),), 1000)
    df = spark.createDataFrame([(0.5, "produce", None, 1, None, 10, 0, None)],
                               "ts_us double, kind string, broker int, msg_id bigint, key string, size_bytes int, "
                               "producer_id int, upto_us bigint")
    report = check_trace_rules(spark, df, manifest)
    assert report.counts["column-type"] == 1 and not report.success
    assert "column 'ts_us' has type double" in str(report.to_bad_input())


def test_missing_column_in_a_dataframe_is_reported_not_raised(spark):
    """The rule columns are computed beside the column checks; Spark's error over a missing column is dropped and
    the column check reports it."""
    from schemas.trace import Broker, Manifest

    manifest = Manifest("plain", (Broker(0, "a"),), 1000)
    df = spark.createDataFrame([(0, "produce", None, 1, None, 10, 0)],
                               "ts_us bigint, kind string, broker int, msg_id bigint, key string, size_bytes int, "
                               "producer_id int")
    report = check_trace_rules(spark, df, manifest)
    assert {k: v for k, v in report.counts.items() if v} == {"column-missing": 1}
    assert report.violations is None and not report.success
    assert "missing column 'upto_us'" in str(report.to_bad_input())


QUARANTINE_BODY = (
    "0,produce,,1,,100,0,\n"           # 1
    "10,replicate,1,,,,,8\n"           # 2
    "20,replicate,1,,,,,6\n"           # 3 quarantine: upto below 8 reported at row 2
    "30,crash,1,,,,,\n"                # 4
    "40,replicate,1,,,,,35\n"          # 5 quarantine: broker 1 is down
    "50,restart,1,,,,,\n"              # 6
    "60,replicate,1,,,,,2\n"           # 7 fine: a new incarnation starts over
    "70,isolate,2,,,,,\n"              # 8
    "80,replicate,2,,,,,75\n"          # 9 quarantine: broker 2 is isolated
    "90,heal,2,,,,,\n"                 # 10
    "95,replicate,2,,,,,1\n"           # 11 fine: the isolated report at row 9 does not count
    "99,produce,,2,,100,0,\n"          # 12
)


def test_quarantine_rows_land_with_rule_and_clean_events_exclude_them(spark, tmp_path):
    trace = make_trace(tmp_path / "trace", QUARANTINE_BODY, trace_id="q-trace")
    lh = Lakehouse(tmp_path / "lh", spark)
    clean, result = run_trace_gate(spark, trace, lh, run_ids=["run-a", "run-b"])
    assert result.success and result.quarantined == 3
    got = sorted((r.row, r.rule, r.severity, r.trace_id, json.loads(r.raw)["ts_us"])
                 for r in lh.read("quarantine").collect())
    assert got == [(3, "upto-decreasing", "quarantine", "q-trace", 20),
                   (5, "replicate-while-unavailable", "quarantine", "q-trace", 40),
                   (9, "replicate-while-unavailable", "quarantine", "q-trace", 80)]
    assert sorted(r.ts_us for r in clean.collect()) == [0, 10, 30, 50, 60, 70, 90, 95, 99]
    assert clean.columns == [n for n, _ in __import__("schemas.trace", fromlist=["x"]).EVENT_COLUMNS]
    validations = lh.read("validations").collect()
    assert sorted(v.run_id for v in validations) == ["run-a", "run-b"]
    assert all(v.success and v.unexpected_rows == 3 and Path(v.report_path).is_file() for v in validations)
    # Re-validating replaces this trace's rows: no duplicates in quarantine or validations.
    run_trace_gate(spark, trace, lh, run_ids=["run-a", "run-b"])[1].report.release()
    assert lh.read("quarantine").count() == 3 and lh.read("validations").count() == 2
    result.report.release()


def test_validate_cli_reports_quarantine(spark, tmp_path, capsys):
    trace = make_trace(tmp_path / "trace", QUARANTINE_BODY)
    assert main(["validate", "--trace", str(trace), "--lakehouse", str(tmp_path / "lh")]) == 0
    out = capsys.readouterr().out
    assert "quarantined rows: 3" in out and "upto-decreasing: 1" in out and "replicate-while-unavailable: 2" in out


def test_parquet_trace_rows_are_located(spark, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from schemas.trace import EVENT_ARROW_SCHEMA

    trace = make_trace(tmp_path / "trace", "")
    (trace / "events.csv").unlink()
    (trace / "events").mkdir()
    rows = [{"ts_us": 0, "kind": "produce", "msg_id": 1, "size_bytes": 10, "producer_id": 0},
            {"ts_us": 5, "kind": "restart", "broker": 1}]
    pq.write_table(pa.Table.from_pylist(rows, schema=EVENT_ARROW_SCHEMA), trace / "events" / "part-0.parquet")
    with pytest.raises(BadInput) as info:
        run_trace_gate(spark, trace, None)
    assert info.value.file == str(trace / "events" / "part-0.parquet") and info.value.row == 2


def test_reports_stay_inside_the_lakehouse(spark, tmp_path):
    trace = make_trace(tmp_path / "trace", GOOD, trace_id="../../../etc/evil")
    lh = Lakehouse(tmp_path / "lh", spark, create=False)
    _, result = run_trace_gate(spark, trace, lh)
    assert lh.root in result.report_html.parents
    assert ".." not in result.report_html.relative_to(lh.root).parts
