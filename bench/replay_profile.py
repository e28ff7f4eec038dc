"""Where a replay's time goes, step by step (SPEC §10): `replab replay` of a scenario's trace, profiled from its
progress lines, Spark's event log and /proc (bench/spark_profile.py).

    python -m bench.replay_profile          # the demo's replay: `demo` at scale 0.5, seed 0, every preset that
                                            # fits, MLflow on (what `make demo` replays, without its figures)
    python -m bench.replay_profile --scenario steady-state --events 1e7 --policy kafka-durable --no-mlflow

The trace is generated first by `replab generate` in a process of its own, so the profiled process starts cold
as a user's would. Written to bench/results/replay-profile-<scenario>-<events, e.g. 10M>.md (or --out): the steps (wall
time, Spark jobs, the share of wall time with some Spark job running, task time against the two task slots, GC,
spill, CPU seconds, the machine's busy and I/O-wait shares) and the longest Spark jobs.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from bench.procs import load_average
from bench.spark_profile import ProfiledCommand, command_env, jobs_markdown, run_profiled, steps_markdown

RESULTS = Path(__file__).resolve().parent / "results"


def generate(scenario: str, seed: int, scale: float, out: Path) -> int:
    """Write the trace with `replab generate`; its event count."""
    cmd = [sys.executable, "-m", "pipelines", "generate", "--scenario", scenario, "--seed", str(seed),
           "--scale", repr(scale), "--out", str(out)]
    proc = subprocess.run(cmd, env=command_env(), text=True, capture_output=True)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr[-3000:]}")
    found = re.search(r"([\d,]+) events", proc.stdout)  # "<dir>: trace <id>, 1,234 events ..."
    if not found:
        raise RuntimeError(f"no event count in the output of {' '.join(cmd)}: {proc.stdout[-1000:]}")
    return int(found.group(1).replace(",", ""))


def demo_policies(trace: Path) -> list[str]:
    """The presets `make demo` replays this trace under (those that fit its cluster)."""
    from pipelines.demo_job import fitting_presets
    from storage.trace_loader import locate

    presets, _ = fitting_presets(locate(str(trace)).manifest)
    return [p.canonical() for p in presets]


def profile(*, scenario: str, seed: int, scale: float, policies: list[str] | None, mlflow: bool,
            workdir: Path, log=print) -> tuple[ProfiledCommand, int, list[str]]:
    trace = workdir / "trace"
    events = generate(scenario, seed, scale, trace)
    policies = policies or demo_policies(trace)
    log(f"{scenario} seed {seed} scale {scale:g}: {events:,} events; replaying under {len(policies)} "
        f"polic{'y' if len(policies) == 1 else 'ies'}; load {load_average()}")
    cmd = [sys.executable, "-m", "pipelines", "replay", "--trace", str(trace), "--lakehouse",
           str(workdir / "lakehouse")]
    for p in policies:
        cmd += ["--policy", p]
    cmd += ["--tracking-uri", f"sqlite:///{workdir / 'mlflow.db'}"] if mlflow else ["--no-mlflow"]
    run = run_profiled(cmd, cwd=workdir, event_log=workdir / "eventlog")
    return run, events, policies


#: The steps after the replay core that SPEC §10 calls the tail (MLflow logging and the exit are not in it).
TAIL = ("windows", "output_gate", "delta_writes")


def step_ratios(run: ProfiledCommand) -> dict[str, float]:
    seconds = run.step_seconds()
    core = seconds.get("replay", 0.0)
    tail = sum(seconds.get(s, 0.0) for s in TAIL)
    return {"core_s": core, "trace_gate_s": seconds.get("trace_gate", 0.0), "tail_s": round(tail, 2),
            "trace_gate_to_core": round(seconds.get("trace_gate", 0.0) / core, 2) if core else float("nan"),
            "tail_to_core": round(tail / core, 2) if core else float("nan")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replay_profile", description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="demo")
    parser.add_argument("--seed", type=int, default=0)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--scale", type=float, default=None, help="the generator's --scale (default 0.5, the demo's)")
    size.add_argument("--events", default=None, help="about this many events (sets --scale), e.g. 1e7")
    parser.add_argument("--policy", action="append", default=None,
                        help="repeat for several (default: every preset that fits, as the demo)")
    parser.add_argument("--no-mlflow", action="store_true")
    parser.add_argument("--top", type=int, default=30, help="how many of the longest Spark jobs to list")
    parser.add_argument("--out", default=None, help="the Markdown profile (default bench/results/...)")
    parser.add_argument("--json", default=None, metavar="FILE", help="the steps and ratios as JSON")
    parser.add_argument("--workdir", default=None, help="trace, lakehouse and event log (default: temp, removed)")
    args = parser.parse_args(argv)
    if args.events is not None:
        from bench.generate_bench import scale_for
        from generators.library import resolve_scenario

        scale = round(scale_for(resolve_scenario(args.scenario), int(float(args.events))), 4)
    else:
        scale = 0.5 if args.scale is None else args.scale
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="replab-replay-profile-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        run, events, policies = profile(scenario=args.scenario, seed=args.seed, scale=scale, policies=args.policy,
                                        mlflow=not args.no_mlflow, workdir=workdir)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    total_task = sum(s.task_s for s in run.steps)
    ratios = step_ratios(run)
    head = (f"# Replay profile: `{args.scenario}` seed {args.seed} scale {scale:g}, {events:,} events, "
            f"{len(policies)} polic{'y' if len(policies) == 1 else 'ies'}, MLflow {'off' if args.no_mlflow else 'on'}"
            f"\n\n`python -m bench.replay_profile {' '.join(argv if argv is not None else sys.argv[1:])}`: "
            f"{run.seconds:.1f} s wall, {sum(s.cpu_s for s in run.steps):.1f} CPU-s of the command's processes, "
            f"{total_task:.1f} task-s in {sum(s.jobs for s in run.steps)} Spark jobs on local[2]; load average "
            f"after: {load_average()}.\n\nPolicies: {', '.join(policies)}\n\n"
            f"Issue 15's ratios (targets ≤ 0.5): trace gate / replay core **{ratios['trace_gate_to_core']:.2f}**, "
            f"tail (windows and summary, output gate, Delta tables) / replay core **{ratios['tail_to_core']:.2f}**")
    text = (f"{head}\n\n## Steps\n\n{steps_markdown(run)}\n\n## The {args.top} longest Spark jobs\n\n"
            f"{jobs_markdown(run, top=args.top)}\n")
    size = f"{round(events / 1e6)}M" if events >= 1e6 else f"{round(events / 1e3)}k"
    out = Path(args.out) if args.out else RESULTS / f"replay-profile-{args.scenario}-{size}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    print(f"written to {out}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "scenario": args.scenario, "seed": args.seed, "scale": scale, "events": events, "policies": policies,
            "mlflow": not args.no_mlflow, "seconds": run.seconds, **ratios,
            "steps": [asdict(s) for s in run.steps]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
