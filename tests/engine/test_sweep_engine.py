"""The distributed sweep (pipelines/sweep_engine.py): one Spark job whatever the seed count, and per-seed figures
equal to what `replab replay` computes on the same trace with Spark (trace gate, group replay, run_summary)."""

from __future__ import annotations

import math

import pytest

from engine.sweep.job import FATAL, OK, SweepSpec, run_sweep_job, seed_rows
from generators.library import resolve_scenario
from replay.policies import parse_policy
from schemas.tables import SUMMARY_FIELDS

pytestmark = pytest.mark.spark

POLICIES = ("kafka-acks0", "kafka-acks1", "kafka-durable", "kafka-unclean")


def _spec(scale: float = 0.05, **kw) -> SweepSpec:
    return SweepSpec(resolve_scenario("demo"), scale, tuple(parse_policy(p) for p in POLICIES), **kw)


def _jobs_of_group(spark, group: str) -> list[int]:
    return sorted(spark.sparkContext.statusTracker().getJobIdsForGroup(group))


def test_job_count_does_not_grow_with_seeds(spark):
    spec = _spec(0.02)
    four = run_sweep_job(spark, spec, range(4), job_group="sweep-4")
    sixteen = run_sweep_job(spark, spec, range(16), job_group="sweep-16")
    assert four.num_rows == 4 * len(POLICIES) and sixteen.num_rows == 16 * len(POLICIES)
    jobs4, jobs16 = _jobs_of_group(spark, "sweep-4"), _jobs_of_group(spark, "sweep-16")
    assert len(jobs4) == len(jobs16) == 1, (jobs4, jobs16)
    # Seeds 0-3 are the same computations in both runs (deterministic generation, SPEC §8).
    assert sixteen.slice(0, four.num_rows).to_pylist() == [
        {**r, "task_seconds": s["task_seconds"]} for r, s in zip(four.to_pylist(), sixteen.to_pylist(), strict=False)]
    assert sorted(set(sixteen.column("seed").to_pylist())) == list(range(16))
    assert set(sixteen.column("status").to_pylist()) == {OK}


@pytest.mark.slow  # the Spark replay of one small trace: 8 minutes on the shared 2-core machine
def test_seed_figures_equal_the_spark_replay_of_the_same_trace(spark, tmp_path):
    """--keep-traces writes the seed's trace; `run_replay` on it gives the same run_summary, field by field."""
    from engine.plan import ReplayRequest
    from engine.replay import run_replay

    spec = _spec(0.05, traces_dir=str(tmp_path / "traces"), series=True, window_us=1_000_000)
    rows = seed_rows(spec, 3)
    trace = tmp_path / "traces" / rows[0]["trace_id"]
    assert (trace / "manifest.json").is_file() and (trace / "events" / "_COMPLETE").is_file()
    report = run_replay(spark, ReplayRequest(trace=str(trace), policies=list(spec.policies),
                                             lakehouse=str(tmp_path / "lh"), mlflow=False))
    assert [r.canonical for r in report.runs] == [r["policy"] for r in rows]
    for row, summary in zip(rows, report.summaries, strict=True):
        assert row["status"] == OK
        for name in SUMMARY_FIELDS:
            want, got = summary[name], row[name]
            if want is None or got is None:
                assert want is got, (row["policy"], name, want, got)
            else:
                assert math.isclose(float(got), float(want), rel_tol=1e-12, abs_tol=1e-9), (
                    row["policy"], name, want, got)
        assert sum(row["loss_series"]) == row["acked_lost"]
        assert sum(row["unavailable_series"]) == round(row["unavailable_partition_seconds"] * 1e6)
    assert any(r["acked_lost"] for r in rows) and any(not r["acked_lost"] for r in rows)


def test_a_seed_breaking_a_fatal_rule_is_reported_not_dropped(monkeypatch):
    """A generator bug producing a restart of an up broker: the seed comes back `fatal` with the rule's count."""
    import dataclasses

    import numpy as np

    import generators.generate as gen

    real = gen.build_plan

    def broken(scenario, seed, scale, **kw):
        plan = real(scenario, seed, scale, **kw)
        if seed != 1:
            return plan
        return dataclasses.replace(plan, fault_ts_us=np.append(plan.fault_ts_us, 5),
                                   fault_kind=np.append(plan.fault_kind, np.int8(5)),  # Kind.RESTART
                                   fault_broker=np.append(plan.fault_broker, np.int32(1)))

    monkeypatch.setattr(gen, "build_plan", broken)
    spec = _spec(0.02)
    good, bad = seed_rows(spec, 0), seed_rows(spec, 1)
    assert {r["status"] for r in good} == {OK} and {r["status"] for r in bad} == {FATAL}
    assert bad[0]["gate_fatal_rows"] == 1 and bad[0]["gate_rules"] == '{"restart-of-up-broker": 1}'
    assert all(r["produced"] is None for r in bad) and len(bad) == len(POLICIES)
