"""Kernel benchmark (SPEC §10: ≥ 10 M trace events/s per core on a steady trace, and ≥ 50× the reference
interpreter on every scenario), for every preset.

    python -m bench.kernel_bench                          # steady-state at --scale 1 (≈1.7 M events), all presets
    python -m bench.kernel_bench --scale 2 --reference-scale 0.2 --json out.json
    python -m bench.kernel_bench --every-scenario         # kernel/reference on every library scenario

Traces are the library's `steady-state` scenario (6 brokers, 5000 keyed msg/s, GC pauses; events grow with
scale²) generated in-process, and `dledger5-double-failure` (faults). No Spark: this measures the engines alone,
single-threaded. For each policy: routing (the family's `route` over all produce events), the kernels of every
unit (one pass, then in 10 s chunks with carried state) and, on a smaller trace, the reference interpreter.
events/s = trace rows / seconds, where a unit's kernel reads every broker event of the trace (broadcast) and
its own messages.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass

from replay.events import split_trace_table
from replay.families import RouteInput, family_of
from replay.local import control_events, msg_rank, unit_events
from replay.policies import parse_policy, presets
from report.dledger_vs_kafka import load_trace
from schemas.errors import BadInput

#: Every preset (conf/policies.yaml).
POLICIES = tuple(presets())
#: For the every-scenario speedup check: one policy per family and acks mode (the reference is slow).
SPEEDUP_POLICIES = ("kafka-acks1", "kafka-durable", "kafka-unclean", "rocketmq-async", "rocketmq-sync",
                    "dledger-3", "rocketmq-controller-allack")


@dataclass(frozen=True)
class Row:
    trace: str
    policy: str
    events: int
    route_s: float
    kernel_s: float
    kernel_chunked_s: float
    kernel_events_per_s: float
    reference_events: int | None
    reference_s: float | None
    reference_events_per_s: float | None
    speedup: float | None
    first_pass_s: float  # the first pass of the process: with numba compilation (or cache load), imports, caches


def time_route(policy, manifest, table) -> float:
    """The family's route() over every produce event (what the Spark job runs per Arrow batch)."""
    fam = family_of(policy)
    produce, broker_events = split_trace_table(table)
    layout = fam.layout(policy, manifest)
    control = control_events(broker_events)
    batch = RouteInput(produce["ts_us"], msg_rank(produce["msg_id"]), list(produce["key"]))
    fam.route(policy, manifest, layout, control, batch)  # warm (the route model is cached per trace)
    t0 = time.perf_counter()
    fam.route(policy, manifest, layout, control, batch)
    return time.perf_counter() - t0


def time_kernels(policy, manifest, table, chunk_us: int | None) -> tuple[float, float]:
    fam = family_of(policy)
    events, info = unit_events(policy, manifest, table)
    route_s = time_route(policy, manifest, table)
    t0 = time.perf_counter()
    for u in info["layout"].units:
        k = fam.kernel(policy, u, info["layout"].replicas[u], manifest.duration_us)
        if chunk_us is None:
            k.advance(events[u], manifest.duration_us + 1)
        else:
            start = 0
            for cut in [*range(chunk_us, manifest.duration_us + 1, chunk_us), manifest.duration_us + 1]:
                k.advance(events[u].slice_time(start, cut), cut)
                start = cut
        k.finish()
    return route_s, time.perf_counter() - t0


def time_reference(policy, manifest, table) -> float:
    fam = family_of(policy)
    events, info = unit_events(policy, manifest, table)
    t0 = time.perf_counter()
    for u in info["layout"].units:
        fam.reference(policy, u, info["layout"].replicas[u], events[u], manifest.duration_us)
    return time.perf_counter() - t0


def bench(trace: str, scale: float, reference_scale: float | None, policies=POLICIES) -> list[Row]:
    manifest, table = load_trace(trace, 1, scale)
    small = load_trace(trace, 1, reference_scale) if reference_scale else None
    rows = []
    for text in policies:
        policy = parse_policy(text)
        try:
            family_of(policy).layout(policy, manifest)
        except BadInput as exc:  # e.g. a 2-broker scenario cannot host replication_factor=3
            print(f"{trace:24s} {text:28s} skipped: {exc}", flush=True)
            continue
        _, warm_s = time_kernels(policy, manifest, table, None)  # warm-up (compilation, imports, caches)
        route_s, kernel_s = time_kernels(policy, manifest, table, None)
        _, chunked_s = time_kernels(policy, manifest, table, 10_000_000)
        ref_n = ref_s = ref_rate = speedup = None
        if small is not None:
            ref_s = time_reference(policy, *small)
            ref_n = small[1].num_rows
            ref_rate = ref_n / ref_s
            _, k_small = time_kernels(policy, *small, None)
            speedup = ref_s / k_small
        rows.append(Row(trace, text, table.num_rows, route_s, kernel_s, chunked_s, table.num_rows / kernel_s,
                        ref_n, ref_s, ref_rate, speedup, warm_s))
        print(f"{trace:24s} {text:28s} {table.num_rows:>9d} ev  route {route_s:6.2f}s  kernel {kernel_s:6.2f}s "
              f"({table.num_rows / kernel_s / 1e6:5.2f} M ev/s)  first pass {warm_s:6.2f}s  "
              f"chunked {chunked_s:6.2f}s  "
              + (f"reference {ref_rate / 1e3:6.1f} k ev/s ({ref_n} ev)  kernel/reference {speedup:5.0f}x"
                 if ref_rate else ""), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--reference-scale", type=float, default=0.15)
    ap.add_argument("--traces", default="steady-state,dledger5-double-failure")
    ap.add_argument("--every-scenario", action="store_true",
                    help="kernel/reference speedup on every library scenario (at --reference-scale)")
    ap.add_argument("--policies", default=",".join(POLICIES), help="comma-separated presets")
    ap.add_argument("--json")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}")
    if args.every_scenario:
        from generators.library import scenario_files

        rows = [r for t in sorted(scenario_files()) for r in bench(t, args.reference_scale, args.reference_scale,
                                                                  SPEEDUP_POLICIES)]
        slowest = min(rows, key=lambda r: r.speedup or float("inf"))
        print(f"smallest kernel/reference speedup: {slowest.speedup:.0f}x ({slowest.trace}, {slowest.policy})")
    else:
        rows = [r for t in args.traces.split(",")
                for r in bench(t, args.scale, args.reference_scale, tuple(args.policies.split(",")))]
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=1)


if __name__ == "__main__":
    main()
