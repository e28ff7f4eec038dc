"""The distributed sweep: ONE Spark job over the seeds, each task generating, checking and replaying its seeds.

A sweep asks how a policy fares over many timelines of one scenario. A seed's trace is a pure function of
(scenario, seed, scale) (SPEC §8), so nothing needs to travel but the seed: the job is a `mapInArrow` over a
range of seeds, and for each seed its task

1. builds the generator's plan and its event chunks in-process (`generators.generate.build_plan`,
   `chunk_table`: the same code `replab generate` runs inside its Spark tasks, no Spark inside this task);
2. runs the trace gate's row rules on every chunk (`expectations.trace_rules`, the rules of
   `expectations.trace_gate` on Arrow): quarantined rows leave the replay as in `replab replay`; a seed with a
   fatal row is not replayed and comes back with status `fatal` and its rule counts (reported, not dropped);
3. routes each chunk per route class and advances one chunked kernel per (policy, replay unit)
   (`replay/<family>/kernels/`, as `engine/groups.py` does after its shuffle), so a task holds one chunk and
   the kernels' state, never a whole trace;
4. returns one row per policy: every run_summary field (SPEC §4.4, the definitions of `engine.metrics`
   computed with numpy over the kernels' message records), the gate's counts and, if asked, the per-window
   acked-lost and unavailable series.

Only those rows reach the driver. `--keep-traces` makes each task also write its seed's trace (the layout of
`replab generate`). Tasks take several seeds in turn; the job's task count is bounded by the parallelism, not
the seed count, so the Spark UI shows one job whatever N is.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine import worker_imports
from schemas.tables import SUMMARY_FIELDS, TABLES

# Executor code is imported first in a Python worker: from here on its tasks start without re-reading zips.
worker_imports.install()

#: Seeds per task wave: a Python task costs 0.1-0.3 s of fixed overhead here, a seed much more, so a few
#: waves balance the cores without paying that overhead per seed.
TASK_WAVES = 4
OK, FATAL = "ok", "fatal"

_SUMMARY_ARROW = {f.name: f.type for f in TABLES["run_summary"].arrow_schema()}
#: One row per (seed, policy) from the executors: identity, the gate's counts, every run_summary field, series.
RESULT_SCHEMA = pa.schema([
    ("seed", pa.int64()), ("trace_id", pa.string()), ("policy_idx", pa.int32()), ("policy", pa.string()),
    ("status", pa.string()), ("events", pa.int64()), ("gate_fatal_rows", pa.int64()),
    ("gate_quarantined_rows", pa.int64()), ("gate_rules", pa.string()), ("duration_us", pa.int64()),
    ("task_seconds", pa.float64()),
    *[(name, _SUMMARY_ARROW[name]) for name in SUMMARY_FIELDS],
    ("loss_series", pa.list_(pa.int64())), ("unavailable_series", pa.list_(pa.int64())),
])
_DDL_OF = {pa.int64(): "BIGINT", pa.int32(): "INT", pa.string(): "STRING", pa.float64(): "DOUBLE",
           pa.list_(pa.int64()): "ARRAY<BIGINT>"}
RESULT_DDL = ", ".join(f"{f.name} {_DDL_OF[f.type]}" for f in RESULT_SCHEMA)


@dataclass(frozen=True)
class SweepSpec:
    """What every task needs (shipped in the function's closure): small."""

    scenario: Any  # generators.scenario.Scenario
    scale: float
    policies: tuple[Any, ...]  # replay.policies.Policy, in --policy order
    window_us: int = 1_000_000
    series: bool = False
    #: Absolute folder for per-seed traces (`--keep-traces`), None to keep none.
    traces_dir: str | None = None


@dataclass
class _Run:
    index: int
    policy: Any
    layout: Any
    unit_parts: dict[int, int]  # unit -> how many partitions its timeline applies to
    kernels: dict[int, Any] = field(default_factory=dict)


def slug(text: str) -> str:
    """A file-name-safe form of a trace id or sweep name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "sweep"


# ----------------------------------------------------------------------------------------------- one seed
def plan_runs(spec: SweepSpec, manifest, duration_us: int, control) -> tuple[list[_Run], list[list[_Run]]]:
    from replay.families import engine_context, family_of

    runs, classes = [], {}
    for i, policy in enumerate(spec.policies):
        fam = family_of(policy)
        layout = fam.layout(policy, manifest)
        run = _Run(i, policy, layout, {u: len(fam.partitions_of(policy, layout, u)) for u in layout.units})
        for u in layout.units:
            k = fam.kernel(policy, u, layout.replicas[u], duration_us, **engine_context(policy, manifest, control))
            if hasattr(k, "window_us"):
                k.window_us = spec.window_us
            run.kernels[u] = k
        runs.append(run)
        classes.setdefault(fam.routing_key(policy), []).append(run)
    return runs, list(classes.values())


def control_of(plan):
    from replay.events import PartitionEvents
    from replay.local import control_events

    z = np.zeros(0, dtype=np.int64)
    order = np.lexsort((plan.fault_broker, plan.fault_kind, plan.fault_ts_us))
    return control_events(PartitionEvents(z, z, z, plan.fault_ts_us[order], plan.fault_kind[order],
                                          plan.fault_broker[order].astype(np.int64), np.zeros(len(order), np.int64)))


def feed_chunk(table: pa.Table, until_us: int, classes: list[list[_Run]], manifest, control) -> None:
    """Route one chunk's events and advance every kernel to `until_us` (all events are before it)."""
    from replay.events import PartitionEvents, hosted_rows
    from replay.families import family_of
    from replay.family import RouteInput
    from schemas.trace import Kind, kind_codes

    kind = kind_codes(table.column("kind"))
    ts = table.column("ts_us").to_numpy(zero_copy_only=False).astype(np.int64)
    prod = kind == int(Kind.PRODUCE)
    produce = table.filter(pa.array(prod))
    brokers = table.filter(pa.array(~prod))

    def ints(t: pa.Table, name: str) -> np.ndarray:
        return pc.fill_null(t.column(name), 0).to_numpy(zero_copy_only=False).astype(np.int64)

    p_ts, p_msg, p_size = ts[prod], ints(produce, "msg_id"), ints(produce, "size_bytes")
    keys = produce.column("key").combine_chunks()
    b_ts, b_kind, b_id, b_upto = ts[~prod], kind[~prod], ints(brokers, "broker"), ints(brokers, "upto_us")
    order = np.lexsort((b_id, b_kind, b_ts))  # SPEC §2.2 same-instant order
    b_ts, b_kind, b_id, b_upto = b_ts[order], b_kind[order], b_id[order], b_upto[order]
    # Generated msg_ids are dense 1..n in produce order (generators/generate.py), so the rank is msg_id − 1.
    route_input = RouteInput(p_ts, p_msg - 1, keys)
    for members in classes:
        lead = members[0]
        routed = family_of(lead.policy).route(lead.policy, manifest, lead.layout, control, route_input)
        delay = routed.delay_us if routed.delay_us is not None else np.zeros(len(p_ts), dtype=np.int64)
        for u in lead.layout.units:
            sel = routed.unit == u
            bsel = hosted_rows(b_id, [b for r in members for b in r.layout.replicas[u]])
            events = PartitionEvents(p_ts[sel], p_msg[sel], p_size[sel], b_ts[bsel], b_kind[bsel], b_id[bsel],
                                     b_upto[bsel], payload={"part": routed.partition[sel].astype(np.int64),
                                                            "delay": delay[sel].astype(np.int64)})
            for r in members:
                r.kernels[u].advance(events, until_us)


def _percentiles(values: np.ndarray, qs: Sequence[float]) -> list[float | None]:
    """Spark's exact `percentile` (linear interpolation between closest ranks); None over no values."""
    if not len(values):
        return [None] * len(qs)
    return [float(v) for v in np.percentile(values, [q * 100 for q in qs])]


def summarize(run: _Run, results: Sequence[Any], duration_us: int, window_us: int, series: bool) -> dict[str, Any]:
    """Every run_summary field of one policy from its units' results (`engine.metrics.run_summary`'s
    definitions), and the per-window series when asked."""
    from schemas.outcomes import NULL_US, Fate, Status

    n_windows = duration_us // window_us + 1
    produced = acked = failed = pending = acked_lost = failed_committed = stranded = 0
    latencies, lags, lost_at = [], [], []
    unavailable_us = 0
    unavailable_series = np.zeros(n_windows, dtype=np.int64)
    for unit, res in zip(run.layout.units, results, strict=True):
        rec, fate = res.messages.records, res.messages.fate
        status = rec.status
        is_acked = status == Status.ACKED
        committed = fate == Fate.COMMITTED
        produced += len(status)
        acked += int(is_acked.sum())
        failed += int((status == Status.FAILED).sum())
        pending += int((status == Status.PENDING).sum())
        lost = is_acked & ~committed
        acked_lost += int(lost.sum())
        failed_committed += int(((status == Status.FAILED) & committed).sum())
        stranded += int((is_acked & committed & ~res.messages.readable_at_end).sum())
        latencies.append((rec.ack_us - rec.produce_us)[is_acked & (rec.ack_us != NULL_US)])
        lags.append((rec.visible_us - rec.produce_us)[rec.visible_us != NULL_US])
        if series:
            lost_at.append(rec.produce_us[lost])
        parts = run.unit_parts[unit]
        for start, end in res.unavailable:
            a, b = max(int(start), 0), min(int(end), duration_us)
            if b <= a:
                continue
            unavailable_us += (b - a) * parts
            if series:
                for k in range(a // window_us, (b - 1) // window_us + 1):
                    overlap = min(b, (k + 1) * window_us) - max(a, k * window_us)
                    unavailable_series[k] += overlap * parts
    lat = np.concatenate(latencies) if latencies else np.zeros(0, np.int64)
    lag = np.concatenate(lags) if lags else np.zeros(0, np.int64)
    p50, p99, p999 = _percentiles(lat, (0.5, 0.99, 0.999))
    (lag99,) = _percentiles(lag, (0.99,))

    def ms(v: float | None) -> float | None:
        return None if v is None else v / 1000.0

    out = {
        "produced": produced, "acked": acked, "failed": failed, "pending": pending, "acked_lost": acked_lost,
        "acked_lost_rate": acked_lost / acked if acked else 0.0, "failed_committed": failed_committed,
        "stranded": stranded, "availability": acked / produced if produced else None,
        "unavailable_partition_seconds": unavailable_us / 1e6, "ack_latency_p50_ms": ms(p50),
        "ack_latency_p99_ms": ms(p99), "ack_latency_p999_ms": ms(p999),
        "ack_latency_max_ms": ms(float(lat.max())) if len(lat) else None, "visibility_lag_p99_ms": ms(lag99),
        "brokers_used": run.layout.brokers_used, "replicas_per_message": float(run.layout.replicas_per_message),
        "replication_bytes": int(sum(r.replication_bytes for r in results)),
    }
    assert tuple(out) == SUMMARY_FIELDS
    if series:
        at = np.concatenate(lost_at) if lost_at else np.zeros(0, np.int64)
        out["loss_series"] = np.bincount(at // window_us, minlength=n_windows).astype(np.int64).tolist()
        out["unavailable_series"] = unavailable_series.tolist()
    return out


def _keep_trace(spec: SweepSpec, plan, manifest, tables: Iterator[tuple[int, pa.Table]]) -> Iterator[pa.Table]:
    """Pass the chunks through, writing them as `replab generate` lays a trace out (manifest last)."""
    from generators.generate import COMPLETE_MARKER, clear_trace, write_part

    out = Path(spec.traces_dir) / slug(plan.trace_id)
    clear_trace(out)
    events = out / "events"
    events.mkdir(parents=True, exist_ok=True)
    for c, table in tables:
        write_part(table, c, str(events))
        yield table
    (events / COMPLETE_MARKER).write_text(json.dumps({"files": plan.n_chunks}) + "\n")
    manifest.write(out)


def seed_rows(spec: SweepSpec, seed: int) -> list[dict[str, Any]]:
    """Generate, check and replay one seed under every policy: one row per policy (RESULT_DDL)."""
    from expectations.trace_rules import TraceRules
    from generators.generate import build_plan, chunk_table, manifest_for

    started = time.monotonic()
    plan = build_plan(spec.scenario, seed, spec.scale)
    manifest = manifest_for(plan)
    control = control_of(plan)
    runs, classes = plan_runs(spec, manifest, plan.duration_us, control)
    rules = TraceRules(manifest)
    fatal = False
    chunks: Iterator[tuple[int, pa.Table]] = ((c, chunk_table(plan, c)[0]) for c in range(plan.n_chunks))
    if spec.traces_dir:
        chunks = enumerate(_keep_trace(spec, plan, manifest, chunks))
    events = 0
    for c, table in chunks:
        events += table.num_rows
        verdict = rules.check(table)
        fatal = fatal or bool(verdict.fatal.any())
        if fatal:
            continue  # the rest of the trace is still checked, so every rule's count is complete
        if verdict.quarantine.any():
            table = table.filter(pa.array(~verdict.quarantine))
        _, hi, last = plan.chunk_span(c)
        feed_chunk(table, plan.duration_us + 1 if last else hi, classes, manifest, control)

    common = {"seed": seed, "trace_id": plan.trace_id, "events": events, "gate_fatal_rows": rules.fatal_rows,
              "gate_quarantined_rows": rules.quarantined_rows,
              "gate_rules": json.dumps({k: v for k, v in rules.counts.items() if v}, sort_keys=True),
              "duration_us": plan.duration_us}
    rows = []
    for run in runs:
        row = {**common, "policy_idx": run.index, "policy": run.policy.canonical(), "status": FATAL if fatal else OK,
               **dict.fromkeys(SUMMARY_FIELDS), "loss_series": None, "unavailable_series": None}
        if not fatal:
            results = [run.kernels[u].finish() for u in run.layout.units]
            row.update(summarize(run, results, plan.duration_us, spec.window_us, spec.series))
        rows.append(row)
    elapsed = time.monotonic() - started
    for row in rows:
        row["task_seconds"] = elapsed
    return rows


def sweep_task(spec: SweepSpec):
    """mapInArrow function: rows of `seed` → RESULT_DDL rows for each seed and policy."""

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for seed in batch.column(0).to_pylist():
                rows = seed_rows(spec, int(seed))
                yield pa.RecordBatch.from_pylist(rows, schema=RESULT_SCHEMA)

    return fn


# ----------------------------------------------------------------------------------------------- the job
def run_sweep_job(spark, spec: SweepSpec, seeds: Sequence[int], *, job_group: str | None = None) -> pa.Table:
    """The sweep's one Spark job: every (seed, policy) result row, sorted by (seed, policy index).

    `job_group` tags the job (`SparkContext.setJobGroup`), so a caller can count what ran.
    """
    sc = spark.sparkContext
    seeds = list(seeds)
    if seeds != list(range(seeds[0], seeds[0] + len(seeds))):
        raise ValueError("seeds must be consecutive")
    tasks = max(1, min(len(seeds), TASK_WAVES * sc.defaultParallelism))
    if job_group:
        sc.setJobGroup(job_group, f"replab sweep {spec.scenario.name}: {len(seeds)} seeds", interruptOnCancel=True)
    try:
        df = (spark.range(seeds[0], seeds[-1] + 1, 1, numPartitions=tasks).toDF("seed")
              .mapInArrow(sweep_task(spec), RESULT_DDL))
        table = df.toArrow().cast(RESULT_SCHEMA)
    finally:
        if job_group:
            sc.setLocalProperty("spark.jobGroup.id", None)
    return table.sort_by([("seed", "ascending"), ("policy_idx", "ascending")])
