"""The fixed cost of a replay (SPEC §10): `replab replay` of a three-message trace against a bare SparkSession.

    python -m bench.fixed_cost_bench                     # one bare session, one replay into a new lakehouse,
                                                         # one into the same (existing) lakehouse
    python -m bench.fixed_cost_bench --repeat 2 --json out.json

Measured in one run, each in a fresh process as a user starts it:

- bare: `storage.session.get_spark()` (Delta configured) then `spark.stop()`, the process's whole wall time
  (Python start, pyspark import, JVM start, stop);
- replay new / existing: `python -m pipelines replay` of a 3-message trace with an sqlite MLflow store under a
  temp folder, into a NEW lakehouse, then again into the same lakehouse (its tables exist). The whole process's
  wall time, and a per-step breakdown from the command's progress lines (`engine.replay.run_replay`'s steps),
  timed by this process as each line arrives: Spark start (process start to the first step, imports
  included), trace gate, MLflow runs, replay core, windows and summary, output gate, Delta tables, MLflow
  logging, and the exit (the last lines, Spark stop). The command starts its JVM on C1 only, as it does for any
  small batch replay (`engine.replay.short_lived_jvm`); the bare session is a default one;
- replay warm: three replays of the trace in ONE process and session (`engine.replay.run_replay`), each into a new
  lakehouse; the row is the mean of the second and third, the cost of a small replay in a session that stays up;
- validate new: `python -m pipelines validate` of the trace into a new lakehouse, the trace gate's fixed cost alone.

CPU seconds of each process tree, of its JVMs, and of their JIT compiler threads are sampled from /proc (a fresh
JVM compiling the code paths a replay touches is most of the fixed cost: the JVM is busy, not waiting).

Spark jobs per step come from the run's Spark event log (`spark.eventLog.enabled` through PYSPARK_SUBMIT_ARGS):
a figure that does not depend on the machine's load, unlike the seconds.

Laziness blurs the line between windows and output gate: the windows' frames are computed by the gate's first
Spark job. The ratio replay / bare is SPEC §10's target (<= 2 with the new lakehouse).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.procs import emit, load_average
from bench.spark_profile import REPLAY_STEPS, TreeCpu, command_env, jobs_markdown, run_profiled, steps_markdown

STEPS = REPLAY_STEPS

BARE = """
import time
t0 = time.monotonic()
from storage.session import get_spark
spark = get_spark("replab-bench-bare")
t1 = time.monotonic()
spark.stop()
print(f"start {t1 - t0:.3f} stop {time.monotonic() - t1:.3f}")
"""

#: Replays of the trace in ONE session, each into a new lakehouse: the first pays the cold JVM, the later ones show
#: what a replay costs in a session that stays up (a notebook's, a cluster's).
WARM = """
import sys, time
from engine.plan import ReplayRequest
from engine.replay import run_replay
from replay.policies import parse_policy
from report.figures import run_figures
from storage.session import get_spark
trace, root, uri, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
spark = get_spark("replab-bench-warm")
for i in range(count):
    t = time.monotonic()
    run_replay(spark, ReplayRequest(trace=trace, policies=[parse_policy("kafka-acks1")], lakehouse=f"{root}/lh{i}",
                                    tracking_uri=uri, figures=run_figures))
    print(f"replay{i} {time.monotonic() - t:.3f}", flush=True)
spark.stop()
"""


@dataclass
class FixedCostRow:
    what: str  # bare, replay-new, replay-existing, replay-warm, validate-new
    seconds: float
    steps: dict[str, float] = field(default_factory=dict)
    jobs: dict[str, int] = field(default_factory=dict)  # Spark jobs started during each step
    ratio_to_bare: float | None = None
    load_avg_1m: float = 0.0
    load_avg_5m: float = 0.0
    cpu_s: float = 0.0  # every process of the command (Python, JVM, Python workers)
    jvm_cpu_s: float = 0.0  # of it, the JVMs
    jit_cpu_s: float = 0.0  # of that, the JIT compiler threads: the cold JVM compiling Spark's and Delta's code


def write_tiny_trace(folder: Path) -> Path:
    """Three messages on a 3-broker cluster, one replicate report each on brokers 1 and 2 (SPEC §2.1)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").write_text(json.dumps({
        "format": "replab-trace", "version": 1, "trace_id": "fixed-cost-tiny",
        "brokers": [{"id": b, "rack": f"r{b}"} for b in (0, 1, 2)], "duration_us": 1_000_000,
        "seed": None, "generator": None}))
    (folder / "events.csv").write_text(
        "ts_us,kind,broker,msg_id,key,size_bytes,producer_id,upto_us\n"
        "0,produce,,1,a,100,0,\n"
        "1000,produce,,2,b,100,0,\n"
        "2000,produce,,3,c,100,0,\n"
        "50000,replicate,1,,,,,3000\n"
        "50000,replicate,2,,,,,3000\n")
    return folder


def _load() -> tuple[float, float]:
    one, five, _ = os.getloadavg()
    return round(one, 2), round(five, 2)


def _process_row(what: str, cmd: list[str], workdir: Path, label: str) -> tuple[FixedCostRow, str]:
    """Run `cmd` in a fresh process: a row with its whole wall time and its process tree's CPU, and its stdout."""
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=workdir, env=command_env(), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    tree = TreeCpu(proc.pid)
    out, err = proc.communicate()
    seconds = time.monotonic() - started
    cpu = tree.stop()
    if proc.returncode:
        raise RuntimeError(f"{label} failed: {err[-2000:]}")
    one, five = _load()
    return FixedCostRow(what, round(seconds, 2), load_avg_1m=one, load_avg_5m=five, cpu_s=round(cpu, 1),
                        jvm_cpu_s=round(tree.jvm_seconds(), 1), jit_cpu_s=round(tree.jit_seconds(), 1)), out


def bare(workdir: Path, log=print) -> FixedCostRow:
    row, out = _process_row("bare", [sys.executable, "-c", BARE], workdir, "bare session")
    parts = out.split()
    row.steps = {parts[i]: float(parts[i + 1]) for i in range(0, len(parts) - 1, 2) if parts[i] in ("start", "stop")}
    log(f"bare session start + stop: {row.seconds:.1f} s ({row.steps}) load {row.load_avg_1m} {row.load_avg_5m}; "
        f"CPU {row.cpu_s} s, JVM {row.jvm_cpu_s}, JIT {row.jit_cpu_s}")
    return row


def validate(workdir: Path, trace: Path, lakehouse: Path, log=print) -> FixedCostRow:
    """`replab validate` of the trace into a new lakehouse, in a fresh process: the trace gate's fixed cost alone
    (its JVM on C1 only, as for any trace the driver checks: `expectations.trace_gate.short_lived_gate`)."""
    row, _ = _process_row("validate-new", [sys.executable, "-m", "pipelines", "validate", "--trace", str(trace),
                                           "--lakehouse", str(lakehouse)], workdir, "replab validate")
    log(f"replab validate into a new lakehouse: {row.seconds:.1f} s load {row.load_avg_1m} {row.load_avg_5m}; "
        f"CPU {row.cpu_s} s, JVM {row.jvm_cpu_s}, JIT {row.jit_cpu_s}")
    return row


def warm(workdir: Path, trace: Path, tracking_uri: str, count: int = 3, log=print) -> FixedCostRow:
    """The later replays of `count` in one session (each into a new lakehouse): their mean wall time."""
    proc = subprocess.run([sys.executable, "-c", WARM, str(trace), str(workdir / "warm"), tracking_uri, str(count)],
                          cwd=workdir, env=command_env(), text=True, capture_output=True)
    if proc.returncode:
        raise RuntimeError(f"warm replays failed: {proc.stderr[-2000:]}")
    times = {k: float(v) for k, v in (line.split() for line in proc.stdout.splitlines() if line.startswith("replay"))}
    later = [times[f"replay{i}"] for i in range(1, count)]
    one, five = _load()
    row = FixedCostRow("replay-warm", round(sum(later) / len(later), 2), {k: round(v, 2) for k, v in times.items()},
                       load_avg_1m=one, load_avg_5m=five)
    log(f"replays in one session: {times} (the first pays the cold JVM) load {one} {five}")
    return row


def replay(what: str, workdir: Path, trace: Path, lakehouse: Path, tracking_uri: str, log=print,
           profiles: dict[str, str] | None = None) -> FixedCostRow:
    """One replay; `profiles[what]` gets its steps and Spark jobs (step, time, stages, query) as Markdown."""
    cmd = [sys.executable, "-m", "pipelines", "replay", "--trace", str(trace), "--policy", "kafka-acks1",
           "--lakehouse", str(lakehouse), "--tracking-uri", tracking_uri,
           "--summary-json", str(workdir / f"{what}.json")]
    run = run_profiled(cmd, cwd=workdir, event_log=workdir / f"eventlog-{what}")
    steps, jobs = run.step_seconds(), run.step_jobs()
    one, five = _load()
    row = FixedCostRow(what, run.seconds, steps, jobs, load_avg_1m=one, load_avg_5m=five, cpu_s=run.cpu_s,
                       jvm_cpu_s=run.jvm_cpu_s, jit_cpu_s=run.jit_cpu_s)
    if profiles is not None:
        profiles[what] = f"### {what}\n\n{steps_markdown(run)}\n\n{jobs_markdown(run)}"
    log(f"{what}: {row.seconds:.1f} s  " + "  ".join(f"{k} {v:.1f}" for k, v in steps.items()) +
        f"  load {one} {five}; {sum(jobs.values())} Spark jobs: {jobs}; CPU {row.cpu_s} s, JVM {row.jvm_cpu_s}, "
        f"JIT {row.jit_cpu_s}")
    return row


def run(repeat: int = 1, *, workdir: str | None = None, log=print,
        profiles: dict[str, str] | None = None) -> list[FixedCostRow]:
    root = Path(workdir or tempfile.mkdtemp(prefix="replab-bench-fixed-"))
    rows: list[FixedCostRow] = []
    try:
        trace = write_tiny_trace(root / "trace")
        for i in range(repeat):
            run_dir = root / f"run{i}"
            run_dir.mkdir()
            uri = f"sqlite:///{run_dir / 'mlflow.db'}"
            b = bare(run_dir, log)
            new = replay("replay-new", run_dir, trace, run_dir / "lakehouse", uri, log, profiles)
            existing = replay("replay-existing", run_dir, trace, run_dir / "lakehouse", uri, log, profiles)
            warm_row = warm(run_dir, trace, uri, log=log)
            gate = validate(run_dir, trace, run_dir / "validated", log)
            for r in (new, existing, warm_row, gate):
                r.ratio_to_bare = round(r.seconds / b.seconds, 2)
            rows += [b, new, existing, warm_row, gate]
            log(f"replay into a new lakehouse / bare = {new.ratio_to_bare:.2f}; into an existing one = "
                f"{existing.ratio_to_bare:.2f}; in a session that stays up = {warm_row.ratio_to_bare:.2f}; "
                f"replab validate / bare = {gate.ratio_to_bare:.2f}")
    finally:
        if workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    return rows


def markdown(rows: list[FixedCostRow]) -> str:
    names = [n for _, n in STEPS]
    lines = ["| what | wall s | / bare | " + " | ".join(names) + " | Spark jobs | CPU s | JVM CPU s | JIT CPU s | "
             "load 1m, 5m |",
             "|---|---:|---:|" + "---:|" * len(names) + "---:|---:|---:|---:|---|"]
    for r in rows:
        cells = [f"{r.steps[n]:.1f}" + (f" ({r.jobs[n]})" if r.jobs.get(n) else "") if n in r.steps else ""
                 for n in names]
        ratio = f"{r.ratio_to_bare:.2f}" if r.ratio_to_bare is not None else ""
        jobs = sum(r.jobs.values()) if r.jobs else ""
        cpu = " | ".join(f"{v}" if r.cpu_s else "" for v in (r.cpu_s, r.jvm_cpu_s, r.jit_cpu_s))
        lines.append(f"| {r.what} | {r.seconds:.1f} | {ratio} | " + " | ".join(cells) +
                     f" | {jobs} | {cpu} | {r.load_avg_1m}, {r.load_avg_5m} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fixed_cost_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="how many (bare, new, existing) triples")
    parser.add_argument("--workdir", default=None, help="where traces and lakehouses go (default: temp, removed)")
    parser.add_argument("--json", default=None, metavar="FILE", help="write the rows as JSON")
    parser.add_argument("--profile", default=None, metavar="FILE",
                        help="write every Spark job of the replays (step, time, stages, query) as Markdown")
    args = parser.parse_args(argv)
    print(f"load average before: {load_average()}", flush=True)
    profiles: dict[str, str] = {}
    rows = run(args.repeat, workdir=args.workdir, profiles=profiles)
    if args.profile:
        Path(args.profile).write_text("# Spark jobs of the fixed-cost replays (python -m bench.fixed_cost_bench)\n\n"
                                      + "\n\n".join(profiles.values()) + "\n")
    return emit(rows, markdown(rows), args.json)


if __name__ == "__main__":
    raise SystemExit(main())
