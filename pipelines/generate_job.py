"""`replab generate` (SPEC §6.1, §8): a scenario, a seed and a scale in; a trace directory out.

Also runs under spark-submit (SPEC §6.2): `spark-submit pipelines/generate_job.py --scenario NAME --out DIR`.
On a cluster, --out must be a folder that the driver and the executors both see (each task writes its own
Parquet file there; a Databricks /dbfs/... path or a shared mount).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __name__ == "__main__" and __package__ in (None, ""):
    # spark-submit pipelines/generate_job.py without the package installed: the repo root holds the packages.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from schemas.errors import BadInput


def cli(args: argparse.Namespace) -> int:
    from generators.generate import build_plan, generate_trace
    from generators.library import resolve_scenario
    from storage.session import get_spark

    scenario = resolve_scenario(args.scenario)
    # Bad --seed/--scale/--live-speed fail here, before a SparkSession starts.
    build_plan(scenario, args.seed, args.scale)
    if args.live and not args.live_speed > 0:
        raise BadInput(f"--live-speed must be > 0, got {args.live_speed!r}", rule="arguments")
    spark = get_spark("replab-generate")

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    result = generate_trace(spark, scenario, seed=args.seed, scale=args.scale, out=args.out, live=args.live,
                            live_speed=args.live_speed, log=log)
    print(f"{result.trace_dir}: trace {result.manifest.trace_id}, {result.events:,} events "
          f"({result.count('produce'):,} produce, {result.count('replicate'):,} replicate, "
          f"{result.count('faults')} faults) in {len(result.chunks)} files, "
          f"{result.manifest.duration_us / 1e6:g} s of trace, generated in {result.seconds:.1f} s")
    return 0


if __name__ == "__main__":  # spark-submit pipelines/generate_job.py --scenario ... --out ...
    from pipelines.cli import main

    sys.exit(main(["generate", *sys.argv[1:]]))
