"""Trace generation (SPEC §8): determinism, layout and columns, validity (the trace gate), scale, live mode."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from expectations.trace_gate import check_trace_rules
from generators.generate import COMPLETE_MARKER, build_plan, chunk_table, generate_trace
from generators.library import resolve_scenario, scenario_files
from generators.timeline import fault_events, to_us
from pipelines.cli import main
from schemas.trace import EVENT_ARROW_SCHEMA, Kind, Manifest
from schemas.units import S
from storage.trace_loader import read_events_arrow, read_events_spark

pytestmark = pytest.mark.spark

DEMO_SCALE = 0.2  # 30 s of trace at 800 msg/s: every demo fault, ~45 k events


def files_of(trace: Path) -> dict[str, bytes]:
    out = {"manifest.json": (trace / "manifest.json").read_bytes()}
    for f in sorted((trace / "events").iterdir()):
        out[f"events/{f.name}"] = f.read_bytes()
    return out


def check_valid(spark, trace: Path) -> dict[str, int]:
    """Run the trace gate (SPEC §2.3, expectations/trace_gate.py); return the per-rule counts."""
    manifest, events = read_events_spark(spark, trace, with_location=True)
    report = check_trace_rules(spark, events, manifest)
    try:
        return report.counts
    finally:
        report.release()


@pytest.fixture(scope="module")
def demo_trace(spark, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gen") / "demo"
    generate_trace(spark, resolve_scenario("demo"), seed=5, scale=DEMO_SCALE, out=out, target_events_per_chunk=8000)
    return out


def test_same_seed_same_bytes(spark, demo_trace, tmp_path):
    again = tmp_path / "again"
    generate_trace(spark, resolve_scenario("demo"), seed=5, scale=DEMO_SCALE, out=again, target_events_per_chunk=8000)
    first, second = files_of(demo_trace), files_of(again)
    assert len(first) > 4  # several event files, a marker, the manifest
    assert list(first) == list(second)
    assert all(first[name] == second[name] for name in first)
    other = tmp_path / "other-seed"
    generate_trace(spark, resolve_scenario("demo"), seed=6, scale=DEMO_SCALE, out=other, target_events_per_chunk=8000)
    assert files_of(other)["events/part-000000.parquet"] != first["events/part-000000.parquet"]


def test_layout_schema_and_order(demo_trace):
    names = sorted(p.name for p in (demo_trace / "events").iterdir())
    parts = [n for n in names if n.startswith("part-")]
    assert names == [COMPLETE_MARKER, *parts]
    assert parts == [f"part-{i:06d}.parquet" for i in range(len(parts))]
    assert json.loads((demo_trace / "events" / COMPLETE_MARKER).read_text()) == {"files": len(parts)}
    for p in parts:
        assert pq.read_schema(demo_trace / "events" / p).remove_metadata() == EVENT_ARROW_SCHEMA
    _, table = read_events_arrow(demo_trace)  # files in name order
    kind_order = {k.label: int(k) for k in Kind}
    ts = table["ts_us"].to_numpy()
    order = np.array([kind_order[k] for k in table["kind"].to_pylist()])
    msg = table["msg_id"].fill_null(0).to_numpy()
    broker = table["broker"].fill_null(-1).to_numpy()
    # One sort key over the whole trace: every file sorted, and files in time order (SPEC §2.2).
    key = np.lexsort((broker, msg, order, ts))
    assert (key == np.arange(len(key))).all()


def test_columns_follow_the_scenario(demo_trace):
    manifest, table = read_events_arrow(demo_trace)
    sc = resolve_scenario("demo")
    kinds = table["kind"]
    produce = table.filter(pc.equal(kinds, "produce"))
    n = produce.num_rows
    assert n == manifest.generator["produce_events"]
    assert abs(n - sc.workload.rate_per_s * DEMO_SCALE * manifest.duration_us / 1e6) < 5 * np.sqrt(n)
    assert produce["msg_id"].to_pylist() == list(range(1, n + 1))  # dense, in produce-time order
    keys = produce["key"]
    assert abs(keys.null_count / n - sc.workload.keys.unkeyed_share) < 0.03
    named = pc.drop_null(keys)
    assert pc.all(pc.match_substring_regex(named, r"^k\d{5}$")).as_py()
    counts = pc.value_counts(named).to_pylist()
    assert max(counts, key=lambda c: c["counts"])["values"] == "k00000"  # Zipf: the first key is the hottest
    assert pc.min(produce["size_bytes"]).as_py() >= 64 and pc.max(produce["size_bytes"]).as_py() <= 65536
    assert set(produce["producer_id"].to_pylist()) == set(range(sc.workload.producers))
    for col in ("broker", "upto_us"):
        assert produce[col].null_count == n
    others = table.filter(pc.not_equal(kinds, "produce"))
    for col in ("msg_id", "key", "size_bytes", "producer_id"):
        assert others[col].null_count == others.num_rows
    assert set(others["broker"].to_pylist()) == set(sc.broker_ids)
    assert pc.min(table["ts_us"]).as_py() >= 0 and pc.max(table["ts_us"]).as_py() <= manifest.duration_us
    faults = others.filter(pc.not_equal(others["kind"], "replicate"))
    expected = fault_events(sc, 5, DEMO_SCALE)
    assert [(r["ts_us"], r["kind"], r["broker"]) for r in faults.to_pylist()] == [
        (e.ts_us, e.kind.label, e.broker) for e in expected]
    assert {e.kind for e in expected} >= {Kind.CRASH, Kind.RESTART, Kind.ISOLATE, Kind.HEAL, Kind.POWER_LOSS}


def test_reports_stall_and_catch_up(demo_trace):
    _, table = read_events_arrow(demo_trace)
    rep = table.filter(pc.equal(table["kind"], "replicate")).to_pandas()
    assert (rep["upto_us"] <= rep["ts_us"]).all() and (rep["upto_us"] >= 0).all()
    # Broker 4 stalls over [45 s, 95 s) of the unscaled demo: no report in that stretch.
    b4 = rep[rep.broker == 4]
    stall = (45e6 * DEMO_SCALE, 95e6 * DEMO_SCALE)
    assert not ((b4.ts_us >= stall[0]) & (b4.ts_us < stall[1])).any()
    assert ((b4.ts_us >= stall[0] - 20_000) & (b4.ts_us < stall[0])).any()
    # Broker 0 crashes at 30 s and restarts at 75 s; from the restart it catches up from where its data
    # ended, at catchup_speed (10) trace µs per µs, then tracks the leader again.
    crash, restart = 30e6 * DEMO_SCALE, 75e6 * DEMO_SCALE
    b0 = rep[rep.broker == 0]
    assert not ((b0.ts_us >= crash) & (b0.ts_us < restart)).any()
    before = b0[b0.ts_us < crash].iloc[-1]
    after = b0[b0.ts_us >= restart]
    first = after.iloc[0]
    assert first.ts_us - restart < 20_000
    assert before.upto_us <= first.upto_us <= before.upto_us + 10 * (first.ts_us - restart) + 1
    catching = after[after.ts_us < restart + 0.5e6]
    slope = np.diff(catching.upto_us) / np.diff(catching.ts_us)
    assert np.allclose(slope, 10, atol=0.01)
    assert (after.upto_us.diff().dropna() >= 0).all()
    late = after[after.ts_us > restart + 2e6]
    assert (late.ts_us - late.upto_us).median() <= 10_000  # delay median 2 ms (GC pauses add a little)


def test_generated_traces_pass_the_trace_gate(spark, demo_trace, tmp_path):
    counts = check_valid(spark, demo_trace)
    assert set(counts.values()) == {0}, counts
    chaos = resolve_scenario("chaos")
    for seed in (0,):  # more seeds and scenarios: the slow suite
        out = tmp_path / f"chaos-{seed}"
        result = generate_trace(spark, chaos, seed=seed, scale=0.05, out=out)
        assert result.count("faults") > 0
        counts = check_valid(spark, out)
        assert set(counts.values()) == {0}, (seed, counts)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["chaos", "flaky-network", "rolling-restart", "slow-disk", "rack-power-loss"])
def test_many_seeds_pass_the_trace_gate(spark, tmp_path, name):
    scenario = resolve_scenario(name)
    for seed in range(20 if name == "chaos" else 8):
        out = tmp_path / f"{name}-{seed}"
        generate_trace(spark, scenario, seed=seed, scale=0.04 if name == "chaos" else 0.1, out=out)
        counts = check_valid(spark, out)
        assert set(counts.values()) == {0}, f"{name} seed {seed}: {counts} (replab generate --scenario {name} " \
                                            f"--seed {seed})"


def test_scale_multiplies_rate_and_duration():
    sc = resolve_scenario("k2-acks1-leader-crash")
    small, big = build_plan(sc, 3, 0.1), build_plan(sc, 3, 0.2)
    assert (small.duration_us, big.duration_us) == (12_000_000, 24_000_000)
    assert abs(big.produce_count / small.produce_count - 4) < 0.3  # rate × 2 and duration × 2
    assert list(big.fault_ts_us) == [2 * t for t in small.fault_ts_us]
    reports = [sum(int(chunk_table(p, c)[1][1]) for c in range(p.n_chunks)) for p in (small, big)]
    assert abs(reports[1] / reports[0] - 2) < 0.1  # fetch cadence is not scaled: reports grow with duration


def test_rate_shapes():
    """Messages per second follow the scenario's rate curve (diurnal: rolling-restart; bursty: chaos)."""
    diurnal = build_plan(resolve_scenario("rolling-restart"), 1, 1.0)  # 3000/s · (1 + 0.4 cos(2π t / 720 s))
    t = np.arange(diurnal.n_blocks) + 0.5
    expected = 3000 * (1 + 0.4 * np.cos(2 * np.pi * t / 720))
    assert np.abs(diurnal.block_counts - expected).max() < 6 * np.sqrt(expected.max())
    assert diurnal.block_counts[:10].mean() > 1.3 * 3000 and diurnal.block_counts[355:365].mean() < 0.7 * 3000
    bursty = build_plan(resolve_scenario("chaos"), 1, 1.0)  # 5000/s, × 3 during 10 s bursts
    inside = bursty.rate.multiplier(np.arange(bursty.n_blocks) * 1e6 + 0.5e6) == 3
    assert 0.02 < inside.mean() < 0.2
    assert abs(bursty.block_counts[inside].mean() / bursty.block_counts[~inside].mean() - 3) < 0.1
    # Inside a block, times follow the curve too: a burst starting mid-block shows up in its half.
    edge = int(bursty.rate.burst_starts_us[0] // 1_000_000)
    table, _ = chunk_table(build_plan(resolve_scenario("chaos"), 1, 1.0, slice_blocks=1), edge)
    ts = table.filter(pc.equal(table["kind"], "produce"))["ts_us"].to_numpy()
    start = bursty.rate.burst_starts_us[0]
    before, after = (ts < start).sum() / (start - edge * 1e6), (ts >= start).sum() / ((edge + 1) * 1e6 - start)
    assert after > 2 * before


def test_chunks_do_not_change_the_events():
    """Events come from per-block seeds and per-report hashes: how blocks group into files is invisible."""
    sc = resolve_scenario("demo")
    one = build_plan(sc, 2, 0.1, target_events_per_chunk=10**9)
    many = build_plan(sc, 2, 0.1, target_events_per_chunk=3000)
    assert one.n_chunks == 1 and many.n_chunks > 3
    whole = chunk_table(one, 0)[0]
    parts = pa.concat_tables([chunk_table(many, c)[0] for c in range(many.n_chunks)])
    assert parts.equals(whole)


def test_manifest(demo_trace):
    manifest = Manifest.read(demo_trace)
    raw = json.loads((demo_trace / "manifest.json").read_text())
    assert manifest.trace_id == "demo-s5-x0.2"
    assert [(b.id, b.rack) for b in manifest.brokers] == [(i, f"r{i % 3}") for i in range(6)]
    assert manifest.duration_us == 30_000_000 and manifest.seed == 5
    gen = raw["generator"]
    assert (gen["scenario"], gen["seed"], gen["scale"]) == ("demo", 5, DEMO_SCALE)
    assert gen["parameters"] == resolve_scenario("demo").to_json()
    assert gen["parameters"]["faults"]["scheduled"][0] == {"at_ms": 30000.0, "kind": "crash", "brokers": [0],
                                                           "group": False}


def test_live_mode_appends_time_slices(spark, tmp_path):
    sc = resolve_scenario("k1-acks0-leader-crash")
    out = tmp_path / "live"
    seen: list[tuple[float, bool, tuple[str, ...]]] = []
    done = threading.Event()

    def look():
        events = out / "events"
        parts = tuple(sorted(p.name for p in events.iterdir() if p.name.startswith("part-"))) \
            if events.is_dir() else ()
        seen.append((time.monotonic(), (out / "manifest.json").is_file(), parts))

    def watch():
        while not done.is_set():
            look()
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        # 6 s of trace at 2 trace seconds per second: three 2-second slices, released about 1 s apart.
        result = generate_trace(spark, sc, seed=4, scale=0.05, out=out, live=True, live_speed=2.0)
    finally:
        done.set()
        watcher.join()
    look()
    parts = [f"part-{i:06d}.parquet" for i in range(3)]
    assert sorted(p.name for p in (out / "events").iterdir()) == [COMPLETE_MARKER, *parts]
    appeared = {}
    for t, has_manifest, names in seen:
        for name in names:
            appeared.setdefault(name, t)
            assert has_manifest  # the manifest comes first
    assert list(appeared) == parts  # one slice at a time, in time order
    assert appeared[parts[2]] - appeared[parts[0]] >= 1.5  # paced by the wall clock (2 s of trace per second)
    assert not (out / "_staging_events").exists()
    # Same events as the batch trace, only split differently.
    batch = tmp_path / "batch"
    generate_trace(spark, sc, seed=4, scale=0.05, out=batch)
    assert read_events_arrow(out)[1].equals(read_events_arrow(batch)[1])
    assert result.events == read_events_arrow(batch)[1].num_rows
    assert (out / "manifest.json").read_bytes() == (batch / "manifest.json").read_bytes()


@pytest.mark.parametrize("name", sorted(scenario_files()))
def test_every_library_scenario_generates_through_the_cli(spark, tmp_path, name, capsys):
    out = tmp_path / name
    assert main(["generate", "--scenario", name, "--seed", "1", "--scale", "0.05", "--out", str(out)]) == 0
    line = capsys.readouterr().out
    assert re.search(rf"trace {re.escape(name)}-s1-x0\.05, [\d,]+ events", line), line
    manifest, table = read_events_arrow(out)
    sc = resolve_scenario(name)
    assert manifest.generator["scenario"] == name
    assert manifest.duration_us == to_us(sc.workload.duration_s, S, 0.05)
    kinds = table["kind"].to_pylist()
    assert kinds.count("produce") == manifest.generator["produce_events"] > 0
    assert kinds.count("replicate") > 0
    assert len(kinds) - kinds.count("produce") - kinds.count("replicate") == len(fault_events(sc, 1, 0.05))


@pytest.mark.slow
def test_every_library_scenario_passes_the_trace_gate(spark, tmp_path):
    for name in scenario_files():
        out = tmp_path / name
        generate_trace(spark, resolve_scenario(name), seed=11, scale=0.1, out=out)
        counts = check_valid(spark, out)
        assert set(counts.values()) == {0}, (name, counts)
