"""The lakehouse writer (SPEC §5, §11): declared schemas, one commit per table and run, idempotent re-runs,
kill -9 at several points then re-run = an uninterrupted run, concurrent writers both land, delta-rs reads."""

from __future__ import annotations

import collections
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from expectations.report import inside, safe_component
from schemas.errors import ReplabError
from schemas.tables import TABLES
from storage.lakehouse import RUN_TABLES, Lakehouse, RunRecord, as_table, in_predicate
from tests.synthetic import make_run, run_tables

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
#: Columns that differ between two correct executions of the same run (wall-clock times).
VOLATILE = {"runs": {"started_at", "finished_at"}, "validations": {"validated_at", "report_path"}}


def snapshot(root: Path) -> dict[str, list]:
    """Every table's rows read with delta-rs (another Delta implementation), sorted, without wall-clock columns."""
    out = {}
    for name in TABLES:
        path = root / name
        if not (path / "_delta_log").is_dir():
            out[name] = None
            continue
        table = DeltaTable(str(path)).to_pyarrow_table()
        keep = [c for c in TABLES[name].columns if c not in VOLATILE.get(name, set())]
        out[name] = sorted(repr(row) for row in table.select(keep).to_pylist())
    return out


def only_run(snap: dict[str, list], run_id: str) -> dict[str, list]:
    return {name: [r for r in rows if f"'run_id': '{run_id}'" in r] if rows else rows for name, rows in snap.items()}


def record(run_id: str, seed: int) -> RunRecord:
    return RunRecord(run_id, "synthetic-trace", f"synthetic:seed={seed}", "synthetic", {"seed": str(seed)})


def write_run(lh: Lakehouse, spark, run_id: str, seed: int) -> None:
    """What the writer process does, in this process (same data: tests/synthetic.py main)."""
    lh.publish_runs([record(run_id, seed)], run_tables(spark, make_run(run_id, seed)))


def writer(root: Path, *run_args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # Own session (process group): kill -9 takes the Python driver and its JVM down together.
    return subprocess.Popen([sys.executable, "-m", "tests.synthetic", "--lakehouse", str(root),
                             *run_args], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


@pytest.fixture(scope="module")
def b_only(spark, tmp_path_factory) -> Path:
    """A lakehouse holding run b (seed 2) only (tests copy it: Delta tables are plain folders)."""
    root = tmp_path_factory.mktemp("b_only") / "lakehouse"
    write_run(Lakehouse(root, spark), spark, "b", 2)
    return root


@pytest.fixture(scope="module")
def reference_root(spark, tmp_path_factory, b_only) -> Path:
    """Runs b then a (seed 1) written without interruption."""
    root = tmp_path_factory.mktemp("reference") / "lakehouse"
    shutil.copytree(b_only, root)
    write_run(Lakehouse(root, spark), spark, "a", 1)
    return root


@pytest.fixture(scope="module")
def reference(reference_root) -> dict[str, list]:
    return snapshot(reference_root)


def copy_of(root: Path, tmp_path: Path) -> Path:
    target = tmp_path / "lakehouse"
    shutil.copytree(root, target)
    return target


def test_tables_have_declared_schema_partitioning_and_properties(spark, b_only):
    lh = Lakehouse(b_only, spark, create=False)
    for name, spec in TABLES.items():
        detail = spark.sql(f"DESCRIBE DETAIL delta.`{lh.path(name)}`").collect()[0]
        assert detail.format == "delta" and list(detail.partitionColumns) == list(spec.partition_by), name
        for key, value in spec.properties.items():
            assert detail.properties.get(key) == value, (name, key)
        schema = spark.read.format("delta").load(lh.path(name)).schema
        assert [(f.name, f.dataType, f.nullable) for f in schema.fields] == [
            (f.name, f.dataType, f.nullable) for f in spec.spark_schema().fields], name
        assert DeltaTable(lh.path(name)).schema().to_arrow().names == spec.columns  # delta-rs too


def test_delta_rs_reads_every_table_with_the_documented_columns(reference_root):
    for name, spec in TABLES.items():
        table = DeltaTable(str(reference_root / name)).to_pyarrow_table()
        # delta-rs puts partition columns last; the set and the types are the documented ones
        assert sorted(table.schema.names) == sorted(spec.columns), name
        for column in spec.columns:
            assert table.schema.field(column).type == spec.arrow_schema().field(column).type, (name, column)
    outcomes = DeltaTable(str(reference_root / "message_outcomes")).to_pyarrow_table()
    assert outcomes.num_rows == 800 and pa.compute.count_distinct(outcomes["msg_id"]).as_py() == 400
    runs = DeltaTable(str(reference_root / "runs")).to_pyarrow_table().to_pylist()
    assert sorted((r["run_id"], r["status"]) for r in runs) == [("a", "succeeded"), ("b", "succeeded")]


def test_rerun_replaces_and_never_duplicates(spark, tmp_path, reference_root, reference):
    root = copy_of(reference_root, tmp_path)
    lh = Lakehouse(root, spark)
    before = {t: DeltaTable(lh.path(t)).version() for t in RUN_TABLES}
    write_run(lh, spark, "a", 1)
    assert snapshot(root) == reference
    history = spark.sql(f"DESCRIBE HISTORY delta.`{lh.path('message_outcomes')}`").collect()
    writes = [h for h in history if h.version > before["message_outcomes"] and h.operation == "WRITE"]
    assert len(writes) == 1  # one commit replaced run a's rows
    assert "`run_id` IN ('a')" in writes[0].operationParameters["predicate"]


def test_replace_run_touches_only_that_run(spark, tmp_path, reference_root):
    lh = Lakehouse(copy_of(reference_root, tmp_path), spark)
    b_rows = sorted(map(tuple, lh.read("partition_states").where("run_id = 'b'").collect()))
    new_a = spark.createDataFrame(make_run("a", 99).states)
    lh.replace_run("partition_states", "a", new_a)
    assert sorted(map(tuple, lh.read("partition_states").where("run_id = 'b'").collect())) == b_rows
    assert lh.read("partition_states").where("run_id = 'a'").count() == new_a.count()


def test_delete_rows_removes_those_keys_and_skips_a_table_known_empty(spark, tmp_path, reference_root):
    """A table with rows: one commit removes exactly those runs' rows. A table this object just created: no
    commit at all (its log stays at the creation), and a later write still lands."""
    lh = Lakehouse(copy_of(reference_root, tmp_path), spark)
    b_rows = sorted(map(tuple, lh.read("partition_states").where("run_id = 'b'").collect()))
    before = DeltaTable(lh.path("partition_states")).version()
    lh.delete_rows("partition_states", "run_id", ["a"])
    assert DeltaTable(lh.path("partition_states")).version() == before + 1
    assert lh.read("partition_states").where("run_id = 'a'").count() == 0
    assert sorted(map(tuple, lh.read("partition_states").where("run_id = 'b'").collect())) == b_rows

    fresh = Lakehouse(tmp_path / "fresh", spark, create=False)
    fresh.delete_rows("watermarks", "run_id", ["a"])
    assert DeltaTable(fresh.path("watermarks")).version() == 0  # created, nothing committed after
    rows = spark.createDataFrame([("a", 0, 1, 2, 3, 0)], TABLES["watermarks"].spark_schema())
    fresh.replace_rows("watermarks", "run_id", ["a"], rows)
    fresh.delete_rows("watermarks", "run_id", ["a"])  # no longer known empty: a real delete
    assert DeltaTable(fresh.path("watermarks")).version() == 2
    assert fresh.read("watermarks").count() == 0


def test_a_big_frame_is_written_by_its_tasks_with_no_compaction_after(spark, tmp_path, monkeypatch):
    """A frame over ONE_TASK_BYTES is written as its tasks hold it (no shuffle by run first): a file per task and
    run, and no OPTIMIZE after the write (the big tables do not auto-compact: a run is always replaced whole).
    A frame under it is written by one task: one file per run."""
    from storage import lakehouse as lakehouse_module

    rows = [make_run(run_id, seed).outcomes for run_id, seed in (("a", 1), ("b", 2))]
    df = spark.createDataFrame(pa.concat_tables(rows)).repartition(4)

    def files_per_run(lh):
        files = DeltaTable(lh.path("message_outcomes")).file_uris()
        return collections.Counter(Path(f).parent.name for f in files)

    monkeypatch.setattr(lakehouse_module, "ONE_TASK_BYTES", 0)  # every frame counts as big
    big = Lakehouse(tmp_path / "big", spark, create=False)
    big.replace_rows("message_outcomes", "run_id", ["a", "b"], df)
    assert files_per_run(big) == {"run_id=a": 4, "run_id=b": 4}
    history = spark.sql(f"DESCRIBE HISTORY delta.`{big.path('message_outcomes')}`").collect()
    assert [h.operation for h in history] == ["WRITE", "CREATE TABLE"]
    assert big.read("message_outcomes").count() == sum(len(r) for r in rows)
    # File statistics on the declared numeric columns only (Delta's default: the first 32 columns).
    added = DeltaTable(big.path("message_outcomes")).get_add_actions(flatten=True)
    assert sorted(c.removeprefix("min.") for c in added.column_names if c.startswith("min.")) == [
        "msg_id", "partition", "produce_us"]
    assert min(added.column("num_records").to_pylist()) > 0

    monkeypatch.setattr(lakehouse_module, "ONE_TASK_BYTES", 1 << 40)  # every frame counts as small
    small = Lakehouse(tmp_path / "small", spark, create=False)
    small.replace_rows("message_outcomes", "run_id", ["a", "b"], df)
    assert files_per_run(small) == {"run_id=a": 1, "run_id=b": 1}


def test_rows_of_another_run_are_refused(spark, tmp_path):
    """On a new table (its first write appends, `Lakehouse.replace_rows`) and on one with rows (replaceWhere)."""
    lh = Lakehouse(tmp_path / "lh", spark, create=False)
    b_rows = spark.createDataFrame(make_run("b", 1).states)
    with pytest.raises(Exception, match=r"(?i)replaceWhere|DELTA_REPLACE_WHERE"):
        lh.replace_run("partition_states", "a", b_rows)
    assert lh.version("partition_states") == 0  # created, nothing committed
    lh.replace_run("partition_states", "a", spark.createDataFrame(make_run("a", 1).states))
    with pytest.raises(Exception, match=r"(?i)replaceWhere|DELTA_REPLACE_WHERE"):
        lh.replace_run("partition_states", "a", b_rows)
    assert lh.version("partition_states") == 1
    assert {r.run_id for r in lh.read("partition_states").select("run_id").distinct().collect()} == {"a"}


def test_a_first_write_retried_after_its_commit_does_not_duplicate(spark, tmp_path, monkeypatch):
    """The first write of a new table appends; a retry after that append committed (an error raised after the
    commit) replaces the run's rows instead of appending them twice."""
    from pyspark.sql.readwriter import DataFrameWriter

    import storage.lakehouse as lakehouse_module

    lh = Lakehouse(tmp_path / "lh", spark, create=False)
    states = spark.createDataFrame(make_run("a", 1).states)
    real_save, calls = DataFrameWriter.save, []

    def save_then_fail_once(self, *args, **kwargs):
        real_save(self, *args, **kwargs)
        calls.append(args)
        if len(calls) == 1:
            raise RuntimeError("lost after the commit")

    monkeypatch.setattr(DataFrameWriter, "save", save_then_fail_once)
    monkeypatch.setattr(lakehouse_module, "_retryable", lambda exc, creating=False: "lost after" in str(exc))
    lh.replace_run("partition_states", "a", states)
    assert len(calls) == 2 and lh.version("partition_states") == 2  # the append, then the replaceWhere
    assert lh.read("partition_states").count() == states.count()


def test_schema_is_never_inferred(spark, tmp_path):
    lh = Lakehouse(tmp_path / "lh", spark, create=False)
    states = spark.createDataFrame(make_run("a", 1).states)
    with pytest.raises(ReplabError, match="missing: \\['high_watermark'\\]"):
        lh.replace_run("partition_states", "a", states.drop("high_watermark"))
    with pytest.raises(ReplabError, match="extra: \\['surprise'\\]"):
        lh.replace_run("partition_states", "a", states.withColumn("surprise", states.ts_us))


def test_as_table_reorders_and_casts_like_a_cast_per_column(spark):
    """`as_table`: the table's column order and types; a frame already of those types is only reordered, any
    other cast as `Column.cast` would (a timestamp from its text, which `DataFrame.to` alone refuses); each
    column keeps its own nullability; values survive."""
    from pyspark.sql import functions as F

    schema = TABLES["validations"].spark_schema()
    row = {"validation_id": "v1", "suite": "s", "trace_id": "t", "run_id": None, "target": "x", "success": True,
           "evaluated": 3, "successful": 3, "unexpected_rows": 0, "report_path": None,
           "validated_at": "2026-11-27 12:00:00"}
    text = spark.createDataFrame([tuple(row.values())], ", ".join(
        f"`{k}` {'BOOLEAN' if k == 'success' else 'STRING'}" for k in row)).select(*reversed(list(row)))
    cast = as_table(text, "validations")
    assert cast.schema.fieldNames() == schema.fieldNames()
    assert [f.dataType for f in cast.schema.fields] == [f.dataType for f in schema.fields]
    got = cast.first().asDict()
    assert got["evaluated"] == 3 and got["run_id"] is None and str(got["validated_at"]) == "2026-11-27 12:00:00"
    exact = spark.createDataFrame([], schema).withColumn("evaluated", F.lit(7).cast("int"))  # not nullable
    again = as_table(exact.select(*reversed(exact.columns)), "validations")
    assert again.schema.fieldNames() == schema.fieldNames()
    assert not again.schema["evaluated"].nullable and again.schema["run_id"].nullable


def test_succeeded_only_readers_skip_running_runs(spark, tmp_path, b_only):
    lh = Lakehouse(copy_of(b_only, tmp_path), spark)
    txn = lh.begin_runs([record("a", 1)])
    txn.write("message_outcomes", spark.createDataFrame(make_run("a", 1).outcomes))
    assert {r.run_id for r in lh.read("message_outcomes").select("run_id").distinct().collect()} == {"a", "b"}
    assert {r.run_id for r in lh.read("message_outcomes", succeeded_only=True).select("run_id")
            .distinct().collect()} == {"b"}
    assert lh.succeeded_run_ids() == ["b"]


def test_predicates_and_paths_are_safe(tmp_path):
    assert in_predicate("run_id", ["x'); DROP TABLE t; --", "a"]) == (
        "`run_id` IN ('a', 'x\\'); DROP TABLE t; --')")
    for evil in ("../../etc", "/abs/path", "..", "a/../../b", ".hidden", ""):
        part = safe_component(evil)
        assert "/" not in part and not part.startswith(".") and part
        assert tmp_path in inside(tmp_path, part).parents
    with pytest.raises(ReplabError):
        inside(tmp_path, "..", "x")


def _kill_after(proc: subprocess.Popen, marker: str, timeout_s: float = 600) -> list[str]:
    seen = []
    deadline = time.time() + timeout_s
    for line in proc.stdout:
        seen.append(line.strip())
        if line.startswith(marker):
            os.killpg(proc.pid, signal.SIGKILL)
            break
        assert time.time() < deadline, seen
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, (seen, proc.stderr.read()[-3000:])
    return seen


# The writer (Lakehouse.publish_runs, as a replay) prints "begin" once the runs row says running, then writes the
# run tables concurrently and prints each as its commit lands: killing right after a marker lands while the
# other tables' writes (or the commit of the runs row) are in flight.
# One point runs in the fast suite (mid-way through the run tables), all of them in the slow suite (each costs a
# Spark process).
KILL_POINTS = [pytest.param("step begin a", marks=pytest.mark.slow), "step wrote message_outcomes a",
               pytest.param("step wrote loss_metrics a", marks=pytest.mark.slow),
               pytest.param("step wrote run_summary a", marks=pytest.mark.slow)]


@pytest.mark.parametrize("marker", KILL_POINTS)
def test_kill_9_then_rerun_equals_an_uninterrupted_run(spark, tmp_path, b_only, reference, marker):
    root = copy_of(b_only, tmp_path)
    b_before = only_run(snapshot(root), "b")

    seen = _kill_after(writer(root, "--run-id", "a", "--seed", "1"), marker)
    assert seen[-1] == marker
    after_kill = snapshot(root)
    # Run b, written before, is intact; run a is not visible as succeeded.
    assert only_run(after_kill, "b") == b_before
    assert "a" not in Lakehouse(root, spark, create=False).succeeded_run_ids()

    write_run(Lakehouse(root, spark), spark, "a", 1)
    assert snapshot(root) == reference


@pytest.mark.slow  # two writer processes (two JVMs) at once: 3 minutes on 2 cores
def test_concurrent_writers_of_different_runs_both_land(spark, tmp_path, reference):
    root = tmp_path / "lakehouse"  # fresh: the two processes also race to create the tables
    procs = [writer(root, "--run-id", "a", "--seed", "1"), writer(root, "--run-id", "b", "--seed", "2")]
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    assert snapshot(root) == reference
    assert Lakehouse(root, spark, create=False).succeeded_run_ids() == ["a", "b"]


def test_publish_derives_gates_and_writes_every_table(spark, tmp_path):
    """engine.publish: what a replay job calls with its outcomes, timelines and intervals. Inside `publishing`'s
    block MLflow's views of the runs come from the persisted frames, and equal those read back from Delta."""
    from engine.plan import OutcomeFrames
    from engine.publish import ReplayResults, publishing
    from storage import report_data

    runs = [make_run("p1", 1, n_messages=80), make_run("p2", 2, n_messages=80)]
    outcomes = spark.createDataFrame(pa.concat_tables([r.outcomes for r in runs]))
    events = outcomes.where("run_id = 'p1'").selectExpr("produce_us AS ts_us", "'produce' AS kind", "msg_id")
    results = ReplayResults(
        [record(r.run_id, i) for i, r in enumerate(runs)], [r.info for r in runs], OutcomeFrames(
            outcomes, spark.createDataFrame(pa.concat_tables([r.states for r in runs])),
            spark.createDataFrame(pa.concat_tables([r.unavailability for r in runs]))), events)
    lh = Lakehouse(tmp_path / "lh", spark, create=False)
    ids = ["p1", "p2"]
    with publishing(spark, lh, results, trace_id="synthetic-trace", window_ms=500) as published:
        summaries = published.summaries
        assert [s["run_id"] for s in summaries] == ids and all(s["produced"] == 80 for s in summaries)
        assert lh.succeeded_run_ids() == ids
        for name in RUN_TABLES:
            assert {r.run_id for r in lh.read(name).select("run_id").distinct().collect()} == set(ids), name
        gate = lh.read("validations").where("suite = 'output_gate'").collect()
        assert sorted((v.run_id, v.success) for v in gate) == [("p1", True), ("p2", True)]
        assert lh.read("loss_metrics").where("run_id = 'p1'").count() == 3 * (20_000_000 // 500_000 + 1)

        held = published.tables
        assert held.root == lh.root
        plan = held.read("loss_metrics")._jdf.queryExecution().executedPlan().toString()
        assert "InMemoryTableScan" in plan and "delta" not in plan.lower()
        views = {
            "series": (report_data.window_series(held, ids, 500_000), report_data.window_series(lh, ids, 500_000)),
            "quantiles": (report_data.latency_quantiles(held, ids), report_data.latency_quantiles(lh, ids)),
            "histories": tuple(report_data.partition_histories(source, report_data.busiest_partitions_of(source, ids),
                                                               20_000_000) for source in (held, lh)),
        }
        for name, (mine, theirs) in views.items():
            assert len(mine) > 0, name
            pd.testing.assert_frame_equal(mine.sort_values(list(mine.columns)).reset_index(drop=True),
                                          theirs.sort_values(list(theirs.columns)).reset_index(drop=True),
                                          check_dtype=False, obj=name)
    assert not held.frames["loss_metrics"].storageLevel.useMemory  # released with the block
