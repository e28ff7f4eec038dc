"""Sweep benchmark: what one more seed costs in the distributed sweep, against one replay core of the same trace.

- **replay core, one seed** (no Spark, one core): route the seed's trace and replay it under the policies with
  the chunked kernels, then compute the run_summary figures: the work a sweep cannot avoid per seed. The trace
  is generated before the clock starts; the mean over `--core-seeds` seeds.
- **sweep job, N seeds** (`engine.sweep.run_sweep_job` on the session's master): generation, trace
  rules, replay and figures of every seed inside ONE Spark job; wall and CPU seconds for a small and a large N.
  The marginal cost per seed is (T(N) − T(n)) / (N − n) in wall seconds, times the cores the job ran on, in
  core-seconds: the figure to hold against the replay core (target ≤ 1.2×).

    python -m bench.sweep_bench                               # demo at scale 0.1, the 7 Kafka presets, 4 and 200
    python -m bench.sweep_bench --seeds 4,50 --json out.json
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from bench.procs import cpu_seconds, emit, jvm_pid, load_average


@dataclass(frozen=True)
class Row:
    what: str
    seeds: int
    wall_s: float
    cpu_s: float
    per_seed_s: float
    load: float


def core_seconds(spec, seeds: list[int]) -> float:
    """Mean seconds of one seed's replay core (routing, kernels, figures), trace generated beforehand."""
    from engine.sweep import control_of, feed_chunk, plan_runs, summarize
    from generators.generate import build_plan, chunk_table, manifest_for

    total = 0.0
    for seed in seeds:
        plan = build_plan(spec.scenario, seed, spec.scale)
        manifest = manifest_for(plan)
        tables = [chunk_table(plan, c)[0] for c in range(plan.n_chunks)]
        started = time.process_time()
        runs, classes = plan_runs(spec, manifest, plan.duration_us)
        control = control_of(plan)
        for c, table in enumerate(tables):
            _, hi, last = plan.chunk_span(c)
            feed_chunk(table, plan.duration_us + 1 if last else hi, classes, manifest, control)
        for run in runs:
            summarize(run, [run.kernels[u].finish() for u in run.layout.units], plan.duration_us, spec.window_us,
                      False)
        total += time.process_time() - started
    return total / len(seeds)


def main(argv: list[str] | None = None) -> int:
    from engine.sweep import SweepSpec, run_sweep_job
    from generators.library import resolve_scenario
    from replay.policies import all_presets
    from storage.session import get_spark

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="demo")
    ap.add_argument("--scale", type=float, default=0.1)
    ap.add_argument("--seeds", default="4,200", help="small,large seed counts of the sweep job")
    ap.add_argument("--core-seeds", type=int, default=5)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    small, large = (int(x) for x in args.seeds.split(","))
    spec = SweepSpec(resolve_scenario(args.scenario), args.scale,
                     tuple(policy for _, policy in all_presets() if policy.family == "kafka"))

    rows = []
    core = core_seconds(spec, list(range(args.core_seeds)))
    rows.append(Row("replay core, one seed (no Spark, CPU s)", 1, core, core, core, load_average()))
    spark = get_spark("replab-sweep-bench", master=args.master)
    cores = spark.sparkContext.defaultParallelism
    jvm = jvm_pid(spark)
    run_sweep_job(spark, spec, range(1000, 1002))  # warm-up: JVM, Python workers, imports
    timings = {}
    for n in (small, large):
        cpu0, t0 = cpu_seconds(jvm), time.monotonic()
        table = run_sweep_job(spark, spec, range(n), job_group=f"bench-{n}")
        wall, cpu = time.monotonic() - t0, cpu_seconds(jvm) - cpu0
        assert table.num_rows == n * len(spec.policies)
        timings[n] = (wall, cpu)
        rows.append(Row(f"sweep job, {n} seeds ({args.master})", n, wall, cpu, wall / n, load_average()))
    marginal_wall = (timings[large][0] - timings[small][0]) / (large - small)
    marginal_cpu = (timings[large][1] - timings[small][1]) / (large - small)
    rows.append(Row(f"marginal seed, wall × {cores} cores", large - small, marginal_wall * cores, marginal_cpu,
                    marginal_wall * cores, load_average()))
    spark.stop()
    table = ["| what | seeds | wall s | CPU s | per seed s | load |", "|---|---:|---:|---:|---:|---:|"]
    table += [f"| {r.what} | {r.seeds} | {r.wall_s:.2f} | {r.cpu_s:.2f} | {r.per_seed_s:.3f} | {r.load} |"
              for r in rows]
    table.append(f"\nmarginal seed / replay core: {marginal_wall * cores / core:.2f}× (core-seconds), "
                 f"{marginal_cpu / core:.2f}× (CPU seconds)")
    return emit(rows, "\n".join(table), args.json)


if __name__ == "__main__":
    raise SystemExit(main())
