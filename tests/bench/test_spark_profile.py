"""The profile's arithmetic (bench/spark_profile.py): what an event log says about each Spark job, and how much of
a step's wall time some job was running."""

from __future__ import annotations

import json

import pytest

from bench.spark_profile import spark_jobs, union_seconds


def _line(event: str, **fields) -> str:
    return json.dumps({"Event": event, **fields})


def _stage(stage_id: int, tasks: int, run_ms: int, cpu_ns: int, gc_ms: int, spilled: int) -> str:
    names = {"internal.metrics.executorRunTime": run_ms, "internal.metrics.executorCpuTime": cpu_ns,
             "internal.metrics.jvmGCTime": gc_ms, "internal.metrics.diskBytesSpilled": spilled,
             "internal.metrics.resultSize": 999}
    return _line("SparkListenerStageCompleted", **{"Stage Info": {
        "Stage ID": stage_id, "Number of Tasks": tasks,
        "Accumulables": [{"ID": i, "Name": n, "Value": v} for i, (n, v) in enumerate(names.items())]}})


def test_spark_jobs_sums_the_completed_stages_of_each_job(tmp_path):
    log = tmp_path / "eventlog" / "app-1"
    log.parent.mkdir()
    log.write_text("\n".join([
        _line("SparkListenerJobStart", **{"Job ID": 1, "Submission Time": 5_000, "Stage IDs": [3, 4],
                                          "Stage Infos": [{}, {}], "Properties": {
                                              "spark.sql.execution.id": "7", "callSite.short": "collect at x.py:1"}}),
        _stage(3, 2, 1_500, 2_000_000_000, 100, 0),
        _stage(4, 1, 500, 0, 0, 3 * 2**20),
        _line("SparkListenerJobEnd", **{"Job ID": 1, "Completion Time": 7_500}),
        # Stage 5 is skipped (its shuffle output reused): it never completes and adds nothing.
        _line("SparkListenerJobStart", **{"Job ID": 0, "Submission Time": 4_000, "Stage IDs": [5],
                                          "Properties": {"spark.job.description": "Delta: a | b"}}),
        _line("SparkListenerJobEnd", **{"Job ID": 0, "Completion Time": 4_250}),
    ]) + "\n")
    first, second = spark_jobs(tmp_path / "eventlog")
    assert (first.job_id, first.start, first.end, first.what, first.tasks, first.task_s) == (
        0, 4.0, 4.25, "Delta: a / b", 0, 0.0)
    assert (second.job_id, second.sql, second.what, second.stages, second.tasks) == (1, "7", "collect at x.py:1", 2, 3)
    assert second.task_s == pytest.approx(2.0)
    assert second.task_cpu_s == pytest.approx(2.0)
    assert second.gc_s == pytest.approx(0.1)
    assert second.spill_mb == pytest.approx(3.0)


@pytest.mark.parametrize(("intervals", "seconds"), [
    ([], 0.0),
    ([(0.0, 2.0), (1.0, 3.0)], 3.0),  # overlapping jobs count once
    ([(0.0, 1.0), (2.0, 4.0)], 3.0),  # the gap between them is the driver alone
    ([(1.0, 5.0), (2.0, 3.0), (6.0, 6.5)], 4.5),  # one job inside another
])
def testunion_seconds(intervals, seconds):
    assert union_seconds(intervals) == pytest.approx(seconds)


def test_tree_cpu_finds_the_jvm_and_its_jit_compiler_threads(spark):
    """The session's JVM runs under this process: its CPU, and within it the JIT compiler threads', are counted."""
    import os

    from bench.spark_profile import TreeCpu

    spark.range(1000).selectExpr("sum(id)").collect()  # the JVM has compiled something
    tree = TreeCpu(os.getpid(), every_s=60)  # sampled once, by hand
    total = tree.seconds()
    tree.stop()
    assert 0 < tree.jit_seconds() < tree.jvm_seconds() <= total
