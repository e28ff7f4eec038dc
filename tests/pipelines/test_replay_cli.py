"""`replab replay` end to end (SPEC §6.1): every preset of every family in one pass on a generated trace, the
comparison table, the summary JSON, and every Delta table of SPEC §4-5 with its documented columns."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipelines.cli import main
from replay.local import replay_local
from replay.policies import parse_policy, presets
from schemas.outcomes import Fate, Status
from schemas.tables import SUMMARY_FIELDS, TABLES
from storage.trace_loader import read_events_arrow

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def replayed(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("replay-cli")
    trace = root / "trace"
    assert main(["generate", "--scenario", "chaos", "--seed", "3", "--scale", "0.01", "--out", str(trace)]) == 0
    names = list(presets())
    args = ["replay", "--trace", str(trace), "--lakehouse", str(root / "lh"), "--no-mlflow",
            "--summary-json", str(root / "summary.json")]
    for name in names:
        args += ["--policy", name]
    return root, trace, names, args


def test_every_preset_in_one_run(replayed, capsys):
    root, trace, names, args = replayed
    assert main(args) == 0
    out = capsys.readouterr().out
    for name in names:  # the table names policies as they were asked for, side by side
        assert name in out
    for header in ("acked lost", "availability", "ack p99 ms", "unavailable partition-s", "brokers"):
        assert header in out
    assert max(len(line) for line in out.splitlines()) <= 200  # a wide table, not folded into 80 columns

    summary = json.loads((root / "summary.json").read_text())
    assert [s["policy"] for s in summary] == [parse_policy(n).canonical() for n in names]  # --policy order
    manifest, table = read_events_arrow(trace)
    for s, name in zip(summary, names, strict=True):
        assert set(s) == {"policy", "run_id", *SUMMARY_FIELDS}
        results = replay_local(parse_policy(name), manifest, table, engine="kernel")
        status = np.concatenate([r.messages.records.status for r in results])
        fate = np.concatenate([r.messages.fate for r in results])
        acked = status == Status.ACKED
        assert s["produced"] == len(status), name
        assert s["acked"] == int(acked.sum()) and s["failed"] == int((status == Status.FAILED).sum()), name
        assert s["acked_lost"] == int((acked & (fate != Fate.COMMITTED)).sum()), name
        assert s["availability"] == pytest.approx(acked.mean()), name
        unavailable = sum(b - a for r in results for a, b in r.unavailable) / 1e6
        per_unit = s["unavailable_partition_seconds"]
        assert per_unit >= unavailable - 1e-9, name  # RocketMQ groups count once per queue they hold


def test_every_table_exists_with_its_documented_columns(replayed, spark):
    from deltalake import DeltaTable

    root, _, names, _ = replayed
    # The tables a replay writes (SPEC §4-5); the testbed's, the sweep's and the durability run's own tables are
    # written, and read back, by their jobs' tests (tests/testbed, tests/engine/test_sweep_tables.py,
    # tests/pipelines/test_durability_spark.py).
    replay_tables = {n: s for n, s in TABLES.items() if not n.startswith(("testbed_", "sweep", "durability_"))}
    assert len(replay_tables) == len(TABLES) - 6
    for name, spec in replay_tables.items():
        table = DeltaTable(str(root / "lh" / name))  # delta-rs: any Delta reader reads them (SPEC §5)
        assert [f.name for f in table.schema().fields] == spec.columns, name
    runs = spark.read.format("delta").load(str(root / "lh" / "runs")).collect()
    assert sorted(r.policy for r in runs) == sorted(parse_policy(n).canonical() for n in names)
    assert {r.status for r in runs} == {"succeeded"}
    suites = {r.suite for r in spark.read.format("delta").load(str(root / "lh" / "validations")).collect()}
    assert suites == {"trace_gate", "output_gate"}


def test_the_same_policy_twice_is_bad_input(replayed, capsys):
    _, trace, _, _ = replayed
    code = main(["replay", "--trace", str(trace), "--no-mlflow", "--policy", "kafka-durable",
                 "--policy", "kafka:min_insync_replicas=2"])
    assert code == 2
    assert "same policy" in capsys.readouterr().err


@pytest.mark.parametrize(("extra", "limit", "short_lived"), [
    ([], None, True),  # 5 events x 1 policy: small
    (["--policy", "kafka-durable"], 10, True),  # 5 x 2 = the limit
    (["--policy", "kafka-durable"], 9, False),  # one over it
    (["--mode", "stream"], None, False),  # a stream's trace may still be growing: its size at start says nothing
], ids=["small", "at-the-limit", "over-the-limit", "stream"])
def test_replay_starts_a_short_lived_jvm_only_for_a_small_batch_replay(tmp_path, monkeypatch, spark_start_spy, extra,
                                                                        limit, short_lived):
    """`replab replay` starts its JVM on C1 only (`get_spark(short_lived=True)`) when the trace's events times
    the policies are at most `engine.replay.SMALL_REPLAY_OUTCOMES`, counted before Spark starts."""
    from bench.fixed_cost_bench import write_tiny_trace
    from engine import replay as engine_replay

    if limit is not None:
        monkeypatch.setattr(engine_replay, "SMALL_REPLAY_OUTCOMES", limit)
    trace = write_tiny_trace(tmp_path / "trace")  # 5 events: 3 produce, 2 replicate
    with pytest.raises(spark_start_spy.started):
        main(["replay", "--trace", str(trace), "--policy", "kafka-acks1", "--no-mlflow",
              "--lakehouse", str(tmp_path / "lh"), *extra])
    assert spark_start_spy.asked == [short_lived]


def test_a_missing_trace_is_not_short_lived():
    from engine.plan import ReplayRequest
    from engine.replay import short_lived_jvm

    assert not short_lived_jvm(ReplayRequest(trace="/nonexistent/trace", policies=[parse_policy("kafka-acks1")],
                                             lakehouse="/tmp/unused", mlflow=False))


def test_a_corrupt_parquet_trace_is_not_short_lived(tmp_path):
    """A footer that cannot be read makes the replay not small, and the trace gate, not this count, reports it."""
    import json

    from engine.plan import ReplayRequest
    from engine.replay import short_lived_jvm

    trace = tmp_path / "trace"
    (trace / "events").mkdir(parents=True)
    (trace / "manifest.json").write_text(json.dumps({
        "format": "replab-trace", "version": 1, "trace_id": "corrupt", "brokers": [{"id": 0, "rack": "a"}],
        "duration_us": 10, "seed": None, "generator": None}))
    (trace / "events" / "part-0.parquet").write_bytes(b"not a parquet file")
    assert not short_lived_jvm(ReplayRequest(trace=str(trace), policies=[parse_policy("kafka-acks1")],
                                             lakehouse=str(tmp_path / "lh"), mlflow=False))
