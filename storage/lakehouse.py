"""The one table writer (SPEC §5): every table of `schemas/tables.py` as Delta under one root.

- Tables are created with their declared schema, partitioning and properties (never inferred), and read by any
  Delta reader (delta-spark, delta-rs).
- `replace_run` replaces exactly the given runs' rows of one table in ONE Delta commit (overwrite with
  `replaceWhere run_id IN (...)`; the first write of a table this object created appends, held to the same keys:
  there is nothing to replace): a re-run never duplicates, and a crash mid-write leaves the previous version
  (Delta commits are atomic). Commits that lose a race against another writer (Delta's retryable
  concurrent-modification conflicts) are retried with backoff, so replays of different policies writing at
  the same time both land.
- Run protocol: the `runs` row is written with status `running` first; every table of the run is written;
  the row is marked `succeeded` only after all tables and the output gate are done. Readers use succeeded
  runs (`succeeded_run_ids`, `read(..., succeeded_only=True)`). The output gate validates the run's
  DataFrames BEFORE any of its tables is replaced ("validate before write"): a failing gate leaves every run
  table at its previous version, and the `runs` row goes back to what it was (a previously succeeded run
  stays visible) or becomes `failed`.
- Paths: table folders are fixed names under the root and reports go through `expectations.report.inside`;
  nothing taken from a trace or a config can point outside the root (SPEC §11).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import os
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas.errors import BadInput, ReplabError
from schemas.tables import TABLES, TableSpec
from schemas.version import __version__

log = logging.getLogger(__name__)

RUNNING, SUCCEEDED, FAILED = "running", "succeeded", "failed"
#: Tables holding a run's results (written concurrently; the `runs` row is the commit marker).
RUN_TABLES: tuple[str, ...] = ("message_outcomes", "partition_states", "unavailability", "committed_offsets",
                               "loss_metrics", "watermarks", "run_summary")
MAX_ATTEMPTS = 12


_NO_SPACE = "No space left on device"
_CONFLICT_MARKERS = ("DELTA_CONCURRENT", "DELTA_PROTOCOL_CHANGED", "DELTA_METADATA_CHANGED", "concurrent update")
#: Two processes creating the same table race for version 0: the loser may find a log folder without a commit
#: yet, or the winner's commit file. Both resolve on the next attempt (then the table exists).
_CREATE_RACE_MARKERS = ("DELTA_TABLE_NOT_FOUND", "FileAlreadyExistsException", "DELTA_TABLE_ALREADY_EXISTS",
                        "DELTA_CREATE_TABLE_WITH_DIFFERENT", "DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION")


def create_table(spark, path: str, spec: TableSpec) -> None:
    """The Delta table `spec` declares (schema, partitioning, properties, comment) at `path`, unless one is there."""
    from delta.tables import DeltaTable

    builder = (DeltaTable.createIfNotExists(spark).location(path).addColumns(spec.spark_schema())
               .comment(spec.description))
    if spec.partition_by:
        builder = builder.partitionedBy(*spec.partition_by)
    for key, value in spec.properties.items():
        builder = builder.property(key, value)
    builder.execute()


def _retryable(exc: BaseException, *, creating: bool = False) -> bool:
    """Delta's conflicts that a fresh attempt resolves (another writer committed first)."""
    from delta.exceptions import DeltaConcurrentModificationException

    if isinstance(exc, DeltaConcurrentModificationException):
        return True
    text = str(exc)
    markers = _CONFLICT_MARKERS + (_CREATE_RACE_MARKERS if creating else ())
    return any(s in text for s in markers)


def with_retries(action: Callable[[], Any], what: str, attempts: int = MAX_ATTEMPTS, *,
                 creating: bool = False) -> Any:
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except Exception as exc:
            if attempt == attempts or not _retryable(exc, creating=creating):
                if _NO_SPACE in str(exc):  # Delta committed nothing: the write failed before its commit
                    raise ReplabError(f"{what}: no space left on device (the lakehouse's disk is full); "
                                      "this write was not committed") from exc
                raise
            delay = min(5.0, 0.1 * 2 ** (attempt - 1)) * (0.5 + random.random())
            log.info("%s: concurrent commit (%s); retry %d in %.2fs", what, type(exc).__name__, attempt, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


def sql_string(value: str) -> str:
    """A Spark SQL string literal (backslash escapes are on by default)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def in_predicate(column: str, values: Iterable[str]) -> str:
    vals = sorted(set(values))
    if not vals:
        raise ValueError("no key values")
    return f"`{column}` IN ({', '.join(sql_string(v) for v in vals)})"


def as_table(df, table: str):
    """`df`'s columns of `table` in the table's order and types. A frame whose columns already have the table's
    types is reordered by ONE `DataFrame.to` (against the schema with every field nullable, so each column keeps
    its own nullability); any other by one `selectExpr` of SQL casts, the cast a `Column.cast` makes (`to` refuses
    some of them, e.g. string to timestamp). A select of `F.col(...).cast(...).alias(...)` per column made about 40
    Py4J round trips per column (784 for run_summary's 19 columns, 110 ms, against 3 round trips and 6 ms with `to`
    and 26 round trips with `selectExpr`): a small replay built 25 000 round trips, a quarter of them here. Columns
    the table does not have are dropped (`Lakehouse.conform` refuses those first)."""
    from pyspark.sql import types as T

    schema = TABLES[table].spark_schema()
    have = {f.name: f.dataType for f in df.schema.fields}
    if all(have.get(f.name) == f.dataType for f in schema.fields):
        return df.to(T.StructType([T.StructField(f.name, f.dataType, True, f.metadata) for f in schema.fields]))

    def quoted(name: str) -> str:
        return "`" + name.replace("`", "``") + "`"

    return df.selectExpr(*[f"CAST({quoted(f.name)} AS {f.dataType.simpleString()}) AS {quoted(f.name)}"
                           for f in schema.fields])


def validation_id(suite: str, trace_id: str, run_id: str | None) -> str:
    """One row per (suite, trace, run) in `validations`: a gate re-run replaces its row."""
    return hashlib.sha1(f"{suite}\x00{trace_id}\x00{run_id or ''}".encode()).hexdigest()[:20]


@dataclass(frozen=True)
class RunRecord:
    """The identity of a run (SPEC §4.4 `runs`); timestamps and status are the writer's business."""

    run_id: str
    trace_id: str
    policy: str
    family: str
    params: Mapping[str, str] = field(default_factory=dict)
    mode: str = "batch"
    replab_version: str = __version__
    mlflow_run_id: str | None = None


class Lakehouse:
    """Delta tables under `root`, created with their declared schemas.

    `create=False` opens the root without touching it: a table is then created on its first write. The trace
    gate uses that, so that a refused trace leaves a fresh lakehouse without any table (SPEC §2.3).
    """

    def __init__(self, root: str | Path, spark=None, *, create: bool = True) -> None:
        if spark is None:
            from storage.session import get_spark

            spark = get_spark()
        self.spark = spark
        self.root = Path(root).resolve()
        self._ready: set[str] = set()
        #: Tables this object created (empty): until someone commits to one, it is known empty without a read.
        self._created: set[str] = set()
        self._pending_validations: list[Mapping[str, Any]] = []
        if create:
            self.create_tables()

    def check_writable(self) -> None:
        """Refuse a root that cannot be written (exit 2) before any work, without creating anything: its nearest
        existing folder must be a writable folder (a read-only mount or a file in the path is refused)."""
        existing = self.root
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            raise BadInput(f"lakehouse {self.root} is not writable: {existing} is not a folder", rule="lakehouse")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise BadInput(f"lakehouse {self.root} is not writable ({existing}: permission denied or read-only)",
                           rule="lakehouse")

    # ------------------------------------------------------------------------------------------- layout
    @property
    def reports_root(self) -> Path:
        return self.root / "_reports"

    def path(self, table: str) -> str:
        if table not in TABLES:
            raise ReplabError(f"unknown table {table!r} (known: {', '.join(TABLES)})")
        return str(self.root / table)

    def spec(self, table: str) -> TableSpec:
        self.path(table)
        return TABLES[table]

    def create_tables(self) -> None:
        self.ensure_tables(list(TABLES))

    def ensure_tables(self, names: Sequence[str]) -> None:
        """Create (or check and evolve) these tables in one pass: concurrently, since each is a few small Delta
        log operations whose latency, not CPU, dominates (a new lakehouse's tables took one chain each)."""
        specs = [self.spec(n) for n in dict.fromkeys(names) if n not in self._ready]
        self.root.mkdir(parents=True, exist_ok=True)
        in_threads([lambda spec=spec: self._ensure(spec) for spec in specs])

    def _ensure(self, spec: TableSpec) -> None:
        from delta.tables import DeltaTable

        path = self.path(spec.name)
        if spec.name in self._ready:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        if DeltaTable.isDeltaTable(self.spark, path):
            self._add_missing_columns(spec)
            self._ready.add(spec.name)
            return

        with_retries(lambda: create_table(self.spark, path, spec), f"create {spec.name}", creating=True)
        self._created.add(spec.name)
        self._ready.add(spec.name)

    def _add_missing_columns(self, spec: TableSpec) -> None:
        """Schemas evolve additively: a lakehouse made by an older replab gains the new (nullable) columns."""
        existing = set(self.spark.read.format("delta").load(self.path(spec.name)).columns)
        missing = [f for f in spec.spark_schema().fields if f.name not in existing]
        if not missing:
            return
        cols = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in missing)
        with_retries(lambda: self.spark.sql(f"ALTER TABLE delta.`{self.path(spec.name)}` ADD COLUMNS ({cols})"),
                     f"evolve {spec.name}")

    # ------------------------------------------------------------------------------------------- reading
    def read(self, table: str, *, succeeded_only: bool = False):
        self._ensure(self.spec(table))
        df = self.spark.read.format("delta").load(self.path(table))
        if succeeded_only and "run_id" in df.columns and table != "runs":
            ok = self.read("runs").where(f"status = '{SUCCEEDED}'").select("run_id")
            df = df.join(ok, "run_id", "left_semi")
        return df

    def succeeded_run_ids(self) -> list[str]:
        rows = self.read("runs").where(f"status = '{SUCCEEDED}'").select("run_id").collect()
        return sorted(r.run_id for r in rows)

    def version(self, table: str) -> int | None:
        """The table's latest Delta version (None: not created yet)."""
        from delta.tables import DeltaTable

        path = self.path(table)
        if not DeltaTable.isDeltaTable(self.spark, path):
            return None
        return int(DeltaTable.forPath(self.spark, path).history(1).first()["version"])

    def versions(self) -> dict[str, int | None]:
        return {name: self.version(name) for name in TABLES}

    # ------------------------------------------------------------------------------------------- writing
    def conform(self, table: str, df):
        """`df` with exactly the table's columns, in its order and types (a missing or extra column is a bug,
        not something to infer or drop silently)."""
        spec = self.spec(table)
        self._ensure(spec)
        schema = spec.spark_schema()
        have = set(df.columns)
        missing = [f.name for f in schema.fields if f.name not in have]
        extra = sorted(have - set(schema.fieldNames()))
        if missing or extra:
            raise ReplabError(f"{table}: DataFrame does not match the declared schema (missing: {missing}, "
                              f"extra: {extra})")
        return as_table(df, table)

    def replace_rows(self, table: str, key_column: str, key_values: Sequence[str], df) -> None:
        """Replace every row whose `key_column` is in `key_values` by `df`'s rows: one Delta commit.

        `df` must only hold rows of those keys (Delta checks it: replaceWhere's constraint check).

        On a table this object created and nobody has committed to since (`_still_empty`) there is nothing to
        replace: the rows are appended, held to the keys by a check of the same rule in the write's own tasks.
        replaceWhere first reconstructs the table's version 0 (1-3 Spark jobs per table), about a quarter of a small
        replay's Spark jobs into a new lakehouse.
        """
        from pyspark.sql import functions as F

        predicate = in_predicate(key_column, key_values)
        data = _few_files(self.conform(table, df))
        path = self.path(table)
        outside = (f"DELTA_REPLACE_WHERE_MISMATCH: a row written to {table} is outside its replaceWhere condition "
                   f"{predicate[:200]}")
        held = data.where(F.when(F.expr(predicate), F.lit(True)).otherwise(F.raise_error(F.lit(outside))))

        def write() -> None:
            # Asked at each attempt: a retry after any commit (another writer's, or this one's if it raised after
            # committing) replaces, which is idempotent, where a second append would duplicate.
            if self._still_empty(table):
                held.write.format("delta").mode("append").save(path)
            else:
                (data.write.format("delta").mode("overwrite").option("replaceWhere", predicate)
                 .save(path))

        with_retries(write, f"replace {table} where {predicate[:80]}")

    def delete_rows(self, table: str, key_column: str, key_values: Sequence[str]) -> None:
        """Remove every row whose `key_column` is in `key_values`: one Delta commit, or none on a table this object
        created and nobody has committed to since (known empty: a stream replay's first act in a new lakehouse)."""
        self._ensure(self.spec(table))
        if self._still_empty(table):
            return
        self.replace_rows(table, key_column, key_values, self.spark.createDataFrame([], TABLES[table].spark_schema()))

    def append_once(self, table: str, df, *, app_id: str, version: int) -> None:
        """Append `df`'s rows exactly once: Delta skips a (txnAppId, txnVersion) it has already committed, so a
        stream's micro-batch that runs again after a crash writes nothing twice."""
        data = self.conform(table, df)
        path = self.path(table)

        def write() -> None:
            (data.write.format("delta").mode("append").option("txnAppId", app_id)
             .option("txnVersion", version).save(path))

        with_retries(write, f"append {table} ({app_id} version {version})")

    def replace_run(self, table: str, key_values: str | Sequence[str], df) -> None:
        """Replace exactly these runs' rows of `table` (keyed by the table's run key, SPEC §5)."""
        keys = [key_values] if isinstance(key_values, str) else list(key_values)
        self.replace_rows(table, self.spec(table).run_key, keys, df)

    def _upsert(self, table: str, key: str, rows_df, keys: Sequence[str]) -> None:
        """Insert or replace small rows by key: replaceWhere on the keys (one commit, much cheaper than MERGE)."""
        self.replace_rows(table, key, keys, rows_df)

    def record_validations(self, rows: Sequence[Mapping[str, Any]], *, defer: bool = False) -> None:
        """Upsert gate runs into `validations` (one row per suite, trace and run; SPEC §5, §7).

        `defer`: keep the rows and write them with the next call (one commit for a replay's trace gate and
        output gate); `flush_validations()` writes what is kept, e.g. when a replay fails in between.
        """
        self._pending_validations.extend(rows)
        if defer:
            return
        self.flush_validations()

    def flush_validations(self) -> None:
        rows, self._pending_validations = self._pending_validations, []
        if not rows:
            return
        now = dt.datetime.now(dt.UTC)
        full: dict[str, dict[str, Any]] = {}
        for r in rows:
            row = {name: r.get(name) for name in TABLES["validations"].columns}
            row["validation_id"] = validation_id(r["suite"], r["trace_id"], r.get("run_id"))
            row["validated_at"] = row["validated_at"] or now
            full[row["validation_id"]] = row  # a later row of the same gate run replaces an earlier one
        df = self.spark.createDataFrame(list(full.values()), schema=TABLES["validations"].spark_schema()).coalesce(1)
        self._upsert("validations", "validation_id", df, list(full))

    def _still_empty(self, table: str) -> bool:
        """Whether a table this object created has had no commit since (by anyone): its log holds version 0 only,
        the creation, which adds no file (Delta's log names each version's commit file; no Spark job)."""
        return table in self._created and not (Path(self.path(table)) / "_delta_log" / f"{1:020d}.json").exists()

    def has_rows(self, table: str, column: str, value: str) -> bool:
        """Whether the table holds a row with this key (a cheap read: Delta skips files by their stats). A table
        not created yet holds none, and is not created by asking."""
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        if self._still_empty(table):
            return False
        if table not in self._ready and not DeltaTable.isDeltaTable(self.spark, self.path(table)):
            return False
        return bool(self.read(table).where(F.col(column) == value).limit(1).count())

    # ------------------------------------------------------------------------------------------- runs
    def _run_rows(self, records: Sequence[RunRecord], status: str, started: dt.datetime,
                  finished: dt.datetime | None):
        rows = [{"run_id": r.run_id, "trace_id": r.trace_id, "policy": r.policy, "family": r.family,
                 "params": {str(k): str(v) for k, v in r.params.items()}, "mode": r.mode, "started_at": started,
                 "finished_at": finished, "status": status, "mlflow_run_id": r.mlflow_run_id,
                 "replab_version": r.replab_version} for r in records]
        return self.spark.createDataFrame(rows, schema=TABLES["runs"].spark_schema()).coalesce(1)  # one file

    def begin_runs(self, records: Sequence[RunRecord]) -> RunsTransaction:
        """Mark these runs `running` (one commit) and return the transaction that writes their tables."""
        if not records:
            raise ValueError("no runs")
        ids = [r.run_id for r in records]
        if len(set(ids)) != len(ids):
            raise ReplabError(f"duplicate run ids in one write: {ids}")
        self._ensure(self.spec("runs"))
        # A runs table made by this object holds no earlier row to restore (its read: two Spark jobs).
        previous = [] if self._still_empty("runs") else [
            r.asDict(recursive=True) for r in self.read("runs").where(in_predicate("run_id", ids)).collect()]
        started = dt.datetime.now(dt.UTC)
        self._upsert("runs", "run_id", self._run_rows(records, RUNNING, started, None), ids)
        return RunsTransaction(self, list(records), started, {p["run_id"]: p for p in previous})

    def publish_runs(self, records: Sequence[RunRecord], tables: Mapping[str, Any],
                     gate: Callable[[], Any] | None = None,
                     progress: Callable[[str], None] | None = None) -> None:
        """The whole run protocol: running → gate on the DataFrames → every table → succeeded.

        `tables` maps table names of RUN_TABLES to DataFrames holding exactly these runs' rows (persist them
        first: the gate and the writes both read them). A gate that raises (GateFailed) leaves every run
        table untouched. `progress` hears "begin" once the runs are marked running and "wrote <table>" as each
        table's commit lands (the others may still be in flight).
        """
        step = progress or (lambda text: None)
        unknown = set(tables) - set(RUN_TABLES)
        if unknown:
            raise ReplabError(f"not run tables: {sorted(unknown)}")
        # The replay's tables in one pass (a trace gate's quarantine too: it did not create it to find it empty).
        self.ensure_tables(["runs", "validations", "quarantine", *tables])
        with self.begin_runs(records) as txn:
            step("begin")
            if gate is not None:
                gate()
            # Different tables, independent commits: written concurrently (the runs row is the commit marker).
            names = [name for name in RUN_TABLES if name in tables]
            in_threads([lambda name=name: txn.write(name, tables[name]) for name in names],
                       done=lambda i: step(f"wrote {names[i]}"))
            txn.succeed()


class HeldTables:
    """Reads a lakehouse as `Lakehouse.read` does, but answers from the DataFrames its caller still holds for some
    tables: the rows of the runs it has just written (persisted), read without Delta's snapshot and file listing
    (2-4 Spark jobs per read of a table just written). Ask it about those runs only; every other table is read
    from the lakehouse."""

    def __init__(self, lakehouse: Lakehouse, frames: Mapping[str, Any]) -> None:
        self.lakehouse = lakehouse
        self.frames = dict(frames)

    @property
    def root(self) -> Path:
        return self.lakehouse.root

    def read(self, table: str, *, succeeded_only: bool = False):
        if table in self.frames and not succeeded_only:
            return self.lakehouse.conform(table, self.frames[table])
        return self.lakehouse.read(table, succeeded_only=succeeded_only)


def in_threads(actions: Sequence[Callable[[], Any]], workers: int = 4,
               done: Callable[[int], None] | None = None) -> None:
    """Run Spark/Delta actions from several driver threads (Spark schedules concurrent jobs); the first error
    is raised after every action has ended, so none is left running behind the caller. `done(i)` is called in
    the caller's thread as action i succeeds, in the order they end."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(actions))),
                            thread_name_prefix="replab-delta") as pool:
        futures = {pool.submit(action): i for i, action in enumerate(actions)}
        error: BaseException | None = None
        for future in as_completed(futures):
            if future.exception() is not None:
                error = error or future.exception()
            elif done is not None and error is None:
                done(futures[future])
    if error is not None:
        raise error


#: A frame smaller than this is written by one task: one file per table partition. Written by as many tasks as
#: it has partitions (four on two cores), a small run's table got a file per task, which Delta's auto compaction
#: (the small tables' autoCompact property) rewrote right after the write: one more commit and four more Spark jobs.
ONE_TASK_BYTES = 32 << 20


def _few_files(df):
    """`df` in one Spark partition, so one file per table partition, when Spark's plan statistics put it under
    ONE_TASK_BYTES (exact for a persisted frame already computed: the output gate computes the tables it checks
    before they are written). A bigger frame keeps its partitions: each task writes a file of each table partition
    it holds rows of, and the big tables do not compact after the write (`schemas.tables._BIG`). Hashing it by the
    table's partition columns first (one file per run) cost a shuffle of every row: 14 M outcome rows of 16 runs
    took 29.5-46.8 s to write that way, 20.2-21.6 s as they are. A frame of unknown size keeps its partitions (rows
    made on the driver are coalesced where they are made). No Spark job."""
    try:
        size = int(str(df._jdf.queryExecution().optimizedPlan().stats().sizeInBytes()))
    except Exception:  # not a classic session (Spark Connect): keep the frame as it is
        return df
    return df.coalesce(1) if size < ONE_TASK_BYTES else df


class RunsTransaction:
    """The runs being written; as a context manager, an exception marks them failed (or restores them)."""

    def __init__(self, lh: Lakehouse, records: list[RunRecord], started: dt.datetime,
                 previous: dict[str, dict[str, Any]]) -> None:
        self.lh, self.records, self.started, self.previous = lh, records, started, previous
        self.run_ids = [r.run_id for r in records]
        self.written: list[str] = []
        self.done = False

    def write(self, table: str, df) -> None:
        self.written.append(table)
        self.lh.replace_run(table, self.run_ids, df)

    def succeed(self, mlflow_run_ids: Mapping[str, str] | None = None) -> None:
        ids = mlflow_run_ids or {}
        records = [RunRecord(**{**r.__dict__, "mlflow_run_id": ids.get(r.run_id, r.mlflow_run_id)})
                   for r in self.records]
        rows = self.lh._run_rows(records, SUCCEEDED, self.started, dt.datetime.now(dt.UTC))
        self.lh._upsert("runs", "run_id", rows, self.run_ids)
        self.done = True

    def fail(self) -> None:
        """Give the runs back their previous succeeded row if none of their tables was replaced yet (a gate
        failure: the previous version of every table is intact), else mark them failed."""
        restore = [p for p in self.previous.values() if p["status"] == SUCCEEDED and not self.written]
        restored = {p["run_id"] for p in restore}
        failed = [r for r in self.records if r.run_id not in restored]
        rows = self.lh._run_rows(failed, FAILED, self.started, dt.datetime.now(dt.UTC))
        if restore:
            rows = rows.unionByName(self.lh.spark.createDataFrame(restore, schema=TABLES["runs"].spark_schema())
                                    ).coalesce(1)
        self.lh._upsert("runs", "run_id", rows, self.run_ids)
        self.done = True

    def __enter__(self) -> RunsTransaction:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and not self.done:
            try:
                self.fail()
            except Exception:  # the original error matters more; the runs row then stays `running`
                log.exception("could not mark runs %s failed", self.run_ids)
