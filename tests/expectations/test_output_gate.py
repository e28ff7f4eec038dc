"""The output gate (SPEC §7, §9): each expectation catches its violation and names the run; a failing gate
exits 3 with the report path and leaves the previous version of every run table."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import functions as F

from expectations.output_gate import (
    SCREEN_FATE,
    SCREEN_LATENCY,
    SCREEN_MESSAGES,
    SCREEN_STATUS,
    NamedCheck,
    RunOutputs,
    check_outputs,
    duplicate_outcomes,
    message_coverage,
    message_screen,
    outcome_keys,
    run_output_gate,
    screen_column,
)
from schemas.errors import GateFailed
from storage.lakehouse import RUN_TABLES, Lakehouse, RunRecord
from tests.synthetic import make_run, run_tables

pytestmark = pytest.mark.spark

N_MESSAGES = 60
SUMMARY_VS_WINDOWS = "summary totals equal the sums of the windows, and produced = acked + failed + pending"
SUMMARY_VS_OUTCOMES = "summary counts equal the counts of the run's message outcomes"


def run_frames(spark, run_id: str, seed: int) -> dict:
    return run_tables(spark, make_run(run_id, seed, n_messages=N_MESSAGES))


def union(frames: list[dict], name: str):
    """One table of several runs, materialized: the gate's checks then plan over rows, not over ten runs'
    derivations each (which took the gate minutes to plan and run)."""
    out = frames[0][name]
    for f in frames[1:]:
        out = out.unionByName(f[name])
    return out.localCheckpoint()


def corrupt(frames: dict, table: str, change) -> dict:
    return {**frames, table: change(frames[table])}


@pytest.fixture(scope="module")
def produced_ids(spark):
    return spark.range(1, N_MESSAGES + 1).withColumnRenamed("id", "msg_id")


def test_a_correct_run_passes(spark, produced_ids):
    frames = run_frames(spark, "ok", 1)
    outputs = RunOutputs(frames["message_outcomes"], frames["partition_states"], frames["loss_metrics"],
                         frames["run_summary"])
    report = check_outputs(spark, outputs, ["ok"], produced_msg_ids=produced_ids)
    assert report.success and report.failures == [] and report.evaluated == 13
    assert report.evaluated == report.successful
    # the message checks were cleared by the screen, without their exact queries; the others ran theirs
    screened = {r["expectation_config"]["meta"]["expectation"] for r in report.gx_results[0]["results"]
                if r["result"]["screened"]}
    assert screened == {"latency >= 0", "at most one outcome per message and run", "status is acked, failed or pending",
                        "fate is committed, lost or absent", "every produced message has exactly one outcome per run",
                        SUMMARY_VS_OUTCOMES}
    # the gate's query ran with a static plan (`adaptive_off`); the session's own setting is back afterwards
    assert spark.conf.get("spark.sql.adaptive.enabled") == "true"


def test_an_invariant_over_the_outcomes_is_screened_and_its_rows_found_when_flagged(spark, produced_ids):
    """SPEC §9's acked-loss invariant gives the condition of its rows: the screen counts exactly the rows its
    query returns, per run; the gate runs the query only when the screen flags a run, and then names the run."""
    from dataclasses import replace

    from engine.plan import policy_runs
    from expectations import invariants
    from replay.events import PartitionEvents
    from replay.policies import parse_policy
    from schemas.trace import Broker, Manifest

    manifest = Manifest("t", tuple(Broker(b, "r") for b in range(1, 4)), 1_000_000)
    durable, acks1 = policy_runs([parse_policy("kafka-durable"), parse_policy("kafka-acks1")], manifest)
    # the synthetic runs lose about one acknowledged message in ten, in every partition
    frames = {run_id: run_frames(spark, run_id, seed) for seed, run_id in enumerate(["lossy", "acks1"])}
    runs = [replace(durable, run_id="lossy"), replace(acks1, run_id="acks1")]
    outcomes, states = (union(list(frames.values()), n) for n in ("message_outcomes", "partition_states"))
    check = next(c for c in invariants.checks(spark, runs, outcomes, states, PartitionEvents.empty())
                 if c.name == "no_acked_loss_when_guaranteed")
    assert check.screen is not None

    screened = {r["run_id"]: r[screen_column(check)] for r in message_screen(
        outcomes, list(frames), extra_checks=[check]).collect()}
    found = {r["run_id"]: r["count"] for r in check.dataframe().groupBy("run_id").count().collect()}
    assert found["lossy"] > 0 and set(found) == {"lossy"}  # acks=1 guarantees nothing: its losses are allowed
    assert screened == {"lossy": found["lossy"], "acks1": 0}

    def gate(run_id: str):
        f = frames[run_id]
        return check_outputs(spark, RunOutputs(f["message_outcomes"], f["partition_states"], f["loss_metrics"],
                                               f["run_summary"]), [run_id], produced_msg_ids=produced_ids,
                             extra_checks=[replace(check, rows=lambda: check.dataframe().where(
                                 F.col("run_id") == run_id))])

    def result(report):
        return next(r for r in report.gx_results[0]["results"]
                    if r["expectation_config"]["meta"]["target"] == "invariant.no_acked_loss_when_guaranteed")

    holds = gate("acks1")
    assert holds.success and result(holds)["result"]["screened"]  # cleared by the screen: no query of its rows
    broken = gate("lossy")
    assert not broken.success and not result(broken)["result"]["screened"]
    assert [(f.target, f.run_ids, f.count) for f in broken.failures] == [
        ("invariant.no_acked_loss_when_guaranteed", ("lossy",), found["lossy"])]


def test_each_expectation_catches_its_violation_and_names_the_run(spark, produced_ids):
    cases = {
        "ok": lambda f: f,
        "neg-latency": lambda f: corrupt(f, "message_outcomes", lambda d: d.withColumn(
            "latency_us", F.when(F.col("msg_id") == 5, F.lit(-5)).otherwise(F.col("latency_us")))),
        "dup-outcome": lambda f: corrupt(f, "message_outcomes",
                                         lambda d: d.unionByName(d.where(F.col("msg_id") == 7))),
        "hw-over-leo": lambda f: corrupt(f, "partition_states", lambda d: d.withColumn(
            "log_end_offset", F.when(F.col("ts_us") == 0, F.col("high_watermark") - 1)
            .otherwise(F.col("log_end_offset")))),
        "hw-decrease": lambda f: corrupt(f, "partition_states", lambda d: d.unionByName(
            d.where((F.col("partition") == 0) & (F.col("ts_us") == 0))
            .withColumn("ts_us", F.lit(1)).withColumn("high_watermark", F.lit(-1))
            .withColumn("log_end_offset", F.lit(0)))),
        "acked-over-produced": lambda f: corrupt(f, "loss_metrics", lambda d: d.withColumn(
            "acked", F.when((F.col("partition") == 0) & (F.col("window_start_us") == 0), F.col("produced") + 1)
            .otherwise(F.col("acked")))),
        "lost-over-acked": lambda f: corrupt(f, "run_summary", lambda d: d.withColumn(
            "acked_lost", F.col("acked") + 1)),
        "summary-mismatch": lambda f: corrupt(f, "run_summary", lambda d: d.withColumn(
            "stranded", F.col("stranded") + 2)),
        "missing-outcome": lambda f: corrupt(f, "message_outcomes", lambda d: d.where(F.col("msg_id") != 9)),
        "invariant-broken": lambda f: f,
    }
    frames = [change(run_frames(spark, run_id, seed)) for seed, (run_id, change) in enumerate(cases.items())]
    outputs = RunOutputs(*(union(frames, n) for n in ("message_outcomes", "partition_states", "loss_metrics",
                                                        "run_summary")))
    one_leader = NamedCheck("one_leader_at_a_time", spark.createDataFrame(
        [("invariant-broken", 0, 1000, 2)], "run_id STRING, partition INT, ts_us BIGINT, leaders INT"),
        "one leader per partition at a time (SPEC §9)")
    holds = NamedCheck("hw_monotonic", spark.createDataFrame([], "run_id STRING, ts_us BIGINT"))
    report = check_outputs(spark, outputs, list(cases), produced_msg_ids=produced_ids,
                           extra_checks=[one_leader, holds])
    assert not report.success
    failed = {(f.target, f.expectation): f.run_ids for f in report.failures}
    assert failed == {
        ("message_outcomes", "latency >= 0"): ("neg-latency",),
        ("message_outcomes", "at most one outcome per message and run"): ("dup-outcome",),
        ("partition_states", "high_watermark <= log_end_offset"): ("hw-over-leo",),
        ("partition_states.hw_monotonic", "high watermark never decreases within a leader epoch"): (
            "hw-decrease",),
        ("loss_metrics", "loss_metrics: acked <= produced"): ("acked-over-produced",),
        ("run_summary", "run_summary: acked_lost <= acked"): ("lost-over-acked",),
        # a corrupted window or summary also breaks summary = windows, for that run only
        ("summary_vs_windows", SUMMARY_VS_WINDOWS): ("acked-over-produced", "lost-over-acked", "summary-mismatch"),
        # and a summary that is not its outcomes' counts, or outcomes that are not the summary's: the screen flags
        # these runs, and the exact query names them
        ("summary_vs_outcomes", SUMMARY_VS_OUTCOMES): ("dup-outcome", "lost-over-acked", "missing-outcome",
                                                       "summary-mismatch"),
        ("message_coverage", "every produced message has exactly one outcome per run"): ("missing-outcome",),
        ("invariant.one_leader_at_a_time", "one leader per partition at a time (SPEC §9)"): ("invariant-broken",),
    }
    assert set(report.failed_run_ids) == set(cases) - {"ok"}
    mismatch = next(f for f in report.failures if f.target == "summary_vs_windows")
    assert {r["run_id"]: r["differing"] for r in mismatch.rows} == {
        "acked-over-produced": "acked vs windows_acked", "lost-over-acked": "acked_lost vs windows_acked_lost",
        "summary-mismatch": "stranded vs windows_stranded"}
    # a repeated or missing message moves `produced` and every count it falls under (SPEC §4.3's definitions)
    def counted_under(run_id: str, msg_id: int) -> str:
        m = run_frames(spark, run_id, list(cases).index(run_id))["message_outcomes"].where(
            F.col("msg_id") == msg_id).first()
        acked, committed = m.status == "acked", m.fate == "committed"
        flags = {"acked": acked, "failed": m.status == "failed", "pending": m.status == "pending",
                 "acked_lost": acked and not committed, "failed_committed": m.status == "failed" and committed,
                 "stranded": acked and committed and not m.readable_at_end}
        return "; ".join(["produced vs outcomes_produced", *[f"{c} vs outcomes_{c}" for c, on in flags.items() if on]])

    mismatch = next(f for f in report.failures if f.target == "summary_vs_outcomes")
    assert {r["run_id"]: r["differing"] for r in mismatch.rows} == {
        "dup-outcome": counted_under("dup-outcome", 7), "lost-over-acked": "acked_lost vs outcomes_acked_lost",
        "missing-outcome": counted_under("missing-outcome", 9), "summary-mismatch": "stranded vs outcomes_stranded"}
    counts = {f.expectation: f.count for f in report.failures}
    assert counts["latency >= 0"] == 1 and counts["at most one outcome per message and run"] == 2
    assert counts["every produced message has exactly one outcome per run"] == 1


def test_coverage_and_uniqueness_name_every_offending_run_and_message(spark):
    """Message 4 is in no run, 5 was never produced, a misses 2, b has 3 twice: each offender by run and message."""
    outcomes = spark.createDataFrame(
        [("a", 1, "acked"), ("a", 3, "acked"), ("a", 5, "acked"), ("b", 1, "acked"), ("b", 2, "acked"),
         ("b", 3, "acked"), ("b", 3, "failed")], "run_id STRING, msg_id BIGINT, status STRING")
    produced = spark.createDataFrame([(i,) for i in (1, 2, 3, 4)], "msg_id BIGINT")
    missing, unproduced = ("produced message without an outcome in this run",
                           "outcome of a message the trace does not produce")
    # the runs as a bit mask (the gate's way), and counted distinct (over MASK_RUNS runs): the same keys
    for keys in (outcome_keys(outcomes, ["a", "b"]), outcome_keys(outcomes)):
        assert sorted(map(tuple, keys.collect())) == [(1, 2, 2), (2, 1, 1), (3, 3, 2), (5, 1, 1)]
        coverage = {tuple(r) for r in message_coverage(outcomes, produced, ["a", "b"], keys).collect()}
        assert coverage == {("a", 2, missing), ("a", 4, missing), ("b", 4, missing), ("a", 5, unproduced)}
        duplicates = sorted(tuple(r) for r in duplicate_outcomes(outcomes, keys).collect())
        assert duplicates == [("b", 3, 2, "acked"), ("b", 3, 2, "failed")]


def test_the_screen_counts_row_rules_and_flags_each_kind_of_message_mismatch(spark):
    """Produced 1-3. Each run breaks one thing; the screen flags that run, and only for that."""
    produced = spark.createDataFrame([(i,) for i in (1, 2, 3)], "msg_id BIGINT")
    ids = {"ok": [1, 2, 3], "missing": [1, 2], "extra": [1, 2, 3, 4], "repeated": [1, 2, 3, 3],
           "swapped": [1, 2, 4], "repeated-for-missing": [1, 1, 3], "null-id": [1, 2, None], "bad-rows": [1, 2, 3],
           "stranger": [1, 2, 3]}
    rows = [(run, m, -1 if (run, m) == ("bad-rows", 1) else 5, "lost" if (run, m) == ("bad-rows", 2) else "acked",
             None if (run, m) == ("bad-rows", 3) else "committed") for run, ms in ids.items() for m in ms]
    outcomes = spark.createDataFrame(rows, "run_id STRING, msg_id BIGINT, latency_us BIGINT, status STRING, "
                                           "fate STRING")
    runs = [r for r in ids if r != "stranger"] + ["empty"]  # "stranger" is no run of the invocation
    screen = {r["run_id"]: r.asDict() for r in message_screen(outcomes, runs, produced).collect()}
    assert set(screen) == set(runs) | {"stranger"}
    assert {r for r, s in screen.items() if s[SCREEN_MESSAGES]} == set(ids) - {"ok", "bad-rows"} | {"empty"}
    for name in (SCREEN_LATENCY, SCREEN_STATUS, SCREEN_FATE):
        assert {r: s[name] for r, s in screen.items() if s[name]} == {"bad-rows": 1}
    # with nothing produced, a run without outcomes matches; without produced ids there is no message screen
    nothing = spark.createDataFrame([], "msg_id BIGINT")
    assert message_screen(outcomes.where("run_id = 'ok'"), ["ok", "empty"], nothing).where(
        f"{SCREEN_MESSAGES} = 1").select("run_id").collect() == [("ok",)]
    assert SCREEN_MESSAGES not in message_screen(outcomes, runs).columns


def test_the_screen_flags_a_run_exactly_when_the_exact_checks_find_its_rows(spark):
    """The exact uniqueness and coverage queries (which decide and report) find rows of a run if and only if the
    screen flags it. 60 runs (one query each way), each the produced ids changed at random: kept, one dropped,
    one added, one repeated, one replaced, or a few of these at once."""
    rng = random.Random(15)
    produced = rng.sample(range(-50, 200), 30)
    runs = []
    for _ in range(60):
        ids = list(produced)
        for _change in range(rng.choice([0, 0, 1, 1, 2, 3])):
            change = rng.choice(["drop", "add", "repeat", "replace"])
            at = rng.randrange(len(ids)) if ids else 0
            if change == "drop" and ids:
                ids.pop(at)
            elif change == "add":
                ids.append(rng.randrange(-60, 210))
            elif change == "repeat" and ids:
                ids.append(ids[at])
            elif ids:
                ids[at] = rng.randrange(-60, 210)
        runs.append(ids)
    run_ids = [f"r{i:02d}" for i in range(len(runs))]
    outcomes = spark.createDataFrame([(run_ids[i], m, 0, "acked", "committed") for i, ms in enumerate(runs)
                                      for m in ms],
                                     "run_id STRING, msg_id BIGINT, latency_us BIGINT, status STRING, fate STRING")
    produced_df = spark.createDataFrame([(m,) for m in produced], "msg_id BIGINT")
    expected = {run_ids[i] for i, ms in enumerate(runs) if sorted(ms) != sorted(produced)}
    assert 20 <= len(expected) <= 50  # both kinds of run are well represented
    flagged = {r["run_id"] for r in message_screen(outcomes, run_ids, produced_df).collect() if r[SCREEN_MESSAGES]}
    assert flagged == expected
    keys = outcome_keys(outcomes, run_ids)
    exact = ({r["run_id"] for r in message_coverage(outcomes, produced_df, run_ids, keys).collect()}
             | {r["run_id"] for r in duplicate_outcomes(outcomes, keys).collect()})
    assert exact == flagged


@dataclass
class GatedLakehouse:
    """A lakehouse where run-x (good frames) passed the gate: both failing-gate tests write into it, each to
    its own run, so the tables are created once (the lakehouse's creation is most of either test's time)."""

    lh: Lakehouse
    good: dict
    gate_for: Callable[[dict], Callable[[], Any]]


@pytest.fixture(scope="module")
def gated(spark, tmp_path_factory, produced_ids) -> GatedLakehouse:
    lh = Lakehouse(tmp_path_factory.mktemp("gated") / "lh", spark)
    good = run_frames(spark, "run-x", 1)

    def gate_for(frames):
        outputs = RunOutputs(frames["message_outcomes"], frames["partition_states"], frames["loss_metrics"],
                             frames["run_summary"])
        return lambda: run_output_gate(spark, outputs, trace_id="synthetic-trace", run_ids=["run-x"],
                                       lakehouse=lh, produced_msg_ids=produced_ids)

    lh.publish_runs([RunRecord("run-x", "synthetic-trace", "synthetic:seed=1", "synthetic")], good,
                    gate=gate_for(good))
    return GatedLakehouse(lh, good, gate_for)


def test_failing_gate_exits_3_and_keeps_the_previous_version(gated):
    lh, good = gated.lh, gated.good
    record = RunRecord("run-x", "synthetic-trace", "synthetic:seed=1", "synthetic")
    versions = {t: DeltaTable(lh.path(t)).version() for t in RUN_TABLES}
    before = {t: sorted(map(tuple, lh.read(t).collect())) for t in RUN_TABLES}

    bad = corrupt(good, "partition_states", lambda d: d.withColumn("high_watermark", F.col("log_end_offset") + 1))
    with pytest.raises(GateFailed) as info:
        lh.publish_runs([record], bad, gate=gated.gate_for(bad))
    error = info.value
    assert error.exit_code == 3 and "high_watermark <= log_end_offset" in str(error) and "run-x" in str(error)
    report = Path(error.report_path)
    assert report.is_file() and lh.root in report.parents and str(report) in str(error)
    assert "high_watermark &lt;= log_end_offset" in report.read_text()
    assert {t: DeltaTable(lh.path(t)).version() for t in RUN_TABLES} == versions
    assert {t: sorted(map(tuple, lh.read(t).collect())) for t in RUN_TABLES} == before
    assert [(r.run_id, r.status) for r in lh.read("runs").where("run_id = 'run-x'").collect()] == [
        ("run-x", "succeeded")]
    assert (lh.read("partition_states", succeeded_only=True).where("run_id = 'run-x'").count()
            == good["partition_states"].count())
    # run-y's gate (the other test) records under its own trace, "t"
    validation = lh.read("validations").where("suite = 'output_gate' AND trace_id = 'synthetic-trace'").collect()
    assert len(validation) == 1 and not validation[0].success and validation[0].report_path == str(report)


def test_failing_gate_on_a_new_run_marks_it_failed(spark, gated):
    lh = gated.lh
    bad = corrupt(run_frames(spark, "run-y", 2), "run_summary", lambda d: d.withColumn("acked_lost",
                                                                                       F.col("acked") + 1))
    outputs = RunOutputs(bad["message_outcomes"], bad["partition_states"], bad["loss_metrics"], bad["run_summary"])
    with pytest.raises(GateFailed):
        lh.publish_runs([RunRecord("run-y", "t", "p", "f")], bad, gate=lambda: run_output_gate(
            spark, outputs, trace_id="t", run_ids=["run-y"], lakehouse=lh))
    assert [(r.run_id, r.status) for r in lh.read("runs").where("run_id = 'run-y'").collect()] == [
        ("run-y", "failed")]
    # Nothing of run-y in the run tables; run-x (published before, in the same tables) is the only succeeded run.
    assert lh.read("message_outcomes").where("run_id = 'run-y'").count() == 0
    assert lh.succeeded_run_ids() == ["run-x"]
