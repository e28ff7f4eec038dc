"""The Spark replay (pipelines/replay_job.py) on golden scenarios and generated traces.

- Golden scenarios: every summary field of tests/scenarios/*/expected.json (derived by hand from SPEC) through
  the Spark path (routing, fan-out, one shuffle, chunked kernels, split, run_summary), all policies of a
  scenario in one pass; per-message expectations too.
- A generated trace under every preset in one pass equals the local kernels message by message, timeline by
  timeline, with Arrow batches small enough that each group is fed in many chunks.
- `replab replay` end to end: exit code, comparison table, summary JSON (SPEC §6.1), Delta tables.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark import StorageLevel

from engine import metrics
from engine.plan import policy_runs, run_infos
from engine.replay import replay_frames
from replay.local import replay_local
from replay.policies import all_presets, parse_policy
from schemas.outcomes import NULL_US, Error, Fate, Status
from schemas.tables import SUMMARY_FIELDS
from storage.trace_loader import read_events_arrow, read_events_spark

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
GOLDEN = sorted(p for p in SCENARIOS.iterdir() if (p / "expected.json").is_file())
#: Goldens kept in `make test` through Spark: each family, multi-policy passes, routing to several partitions, a
#: zombie leader and ELR, RocketMQ's route poll, its phase and R-5's refetch of an empty route. Every other golden
#: is checked through Spark in `make test-slow` (its rules live in the kernels, which
#: tests/replay/test_golden_local.py checks on every golden in `make test`).
FAST_GOLDEN = {"k2-acks1-leader-crash", "k10-zombie-leader", "k19-elr-last-known-leader", "r1-async-master-crash",
               "d6-dledger-route-poll-failover", "d8-dledger-isolated-leader", "d10-dledger-crash-before-poll",
               "d11-dledger-poll-phase", "c6a-controller-allack-failover", "c9-controller-refusal-retried"}

pytestmark = pytest.mark.spark


def spark_replay(spark, folder, policies, window_ms: int = 1000):
    manifest, events = read_events_spark(spark, folder)
    runs = policy_runs(policies, manifest)
    frames = replay_frames(spark, manifest, events, runs, window_ms)
    return manifest, runs, frames


@pytest.mark.parametrize("folder", [p if p.name in FAST_GOLDEN else pytest.param(p, marks=pytest.mark.slow)
                                    for p in GOLDEN], ids=[p.name for p in GOLDEN])
def test_golden_summaries_through_spark(spark, folder):
    cases = json.loads((folder / "expected.json").read_text())
    policies = [parse_policy(c["policy"]) for c in cases]
    manifest, runs, frames = spark_replay(spark, folder, policies)
    # The kernels' output is kept on disk: in memory it ran a 4 GB heap out at 10 M events x 7 policies (README).
    assert frames.raw.storageLevel == StorageLevel.DISK_ONLY
    try:
        summary = {r["run_id"]: r.asDict() for r in metrics.run_summary(
            frames.outcomes.message_outcomes, frames.outcomes.unavailability,
            run_infos(runs, manifest, frames.outcomes.replication_bytes), spark=spark).collect()}
        outcomes = {(r["run_id"], r["msg_id"]): r.asDict() for r in frames.outcomes.message_outcomes.collect()}
    finally:
        frames.release()
    for case, run in zip(cases, runs, strict=True):
        got = summary[run.run_id]
        why = f"{folder.name} [{case['policy']}]: {case['why']}"
        assert set(got) == {"run_id", *SUMMARY_FIELDS}
        for name, value in case["summary"].items():
            assert got[name] == pytest.approx(value, abs=1e-9), f"{name}: {why}"
        for msg_id, expected in case.get("messages", {}).items():
            row = outcomes[(run.run_id, int(msg_id))]
            for name, value in expected.items():
                assert row[name] == value, f"m{msg_id}.{name}: {why}"
            if row["ack_us"] is not None:
                assert row["latency_us"] == row["ack_us"] - row["produce_us"]
        for msg_id, part in case.get("partitions", {}).items():
            assert outcomes[(run.run_id, int(msg_id))]["partition"] == part, f"m{msg_id} partition: {why}"


# ------------------------------------------------------------------------------------ Spark == local kernels
def _local_rows(policy, manifest, table, run_id: str):
    """message_outcomes, partition_states and unavailability rows from the local kernels, as the job reports."""
    from replay.families import family_of

    fam = family_of(policy)
    layout = fam.layout(policy, manifest)
    results = replay_local(policy, manifest, table, engine="kernel")
    keys = dict(zip(table.column("msg_id").to_pylist(), table.column("key").to_pylist(), strict=True))
    msgs, states, gaps = set(), set(), set()

    def opt(v):
        return None if v == NULL_US else int(v)

    for unit, res in zip(layout.units, results, strict=True):
        j, rec = res.messages, res.messages.records
        part = rec.payload["part"] if rec.payload and "part" in rec.payload else np.full(len(rec), unit)
        for i in range(len(rec)):
            msgs.add((int(rec.msg_id[i]), keys[int(rec.msg_id[i])], None if part[i] < 0 else int(part[i]),
                      int(rec.produce_us[i]), Status(int(rec.status[i])).label, Error(int(rec.error[i])).label,
                      opt(rec.ack_us[i]), opt(rec.visible_us[i]), Fate(int(j.fate[i])).label,
                      bool(j.readable_at_end[i]), opt(j.offset[i])))
        for p in fam.partitions_of(policy, layout, unit):
            states |= {(p, s.ts_us, s.leader, s.leader_epoch, tuple(s.isr), s.log_end_offset, s.high_watermark)
                       for s in res.states}
            gaps |= {(p, a, b) for a, b in res.unavailable}
    return msgs, states, gaps, sum(r.replication_bytes for r in results)


@pytest.fixture(scope="module")
def generated_trace(tmp_path_factory):
    """A small chaos trace (every fault kind) as an events/ Parquet folder of several files."""
    from studies.dledger_vs_kafka import load_trace

    manifest, table = load_trace("chaos", seed=3, scale=0.01)
    folder = tmp_path_factory.mktemp("chaos")
    manifest.write(folder)
    (folder / "events").mkdir()
    step = table.num_rows // 3 + 1
    for i in range(3):
        pq.write_table(table.slice(i * step, step), folder / "events" / f"part-{i}.parquet")
    return folder


def derived_in_tasks_equal_spark_aggregates(outcomes, infos) -> None:
    """loss_metrics and committed_offsets from the message figures the replay tasks derived per window
    (`engine.metrics.message_windows`) equal the Spark aggregation of message_outcomes, row for row."""
    mo, windows = outcomes.message_outcomes, outcomes.windows
    assert windows is not None

    def rows(df) -> list:
        return sorted(df.collect(), key=lambda r: tuple((v is None, v) for v in r))

    spark_lm = rows(metrics.loss_metrics(mo, outcomes.unavailability, infos))
    assert rows(metrics.loss_metrics(mo, outcomes.unavailability, infos, windows=windows)) == spark_lm
    assert sum(r.produced for r in spark_lm) == mo.count()  # every message in some window
    assert any(r.ack_latency_p50_us is not None for r in spark_lm)  # percentiles compared, not only nulls
    spark_co = rows(metrics.committed_offsets(outcomes.partition_states, mo, infos))
    assert rows(metrics.committed_offsets(outcomes.partition_states, mo, infos, windows=windows)) == spark_co
    assert any(r.visibility_lag_p99_us is not None for r in spark_co)
    # run_summary from the windows and the (value, frequency) rows equals its aggregation of message_outcomes
    assert outcomes.histograms is not None
    spark_rs = rows(metrics.run_summary(mo, outcomes.unavailability, infos))
    assert rows(metrics.run_summary(mo, outcomes.unavailability, infos, windows=windows,
                                    histograms=outcomes.histograms)) == spark_rs
    assert len(spark_rs) == len(infos) and sum(r.produced for r in spark_rs) == mo.count()
    assert any(r.ack_latency_p999_ms is not None for r in spark_rs)
    assert any(r.visibility_lag_p99_ms is not None for r in spark_rs)
    # fewer rows than values: each distinct value of a unit is one row
    acked = mo.where("status = 'acked'").count()
    visible = mo.where("visible_us IS NOT NULL").count()
    assert outcomes.histograms.groupBy().sum("frequency").first()[0] == acked + visible


def test_every_preset_in_one_pass_equals_the_local_kernels(spark, generated_trace):
    manifest, table = read_events_arrow(generated_trace)
    kinds = set(table.column("kind").to_pylist())
    assert {"crash", "replicate", "produce", "restart"} <= kinds
    policies = [pol for _, pol in all_presets()]
    previous = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "500")  # many chunks per group
    try:
        manifest, runs, frames = spark_replay(spark, generated_trace, policies)
        msgs = frames.outcomes.message_outcomes.toArrow()
        states = frames.outcomes.partition_states.toArrow()
        gaps = frames.outcomes.unavailability.toArrow()
        infos = run_infos(runs, manifest, frames.outcomes.replication_bytes)
        derived_in_tasks_equal_spark_aggregates(frames.outcomes, infos)
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", previous)
        frames.release()
    produced = int(pa.compute.sum(pa.compute.equal(table.column("kind"), "produce")).as_py())
    assert produced > 1000

    def rows(t: pa.Table, run_id: str, cols: list[str]) -> set:
        mine = t.filter(pa.compute.equal(t.column("run_id"), run_id))
        return {tuple(tuple(v) if isinstance(v, list) else v for v in r)
                for r in zip(*(mine.column(c).to_pylist() for c in cols), strict=True)}

    for run in runs:
        want_msgs, want_states, want_gaps, want_bytes = _local_rows(run.policy, manifest, table, run.run_id)

        got_msgs = rows(msgs, run.run_id, ["msg_id", "key", "partition", "produce_us", "status", "error", "ack_us",
                               "visible_us", "fate", "readable_at_end", "offset"])
        assert len(got_msgs) == produced, run.canonical
        assert got_msgs == want_msgs, run.canonical
        assert rows(states, run.run_id, ["partition", "ts_us", "leader", "leader_epoch", "isr", "log_end_offset",
                             "high_watermark"]) == want_states, run.canonical
        assert rows(gaps, run.run_id, ["partition", "start_us", "end_us"]) == want_gaps, run.canonical
        assert frames.outcomes.replication_bytes[run.run_id] == want_bytes, run.canonical


def test_bundles_hold_each_message_in_its_routed_unit_and_each_broker_event_in_every_unit_hosting_it(
        spark, generated_trace):
    """The route stage (`engine.groups.bundle_batches`) over batches of a chaos trace, under a Kafka, a RocketMQ
    and a DLedger class: per class, every produce event lands in exactly one bundle, of the unit and with the
    partition and delay its family routes it to (the whole trace routed at once), and every broker event in
    exactly the units whose replicas include the broker."""
    from collections import Counter

    from engine.groups import EVENT_SCHEMA, ROUTE_INPUT_COLUMNS, ReplayPlan, bundle_batches, unbundle
    from engine.plan import route_classes
    from engine.replay import control_timeline
    from replay.families import family_of
    from replay.family import RouteInput
    from schemas.trace import Kind, kind_codes

    manifest, events_df = read_events_spark(spark, generated_trace)
    _, table = read_events_arrow(generated_trace)
    runs = policy_runs([parse_policy(p) for p in ("kafka-acks1", "rocketmq-sync", "dledger-3")], manifest)
    classes = route_classes(runs)
    plan = ReplayPlan(manifest, classes, control_timeline(events_df), window_us=1_000_000)
    kind = kind_codes(table.column("kind"))
    is_produce = kind == Kind.PRODUCE
    msg_id = table.column("msg_id").to_numpy(zero_copy_only=False)
    lo = int(np.nanmin(np.where(is_produce, msg_id, np.nan)))
    rank = pa.array(np.where(is_produce, np.nan_to_num(msg_id, nan=lo) - lo, 0).astype(np.int64), mask=~is_produce)
    columns = {**{c: table.column(c) for c in ROUTE_INPUT_COLUMNS if c in table.column_names},
               "kind_code": pa.array(kind), "msg_rank": rank}
    trace = pa.Table.from_arrays([columns[c] for c in ROUTE_INPUT_COLUMNS], names=list(ROUTE_INPUT_COLUMNS))
    bundles = pa.Table.from_batches(list(bundle_batches(plan)(iter(trace.to_batches(max_chunksize=700)))))
    assert bundles.num_rows > 3 * len(classes)  # several input batches, several units each
    got: dict[tuple[int, int], Counter] = {}
    columns = (bundles.column(c).to_pylist() for c in ("class_id", "unit", "events"))
    for class_id, unit, blob in zip(*columns, strict=True):
        events = unbundle(blob)
        assert events.schema == EVENT_SCHEMA
        rows = events.to_pylist()
        got.setdefault((class_id, unit), Counter()).update(tuple(r.values()) for r in rows)

    produce = trace.filter(pa.array(is_produce))
    brokers = trace.filter(pa.array(~is_produce)).to_pylist()
    assert len(produce) > 100 and len(brokers) > 100
    for rc in classes:
        policy, layout = rc.router
        routed = family_of(policy).route(policy, manifest, layout, plan.control, RouteInput(
            produce.column("ts_us").to_numpy(), produce.column("msg_rank").to_numpy(), produce.column("key")))
        delay = routed.delay_us if routed.delay_us is not None else np.zeros(len(produce), dtype=np.int64)
        for unit in rc.units:
            want = Counter()
            for i in np.flatnonzero(routed.unit == unit):
                r = produce.slice(int(i), 1).to_pylist()[0]
                want[(r["ts_us"], int(Kind.PRODUCE), None, None, r["msg_id"], r["size_bytes"], r["key"],
                      r["producer_id"], int(routed.partition[i]), int(delay[i]))] += 1
            hosts = set(layout.replicas[unit])
            want.update((r["ts_us"], r["kind_code"], r["broker"], r["upto_us"], None, None, r["key"],
                         r["producer_id"], None, None) for r in brokers if r["broker"] in hosts)
            assert got.pop((rc.index, unit), Counter()) == want, (policy.canonical(), unit)
    assert not got  # no bundle for a group outside the plan


def test_a_groups_events_are_sorted_in_the_spec_order(spark):
    """`engine.groups.sort_events` orders a group's events as Spark's sort by (ts_us, kind_code, msg_id, broker,
    upto_us) does, ascending with nulls first, whatever order its bundles arrived in."""
    from engine.groups import EVENT_SCHEMA, sort_events
    from schemas.trace import Kind

    rng = np.random.default_rng(11)
    rows = []
    for _ in range(3000):
        ts, kind = int(rng.integers(0, 40)), int(rng.integers(0, len(Kind)))
        if kind == Kind.PRODUCE:
            rows.append((ts, kind, None, None, int(rng.integers(0, 10**6)), 100, "k", 1, 0, 0))
        else:
            rows.append((ts, kind, int(rng.integers(0, 6)), int(rng.integers(0, ts + 1)), None, None, None, None,
                         None, None))
    events = pa.Table.from_pylist([dict(zip(EVENT_SCHEMA.names, r, strict=True)) for r in rows], EVENT_SCHEMA)
    ordered = sort_events(events)
    spark_order = spark.createDataFrame(events).sort("ts_us", "kind_code", "msg_id", "broker", "upto_us")
    assert ordered.to_pylist() == [r.asDict() for r in spark_order.collect()]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-3, 5), max_size=60))
def test_split_by_gives_each_key_its_rows_in_their_order(keys):
    """`engine.groups.split_by` (the batch bundles' and the stream's split by unit): each distinct key once,
    ascending, with exactly its rows in their original order."""
    from engine.groups import split_by

    rows = pa.RecordBatch.from_arrays([pa.array(keys, pa.int64()), pa.array(range(len(keys)), pa.int64())],
                                      names=["key", "row"])
    parts = list(split_by(rows, np.array(keys, dtype=np.int64)))
    assert [k for k, _ in parts] == sorted(set(keys))
    for k, part in parts:
        assert part.column("row").to_pylist() == [i for i, x in enumerate(keys) if x == k]
        assert set(part.column("key").to_pylist()) == {k}

def test_sparse_msg_ids_are_ranked_by_a_sort(spark, tmp_path):
    """Round-robin routing needs each message's rank in msg_id order; non-dense ids take the sort path."""
    from engine.replay import with_msg_rank

    df = spark.createDataFrame([(i * 7 + (3 if i % 2 else 0),) for i in range(50)][::-1], "msg_id BIGINT")
    spark.conf.set("spark.sql.shuffle.partitions", "3")
    try:
        ranked = {r["msg_id"]: r["msg_rank"] for r in with_msg_rank(df).collect()}
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", "2")
    assert [ranked[k] for k in sorted(ranked)] == list(range(50))
    dense = spark.createDataFrame([(i,) for i in range(5, 25)], "msg_id BIGINT")
    assert {r["msg_id"] - 5 == r["msg_rank"] for r in with_msg_rank(dense).collect()} == {True}


def test_a_large_replay_spreads_its_groups_over_more_tasks_than_shuffle_partitions():
    from engine.replay import TASK_OUTCOMES, replay_tasks

    assert replay_tasks(25, 13_842_864, 4) == 4  # 1 M events x 16 presets: the session's partitions
    assert replay_tasks(25, 152_849_600, 4) == 25  # 10 M events x 16 presets: one task per group
    assert replay_tasks(12, 66_871_700, 4) == 12
    assert replay_tasks(25, 10 * TASK_OUTCOMES, 4) == 10
    assert replay_tasks(3, 0, 4) == 3  # never more tasks than groups
    assert replay_tasks(1, 0, 0) == 1


def _classes(shape: list[tuple[int, int]]):
    """RouteClass per (policies, units), with real Layouts."""
    from engine.groups import RouteClass
    from replay.family import Layout

    out = []
    for c, (policies, units) in enumerate(shape):
        layout = Layout(tuple(range(units)), {u: (0,) for u in range(units)}, 1, 1.0)
        out.append(RouteClass(c, [(c * 10 + j, None, layout) for j in range(policies)]))
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 7), st.integers(1, 12)), min_size=1, max_size=6), st.integers(1, 40))
def test_groups_are_placed_longest_first_on_the_least_loaded_task(shape, tasks):
    """`engine.plan.place_groups`: every group on one task in range; no task's expected work exceeds another's by
    more than the heaviest group (LPT); with a task per group, one group per task, heaviest on the lowest task."""
    from engine.plan import place_groups

    classes = _classes(shape)
    weight = {(c, u): p / n for c, (p, n) in enumerate(shape) for u in range(n)}
    placed = place_groups(classes, tasks)
    assert set(placed) == set(weight) and set(placed.values()) <= set(range(tasks))
    load = [sum(w for g, w in weight.items() if placed[g] == t) for t in range(tasks)]
    if tasks <= len(weight):
        assert max(load) - min(load) <= max(weight.values()) + 1e-9
    else:
        assert sorted(placed.values()) == list(range(len(weight)))
    if tasks >= len(weight):
        by_task = sorted(placed, key=placed.get)
        assert [weight[g] for g in by_task] == sorted(weight.values(), reverse=True)


def test_each_replay_task_holds_the_groups_placed_on_it(spark):
    """The placement reaches Spark: rows of (class_id, unit) repartitioned by `engine.replay.task_of` land in the task
    `place_groups` chose, for the 16 presets' 25 groups of `steady-state` at a task per group and at 4 tasks."""
    from pyspark.sql import functions as F

    from engine.plan import place_groups, route_classes
    from engine.replay import task_of
    from generators.library import resolve_scenario
    from schemas.trace import Manifest

    manifest = Manifest("t", tuple(resolve_scenario("steady-state").brokers), 60_000_000)
    classes = route_classes(policy_runs([pol for _, pol in all_presets()], manifest))
    groups = [(rc.index, u) for rc in classes for u in rc.units]
    assert len(groups) == 25
    rows = spark.createDataFrame([(c, u, i) for i in range(3) for c, u in groups], "class_id INT, unit INT, n INT")
    for tasks in (25, 4):
        placed = place_groups(classes, tasks)
        got = (rows.repartitionById(tasks, task_of(placed))
               .select("class_id", "unit", F.spark_partition_id().alias("t")).distinct().collect())
        assert {(r["class_id"], r["unit"]): r["t"] for r in got} == placed
        assert len(got) == len(groups)


def test_the_persisted_layout_reads_back_as_the_output_rows(spark):
    """The batch replay persists its output rows with the other row types' columns in one struct (`packed`), null
    in a message row; read back (`unpacked`), every row type has the columns and values it was made with."""
    from engine.groups import MESSAGE, OUTPUT_SCHEMA, PERSISTED_OUTPUT_SCHEMA, STATE, WINDOW, packed
    from engine.replay import unpacked

    def output_rows(n: int, **cols: pa.Array) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays([cols.get(f.name, pa.nulls(n, f.type)) for f in OUTPUT_SCHEMA],
                                          schema=OUTPUT_SCHEMA)

    rows = [
        output_rows(2, policy_idx=pa.array([0, 1], pa.int32()), rtype=pa.array([MESSAGE] * 2, pa.int8()),
                    unit=pa.array([3, 3], pa.int32()), msg_id=pa.array([7, 8]), key=pa.array(["a", None]),
                    partition=pa.array([3, 3], pa.int32()), offset=pa.array([0, None], pa.int64())),
        output_rows(1, policy_idx=pa.array([1], pa.int32()), rtype=pa.array([STATE], pa.int8()),
                    unit=pa.array([3], pa.int32()), ts_us=pa.array([5]), leader=pa.array([2], pa.int32()),
                    isr=pa.array([[2, 0]], pa.list_(pa.int32())), high_watermark=pa.array([4])),
        output_rows(1, policy_idx=pa.array([0], pa.int32()), rtype=pa.array([WINDOW], pa.int8()),
                    unit=pa.array([3], pa.int32()), partition=pa.array([3], pa.int32()),
                    window_start_us=pa.array([0]), produced=pa.array([2]), ack_latency_p99_us=pa.array([9])),
    ]
    batches = [packed(b) for b in rows]
    assert [b.column("detail").null_count for b in batches] == [2, 0, 0]
    back = unpacked(spark.createDataFrame(pa.Table.from_batches(batches, schema=PERSISTED_OUTPUT_SCHEMA)))
    assert back.columns == OUTPUT_SCHEMA.names
    want = pa.Table.from_batches(rows).to_pylist()
    got = [r.asDict() for r in back.collect()]
    assert sorted(got, key=repr) == sorted(want, key=repr)


def test_a_small_replay_runs_interpreted_and_a_large_one_generated(spark, tmp_path, monkeypatch):
    """`engine.replay.replay_expressions`: a replay of at most SMALL_REPLAY_OUTCOMES outcomes runs every step
    after the trace gate on interpreted expressions and leaves the session as it found it; the rule, fed the
    replay's own digest, keeps generated code one outcome over the limit (and for a trace gated by Spark)."""
    from bench.fixed_cost_bench import write_tiny_trace
    from engine import replay as engine_replay
    from engine.plan import ReplayRequest
    from storage.session import INTERPRETED_CONF

    trace = write_tiny_trace(tmp_path / "trace")
    before = {key: spark.conf.get(key, None) for key in INTERPRETED_CONF}
    assert before != INTERPRETED_CONF  # else the checks below could not tell the two apart

    def settings_now() -> dict[str, str | None]:
        return {key: spark.conf.get(key, None) for key in INTERPRETED_CONF}

    asked = []  # what run_replay hands the rule: (digest, policies)
    rule = engine_replay.replay_expressions

    def spy(spark_, digest, policies):
        asked.append((digest, policies))
        return rule(spark_, digest, policies)

    monkeypatch.setattr(engine_replay, "replay_expressions", spy)
    seen: dict[str, dict[str, str | None]] = {}
    report = engine_replay.run_replay(spark, ReplayRequest(
        trace=str(trace), policies=[parse_policy("kafka-acks1"), parse_policy("kafka-durable")],
        lakehouse=str(tmp_path / "lakehouse"), mlflow=False),
        progress=lambda text: seen.setdefault(text.split()[0], settings_now()))
    assert [s["produced"] for s in report.summaries] == [3, 3]
    assert settings_now() == before
    assert {"replay", "windows", "output", "Delta"} <= set(seen)
    for name in ("replay", "windows", "output", "Delta"):
        assert seen[name] == INTERPRETED_CONF, name
    assert seen["trace"] == before  # the trace gate runs before the size is known

    # the rule on the replay's own digest: 3 messages x 2 policies = 6 outcomes
    [(digest, policies)] = asked
    assert (digest.produce.n, policies) == (3, 2)
    for limit, interpreted in ((6, True), (5, False)):
        monkeypatch.setattr(engine_replay, "SMALL_REPLAY_OUTCOMES", limit)
        with rule(spark, digest, policies):
            assert settings_now() == (INTERPRETED_CONF if interpreted else before), limit
        assert settings_now() == before
    with rule(spark, None, 1):  # a trace the gate read with Spark (no digest) is never small
        assert settings_now() == before
