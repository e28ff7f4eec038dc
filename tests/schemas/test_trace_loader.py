"""The trace loader: format errors name file, row and rule, and never coerce (SPEC §2)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from schemas.errors import BadInput
from schemas.trace import EVENT_ARROW_SCHEMA, Manifest
from storage.trace_loader import read_events_arrow, read_events_spark

HEADER = "ts_us,kind,broker,msg_id,key,size_bytes,producer_id,upto_us\n"
MANIFEST = {"format": "replab-trace", "version": 1, "trace_id": "t", "brokers": [{"id": 0, "rack": "a"}],
            "duration_us": 1000, "seed": None, "generator": None}


def make_trace(tmp_path, csv_body: str, manifest: dict | None = MANIFEST):
    (tmp_path / "events.csv").write_text(HEADER + csv_body)
    if manifest is not None:
        (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    return tmp_path


def test_reads_csv_with_exact_types(tmp_path):
    trace = make_trace(tmp_path, "0,crash,0,,,,,\n5,produce,,1,k,10,0,\n")
    manifest, table = read_events_arrow(trace)
    assert manifest.trace_id == "t" and manifest.broker_ids == (0,)
    assert table.schema == EVENT_ARROW_SCHEMA
    assert table.column("msg_id").to_pylist() == [None, 1]
    assert table.column("key").to_pylist() == [None, "k"]


def test_missing_manifest(tmp_path):
    trace = make_trace(tmp_path, "0,crash,0,,,,,\n", manifest=None)
    with pytest.raises(BadInput) as err:
        read_events_arrow(trace)
    assert err.value.exit_code == 2
    assert "manifest.json" in str(err.value) and err.value.rule == "manifest"


@pytest.mark.parametrize(("key", "value", "needle"), [
    ("format", "kafka", "format"), ("version", 2, "version"), ("duration_us", -1, "duration_us"),
    ("brokers", [], "brokers"), ("extra", 1, "unknown key"),
    ("route_poll_phase_us", -5, "route_poll_phase_us"), ("route_poll_phase_us", 1.5, "route_poll_phase_us"),
])
def test_bad_manifest_names_key(tmp_path, key, value, needle):
    trace = make_trace(tmp_path, "0,crash,0,,,,,\n", manifest={**MANIFEST, key: value})
    with pytest.raises(BadInput, match=needle):
        read_events_arrow(trace)


def test_unknown_kind_names_row(tmp_path):
    trace = make_trace(tmp_path, "0,crash,0,,,,,\n5,explode,0,,,,,\n")
    with pytest.raises(BadInput) as err:
        read_events_arrow(trace)
    assert err.value.row == 2 and err.value.rule == "kind-unknown"
    assert "events.csv" in str(err.value) and "'explode'" in str(err.value)


def test_wrong_type_in_csv_names_row_and_column(tmp_path):
    trace = make_trace(tmp_path, "0,crash,0,,,,,\n5.5,produce,,1,,10,0,\n")
    with pytest.raises(BadInput) as err:
        read_events_arrow(trace)
    assert err.value.row == 2 and err.value.rule == "column-type" and "ts_us" in str(err.value)


def test_int32_overflow_is_an_error_not_a_cast(tmp_path):
    trace = make_trace(tmp_path, "5,produce,,1,,3000000000,0,\n")
    with pytest.raises(BadInput, match="does not fit int32"):
        read_events_arrow(trace)


def test_missing_column(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps(MANIFEST))
    (tmp_path / "events.csv").write_text("ts_us,kind,broker\n0,crash,0\n")
    with pytest.raises(BadInput, match="missing column 'msg_id'"):
        read_events_arrow(tmp_path)


def test_parquet_wrong_type_names_file(tmp_path):
    Manifest.parse(MANIFEST).write(tmp_path)
    (tmp_path / "events").mkdir()
    table = pa.table({"ts_us": pa.array([1.0]), "kind": ["crash"], "broker": pa.array([0], pa.int32()),
                      "msg_id": pa.array([None], pa.int64()), "key": pa.array([None], pa.string()),
                      "size_bytes": pa.array([None], pa.int32()), "producer_id": pa.array([None], pa.int32()),
                      "upto_us": pa.array([None], pa.int64())})
    pq.write_table(table, tmp_path / "events" / "part-0.parquet")
    with pytest.raises(BadInput) as err:
        read_events_arrow(tmp_path)
    assert "part-0.parquet" in str(err.value) and err.value.rule == "column-type" and "ts_us" in str(err.value)


@pytest.mark.spark
def test_spark_loader_names_parquet_file_and_row(spark, tmp_path):
    Manifest.parse(MANIFEST).write(tmp_path)
    (tmp_path / "events").mkdir()
    good = pa.table({"ts_us": pa.array([0, 1, 2], pa.int64()), "kind": ["crash", "restart", "melt"],
                     "broker": pa.array([0, 0, 0], pa.int32()), "msg_id": pa.array([None] * 3, pa.int64()),
                     "key": pa.array([None] * 3, pa.string()), "size_bytes": pa.array([None] * 3, pa.int32()),
                     "producer_id": pa.array([None] * 3, pa.int32()), "upto_us": pa.array([None] * 3, pa.int64())})
    pq.write_table(good, tmp_path / "events" / "part-0.parquet")
    with pytest.raises(BadInput) as err:
        read_events_spark(spark, tmp_path)
    assert err.value.row == 3 and "part-0.parquet" in str(err.value) and "'melt'" in str(err.value)
    (tmp_path / "events" / "part-0.parquet").unlink()
    pq.write_table(good.slice(0, 2), tmp_path / "events" / "part-0.parquet")
    _, df = read_events_spark(spark, tmp_path)
    assert [r["kind"] for r in df.orderBy("ts_us").collect()] == ["crash", "restart"]
    # The kinds are checked per file from its dictionaries: a null kind in the 2nd row group of the next file
    nulled = good.slice(0, 2).set_column(1, "kind", pa.array(["crash", None]))
    pq.write_table(nulled, tmp_path / "events" / "part-1.parquet", row_group_size=1)
    with pytest.raises(BadInput) as err:
        read_events_spark(spark, tmp_path)
    assert err.value.row == 2 and err.value.file.endswith("part-1.parquet") and "unknown kind None" in str(err.value)


def test_kind_codes_are_the_kinds_values_and_unknown_elsewhere():
    from schemas.trace import KIND_LABELS, UNKNOWN_KIND, Kind, kind_codes

    labels = pa.chunked_array([list(KIND_LABELS), [None, "explode", "PRODUCE", "crash"]])
    assert kind_codes(labels).tolist() == [int(Kind.from_label(k)) for k in KIND_LABELS] + [
        UNKNOWN_KIND, UNKNOWN_KIND, UNKNOWN_KIND, int(Kind.CRASH)]  # labels are exact (the loader's rule)


def test_an_empty_parquet_file_is_read_as_no_rows(tmp_path):
    from storage.trace_loader import locate, read_events_located

    (tmp_path / "events").mkdir()
    (tmp_path / "manifest.json").write_text(json.dumps({
        "format": "replab-trace", "version": 1, "trace_id": "empty", "brokers": [{"id": 0, "rack": "a"}],
        "duration_us": 10, "seed": None, "generator": None}))
    pq.write_table(EVENT_ARROW_SCHEMA.empty_table(), tmp_path / "events" / "part-0.parquet")
    assert read_events_arrow(tmp_path)[1].num_rows == 0
    located = read_events_located(locate(tmp_path))
    assert located.num_rows == 0 and located.column_names[-2:] == ["_file", "_row"]


@pytest.mark.parametrize(("body", "rows"), [
    ("", 0),
    ("0,crash,0,,,,,\n5,produce,,1,k,10,0,\n", 2),
    ("0,crash,0,,,,,\n5,produce,,1,k,10,0,", 2),  # no newline after the last row
    ("0,crash,0,,,,,\n\n5,produce,,1,k,10,0,\n", 3),  # a blank line counts: an upper bound
], ids=["header-only", "rows", "no-final-newline", "blank-line"])
def test_event_rows_of_a_csv_trace_counts_its_lines_after_the_header(tmp_path, body, rows):
    from storage.trace_loader import event_rows, locate

    tf = locate(make_trace(tmp_path, body))
    assert event_rows(tf) == rows
    assert event_rows(tf) >= read_events_arrow(tmp_path)[1].num_rows


def test_event_rows_of_a_parquet_trace_reads_its_footers(tmp_path):
    from storage.trace_loader import event_rows, locate

    (tmp_path / "csv").mkdir()
    table = read_events_arrow(make_trace(tmp_path / "csv", "0,crash,0,,,,,\n5,produce,,1,k,10,0,\n"))[1]
    (tmp_path / "pq" / "events").mkdir(parents=True)
    (tmp_path / "pq" / "manifest.json").write_text(json.dumps(MANIFEST))
    for i in range(3):
        pq.write_table(table, tmp_path / "pq" / "events" / f"part-{i}.parquet")
    assert event_rows(locate(tmp_path / "pq")) == 6


def test_rows_before_start_counts_a_readable_trace_and_leaves_the_rest_to_the_gate(tmp_path):
    from storage.trace_loader import rows_before_start

    (tmp_path / "ok").mkdir()
    assert rows_before_start(make_trace(tmp_path / "ok", "0,crash,0,,,,,\n5,produce,,1,k,10,0,\n")) == 2
    assert rows_before_start(tmp_path / "missing") is None
    (tmp_path / "corrupt" / "events").mkdir(parents=True)
    (tmp_path / "corrupt" / "manifest.json").write_text(json.dumps(MANIFEST))
    (tmp_path / "corrupt" / "events" / "part-0.parquet").write_bytes(b"not a parquet file")
    assert rows_before_start(tmp_path / "corrupt") is None


def test_route_poll_phase_round_trips(tmp_path):
    trace = make_trace(tmp_path, "0,crash,0,,,,,\n", manifest={**MANIFEST, "route_poll_phase_us": 7_000_000})
    manifest, _ = read_events_arrow(trace)
    assert manifest.route_poll_phase_us == 7_000_000
    assert manifest.to_json()["route_poll_phase_us"] == 7_000_000
    (tmp_path / "plain").mkdir()
    plain, _ = read_events_arrow(make_trace(tmp_path / "plain", "0,crash,0,,,,,\n"))
    assert plain.route_poll_phase_us == 0 and "route_poll_phase_us" not in plain.to_json()
