"""`make bench`: every benchmark behind the README's figures (SPEC §10), one after the other, each in its own
process (one SparkSession each, nothing shared), results as JSON in bench/results/ and one Markdown summary.

    python -m bench.run                    # kernel, generator, Spark replay, stream, sweep (where present)
    python -m bench.run --only kernel,spark
    python -m bench.run --quick            # small sizes: a smoke run of every benchmark (minutes)

Figures are wall seconds and CPU seconds of replab's own processes; the load average is printed beside them
because the machine may be shared (bench/procs.py).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"

#: name -> (module, full arguments, quick arguments)
BENCHES: dict[str, tuple[str, list[str], list[str]]] = {
    "kernel": ("bench.kernel_bench", [], ["--scale", "0.3", "--reference-scale", "0.05"]),
    # Every library scenario: the kernels at about 1 M events each, the reference at about 50 k (where its rate has
    # settled), each at a throughput size (the longest step of `make bench`). At a scenario's own scale a kernel call's
    # fixed cost is its time, and the reference is timed for milliseconds.
    "kernel-every-scenario": ("bench.kernel_bench", ["--every-scenario", "--kernel-events", "1e6",
                                                     "--reference-events", "5e4", "--reference-scale", "0.05"],
                              ["--every-scenario", "--reference-scale", "0.02"]),
    "generate": ("bench.generate_bench", [], ["--sizes", "1e6"]),
    "spark": ("bench.spark_bench", ["--sizes", "1e6"], ["--sizes", "2e5", "--skip-full"]),
    # The scale check (SPEC §10): 1 M and 10 M events, the replay cores and one policy's full replay, peak memory.
    "scale": ("bench.spark_bench", ["--sizes", "1e6,1e7", "--full", "one"], ["--sizes", "1e5,1e6", "--full", "one"]),
    "stream": ("bench.stream_bench", [], []),
    # The sweep's marginal cost per seed against one replay core, and a 2-worker standalone cluster vs local[1].
    "sweep": ("bench.sweep_bench", ["--cluster-seeds", "40"], ["--seeds", "2,6", "--core-seeds", "2",
                                                               "--cluster-seeds", "6"]),
    # The fixed cost (SPEC §10): `replab replay` of a 3-message trace (new and existing lakehouse) against a bare
    # Spark session.
    "fixed-cost": ("bench.fixed_cost_bench", ["--repeat", "2"], []),
    # The durability target (docs/performance.md): every preset's nines per year at the default failure model,
    # in a fixed budget of episodes.
    "durability": ("bench.durability_bench", ["--budget-s", "600"], ["--budget-s", "60"]),
    # Where the driver JVM's CPU goes in that replay in a session that stays up (Java Flight Recorder's samples).
    "jvm-profile": ("bench.jvm_profile", ["--out", str(RESULTS / "warm-replay-jvm-profile.md")], ["--replays", "2"]),
    # The trace gate and tail against the replay core, step by step from the Spark event log: the demo's
    # replay (16 presets, MLflow on), 1 M events x 16 presets, and one policy at 10 M events.
    "profile-demo": ("bench.replay_profile", [], ["--scale", "0.05"]),
    "profile-1m": ("bench.replay_profile", ["--scenario", "steady-state", "--seed", "1", "--events", "1e6",
                                            "--no-mlflow"],
                   ["--scenario", "steady-state", "--seed", "1", "--events", "1e5", "--no-mlflow"]),
    "profile-10m": ("bench.replay_profile", ["--scenario", "steady-state", "--seed", "1", "--events", "1e7",
                                             "--policy", "kafka-durable", "--no-mlflow"],
                    ["--scenario", "steady-state", "--seed", "1", "--events", "1e5", "--policy", "kafka-durable",
                     "--no-mlflow"]),
    "dledger-vs-kafka": ("studies.dledger_vs_kafka", [], []),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help=f"comma-separated subset of {', '.join(BENCHES)}")
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    args = parser.parse_args(argv)
    names = args.only.split(",") if args.only else list(BENCHES)
    unknown = sorted(set(names) - set(BENCHES))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {', '.join(BENCHES)}")
    RESULTS.mkdir(exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    summary = [f"# replab benchmarks, {stamp}{' (quick)' if args.quick else ''}", ""]
    failed = []
    for name in names:
        module, full, quick = BENCHES[name]
        if importlib.util.find_spec(module) is None:
            summary += [f"## {name}", "", f"(skipped: {module} is not in this checkout)", ""]
            continue
        out = RESULTS / f"{stamp}-{name}.json"
        cmd = [sys.executable, "-m", module, *(quick if args.quick else full)]
        if "--json" not in cmd and name != "dledger-vs-kafka":
            cmd += ["--json", str(out)]
        print(f"$ {' '.join(cmd)}", flush=True)
        proc = subprocess.run(cmd, text=True, capture_output=True)
        text = proc.stdout.strip()
        print(text, flush=True)
        if proc.returncode:
            failed.append(name)
            print(proc.stderr[-4000:], file=sys.stderr)
        summary += [f"## {name}", "", f"`{' '.join(cmd[1:])}` (exit {proc.returncode})", "", text, ""]
    path = RESULTS / f"{stamp}-summary.md"
    path.write_text("\n".join(summary) + "\n")
    print(f"\nsummary: {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
