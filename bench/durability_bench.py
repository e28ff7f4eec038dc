"""Durability benchmark (issue target: every preset of conf/policies.yaml, the default failure model on the
`demo` cluster, P(loss per year) to a relative half-width <= 20 % in <= 10 minutes on this 2-core machine).

    python -m bench.durability_bench --budget-s 600 --json out.json     # the target's budget
    python -m bench.durability_bench --budget-s 90                      # a short look
    python -m bench.durability_bench --cluster-episodes 48              # Spark: 2-worker standalone vs local[1]
    python -m bench.durability_bench --budget-s 240 --rows rows.json    # every episode, for bench.durability_diagnose

The estimator runs in-process on one core (`engine.durability.run`, the same episodes and figures a Spark run
gives; a Spark run spreads the rounds over its cores), in rounds of `--batch` episodes, until the budget of wall
seconds is spent. Each episode is one short trace judged under every preset at once. The row gives episodes
per CPU-second (each judged under every policy), the nines each policy reached with its 95 % interval, and the
relative half-width of P(loss per year): the worst over policies that lost something, and their median.
Policies where no sampled episode lost anything carry a proven bound instead and are counted apart.

With `--cluster-episodes N` it times instead the Spark job's round (`engine.durability.job.run_round`, generation
and replay inside the tasks) on the same N episodes, on `local[1]` and on a standalone cluster of two one-core
workers (`bench.cluster`), after a warm-up round on each: the issue's "2-worker standalone ≥ 1.7× local[1]".
"""

from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import dataclass, field

from bench.procs import emit


@dataclass
class DurabilityRow:
    budget_s: float
    wall_s: float
    cpu_s: float
    episodes: int
    policies: int
    episodes_per_cpu_s: float
    worst_rel_half_width: float | None
    median_rel_half_width: float | None
    bounded_policies: int
    load_average: float
    nines: dict[str, list[float | None]] = field(default_factory=dict)  # label -> [low, estimate, high]
    rel_half_width: dict[str, float | None] = field(default_factory=dict)
    episodes_per_stratum: dict[str, int] = field(default_factory=dict)
    cpu_s_per_stratum: dict[str, float] = field(default_factory=dict)


def run(budget_s: float, batch: int, seed: int, rows_out: str | None = None) -> DurabilityRow:
    from engine.durability.run import DurabilitySpec, Estimate, episode_rows, next_work
    from generators.library import resolve_scenario
    from generators.rates import load_rates
    from replay.policies import all_presets

    pairs = list(all_presets())
    spec = DurabilitySpec(resolve_scenario("demo"), load_rates(), tuple(p for _, p in pairs), seed=seed)
    est = Estimate(spec)
    started = time.monotonic()
    while time.monotonic() - started < budget_s:
        est.rows.extend(episode_rows(spec, next_work(est, batch)))
    wall = time.monotonic() - started
    if rows_out:  # every episode's likelihood statistics and verdicts, for `durability_diagnose`
        import json

        with open(rows_out, "w") as f:
            json.dump({"policies": [pre.name for pre, _ in pairs], "seed": seed, "rows": est.rows}, f)
    figures = est.figures()
    cpu = sum(r["cpu_seconds"] for r in est.rows)
    rel = {pre.name: (None if f["bounded"] else f["relative_half_width"]) for (pre, _), f in
           zip(pairs, figures, strict=True)}
    live = sorted(v for v in rel.values() if v is not None)

    def finite(v):
        return None if v is None or not math.isfinite(v) else v

    return DurabilityRow(
        budget_s, wall, cpu, len(est.rows), len(pairs), len(est.rows) / cpu if cpu else 0.0,
        live[-1] if live else None, live[len(live) // 2] if live else None, sum(v is None for v in rel.values()),
        os.getloadavg()[0],
        {pre.name: [finite(f["nines"]["low"]), finite(f["nines"]["estimate"]), finite(f["nines"]["high"])]
         for (pre, _), f in zip(pairs, figures, strict=True)}, rel,
        {p.name: sum(r["stratum"] == k for r in est.rows) for k, p in enumerate(spec.rates.processes)},
        {p.name: sum(r["cpu_seconds"] for r in est.rows if r["stratum"] == k)
         for k, p in enumerate(spec.rates.processes)})


@dataclass
class ClusterRow:
    episodes: int
    local1_wall_s: float
    cluster_wall_s: float
    speedup: float
    load_average: float


def cluster_speedup(episodes: int, seed: int) -> ClusterRow:
    """The same N episodes through the Spark job's round on local[1], then on two one-core standalone workers."""
    import tempfile

    from bench.cluster import standalone_cluster
    from engine.durability.job import run_round
    from engine.durability.run import DurabilitySpec, Estimate, next_work
    from generators.library import resolve_scenario
    from generators.rates import load_rates
    from replay.policies import all_presets
    from storage.session import get_spark

    spec = DurabilitySpec(resolve_scenario("demo"), load_rates(), tuple(p for _, p in all_presets()), seed=seed)
    work = next_work(Estimate(spec), episodes)
    warm = work[:2]
    conf = {"spark.default.parallelism": "2", "spark.executor.cores": "1", "spark.executor.memory": "1g",
            "spark.cores.max": "2"}

    def timed(spark) -> float:
        run_round(spark, spec, warm)  # JVM, Python workers, imports, compiled kernels
        started = time.monotonic()
        rows = run_round(spark, spec, work)
        assert len(rows) == len(work)
        return time.monotonic() - started

    spark = get_spark("replab-durability-bench-local1", master="local[1]", extra_conf=conf)
    try:
        local = timed(spark)
    finally:
        spark.stop()
    with tempfile.TemporaryDirectory(prefix="replab-cluster-") as tmp, \
            standalone_cluster(workers=2, cores=1, memory="2g", work_dir=tmp) as cluster:
        spark = get_spark("replab-durability-bench-cluster", master=cluster.url, extra_conf=conf)
        try:
            remote = timed(spark)
        finally:
            spark.stop()
    return ClusterRow(len(work), local, remote, local / remote, os.getloadavg()[0])


def markdown(rows: list[DurabilityRow]) -> str:
    out = ["| budget (wall s) | episodes | episodes / CPU-s | worst rel. half-width | median | bounded | load |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        def f(v):
            return "–" if v is None else f"{v:.2f}"
        out.append(f"| {r.budget_s:g} | {r.episodes} | {r.episodes_per_cpu_s:.2f} | {f(r.worst_rel_half_width)} | "
                   f"{f(r.median_rel_half_width)} | {r.bounded_policies}/{r.policies} | {r.load_average:.1f} |")
    out.append("")
    out.append("| policy | nines [95 % interval] | rel. half-width |")
    out.append("|---|---|---|")
    for label, (low, est, high) in rows[-1].nines.items():
        rel = rows[-1].rel_half_width[label]
        text = (f"≥ {low:.2f} (bound)" if rel is None else
                f"{est:.2f} [{low:.2f}, {'∞' if high is None else f'{high:.2f}'}]")
        out.append(f"| {label} | {text} | {'–' if rel is None else f'{rel:.2f}'} |")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.durability_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=600.0, help="wall seconds of episodes (default 600)")
    parser.add_argument("--batch", type=int, default=16, help="episodes per round (default 16)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, metavar="FILE", help="write the row as JSON")
    parser.add_argument("--rows", default=None, metavar="FILE",
                        help="write every episode (likelihood statistics, per-policy verdicts) as JSON")
    parser.add_argument("--cluster-episodes", type=int, default=0, metavar="N",
                        help="time N episodes of the Spark job on local[1] and on a 2-worker standalone cluster")
    args = parser.parse_args(argv)
    if args.cluster_episodes:
        row = cluster_speedup(args.cluster_episodes, args.seed)
        table = ("| episodes | local[1] wall s | standalone 2 × 1 core wall s | speedup | load |\n"
                 "|---|---|---|---|---|\n"
                 f"| {row.episodes} | {row.local1_wall_s:.1f} | {row.cluster_wall_s:.1f} | {row.speedup:.2f}× | "
                 f"{row.load_average:.1f} |")
        return emit([row], table, args.json)
    rows = [run(args.budget_s, args.batch, args.seed, args.rows)]
    return emit(rows, markdown(rows), args.json)


if __name__ == "__main__":
    raise SystemExit(main())
