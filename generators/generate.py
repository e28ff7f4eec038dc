"""Generate a trace (SPEC §2) from a scenario (SPEC §8) with Spark, deterministically.

How a trace is built
--------------------
The driver computes only small things (the `TracePlan`): the fault timeline, each broker's stall schedule and
catch-up points, the number of messages in every one-second block (Poisson around the rate curve), and how
blocks group into chunks of about a million events. The plan is broadcast; Spark tasks (a couple per core, each taking
several chunks in turn) build each chunk's events with numpy and write them as one Parquet file. The trace never
passes through the driver, and a worker holds one chunk at a time.

- `produce`: block b's messages come from a generator seeded by (seed, b): times follow the rate shape inside
  the block (inverse CDF over 10 ms bins), keys are Zipf over the key space (`k00042`, null for the unkeyed
  share), sizes and producers from the scenario. msg_id is dense, 1..n in produce-time order: block b's ids
  start after the messages of blocks 0..b-1 (a prefix sum on the driver), so chunks need no coordination.
- `replicate`: broker k's j-th report is due at phase_k + j·fetch_interval ± jitter; its randomness is a
  counter-based hash of (seed, broker, j), so any task can compute any report. upto_us = ts_us − delay,
  made non-decreasing by a running maximum (a report older than the largest delay can never raise it, so a
  task looks back only that far), and capped after every stretch without reports (down, isolated, stalled)
  by a catch-up line: from the data the broker held when the stretch began (its last report; nothing after a
  disk loss; after a power loss its last report too, since what was flushed is the policy's business, §3.1,
  and a follower re-fetches its lost tail with the rest of the backlog), at `catchup_speed` µs of data per µs.
  No report falls in a stretch where the broker is down, isolated or stalled. Every broker reports, leader or
  not (the trace is policy-independent, SPEC §1).
- faults: `generators.timeline` (valid by construction, SPEC §2.3).

Because every block and every report is generated from its own seed, the events do not depend on how blocks
group into chunks: a live trace (one-second slices) holds the same events as a batch one.

Scale
-----
`--scale X` multiplies the message rate and the duration (so a trace has about X² times the messages), and
stretches the fault profile with the duration, so that its shape is unchanged: every scheduled fault and stall
time, every random-fault MTBF and MTTR, slow-follower episode times and lengths, rolling-restart downtimes and
gaps, and the rate shape's period and burst times are multiplied by X. The same seed therefore gives the same
faults, in the same order, at the same fractions of the trace, at any scale (times rounded to the µs). Not
scaled: the broker count, keys, sizes, producers, fetch cadence and delays, GC pauses (a JVM property: their
count grows with the duration) and the catch-up speed.

Output layout
-------------
`<out>/manifest.json` and `<out>/events/part-NNNNNN.parquet` (six digits, zero-padded): file k holds the
events of chunk k, sorted by (ts_us, kind order of SPEC §2.2, msg_id, broker), and every event of file k comes
before every event of file k+1 in that order, so the lexicographic order of names is the time order. Plain
Parquet files with exactly `schemas.trace.EVENT_ARROW_SCHEMA` (zstd, no partition columns), and
`events/_COMPLETE` (ignored by Parquet readers: leading underscore) holding the file count once all are in.
Batch mode writes the events first (into a staging folder renamed into place) and the manifest last; live mode
(`--live`) writes the manifest first, then moves one file per slice of trace time into `events/` when the wall
clock reaches the slice's end (`--live-speed` trace seconds per second), each file complete before it appears.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from generators.model import Dist, DistKind, RateShape, Scenario, ShapeKind
from generators.timeline import STREAM_SHAPE, BrokerBlocks, broker_blocks, fault_events, rng_for, stall_episodes, to_us
from schemas.errors import BadInput
from schemas.trace import EVENT_ARROW_SCHEMA, KIND_LABELS, Broker, Kind, Manifest
from schemas.units import MS, S

BLOCK_US = S  # the unit of produce randomness and of live slices
SUB_BINS = 100  # rate-shape resolution inside a block (10 ms)
TARGET_EVENTS_PER_CHUNK = 1_000_000
TASK_WAVES = 2  # tasks per unit of spark.default.parallelism
MAX_EVENTS = 50_000_000_000  # a guard against a typo in --scale, not a limit of the design
STREAM_COUNTS = 10
STREAM_PRODUCE = 11
_HASH_JITTER, _HASH_DELAY_U, _HASH_DELAY_Z, _HASH_PHASE = 1, 2, 3, 4
PART_NAME = "part-{:06d}.parquet"
COMPLETE_MARKER = "_COMPLETE"
#: Delta encoding suits the sorted time and id columns (4x smaller and faster to read than plain/dictionary).
_PARQUET_OPTIONS = {
    "compression": "zstd",
    "use_dictionary": ["kind", "key"],
    "column_encoding": {"ts_us": "DELTA_BINARY_PACKED", "msg_id": "DELTA_BINARY_PACKED",
                        "upto_us": "DELTA_BINARY_PACKED"},
}


# ---------------------------------------------------------------------------------------------------------
# Counter-based randomness for replicate reports (splitmix64): any task can draw report j of broker k.

_M1, _M2, _GOLDEN = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)
_MASK64 = (1 << 64) - 1


def _mix64(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def _hash_key(*parts: int) -> int:
    h = 0x243F6A8885A308D3
    for p in parts:
        h = int(_mix64(np.array([(h ^ (p & _MASK64)) & _MASK64], dtype=np.uint64))[0])
    return h


def _uniforms(key: int, j: np.ndarray) -> np.ndarray:
    """Uniform floats in [0, 1), one per counter j, for the stream `key`."""
    with np.errstate(over="ignore"):
        x = _mix64(np.uint64(key) + j.astype(np.uint64) * _GOLDEN)
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def _inside(starts: np.ndarray, ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Whether each t falls in one of the sorted, disjoint [starts, ends) intervals."""
    if len(starts) == 0:
        return np.zeros(np.shape(t), dtype=bool)
    i = np.searchsorted(starts, t, side="right") - 1
    return (i >= 0) & (t < ends[np.maximum(i, 0)])


# ---------------------------------------------------------------------------------------------------------
# The plan (driver side, small, broadcast to the tasks)


@dataclass(frozen=True)
class ReporterPlan:
    """Everything a task needs to draw one broker's `replicate` reports."""

    broker: int
    interval_us: int
    jitter_us: int
    phase_us: int
    delay: Dist  # in ms
    max_delay_us: int
    catchup_speed: float
    hash_key: int
    blocks: BrokerBlocks
    resume_us: np.ndarray  # catch-up lines: start instant ...
    resume_from_us: np.ndarray  # ... and the data the broker held then

    def grid_range(self, lo_us: int, hi_us: int) -> tuple[int, int]:
        """Report indices [j_lo, j_hi) whose due time (± jitter) may fall in [lo_us, hi_us]."""
        j_lo = max(0, (lo_us - self.jitter_us - self.phase_us) // self.interval_us - 1)
        j_hi = max(j_lo, (hi_us + self.jitter_us - self.phase_us) // self.interval_us + 2)
        return int(j_lo), int(j_hi)

    def reports(self, j_lo: int, j_hi: int) -> tuple[np.ndarray, np.ndarray]:
        """(ts_us, upto_us) of reports j_lo..j_hi-1, before any blocking; upto is exact for reports at least
        max_delay_us after report j_lo: an older report has upto <= its ts < ts - max_delay <= this raw
        upto, so the running maximum needs no longer look-back."""
        j = np.arange(j_lo, j_hi, dtype=np.int64)
        u = _uniforms(self.hash_key ^ _HASH_JITTER, j)
        ts = self.phase_us + j * self.interval_us + np.rint((2.0 * u - 1.0) * self.jitter_us).astype(np.int64)
        du = _uniforms(self.hash_key ^ _HASH_DELAY_U, j)
        z = None
        if self.delay.kind is DistKind.LOGNORMAL:
            dz = _uniforms(self.hash_key ^ _HASH_DELAY_Z, j)
            z = np.sqrt(-2.0 * np.log1p(-du)) * np.cos(2.0 * np.pi * dz)  # Box-Muller
        delay_us = np.clip(np.floor(self.delay.transform(du, z) * MS), 0, self.max_delay_us).astype(np.int64)
        upto = np.maximum.accumulate(np.maximum(ts - delay_us, 0))
        resume, base = self.resume_us, self.resume_from_us
        if len(resume):
            r = np.searchsorted(resume, ts, side="right") - 1
            has = r >= 0
            rr = np.where(has, r, 0)
            line = base[rr] + np.floor((ts - resume[rr]) * self.catchup_speed).astype(np.int64)
            upto = np.where(has, np.minimum(upto, line), upto)
        return ts, upto

    def blocked(self, ts: np.ndarray) -> np.ndarray:
        return _inside(self.blocks.starts_us, self.blocks.ends_us, ts)

    def window_reports(self, lo_us: int, hi_us: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact (ts_us, upto_us) of the reports due in [lo_us, hi_us], blocked ones included."""
        j_lo, j_hi = self.grid_range(lo_us - self.max_delay_us - self.jitter_us, hi_us)
        ts, upto = self.reports(j_lo, j_hi)
        keep = (ts >= lo_us) & (ts <= hi_us)
        return ts[keep], upto[keep]


@dataclass(frozen=True)
class RateCurve:
    """The message rate over trace time (scaled): rate_per_s × multiplier(t)."""

    rate_per_s: float
    shape: RateShape
    period_us: int | None = None  # diurnal
    burst_starts_us: np.ndarray | None = None  # bursty, merged [start, end)
    burst_ends_us: np.ndarray | None = None

    def multiplier(self, t_us: np.ndarray) -> np.ndarray:
        shape = self.shape
        if shape.kind is ShapeKind.DIURNAL:
            return 1.0 + shape.amplitude * np.sin(2.0 * np.pi * (t_us / self.period_us + shape.phase))
        if shape.kind is ShapeKind.BURSTY:
            return np.where(_inside(self.burst_starts_us, self.burst_ends_us, t_us), shape.factor, 1.0)
        return np.ones(np.shape(t_us))


@dataclass(frozen=True)
class TracePlan:
    trace_id: str
    seed: int
    scale: float
    duration_us: int
    scenario: Scenario
    rate: RateCurve
    block_counts: np.ndarray  # produce events per block
    block_first_msg: np.ndarray  # msg ids of block b are block_first_msg[b] + 1 ..
    chunk_blocks: np.ndarray  # chunk c = blocks [chunk_blocks[c], chunk_blocks[c + 1])
    fault_ts_us: np.ndarray
    fault_kind: np.ndarray
    fault_broker: np.ndarray
    reporters: tuple[ReporterPlan, ...]

    @property
    def n_blocks(self) -> int:
        return len(self.block_counts)

    @property
    def n_chunks(self) -> int:
        return len(self.chunk_blocks) - 1

    @property
    def produce_count(self) -> int:
        return int(self.block_counts.sum())

    def chunk_span(self, c: int) -> tuple[int, int, bool]:
        """[lo_us, hi_us) of chunk c, and whether it is the last (which also holds ts_us = duration_us)."""
        lo = int(self.chunk_blocks[c]) * BLOCK_US
        last = c == self.n_chunks - 1
        hi = self.duration_us if last else int(self.chunk_blocks[c + 1]) * BLOCK_US
        return lo, hi, last


def trace_id_for(scenario: Scenario, seed: int, scale: float) -> str:
    """Distinct per (scenario, seed, scale): run ids hash the trace id (SPEC §4.4), so seeds must not collide."""
    return f"{scenario.name}-s{seed}" + ("" if scale == 1 else f"-x{scale:g}")


def build_plan(scenario: Scenario, seed: int, scale: float, *, slice_blocks: int | None = None,
               target_events_per_chunk: int = TARGET_EVENTS_PER_CHUNK) -> TracePlan:
    """The driver's part: everything small. `slice_blocks` fixes chunks to that many blocks (live slices)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not (0 <= seed < 2**63):
        raise BadInput(f"--seed must be an integer in [0, 2^63), got {seed!r}", rule="arguments")
    if not (isinstance(scale, int | float) and math.isfinite(scale) and scale > 0):
        raise BadInput(f"--scale must be a number > 0, got {scale!r}", rule="arguments")
    wl = scenario.workload
    duration_us = to_us(wl.duration_s, S, scale)
    if duration_us < 1:
        raise BadInput(f"--scale {scale:g} leaves a trace shorter than 1 µs", rule="arguments")
    rate = wl.rate_per_s * scale
    expected = rate * duration_us / S * (wl.shape.factor or 1.0)
    if expected > MAX_EVENTS:
        raise BadInput(f"--scale {scale:g} asks for about {expected:.3g} messages (more than {MAX_EVENTS:.0e})",
                       rule="arguments")

    shape = wl.shape
    curve = RateCurve(rate, shape)
    if shape.kind is ShapeKind.DIURNAL:
        curve = RateCurve(rate, shape, period_us=to_us(shape.period_s, S, scale))
    elif shape.kind is ShapeKind.BURSTY:
        starts, ends = _bursts(seed, shape.every_s, shape.length_s, wl.duration_s, scale)
        curve = RateCurve(rate, shape, burst_starts_us=starts, burst_ends_us=ends)
    n_blocks = -(-duration_us // BLOCK_US)
    # Expected messages per block: the rate curve averaged over 10 ms bins; the count is Poisson around it.
    lam = np.empty(n_blocks)
    for lo in range(0, n_blocks, 4096):  # bounded memory for very long traces
        blocks = np.arange(lo, min(n_blocks, lo + 4096))
        starts = blocks * BLOCK_US
        lengths = np.minimum(starts + BLOCK_US, duration_us) - starts
        centers = starts[:, None] + (np.arange(SUB_BINS) + 0.5)[None, :] * (lengths[:, None] / SUB_BINS)
        lam[blocks] = rate * lengths / S * curve.multiplier(centers).mean(axis=1)
    counts = rng_for(seed, STREAM_COUNTS).poisson(lam).astype(np.int64)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)

    faults = fault_events(scenario, seed, scale)
    stalls = stall_episodes(scenario, seed, scale)
    blocks = broker_blocks(scenario, faults, stalls, duration_us)
    reporters = tuple(_reporter(scenario, seed, b, blocks[b], duration_us) for b in scenario.broker_ids)

    reports_per_block = sum(BLOCK_US / r.interval_us for r in reporters)
    if slice_blocks is not None:
        chunk_blocks = np.append(np.arange(0, n_blocks, slice_blocks), n_blocks).astype(np.int64)
    else:
        chunk_blocks = _pack_chunks(counts + reports_per_block, target_events_per_chunk)
    return TracePlan(
        trace_id=trace_id_for(scenario, seed, scale), seed=seed, scale=scale, duration_us=duration_us,
        scenario=scenario, rate=curve, block_counts=counts, block_first_msg=first, chunk_blocks=chunk_blocks,
        fault_ts_us=np.array([e.ts_us for e in faults], dtype=np.int64),
        fault_kind=np.array([int(e.kind) for e in faults], dtype=np.int8),
        fault_broker=np.array([e.broker for e in faults], dtype=np.int32),
        reporters=reporters,
    )


def _bursts(seed: int, every_s: float, length_s: float, duration_s: float, scale: float):
    rng = rng_for(seed, STREAM_SHAPE)
    starts, t = [], 0.0
    while True:
        t += rng.exponential(every_s)
        if t > duration_s:
            break
        starts.append(t)
    merged: list[list[int]] = []
    for s in starts:
        a, b = to_us(s, S, scale), to_us(s + length_s, S, scale)
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return (np.array([m[0] for m in merged], dtype=np.int64), np.array([m[1] for m in merged], dtype=np.int64))


def _pack_chunks(events_per_block: np.ndarray, target: int) -> np.ndarray:
    """Block boundaries of chunks holding about `target` events each (deterministic from the counts)."""
    cum = np.cumsum(events_per_block)
    total = float(cum[-1]) if len(cum) else 0.0
    n_chunks = max(1, math.ceil(total / target))
    cuts = np.searchsorted(cum, np.arange(1, n_chunks) * (total / n_chunks), side="left") + 1
    bounds = np.unique(np.concatenate([[0], cuts, [len(events_per_block)]]))
    return bounds.astype(np.int64)


def _reporter(scenario: Scenario, seed: int, b: int, blocks: BrokerBlocks, duration_us: int) -> ReporterPlan:
    beh = scenario.replication.for_broker(b)
    interval = max(1, to_us(beh.fetch_interval_ms, MS))
    jitter = to_us(beh.fetch_jitter_ms, MS)
    key = _hash_key(seed, 0x5EB1CA7E, b)
    phase = int(_uniforms(key ^ _HASH_PHASE, np.zeros(1, np.int64))[0] * interval)
    rp = ReporterPlan(b, interval, jitter, phase, beh.delay_ms, math.ceil(beh.delay_ms.upper_bound * MS),
                      beh.catchup_speed, key, blocks, np.zeros(0, np.int64), np.zeros(0, np.int64))
    # Catch-up lines, in time order: each starts where a stretch without reports ends, from the data the
    # broker held when the stretch began: its last report before it (computed with the lines so far), or
    # the previous line's start if it has not reported since, or nothing after a disk loss.
    resume, base = [], []
    prev_end, prev_base = 0, 0
    for i in range(len(blocks.starts_us)):
        start, end = int(blocks.starts_us[i]), int(blocks.ends_us[i])
        if end > duration_us:
            break
        held = prev_base
        if start > prev_end:
            probe = ReporterPlan(**{**rp.__dict__, "resume_us": np.array(resume, np.int64),
                                    "resume_from_us": np.array(base, np.int64)})
            ts, upto = probe.window_reports(max(prev_end, start - 4 * interval - jitter), start - 1)
            ok = (ts >= prev_end) & (ts >= 0) & (ts < start)
            if ok.any():
                held = int(upto[ok][-1])
            elif start - prev_end > 4 * interval + 2 * jitter:
                raise AssertionError("a broker must report between two stretches this far apart")
        if blocks.disk_lost[i]:
            held = 0
        resume.append(end)
        base.append(held)
        prev_end, prev_base = end, held
    return ReporterPlan(**{**rp.__dict__, "resume_us": np.array(resume, np.int64),
                           "resume_from_us": np.array(base, np.int64)})


# ---------------------------------------------------------------------------------------------------------
# One chunk (runs in a Spark task, or anywhere: it only needs the plan)


@dataclass(frozen=True)
class _KeyTable:
    """Zipf key sampling by inverse CDF with a guide table (Chen's method: a bucket of u tells where the
    search starts, so a draw costs a gather and about one comparison instead of a binary search)."""

    cdf: np.ndarray
    guide: np.ndarray
    names: pa.Array

    def draw(self, u: np.ndarray) -> np.ndarray:
        key = self.guide[np.minimum((u * len(self.guide)).astype(np.int64), len(self.guide) - 1)]
        todo = np.flatnonzero(self.cdf[key] <= u)
        while len(todo):
            key[todo] += 1
            todo = todo[self.cdf[key[todo]] <= u[todo]]
        return key


@functools.cache
def _key_table(count: int, zipf_s: float) -> _KeyTable:
    weights = 1.0 / np.arange(1, count + 1, dtype=np.float64) ** zipf_s
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    cdf[-1] = np.inf  # every u < 1 stops at the last key at the latest
    guide = np.searchsorted(cdf, np.arange(count) / count, side="right").astype(np.int32)
    width = max(5, len(str(count - 1)))
    names = pa.array([f"k{i:0{width}d}" for i in range(count)], type=pa.string())
    return _KeyTable(cdf, guide, names)


def _produce(plan: TracePlan, block_lo: int, block_hi: int) -> dict[str, np.ndarray]:
    wl = plan.scenario.workload
    keys = _key_table(wl.keys.count, wl.keys.zipf_s)
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("ts", "msg", "key", "size", "producer")}
    constant = wl.shape.kind is ShapeKind.CONSTANT
    for block in range(block_lo, block_hi):
        n = int(plan.block_counts[block])
        if n == 0:
            continue
        rng = rng_for(plan.seed, STREAM_PRODUCE, block)
        t0 = block * BLOCK_US
        t1 = min(t0 + BLOCK_US, plan.duration_us)
        if constant:
            ts = np.sort(rng.integers(t0, t1, n, dtype=np.int64))
        else:
            edges = np.linspace(t0, t1, SUB_BINS + 1)
            w = plan.rate.multiplier((edges[:-1] + edges[1:]) / 2)
            cum = np.concatenate([[0.0], np.cumsum(w)])
            cum /= cum[-1]
            ts = np.clip(np.floor(np.interp(np.sort(rng.random(n)), cum, edges)).astype(np.int64), t0, t1 - 1)
        key = keys.draw(rng.random(n))
        if wl.keys.unkeyed_share > 0:
            key[rng.random(n) < wl.keys.unkeyed_share] = -1
        size = np.clip(np.rint(wl.size_bytes.sample(rng, n)), 1, 2**31 - 1).astype(np.int32)
        parts["ts"].append(ts)
        parts["msg"].append(plan.block_first_msg[block] + 1 + np.arange(n, dtype=np.int64))
        parts["key"].append(key)
        parts["size"].append(size)
        parts["producer"].append(rng.integers(0, wl.producers, n, dtype=np.int32))
    empty = {"ts": np.int64, "msg": np.int64, "key": np.int32, "size": np.int32, "producer": np.int32}
    return {k: np.concatenate(v) if v else np.zeros(0, empty[k]) for k, v in parts.items()}


def _replicate(plan: TracePlan, lo_us: int, hi_us: int, last: bool):
    ts_parts, broker_parts, upto_parts = [], [], []
    end = hi_us if last else hi_us - 1
    for rp in plan.reporters:
        ts, upto = rp.window_reports(lo_us, end)
        keep = (ts >= 0) & (ts <= plan.duration_us) & ~rp.blocked(ts)
        ts_parts.append(ts[keep])
        upto_parts.append(upto[keep])
        broker_parts.append(np.full(int(keep.sum()), rp.broker, dtype=np.int32))
    if not ts_parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int64)
    return np.concatenate(ts_parts), np.concatenate(broker_parts), np.concatenate(upto_parts)


def chunk_table(plan: TracePlan, c: int) -> tuple[pa.Table, tuple[int, int, int]]:
    """The events of chunk c, sorted by (ts_us, kind order, msg_id, broker), in EVENT_ARROW_SCHEMA, and the
    number of (produce, replicate, fault) events in it."""
    lo, hi, last = plan.chunk_span(c)
    p = _produce(plan, int(plan.chunk_blocks[c]), int(plan.chunk_blocks[c + 1]))
    r_ts, r_broker, r_upto = _replicate(plan, lo, hi, last)
    in_chunk = (plan.fault_ts_us >= lo) & ((plan.fault_ts_us <= hi) if last else (plan.fault_ts_us < hi))
    f_ts, f_kind, f_broker = plan.fault_ts_us[in_chunk], plan.fault_kind[in_chunk], plan.fault_broker[in_chunk]
    n_p, n_r, n_f = len(p["ts"]), len(r_ts), len(f_ts)

    ts = np.concatenate([p["ts"], r_ts, f_ts])
    kind = np.concatenate([np.full(n_p, int(Kind.PRODUCE), np.int8), np.full(n_r, int(Kind.REPLICATE), np.int8),
                           f_kind])
    # Produce rows come in msg_id order, replicate rows broker by broker, faults by broker: a stable sort on
    # (ts, kind) keeps those tie orders (SPEC §2.2).
    order = np.argsort(ts * 16 + kind, kind="stable")
    ts, kind = ts[order], kind[order]
    not_produce = np.concatenate([np.zeros(n_p, bool), np.ones(n_r + n_f, bool)])[order]
    not_replicate = np.concatenate([np.ones(n_p, bool), np.zeros(n_r, bool), np.ones(n_f, bool)])[order]

    def padded(values: np.ndarray, before: int, after: int, dtype) -> np.ndarray:
        return np.concatenate([np.zeros(before, dtype), values.astype(dtype, copy=False), np.zeros(after, dtype)])

    broker = np.concatenate([np.zeros(n_p, np.int32), r_broker, f_broker])[order]
    msg = padded(p["msg"], 0, n_r + n_f, np.int64)[order]
    size = padded(p["size"], 0, n_r + n_f, np.int32)[order]
    producer = padded(p["producer"], 0, n_r + n_f, np.int32)[order]
    key = np.concatenate([p["key"], np.full(n_r + n_f, -1, np.int32)])[order]
    upto = padded(r_upto, n_p, n_f, np.int64)[order]
    key_names = _key_table(plan.scenario.workload.keys.count, plan.scenario.workload.keys.zipf_s).names
    kinds = pa.array(KIND_LABELS, type=pa.string())
    is_produce = ~not_produce
    columns = [
        pa.array(ts, type=pa.int64()),
        kinds.take(pa.array(kind)),
        pa.array(broker, type=pa.int32(), mask=is_produce),
        pa.array(msg, type=pa.int64(), mask=not_produce),
        key_names.take(pa.array(key, type=pa.int32(), mask=key < 0)),
        pa.array(size, type=pa.int32(), mask=not_produce),
        pa.array(producer, type=pa.int32(), mask=not_produce),
        pa.array(upto, type=pa.int64(), mask=not_replicate),
    ]
    return pa.Table.from_arrays(columns, schema=EVENT_ARROW_SCHEMA), (n_p, n_r, n_f)


@dataclass(frozen=True)
class ChunkSummary:
    chunk: int
    rows: int
    produce: int
    replicate: int
    faults: int
    file_bytes: int


SUMMARY_DDL = "chunk long, rows long, produce long, replicate long, faults long, file_bytes long"


def write_part(table: pa.Table, c: int, folder: str) -> str:
    """Write chunk c's events as folder/part-NNNNNN.parquet, complete before the name appears."""
    final = os.path.join(folder, PART_NAME.format(c))
    tmp = os.path.join(folder, f".{PART_NAME.format(c)}.{os.getpid()}.{threading.get_ident()}.tmp")
    pq.write_table(table, tmp, **_PARQUET_OPTIONS)
    os.replace(tmp, final)
    return final


def write_chunk(plan: TracePlan, c: int, folder: str) -> ChunkSummary:
    """Build chunk c and write it to folder/part-NNNNNN.parquet (a retried task simply rewrites it)."""
    table, (produce, replicate, faults) = chunk_table(plan, c)
    final = write_part(table, c, folder)
    return ChunkSummary(c, table.num_rows, produce, replicate, faults, os.path.getsize(final))


def _write_chunks_task(plan_bc, folder: str, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    plan = plan_bc.value
    for batch in batches:
        for c in batch.column(0).to_pylist():
            s = write_chunk(plan, int(c), folder)
            yield pa.RecordBatch.from_pylist([s.__dict__])


# ---------------------------------------------------------------------------------------------------------
# The Spark job


@dataclass(frozen=True)
class GenerateResult:
    trace_dir: Path
    manifest: Manifest
    chunks: tuple[ChunkSummary, ...]
    seconds: float

    @property
    def events(self) -> int:
        return sum(c.rows for c in self.chunks)

    def count(self, kind: str) -> int:
        return sum(getattr(c, kind) for c in self.chunks)


def manifest_for(plan: TracePlan) -> Manifest:
    from schemas.version import __version__

    sc = plan.scenario
    generator = {
        "scenario": sc.name,
        "description": sc.description,
        "seed": plan.seed,
        "scale": plan.scale,
        "parameters": sc.to_json(),
        "produce_events": plan.produce_count,
        "block_us": BLOCK_US,
        "replab_version": __version__,
    }
    brokers = tuple(Broker(b.id, b.rack) for b in sc.brokers)
    return Manifest(plan.trace_id, brokers, plan.duration_us, plan.seed, generator)


def _run_chunks(spark, plan: TracePlan, chunks: range, folder: Path) -> list[ChunkSummary]:
    bc = spark.sparkContext.broadcast(plan)
    try:
        task = functools.partial(_write_chunks_task, bc, str(folder))
        # A Python task costs 0.1-0.3 s of fixed overhead on a small machine, so a task writes several chunks in
        # turn (a worker holds one chunk at a time); a couple of waves keep the cores balanced.
        tasks = max(1, min(len(chunks), TASK_WAVES * spark.sparkContext.defaultParallelism))
        df = spark.range(chunks.start, chunks.stop, 1, numPartitions=tasks).mapInArrow(task, SUMMARY_DDL)
        rows = df.collect()
    finally:
        bc.unpersist()
    return sorted((ChunkSummary(**r.asDict()) for r in rows), key=lambda s: s.chunk)


def clear_trace(out: Path) -> None:
    """Make `out` not a trace first (manifest gone), then drop the old events."""
    (out / "manifest.json").unlink(missing_ok=True)
    for name in ("events", "events.csv"):
        target = out / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()


def generate_trace(spark, scenario: Scenario, *, seed: int, scale: float, out: str | Path, live: bool = False,
                   live_speed: float = 1.0, target_events_per_chunk: int = TARGET_EVENTS_PER_CHUNK,
                   log=None) -> GenerateResult:
    """Write `out/manifest.json` and `out/events/` for (scenario, seed, scale). See the module docstring."""
    started = time.monotonic()
    out = Path(out).resolve()  # executors (Python workers, other machines) do not share our working directory
    if live and not (math.isfinite(live_speed) and live_speed > 0):
        raise BadInput(f"--live-speed must be > 0, got {live_speed!r}", rule="arguments")
    slice_blocks = max(1, round(live_speed)) if live else None
    plan = build_plan(scenario, seed, scale, slice_blocks=slice_blocks,
                      target_events_per_chunk=target_events_per_chunk)
    manifest = manifest_for(plan)
    out.mkdir(parents=True, exist_ok=True)
    clear_trace(out)
    staging = out / "_staging_events"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    if live:
        summaries = _generate_live(spark, plan, manifest, out, staging, live_speed, log)
    else:
        summaries = _run_chunks(spark, plan, range(plan.n_chunks), staging)
        (staging / COMPLETE_MARKER).write_text(json.dumps({"files": plan.n_chunks}) + "\n")
        os.replace(staging, out / "events")
        manifest.write(out)
    if staging.exists():
        shutil.rmtree(staging)
    return GenerateResult(out, manifest, tuple(summaries), time.monotonic() - started)


def _generate_live(spark, plan: TracePlan, manifest: Manifest, out: Path, staging: Path, speed: float, log
                   ) -> list[ChunkSummary]:
    events = out / "events"
    events.mkdir()
    manifest.write(out)
    slice_us = plan.chunk_span(0)[1] - plan.chunk_span(0)[0]
    per_group = max(1, math.ceil(10 * speed * S / max(slice_us, 1)))  # ~10 wall seconds ahead
    groups = [range(g, min(g + per_group, plan.n_chunks)) for g in range(0, plan.n_chunks, per_group)]
    summaries: list[ChunkSummary] = []
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(_run_chunks, spark, plan, groups[0], staging)
        start = None
        for gi in range(len(groups)):
            done = pending.result()
            if start is None:
                start = time.monotonic()  # trace time 0: the first slices are ready (Spark has warmed up)
            if gi + 1 < len(groups):
                pending = pool.submit(_run_chunks, spark, plan, groups[gi + 1], staging)
            for s in done:
                _, hi, _ = plan.chunk_span(s.chunk)
                delay = start + hi / S / speed - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                name = PART_NAME.format(s.chunk)
                os.replace(staging / name, events / name)
                summaries.append(s)
                if log is not None:
                    log(f"live: {name} ({s.rows} events, trace time up to {hi / S:.1f} s)")
    (events / COMPLETE_MARKER).write_text(json.dumps({"files": plan.n_chunks}) + "\n")
    return summaries
