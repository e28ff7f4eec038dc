"""The one trace loader (SPEC §2): a trace directory in, typed events out, or a BadInput naming file and row.

The loader checks the format only: manifest, columns, types and kinds. It never guesses or coerces (a float
column where int64 is due is an error, not a cast). The validity rules of SPEC §2.3 are the trace gate's job
(`expectations/`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.dataset as pads

from schemas.errors import BadInput
from schemas.trace import CONTROL_KINDS, EVENT_ARROW_SCHEMA, EVENT_COLUMNS, KIND_LABELS, Kind, Manifest, TraceFiles

_INT_RANGES = {pa.int64(): (-(2**63), 2**63 - 1), pa.int32(): (-(2**31), 2**31 - 1)}


def locate(trace_dir: str | Path) -> TraceFiles:
    """Find the manifest and the events of a trace directory (absolute paths: executors resolve them)."""
    root = Path(trace_dir).resolve()
    if not root.is_dir():
        raise BadInput("trace directory does not exist", file=str(root), rule="trace-layout")
    manifest = Manifest.read(root)
    parquet_dir, csv_file = root / "events", root / "events.csv"
    if parquet_dir.is_dir():
        return TraceFiles(root, manifest, parquet_dir, is_csv=False)
    if csv_file.is_file():
        return TraceFiles(root, manifest, csv_file, is_csv=True)
    raise BadInput("no events: expected an events/ Parquet folder or events.csv", file=str(root),
                   rule="trace-layout")


def _same_type(actual: pa.DataType, expected: pa.DataType) -> bool:
    if pa.types.is_dictionary(actual):
        actual = actual.value_type
    if expected == pa.string():
        return pa.types.is_string(actual) or pa.types.is_large_string(actual)
    return actual == expected


def check_arrow_schema(schema: pa.Schema, *, file: str) -> None:
    """Every column of SPEC §2.1 present with its exact type (extra columns are ignored)."""
    for name, expected in EVENT_COLUMNS:
        idx = schema.get_field_index(name)
        if idx < 0:
            raise BadInput(f"missing column '{name}' ({expected})", file=file, rule="column-missing")
        actual = schema.field(idx).type
        if not _same_type(actual, expected):
            raise BadInput(f"column '{name}' has type {actual}, expected {expected}", file=file,
                           rule="column-type")


def _first_false(mask: pa.ChunkedArray | pa.Array) -> int | None:
    """Index of the first false in a boolean array (nulls count as true), or None."""
    filled = pc.fill_null(mask, True)
    if pc.all(filled, min_count=0).as_py():  # min_count=0: an empty file has no false (the default says null)
        return None
    return int(pc.index(filled, False).as_py())


def _parse_csv(path: Path) -> pa.Table:
    """Read events.csv as text, then type each column; a bad value names its row (1-based, header excluded)."""
    try:
        raw = pacsv.read_csv(
            path,
            convert_options=pacsv.ConvertOptions(
                column_types={n: pa.string() for n, _ in EVENT_COLUMNS}, strings_can_be_null=True,
                null_values=[""], quoted_strings_can_be_null=False,
            ),
        )
    except pa.ArrowInvalid as exc:
        raise BadInput(f"unreadable CSV: {exc}", file=str(path), rule="csv") from exc
    for name, _ in EVENT_COLUMNS:
        if name not in raw.column_names:
            raise BadInput(f"missing column '{name}'", file=str(path), rule="column-missing")
    arrays = {}
    for name, typ in EVENT_COLUMNS:
        col = raw.column(name)
        if typ == pa.string():
            arrays[name] = col
            continue
        ok = pc.match_substring_regex(pc.utf8_trim_whitespace(col), r"^[+-]?[0-9]+$")
        bad = _first_false(ok)
        if bad is not None:
            raise BadInput(f"column '{name}' value {col[bad].as_py()!r} is not an integer ({typ})",
                           file=str(path), row=bad + 1, rule="column-type")
        as_int = pc.cast(pc.utf8_trim_whitespace(col), pa.int64())
        lo, hi = _INT_RANGES[typ]
        bad = _first_false(pc.and_(pc.greater_equal(as_int, lo), pc.less_equal(as_int, hi)))
        if bad is not None:
            raise BadInput(f"column '{name}' value {col[bad].as_py()!r} does not fit {typ}", file=str(path),
                           row=bad + 1, rule="column-type")
        arrays[name] = pc.cast(as_int, typ)
    return pa.table(arrays, schema=EVENT_ARROW_SCHEMA)


def check_kinds(table: pa.Table, *, file: str) -> None:
    bad = _first_false(pc.and_(pc.is_valid(table["kind"]), pc.is_in(table["kind"], pa.array(KIND_LABELS))))
    if bad is not None:
        raise BadInput(f"unknown kind {table['kind'][bad].as_py()!r} (known: {', '.join(KIND_LABELS)})",
                       file=file, row=bad + 1, rule="kind-unknown")


#: Parquet read with the kind column dictionary-encoded: a file's dictionaries hold its distinct kinds.
_KIND_AS_DICTIONARY = pads.ParquetFileFormat(read_options=pads.ParquetReadOptions(dictionary_columns=["kind"]))


def check_parquet_kinds(fragment) -> None:
    """`check_kinds` of one Parquet file of a trace, on the driver: only its kind column is read, as dictionaries
    of the distinct kinds (87.7 M events: 0.4 s; it was a Spark job over every row), and its rows are looked at
    only when a dictionary holds an unknown kind or a kind is null."""
    kinds = fragment.to_table(columns=["kind"])["kind"]
    known = pa.array(KIND_LABELS)
    if kinds.null_count == 0 and all(pc.all(pc.is_in(chunk.dictionary, known)).as_py() is not False
                                     for chunk in kinds.chunks):
        return
    check_kinds(pa.table({"kind": kinds.cast(pa.string())}), file=fragment.path)


def _checked_parts(tf: TraceFiles) -> list[tuple[str, pa.Table]]:
    """Each events file of a trace as (path, Arrow table with EVENT_ARROW_SCHEMA), in path order, format-checked."""
    if tf.is_csv:
        table = _parse_csv(tf.events_path)
        check_kinds(table, file=str(tf.events_path))
        return [(str(tf.events_path), table)]
    parts = []
    for fragment in sorted(pads.dataset(tf.events_path, format="parquet").get_fragments(), key=lambda f: f.path):
        check_arrow_schema(fragment.physical_schema, file=fragment.path)
        part = fragment.to_table(columns=[n for n, _ in EVENT_COLUMNS])
        check_kinds(part, file=fragment.path)
        parts.append((fragment.path, part.cast(EVENT_ARROW_SCHEMA)))
    return parts


def read_events_arrow(trace: TraceFiles | str | Path) -> tuple[Manifest, pa.Table]:
    """Read a (small) trace into one Arrow table without Spark: tests, the reference interpreter, CSV traces."""
    tf = trace if isinstance(trace, TraceFiles) else locate(trace)
    parts = [table for _, table in _checked_parts(tf)]
    return tf.manifest, pa.concat_tables(parts) if parts else EVENT_ARROW_SCHEMA.empty_table()


#: Location columns added by `read_events_spark(..., with_location=True)`: the file and the 1-based row of each
#: event in it (data rows; a CSV header is not counted), for messages that name where a bad row is.
LOCATION_COLUMNS: tuple[str, ...] = ("_file", "_row")


def read_events_spark(spark, trace: TraceFiles | str | Path, *, with_location: bool = False,
                      located: pa.Table | None = None):
    """Read a trace's events as a Spark DataFrame with the exact schema of SPEC §2.1.

    Parquet is checked file by file from its footers (no data scan), and its kinds from each file's kind
    column on the driver (`check_parquet_kinds`). CSV traces are hand-written and small: they are parsed with
    Arrow (row-exact errors) and handed to Spark as Arrow (no pandas round trip, so int64 values with nulls stay
    exact); `located`, the trace's `read_events_located` table if the caller has it, spares a second parse.
    `with_location` adds `_file` and `_row` (LOCATION_COLUMNS).
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from schemas.trace import event_spark_schema

    tf = trace if isinstance(trace, TraceFiles) else locate(trace)
    names = [n for n, _ in EVENT_COLUMNS]
    if tf.is_csv:
        table = located if located is not None else read_events_located(tf)
        if not with_location:
            return tf.manifest, spark.createDataFrame(table.select(names), schema=event_spark_schema())
        table = table.set_column(table.schema.get_field_index("_file"), "_file", table["_file"].cast(pa.string()))
        schema = T.StructType([*event_spark_schema().fields, T.StructField("_file", T.StringType()),
                               T.StructField("_row", T.LongType())])
        return tf.manifest, spark.createDataFrame(table, schema=schema)
    dataset = pads.dataset(tf.events_path, format=_KIND_AS_DICTIONARY)
    for fragment in sorted(dataset.get_fragments(), key=lambda f: f.path):
        check_arrow_schema(fragment.physical_schema, file=fragment.path)
        check_parquet_kinds(fragment)
    df = spark.read.schema(event_spark_schema()).parquet(str(tf.events_path))
    if with_location:
        # Spark names a file by its URI (file:///a%20b/…); show the plain path, like the CSV case, the BadInputs
        # above and `read_events_located`: a small map from each input file's URI to its path.
        uri = F.regexp_replace(F.col("_metadata.file_path"), _URI_PREFIX, "")
        file_path = uri
        if not all(_PLAIN_PATH.fullmatch(f.path) for f in dataset.get_fragments()):
            paths = [item for u in df.inputFiles() for item in (F.lit(_strip_uri(u)), F.lit(_uri_path(u)))]
            file_path = F.coalesce(F.create_map(*paths)[uri], uri)
        row = F.col("_metadata.row_index") + 1
        return tf.manifest, df.select(*names, file_path.alias("_file"), row.alias("_row"))
    return tf.manifest, df.select(*names)


_URI_PREFIX = "^file:(//)?"
#: Paths whose URI is the path itself (nothing to percent-encode).
_PLAIN_PATH = re.compile(r"[A-Za-z0-9/._=-]*")


def _strip_uri(uri: str) -> str:
    return re.sub(_URI_PREFIX, "", uri)


def _uri_path(uri: str) -> str:
    """The path of a file Spark names by URI (`inputFiles()`, `_metadata.file_path`): percent-decoded, and
    without the scheme for local files (a '+' stays a '+': URIs do not encode spaces as '+')."""
    return unquote(_strip_uri(uri))


def _located(table: pa.Table, file: str) -> pa.Table:
    """`table` plus LOCATION_COLUMNS: `file` on every row (dictionary-encoded: one copy of the path, not one per
    row) and the 1-based data row."""
    n = table.num_rows
    files = pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)), pa.array([file], pa.string()))
    return table.append_column("_file", files).append_column("_row", pa.array(np.arange(1, n + 1, dtype=np.int64)))


def event_rows(tf: TraceFiles) -> int:
    """How many events a trace holds, without parsing them: a Parquet trace's from its files' footers, a CSV
    trace's as its lines after the header (an upper bound: a blank line counts)."""
    if tf.is_csv:
        lines, last = 0, b"\n"
        with open(tf.events_path, "rb") as f:
            while block := f.read(1 << 20):
                lines += block.count(b"\n")
                last = block[-1:]
        return max(lines + (last != b"\n") - 1, 0)
    return sum(f.metadata.num_rows for f in pads.dataset(tf.events_path, format="parquet").get_fragments())


def rows_before_start(trace: str | Path) -> int | None:
    """`event_rows` of the trace at `trace`, or None when it cannot be read (missing, a bad manifest, a corrupt
    Parquet footer): what a CLI decides before Spark starts (`engine.replay.short_lived_jvm`,
    `expectations.trace_gate.short_lived_gate`) leaves such a trace to the trace gate, which reports it by file,
    row and rule."""
    try:
        return event_rows(locate(trace))
    except Exception:  # the gate's to report, not this count's
        return None


def read_events_located(tf: TraceFiles) -> pa.Table:
    """A trace's events in Arrow on the driver, with LOCATION_COLUMNS as `read_events_spark(...,
    with_location=True)` has them, in (file, row) order: what the trace gate checks a small trace on."""
    parts = [_located(table, path) for path, table in _checked_parts(tf)]
    return pa.concat_tables(parts) if parts else _located(EVENT_ARROW_SCHEMA.empty_table(), "")


# ------------------------------------------------------------------------------------------- trace digest
@dataclass(frozen=True)
class ProduceStats:
    """The produce rows' lowest and highest msg_id (None without produce rows) and how many there are."""

    lo: int | None
    hi: int | None
    n: int

    @property
    def dense(self) -> bool:
        """msg_ids lo..hi, each once (msg_id is unique after the trace gate): a message's rank is msg_id − lo."""
        return self.n == 0 or (self.hi - self.lo + 1 == self.n)


#: The control rows' columns a replay's driver reads (`engine.replay.control_timeline`).
CONTROL_COLUMNS = ("ts_us", "kind", "broker")


@dataclass(frozen=True)
class TraceDigest:
    """What a replay's driver needs of the whole trace before its Spark work: the fault timeline's rows
    (CONTROL_KINDS, CONTROL_COLUMNS) and the produce rows' msg_id range and count. Read off a trace the driver
    already holds in Arrow (the trace gate's, for a small trace), it spares the replay two scans of the trace
    by Spark, one of them the session's first job."""

    control: pa.Table
    produce: ProduceStats


def trace_digest(table: pa.Table) -> TraceDigest:
    """The digest of a trace's events in Arrow (SPEC §2.1 columns; extra columns ignored)."""
    kind = table["kind"]
    control = table.filter(pc.is_in(kind, value_set=pa.array([k.label for k in CONTROL_KINDS])))
    ids = table["msg_id"].filter(pc.equal(kind, Kind.PRODUCE.label))
    bounds = pc.min_max(ids)
    return TraceDigest(control.select(list(CONTROL_COLUMNS)),
                       ProduceStats(bounds["min"].as_py(), bounds["max"].as_py(), len(ids)))
