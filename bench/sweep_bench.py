"""Sweep benchmark: what one more seed costs in the distributed sweep, against one replay core of the same trace.

- **replay core, one seed** (no Spark, one core): route the seed's trace and replay it under the policies with
  the chunked kernels, then compute the run_summary figures: the work a sweep cannot avoid per seed. The trace
  is generated before the clock starts; the mean over `--core-seeds` seeds.
- **sweep job, N seeds** (`engine.sweep.job.run_sweep_job` on the session's master): generation, trace
  rules, replay and figures of every seed inside ONE Spark job; wall and CPU seconds for a small and a large N.
  The marginal cost per seed is (T(N) − T(n)) / (N − n) in wall seconds, times the cores the job ran on, in
  core-seconds: the figure to hold against the replay core (target ≤ 1.2×).

- **standalone cluster** (`--cluster-seeds N`): the same job of N seeds on `local[1]` and on a Spark standalone
  cluster of two one-core workers on 127.0.0.1 (`bench/cluster.py`, started here and stopped by process group);
  the speed-up is wall time on local[1] over wall time on the cluster (target ≥ 1.7×), with CPU seconds of
  every process involved and the load average beside it (the machine is shared).

    python -m bench.sweep_bench                               # demo at scale 0.1, the 7 Kafka presets, 4 and 200
    python -m bench.sweep_bench --seeds 4,50 --json out.json
    python -m bench.sweep_bench --seeds 0 --cluster-seeds 24  # only the cluster against local[1]
"""

from __future__ import annotations

import argparse
import os
import re
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
    from engine.sweep.job import control_of, feed_chunk, plan_runs, summarize
    from generators.generate import build_plan, chunk_table, manifest_for

    total = 0.0
    for seed in [None, *seeds]:  # the first, unmeasured, loads numba's compiled kernels, as the sweep's warm-up does
        seed_id = seeds[0] + 1000 if seed is None else seed
        plan = build_plan(spec.scenario, seed_id, spec.scale)
        manifest = manifest_for(plan)
        tables = [chunk_table(plan, c)[0] for c in range(plan.n_chunks)]
        started = time.process_time()
        control = control_of(plan)
        runs, classes = plan_runs(spec, manifest, plan.duration_us, control)
        for c, table in enumerate(tables):
            _, hi, last = plan.chunk_span(c)
            feed_chunk(table, plan.duration_us + 1 if last else hi, classes, manifest, control)
        for run in runs:
            summarize(run, [run.kernels[u].finish() for u in run.layout.units], plan.duration_us, spec.window_us,
                      False)
        if seed is not None:
            total += time.process_time() - started
    return total / len(seeds)


def task_slots(spark, master: str) -> int:
    """Cores the job's tasks run on: N for local[N] (not defaultParallelism, which storage/session.py sets to twice
    the cores)."""
    match = re.fullmatch(r"local\[(\d+|\*)(?:,\d+)?\]", master)
    if match:
        return (os.cpu_count() or 1) if match.group(1) == "*" else int(match.group(1))
    return 1 if master == "local" else spark.sparkContext.defaultParallelism


def main(argv: list[str] | None = None) -> int:
    from engine.sweep.job import SweepSpec
    from generators.library import resolve_scenario
    from replay.policies import all_presets

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="demo")
    ap.add_argument("--scale", type=float, default=0.1)
    ap.add_argument("--seeds", default="4,200", help="small,large seed counts of the sweep job")
    ap.add_argument("--core-seeds", type=int, default=5)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--cluster-seeds", type=int, default=0,
                    help="also time N seeds on local[1] and on a 2-worker standalone cluster (0: not)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    spec = SweepSpec(resolve_scenario(args.scenario), args.scale,
                     tuple(policy for _, policy in all_presets() if policy.family == "kafka"))
    rows: list[Row] = []
    lines: list[str] = []
    if args.seeds != "0":
        lines += marginal(spec, args, rows)
    if args.cluster_seeds:
        lines += cluster_speedup(spec, args.cluster_seeds, rows)
    table = ["| what | seeds | wall s | CPU s | per seed s | load |", "|---|---:|---:|---:|---:|---:|"]
    table += [f"| {r.what} | {r.seeds} | {r.wall_s:.2f} | {r.cpu_s:.2f} | {r.per_seed_s:.3f} | {r.load} |"
              for r in rows]
    return emit(rows, "\n".join([*table, "", *lines]), args.json)


def _tree_cpu(pids: list[int]) -> float:
    """CPU seconds so far of these processes and everything under them (executors, Python workers)."""
    from bench.procs import descendants, proc_cpu_seconds

    return sum(proc_cpu_seconds(p) for root in pids for p in [root, *descendants(root)])


def _timed(spark, spec, seeds: int, extra_pids: list[int]) -> tuple[float, float]:
    from engine.sweep.job import run_sweep_job

    jvm = jvm_pid(spark)
    run_sweep_job(spark, spec, range(1000, 1002))  # warm-up: executors, Python workers, imports
    cpu0, t0 = cpu_seconds(jvm) + _tree_cpu(extra_pids), time.monotonic()
    table = run_sweep_job(spark, spec, range(seeds))
    wall, cpu = time.monotonic() - t0, cpu_seconds(jvm) + _tree_cpu(extra_pids) - cpu0
    assert table.num_rows == seeds * len(spec.policies)
    return wall, cpu


def cluster_speedup(spec, seeds: int, rows: list[Row]) -> list[str]:
    """N seeds on local[1], then on a standalone cluster of two one-core workers; the same parallelism (tasks)."""
    import tempfile

    from bench.cluster import standalone_cluster
    from storage.session import get_spark

    conf = {"spark.default.parallelism": "2", "spark.executor.cores": "1", "spark.executor.memory": "1g",
            "spark.cores.max": "2"}
    spark = get_spark("replab-sweep-bench-local1", master="local[1]", extra_conf=conf)
    local = _timed(spark, spec, seeds, [])
    spark.stop()
    rows.append(Row(f"sweep job, {seeds} seeds (local[1])", seeds, *local, local[0] / seeds, load_average()))
    with tempfile.TemporaryDirectory(prefix="replab-cluster-") as tmp, \
            standalone_cluster(workers=2, cores=1, memory="2g", work_dir=tmp) as cluster:
        spark = get_spark("replab-sweep-bench-cluster", master=cluster.url, extra_conf=conf)
        try:
            remote = _timed(spark, spec, seeds, cluster.pids[1:])
        finally:
            spark.stop()
    rows.append(Row(f"sweep job, {seeds} seeds (standalone, 2 workers × 1 core)", seeds, *remote,
                    remote[0] / seeds, load_average()))
    return [f"standalone 2 × 1 core vs local[1]: {local[0] / remote[0]:.2f}× (wall), CPU seconds "
            f"{local[1]:.1f} vs {remote[1]:.1f}"]


def marginal(spec, args, rows: list[Row]) -> list[str]:
    from engine.sweep.job import run_sweep_job
    from storage.session import get_spark

    small, large = (int(x) for x in args.seeds.split(","))
    core = core_seconds(spec, list(range(args.core_seeds)))
    rows.append(Row("replay core, one seed (no Spark, CPU s)", 1, core, core, core, load_average()))
    spark = get_spark("replab-sweep-bench", master=args.master)
    cores = task_slots(spark, args.master)
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
    return [f"marginal seed / replay core: {marginal_wall * cores / core:.2f}× (core-seconds), "
            f"{marginal_cpu / core:.2f}× (CPU seconds)"]


if __name__ == "__main__":
    raise SystemExit(main())
