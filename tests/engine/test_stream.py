"""Stream mode (engine/stream/query.py): the batch replay's results, through Spark Structured Streaming.

- Routing in state reads the fault timeline only up to the routing horizon (replay/stream.py): no Spark.
- Core queries (source → watermark → routing → transformWithStateInPandas), several at once on the session: on
  golden scenarios, on a chaos trace under every preset, and with files arriving out of time order within the
  allowed lateness, the kernels' rows equal the batch job's (`replay_frames`) row for row.
- End to end (`run_stream_replay`): rows behind the watermark are counted in `watermarks.rows_late` and
  quarantined, the rest equals batch mode on the trace without them; a `python -m pipelines replay --mode
  stream` killed with SIGKILL after a micro-batch and restarted from its checkpoint ends with every run table
  equal to batch mode's, each micro-batch's watermarks row once.

Traces are tiny and split into a few files; one micro-batch per file.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from engine.plan import ReplayRequest, policy_runs
from engine.replay import replay_frames
from replay.policies import parse_policy
from schemas.trace import KIND_LABELS
from storage.trace_loader import read_events_arrow, read_events_spark

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = REPO / "tests" / "scenarios"
ALL_GOLDEN = sorted(p.name for p in SCENARIOS.iterdir() if (p / "expected.json").is_file())
# The fast suite streams one golden scenario, an isolated zombie leader (the chaos trace covers the other fault
# kinds and both families); the slow suite streams every golden scenario, d5-dledger-quorum-loss included.
GOLDEN = ["k10-zombie-leader"]
CHAOS_PRESETS = ["kafka-acks1", "kafka-durable", "kafka-unclean", "rocketmq-async", "rocketmq-sync",
                 "rocketmq-ordered", "dledger-3", "rocketmq-controller"]
TIMEOUT_S = 900

pytestmark = pytest.mark.spark


# ------------------------------------------------------------------------------------------------ traces
def spec_order(table: pa.Table) -> pa.Table:
    """Events in SPEC §2.2 order (time, kind, msg_id, broker): the order of a generator's files."""
    kind = pc.index_in(table.column("kind"), value_set=pa.array(KIND_LABELS))
    keyed = table.append_column("_k", kind)
    return keyed.sort_by([("ts_us", "ascending"), ("_k", "ascending"), ("msg_id", "ascending"),
                          ("broker", "ascending")]).drop_columns(["_k"])


def write_stream_trace(manifest, parts: list[pa.Table], folder: Path) -> Path:
    """A complete trace whose events/ holds one Parquet file per part, in this order (names sort as listed), and
    the `_COMPLETE` marker generators write last."""
    manifest.write(folder)
    (folder / "events").mkdir(parents=True)
    for i, part in enumerate(parts):
        pq.write_table(part, folder / "events" / f"part-{i:06d}.parquet")
    (folder / "events" / "_COMPLETE").write_text(json.dumps({"files": len(parts)}))
    return folder


def split(table: pa.Table, files: int) -> list[pa.Table]:
    step = -(-table.num_rows // files)
    return [table.slice(i * step, step) for i in range(files)]


def from_golden(name: str, folder: Path, files: int = 2) -> Path:
    manifest, table = read_events_arrow(SCENARIOS / name)
    return write_stream_trace(manifest, split(spec_order(table), files), folder)


def policies_of(name: str) -> list[Any]:
    return [parse_policy(c["policy"]) for c in json.loads((SCENARIOS / name / "expected.json").read_text())]


# ------------------------------------------------------------------------------------------------ core queries
@dataclass
class CoreRun:
    """One stream replay query without gate and lakehouse: its micro-batches' rows, collected in memory."""

    name: str
    trace: Path
    policies: list[Any]
    lateness_ms: int = 0
    batches: list[pa.Table] = field(default_factory=list)
    query: Any = None
    runs: Any = None
    final_dir: Path | None = None  # where the groups wrote their final rows

    def start(self, spark, checkpoint: Path) -> None:
        from engine.stream.query import replay_stream, stream_plan
        from engine.stream.trace import is_complete
        from storage.trace_loader import locate

        complete, as_is = is_complete(locate(self.trace))
        assert complete
        manifest, table = read_events_arrow(self.trace)
        self.runs = policy_runs(self.policies, manifest)
        ids = table.filter(pc.equal(table.column("kind"), "produce")).column("msg_id")
        plan = stream_plan(manifest, self.runs, 1000, self.lateness_ms, rank_base=int(pc.min(ids).as_py()))
        self.final_dir = checkpoint.parent / f"{checkpoint.name}.final"
        stream = replay_stream(spark, str(self.trace / "events"), plan, checkpoint.parent / f"{checkpoint.name}.plan",
                               self.final_dir, complete_as_is=as_is)

        def collect(df, batch_id: int) -> None:
            self.batches.append(df.toArrow())
            del batch_id

        self.query = (stream.writeStream.foreachBatch(collect).option("checkpointLocation", str(checkpoint))
                      .trigger(processingTime="0 seconds").start())

    @property
    def done(self) -> bool:
        from engine.stream.plan import END

        return any(pc.any(pc.equal(b.column("rtype"), END)).as_py() for b in self.batches if b.num_rows)

    def rows(self, rtypes: tuple[int, ...]) -> pa.Table:
        t = pa.concat_tables([b for b in self.batches if b.num_rows])
        return t.filter(pc.is_in(t.column("rtype"), pa.array(rtypes, pa.int8())))


def run_all(spark, runs: list[CoreRun], root: Path, at_once: int = 2) -> None:
    """Run the queries, `at_once` at a time (each query starts a Python process for its source on the driver;
    many at once on a loaded 2-core machine miss Spark's connect-back timeout: three at once did)."""
    pending = list(enumerate(runs))
    active: list[CoreRun] = []
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while pending or active:
            for r in active:
                if not r.query.isActive and not r.done:
                    raise AssertionError(f"{r.name}: query ended early: {r.query.exception()}")
            for r in [r for r in active if r.done]:
                r.query.stop()
                active.remove(r)
            while pending and len(active) < at_once:
                i, r = pending.pop(0)
                r.start(spark, root / f"ckpt-{i}")
                active.append(r)
            assert time.monotonic() < deadline, [r.name for r in active]
            time.sleep(0.5)
    finally:
        for r in runs:
            if r.query is not None and r.query.isActive:
                r.query.stop()


def assert_same_as_batch(spark, run: CoreRun, batch_trace: Path | None = None) -> None:
    """The stream's message, state, interval and window rows (and replication bytes) equal batch mode's, row for
    row."""
    from pyspark.testing import assertDataFrameEqual

    from engine.replay import frames_from_raw
    from engine.stream.final import read_final

    manifest, events = read_events_spark(spark, batch_trace or run.trace)
    batch = replay_frames(spark, manifest, events, run.runs)
    try:
        raw = read_final(spark, run.final_dir)
        stream = frames_from_raw(spark, run.runs, raw)
        assertDataFrameEqual(stream.message_outcomes, batch.outcomes.message_outcomes)
        assertDataFrameEqual(stream.partition_states, batch.outcomes.partition_states)
        assertDataFrameEqual(stream.unavailability, batch.outcomes.unavailability)
        assertDataFrameEqual(stream.windows, batch.outcomes.windows)
        assertDataFrameEqual(stream.histograms, batch.outcomes.histograms)
        assert stream.replication_bytes == batch.outcomes.replication_bytes
    finally:
        batch.release()


@pytest.fixture(scope="module")
def chaos():
    from studies.dledger_vs_kafka import load_trace

    return load_trace("chaos", seed=3, scale=0.01)


@pytest.fixture(scope="module")
def core_runs(spark, chaos, tmp_path_factory) -> dict[str, CoreRun]:
    """Every core query of this module, run at once (streaming queries share the session's two cores)."""
    root = tmp_path_factory.mktemp("stream-core")
    runs = [CoreRun(name, from_golden(name, root / name), policies_of(name)) for name in GOLDEN]
    manifest, table = chaos
    runs.append(CoreRun("chaos", write_stream_trace(manifest, split(spec_order(table), 4), root / "chaos"),
                        [parse_policy(p) for p in CHAOS_PRESETS]))
    # Out of order: the third quarter of the trace arrives after the fourth. The watermark after the fourth is
    # its max event time minus the lateness: a lateness past the third quarter's start admits every row.
    parts = split(spec_order(table), 4)
    late_span_ms = int(pc.max(parts[3].column("ts_us")).as_py()) // 1000 - \
        int(pc.min(parts[2].column("ts_us")).as_py()) // 1000
    runs.append(CoreRun("out-of-order", write_stream_trace(manifest, [parts[0], parts[1], parts[3], parts[2]],
                                                           root / "out-of-order"),
                        [parse_policy("kafka-durable"), parse_policy("dledger-3")], lateness_ms=late_span_ms + 1))
    run_all(spark, runs, root)
    return {r.name: r for r in runs}


@pytest.fixture(scope="module")
def generated_run(spark, tmp_path_factory) -> CoreRun:
    """A generated trace as `replab generate` writes it (several files, then events/_COMPLETE)."""
    from generators.generate import generate_trace
    from generators.library import resolve_scenario

    root = tmp_path_factory.mktemp("stream-generated")
    steady = root / "steady-state"
    generate_trace(spark, resolve_scenario("steady-state"), seed=1, scale=0.02, out=steady,
                   target_events_per_chunk=1500)
    run = CoreRun("steady-state", steady, [parse_policy("kafka-acks1"), parse_policy("rocketmq-sync")])
    run_all(spark, [run], root)
    return run


# ------------------------------------------------------------------------------------------------ tests
def test_routing_in_state_reads_faults_only_up_to_the_horizon(chaos):
    """What replay/stream.py promises: a message routed with the faults up to send + horizon is routed as with all
    of them (so routing on the faults seen so far is exact once the watermark passes send + horizon)."""
    from replay.events import split_trace_table
    from replay.families import family_of
    from replay.family import RouteInput
    from replay.local import control_events, msg_rank
    from replay.stream import routing_horizon_us

    manifest, table = chaos
    produce, events = split_trace_table(table)
    control = control_events(events)
    rank = msg_rank(produce["msg_id"])
    assert len(control.broker_ts) >= 5
    for spec in ("rocketmq-async", "rocketmq:ordered=true", "dledger-3", "rocketmq-controller"):
        policy = parse_policy(spec)
        fam = family_of(policy)
        layout = fam.layout(policy, manifest)
        full = fam.route(policy, manifest, layout, control, RouteInput(produce["ts_us"], rank, list(produce["key"])))
        horizon = routing_horizon_us(policy)
        for cut in control.broker_ts[::2]:  # a timeline that ends right at a fault
            seen = control.slice_time(0, int(cut))
            send = produce["ts_us"] + horizon < cut
            part = fam.route(policy, manifest, layout, seen, RouteInput(produce["ts_us"][send], rank[send],
                                                                         list(produce["key"][send])))
            assert np.array_equal(part.unit, full.unit[send]), spec
            assert np.array_equal(part.partition, full.partition[send]), spec


@pytest.mark.parametrize("chunk_bytes", [None, 4096], ids=["whole", "chunked"])
def test_group_rebuilt_from_snapshot_and_log_finishes_like_the_live_one(chaos, chunk_bytes, monkeypatch):
    """What a worker that did not run a group's last micro-batches does (ReplayProcessor._load): the snapshot,
    then the logged micro-batches applied again, gives the same outputs as the group kept in memory. No Spark.
    `chunked`: state values cut to a few KB (as the processor cuts them to STATE_CHUNK_BYTES for the state
    server) rebuild the same group."""
    import engine.stream.state as stream_state
    from engine.plan import policy_runs
    from engine.stream.plan import BUFFER_COLUMNS, ROUTED_SCHEMA
    from engine.stream.query import stream_plan
    from engine.stream.routing import Router, unpack
    from engine.stream.source import EVENT_SOURCE_SCHEMA
    from engine.stream.state import GroupReplay, read_rows, write_rows

    manifest, table = chaos
    runs = policy_runs([parse_policy("kafka-durable"), parse_policy("dledger-3")], manifest)
    plan = stream_plan(manifest, runs, 1000, 0, rank_base=1)
    router = Router(plan)
    n = table.num_rows
    source = (spec_order(table).append_column("file_idx", pa.array(np.zeros(n, dtype=np.int32)))
              .append_column("row", pa.array(np.arange(1, n + 1))).cast(EVENT_SOURCE_SCHEMA))
    micro_batches = [router.pack(b) for b in source.to_batches(max_chunksize=n // 5 + 1)]
    if chunk_bytes:
        monkeypatch.setattr(stream_state, "STATE_CHUNK_BYTES", chunk_bytes)
    for key in [(0, 3), (1, -1)]:  # a Kafka partition; the DLedger class, routed in state
        live, rebuilt, log = GroupReplay(plan, *key), None, []
        watermark_us = 0
        for i, packed in enumerate(micro_batches):
            mine = pc.and_(pc.equal(packed.column("class_id"), key[0]), pc.equal(packed.column("unit"), key[1]))
            rows = unpack(packed.filter(mine).column("events").to_pylist())
            assert rows.schema == ROUTED_SCHEMA
            rows = rows.select(list(BUFFER_COLUMNS))
            live.step(rows, watermark_us)
            if i == 1:
                blob = live.dumps()
                parts = stream_state.snapshot_parts(blob)
                assert (len(parts) > 1) == bool(chunk_bytes)
                rebuilt = GroupReplay.loads(b"".join(parts), plan)
            elif i > 1:
                log.append((watermark_us, write_rows(rows)))
                assert (len(log[-1][1]) > 1) == (chunk_bytes is not None and rows.nbytes > chunk_bytes)
            watermark_us = int(pc.max(rows.column("ts_us")).as_py()) // 1000 * 1000 if rows.num_rows else watermark_us
        for w, entries in log:
            rebuilt.step(pa.concat_tables([read_rows(e) for e in entries]), w)
        got, want = list(rebuilt.finish()), list(live.finish())
        assert pa.Table.from_batches(got).equals(pa.Table.from_batches(want)), key
        assert sum(b.num_rows for b in want) > 100


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_scenarios_stream_equals_batch(spark, core_runs, name):
    assert_same_as_batch(spark, core_runs[name])


@pytest.fixture(scope="module")
def all_golden_runs(spark, tmp_path_factory) -> dict[str, CoreRun]:
    root = tmp_path_factory.mktemp("stream-golden")
    runs = [CoreRun(name, from_golden(name, root / name), policies_of(name)) for name in ALL_GOLDEN]
    run_all(spark, runs, root)
    return {r.name: r for r in runs}


@pytest.mark.slow
@pytest.mark.parametrize("name", ALL_GOLDEN)
def test_every_golden_scenario_stream_equals_batch(spark, all_golden_runs, name):
    assert_same_as_batch(spark, all_golden_runs[name])


def test_chaos_trace_under_presets_stream_equals_batch(spark, core_runs):
    from engine.groups import FINAL_ROW_TYPES
    from engine.stream.plan import STATS

    run = core_runs["chaos"]
    stats = run.rows((STATS,))
    assert sum(stats.column("rows_late").to_pylist()) == 0
    assert sum(stats.column("rows_in").to_pylist()) == read_events_arrow(run.trace)[1].num_rows
    assert len([b for b in run.batches if b.num_rows]) >= 5  # four files, then the end-of-trace timers
    # The final rows went to the groups' files, not through the stream; no half-written file is left
    assert run.rows(FINAL_ROW_TYPES).num_rows == 0
    names = [p.name for p in run.final_dir.iterdir()]
    assert len(names) >= len(CHAOS_PRESETS) and all(re.fullmatch(r"group-\d+-(-1|\d+)\.parquet", n) for n in names)
    assert_same_as_batch(spark, run)


@pytest.mark.slow  # the fast suite's multi-file case is the chaos trace in four files
def test_generated_trace_stream_equals_batch(spark, generated_run):
    run = generated_run
    assert (run.trace / "events" / "_COMPLETE").is_file()
    assert len(list((run.trace / "events").glob("part-*.parquet"))) >= 3
    assert_same_as_batch(spark, run)


def test_out_of_order_within_the_allowed_lateness_equals_batch(spark, core_runs):
    from engine.stream.plan import STATS

    run = core_runs["out-of-order"]
    assert sum(run.rows((STATS,)).column("rows_late").to_pylist()) == 0
    assert_same_as_batch(spark, run)


# ------------------------------------------------------------------------------------------------ end to end
@dataclass
class LateTrace:
    """The chaos trace in five files, the fourth arriving after the fifth: part of it is behind the watermark."""

    trace: Path  # what the stream reads
    reference: Path  # the same trace without the late rows (batch mode's input for the expected tables)
    lateness_ms: int
    late_file: Path
    late_rows: list[int]  # 1-based rows of late_file that are behind the watermark when it arrives
    late_raw: list[dict[str, Any]]
    rows: int


@pytest.fixture(scope="module")
def late_trace(chaos, tmp_path_factory) -> LateTrace:
    """Broker events of the trace's fourth fifth arrive after its last fifth. Only broker events: a produce dropped
    as late would also shift the msg_id ranks (round-robin routing) of a batch replay of the trace without it,
    which the stream, ranking messages over the whole trace, does not do."""
    manifest, table = chaos
    parts = split(spec_order(table), 5)
    is_produce = pc.equal(parts[3].column("kind"), "produce")
    behind = parts[3].filter(pc.invert(is_produce))
    in_order = [parts[0], parts[1], pa.concat_tables([parts[2], parts[3].filter(is_produce)]), parts[4]]
    # The watermark when `behind` arrives: max event time so far (ms) minus the lateness. Half of the gap admits
    # the later part of the file and leaves its earlier part behind the watermark.
    max_ms = int(pc.max(parts[4].column("ts_us")).as_py()) // 1000
    gap_ms = max_ms - int(pc.min(behind.column("ts_us")).as_py()) // 1000
    lateness_ms = gap_ms // 2
    late = behind.column("ts_us").to_numpy() < (max_ms - lateness_ms) * 1000
    assert 0 < late.sum() < len(late)
    root = tmp_path_factory.mktemp("late")
    trace = write_stream_trace(manifest, [*in_order, behind], root / "trace")
    kept = pa.concat_tables([*in_order, behind.filter(pa.array(~late))])
    reference = write_stream_trace(manifest, [spec_order(kept)], root / "reference")
    late_rows = (np.flatnonzero(late) + 1).tolist()
    raw = behind.filter(pa.array(late)).to_pylist()
    return LateTrace(trace, reference, lateness_ms, trace / "events" / "part-000004.parquet", late_rows, raw,
                     table.num_rows)


def kill_after_micro_batch(args: list[str], env: dict[str, str], cwd: Path, batch: int, timeout_s: float) -> str:
    """Run `args`; SIGKILL its whole process group (Python driver, JVM, workers) once it logs micro-batch `batch`."""
    import queue
    import threading

    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd,
                            start_new_session=True)
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            line = lines.get(timeout=max(1.0, deadline - time.monotonic()))
            if line is None:
                raise AssertionError(f"the replay ended before micro-batch {batch}:\n{''.join(seen)}")
            seen.append(line)
            if f"micro-batch {batch}:" in line:
                os.killpg(proc.pid, signal.SIGKILL)
                break
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    return "".join(seen)


def batch_tables(spark, trace: Path, policies: list[Any]) -> dict[str, Any]:
    """Batch mode's run tables for `trace` (replay_frames, then publish's derivation), not written anywhere."""
    from engine.plan import run_infos, run_records
    from engine.publish import ReplayResults, derive_tables

    manifest, events = read_events_spark(spark, trace)
    runs = policy_runs(policies, manifest)
    frames = replay_frames(spark, manifest, events, runs)
    results = ReplayResults(run_records(runs, manifest.trace_id, "batch"),
                            run_infos(runs, manifest, frames.outcomes.replication_bytes), frames.outcomes, events)
    return derive_tables(spark, results)


def assert_run_tables_equal_batch(spark, lh, mine, trace: Path, policies: list[Any]) -> None:
    """Every run table the stream replay wrote (rows matching `mine`) equals batch mode's on `trace`."""
    from pyspark.testing import assertDataFrameEqual

    expected = batch_tables(spark, trace, policies)
    try:
        for name in RUN_TABLES:
            assertDataFrameEqual(lh.read(name).where(mine), lh.conform(name, expected[name]))
    finally:
        for df in expected.values():
            df.unpersist()


RUN_TABLES = ("message_outcomes", "partition_states", "unavailability", "committed_offsets", "loss_metrics",
              "run_summary")


# The fast suite runs the end-to-end replay once without a kill (the same tables, watermarks and quarantine);
# the kill -9 and restart from the checkpoint (a second Spark process) runs in the slow suite.
@pytest.mark.parametrize("killed", [pytest.param(True, marks=pytest.mark.slow, id="killed"),
                                    pytest.param(False, id="uninterrupted")])
def test_killed_stream_replay_restarts_exactly_once_and_quarantines_late_rows(spark, late_trace, tmp_path, killed):
    """SIGKILL after micro-batch 1, restart from the checkpoint: every run table equals batch mode on the trace
    without the late rows; the late rows are counted once per run and quarantined once, with their reason."""
    from mlflow.tracking import MlflowClient
    from pyspark.sql import functions as F

    from engine.stream.query import run_stream_replay
    from engine.stream.sink import LATE_RULE
    from engine.tracking import SERIES_ACKED_LOST
    from expectations.trace_gate import SUITE as TRACE_SUITE
    from report.figures import RUN_PLOTS, run_figures
    from storage.lakehouse import Lakehouse, in_predicate

    specs = ["kafka-durable", "dledger-3"]
    policies = [parse_policy(p) for p in specs]
    lakehouse, checkpoint = tmp_path / "lakehouse", tmp_path / "checkpoint"
    cli = [sys.executable, "-m", "pipelines", "replay", "--trace", str(late_trace.trace), "--mode", "stream",
           "--lakehouse", str(lakehouse), "--checkpoint", str(checkpoint), "--no-mlflow",
           "--allowed-lateness-ms", str(late_trace.lateness_ms), *[a for p in specs for a in ("--policy", p)]]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "REPLAB_SPARK_MASTER": "local[2]",
           "REPLAB_WAREHOUSE_DIR": str(tmp_path / "warehouse"), "REPLAB_DRIVER_MEMORY": "1g"}
    if killed:
        kill_after_micro_batch(cli, env, tmp_path, batch=1, timeout_s=TIMEOUT_S)
        assert not json.loads((checkpoint / "stream.json").read_text())["published"]  # killed mid-way

    steps: list[str] = []
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    report = run_stream_replay(spark, ReplayRequest(
        trace=str(late_trace.trace), policies=policies, lakehouse=str(lakehouse), mode="stream",
        tracking_uri=tracking_uri, figures=run_figures, checkpoint=str(checkpoint),
        allowed_lateness_ms=late_trace.lateness_ms), progress=steps.append)
    # Publishing reports its steps, in order, after the stream's last micro-batch; MLflow's logging after them
    published = [s for s in steps if s in ("windows, output gate, Delta tables", "output gate", "Delta tables",
                                           "MLflow")]
    assert published == ["windows, output gate, Delta tables", "output gate", "Delta tables", "MLflow"], steps
    assert steps.index(published[0]) > max(i for i, s in enumerate(steps) if s.startswith("micro-batch"))
    run_ids = [r.run_id for r in report.runs]
    duration_us = read_events_arrow(late_trace.trace)[0].duration_us
    lh = Lakehouse(lakehouse, spark)
    mine = in_predicate("run_id", run_ids)

    assert_run_tables_equal_batch(spark, lh, mine, late_trace.reference, policies)

    runs = {r["run_id"]: r for r in lh.read("runs").where(mine).collect()}
    assert {(r["mode"], r["status"]) for r in runs.values()} == {("stream", "succeeded")}
    # The trace gate's row per run (written beside the runs' start, once, after the restart too)
    gated = lh.read("validations").where(mine).where(F.col("suite") == TRACE_SUITE).collect()
    assert sorted(r["run_id"] for r in gated) == sorted(run_ids) and all(r["success"] for r in gated)
    marks = lh.read("watermarks").where(mine).collect()
    for run_id in run_ids:
        rows = sorted((r for r in marks if r["run_id"] == run_id), key=lambda r: r["batch"])
        assert len({r["batch"] for r in rows}) == len(rows) >= 6  # each micro-batch once: 5 files, the end
        assert sum(r["rows_in"] for r in rows) == late_trace.rows
        assert sum(r["rows_late"] for r in rows) == len(late_trace.late_rows)
        assert [r["watermark_us"] for r in rows] == sorted(r["watermark_us"] for r in rows)
        assert rows[-1]["watermark_us"] > duration_us  # the end marker moved it past the end of the trace
    late = lh.read("quarantine").where(mine).where(F.col("rule") == LATE_RULE).collect()
    assert sorted((r["run_id"], r["file"], r["row"]) for r in late) == sorted(
        (run_id, str(late_trace.late_file), row) for run_id in run_ids for row in late_trace.late_rows)
    raw = {(r["run_id"], r["row"]): json.loads(r["raw"]) for r in late}
    assert [raw[(run_ids[0], row)] for row in late_trace.late_rows] == late_trace.late_raw

    # The MLflow runs, logged from the tables publishing still held (engine.publish.publishing): their summary and
    # per-window series agree with what the Delta tables hold, and each has its plots.
    client = MlflowClient(tracking_uri)
    summaries = {r["run_id"]: r for r in lh.read("run_summary").where(mine).collect()}
    windows = lh.read("loss_metrics").where(mine).groupBy("run_id", "window_start_us").agg(
        F.sum("acked_lost").alias("lost")).collect()
    for run_id in run_ids:
        run = client.get_run(report.mlflow[run_id])
        assert (run.info.status, run.data.tags["replab.mode"]) == ("FINISHED", "stream")
        assert run.data.metrics["acked_lost"] == summaries[run_id]["acked_lost"]
        series = {m.step: m.value for m in client.get_metric_history(run.info.run_id, SERIES_ACKED_LOST)}
        mine_windows = [w for w in windows if w["run_id"] == run_id]
        assert len(series) == len(mine_windows) > 1
        assert sum(series.values()) == sum(w["lost"] for w in mine_windows) == summaries[run_id]["acked_lost"]
        assert {f.path for f in client.list_artifacts(run.info.run_id, "plots")} == set(RUN_PLOTS)


@pytest.mark.slow  # generator and replay racing on 2 cores: minutes; the fast end-to-end case is the one above
def test_live_trace_replayed_while_it_is_written_equals_batch(spark, tmp_path):
    """`replab generate --live` appends time slices while `replab replay --mode stream` runs on the same trace
    (the README's live replay): the replay starts before the trace is complete, reads the slices as they come
    (processing-time triggers), gates the trace once `_COMPLETE` lands, and ends with batch mode's tables."""
    import threading

    from engine.stream.query import run_stream_replay
    from generators.generate import COMPLETE_MARKER, generate_trace
    from generators.library import resolve_scenario
    from storage.lakehouse import Lakehouse, in_predicate

    trace, lakehouse = tmp_path / "live", tmp_path / "lakehouse"
    failures: list[BaseException] = []

    def write_live() -> None:
        try:  # 7.5 s of trace: 8 one-second slices, one per wall-clock second
            generate_trace(spark, resolve_scenario("demo"), seed=2, scale=0.05, out=trace, live=True,
                           live_speed=1.0)
        except BaseException as exc:  # surfaced below, not lost in the thread
            failures.append(exc)

    writer = threading.Thread(target=write_live)
    writer.start()
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not (trace / "manifest.json").is_file():
            assert writer.is_alive() and time.monotonic() < deadline, failures
            time.sleep(0.05)
        assert not (trace / "events" / COMPLETE_MARKER).exists()  # the replay meets an incomplete trace
        specs = ["kafka-durable", "dledger-3"]
        report = run_stream_replay(spark, ReplayRequest(
            trace=str(trace), policies=[parse_policy(p) for p in specs], lakehouse=str(lakehouse), mode="stream",
            mlflow=False), live_trigger_seconds=1)
    finally:
        writer.join()
    assert not failures, failures
    files = sorted(p.name for p in (trace / "events").glob("part-*.parquet"))
    assert len(files) >= 3

    run_ids = [r.run_id for r in report.runs]
    lh, mine = Lakehouse(lakehouse, spark), in_predicate("run_id", run_ids)
    marks = lh.read("watermarks").where(mine).collect()
    assert sum(r["rows_in"] for r in marks) == len(run_ids) * read_events_arrow(trace)[1].num_rows
    assert sum(r["rows_late"] for r in marks) == 0
    assert len({r["batch"] for r in marks}) >= 2  # slices arrived over several micro-batches
    assert_run_tables_equal_batch(spark, lh, mine, trace, [parse_policy(p) for p in specs])
    assert {r["status"] for r in lh.read("runs").where(mine).collect()} == {"succeeded"}
