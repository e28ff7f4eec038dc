"""The session factory gives real Delta: a table written through it is read back."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from schemas.tables import TABLES

pytestmark = pytest.mark.spark


def test_delta_roundtrip(spark, tmp_path):
    path = str(tmp_path / "t")
    spark.range(5).write.format("delta").save(path)
    spark.range(5, 8).write.format("delta").mode("append").save(path)
    assert sorted(r.id for r in spark.read.format("delta").load(path).collect()) == list(range(8))
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()
    assert len(history) == 2  # two commits: a real Delta log, not parquet


def test_local_settings(spark):
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"
    assert spark.conf.get("spark.sql.extensions") == "io.delta.sql.DeltaSparkSessionExtension"
    # Int.MaxValue is the one value for which Spark skips re-measuring each mapInArrow batch after every row
    assert int(spark.conf.get("spark.sql.execution.arrow.maxBytesPerBatch").rstrip("b")) == 2**31 - 1


def test_a_query_run_again_compiles_nothing_beyond_the_default_cache(spark):
    """More query shapes than Spark's default codegen cache holds (100 classes): a replay has about 480, so with
    the default every replay in a session that stays up compiled them all again (storage.session._CODEGEN_CONF)."""
    metric = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()

    def compiled_by(action) -> int:
        before = metric.getCount()
        action()
        return metric.getCount() - before

    def shapes() -> None:  # the literals are compiled into the code: each i is a class of its own
        for i in range(60):
            spark.range(3).selectExpr(f"id * {i} + {i} AS x").where(f"x > {i}").collect()

    assert compiled_by(shapes) > 100
    assert compiled_by(shapes) == 0


def test_every_table_schema_parses(spark):
    for spec in TABLES.values():
        schema = spec.spark_schema()
        leading = ("run_id", "window_start_us", "validation_id", "sweep_id", "durability_id")
        assert schema.fieldNames()[0] in leading, spec.name
        assert all(p in schema.fieldNames() for p in spec.partition_by)


@pytest.mark.parametrize("rows", [[(0, 2, 5), (1, None, 7), (1, 3, None)], []], ids=["rows", "empty"])
def test_local_frame_equals_create_data_frame_and_runs_no_python(spark, rows):
    """`local_frame` is `createDataFrame` with the same rows and schema, read by the JVM: its plan scans a local
    table, where `createDataFrame` of a list scans a Python RDD (a Python task per slice in every query)."""
    from storage.session import local_frame

    ddl = "cls INT, unit INT, broker BIGINT"
    mine, theirs = local_frame(spark, rows, ddl), spark.createDataFrame(rows, ddl)
    assert mine.schema == theirs.schema
    def content(df) -> list[tuple]:
        return sorted((tuple(r) for r in df.collect()), key=repr)

    assert content(mine) == content(theirs) == sorted(rows, key=repr)

    def plan(df) -> str:
        return df._jdf.queryExecution().executedPlan().toString()

    assert "ExistingRDD" not in plan(mine) and "LocalTableScan" in plan(mine)
    if rows:
        assert "ExistingRDD" in plan(theirs)


def test_interpreted_expressions_compile_no_class_give_the_same_rows_and_restore_the_session(spark):
    """A small replay runs on Spark's interpreted expressions (storage.session.INTERPRETED_CONF): a new query
    shape in the block compiles no class and answers as generated code does, and the settings are back after the
    block, also after an error in it."""
    from storage.session import INTERPRETED_CONF, interpreted_expressions

    metric = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
    before = {key: spark.conf.get(key, None) for key in INTERPRETED_CONF}

    def query(salt: int):  # a shape of its own per salt (the literal is compiled into generated code)
        return (spark.range(40).selectExpr("id % 7 AS k", f"id * {salt} + 1 AS v").where(f"v > {salt}")
                .groupBy("k").agg({"v": "sum"}).orderBy("k").collect())

    with interpreted_expressions(spark):
        assert {key: spark.conf.get(key) for key in INTERPRETED_CONF} == INTERPRETED_CONF
        query(10_000)  # a fresh session's first query compiles a class or two whatever its shape
        count = metric.getCount()
        interpreted = query(10_001)
        assert metric.getCount() == count
    count = metric.getCount()
    assert query(10_001) == interpreted
    assert metric.getCount() > count  # the same shape outside the block is generated and compiled
    with pytest.raises(ZeroDivisionError), interpreted_expressions(spark):
        1 / 0  # noqa: B018
    assert {key: spark.conf.get(key, None) for key in INTERPRETED_CONF} == before


def test_a_short_lived_session_runs_its_jvm_on_c1_only_and_the_default_one_does_not(spark, tmp_path):
    """`get_spark(short_lived=True)` reaches the JVM it starts (a new process: the JVM's own input arguments);
    the session every other job uses keeps HotSpot's tiered compilation."""
    from storage.session import C1_ONLY

    def jvm_arguments(session) -> list[str]:
        return list(session._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())

    assert C1_ONLY not in jvm_arguments(spark)
    script = ("from storage.session import get_spark\n"
              "s = get_spark('replab-short-lived-test', short_lived=True)\n"
              "print(repr(list(s._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()"
              ".getInputArguments())))\n"
              "s.stop()\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert out.returncode == 0, out.stderr[-2000:]
    args = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    assert C1_ONLY in args and any(a.startswith("-Dlog4j2.configurationFile=") for a in args)
