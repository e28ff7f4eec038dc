"""The fixed cost of a replay (issue 15): `replab replay` of a three-message trace against a bare SparkSession.

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
  logging, and the exit (the last lines, Spark stop).

Spark jobs per step come from the run's Spark event log (`spark.eventLog.enabled` through PYSPARK_SUBMIT_ARGS):
a figure that does not depend on the machine's load, unlike the seconds.

Laziness blurs the line between windows and output gate: the windows' frames are computed by the gate's first
Spark job. The ratio replay / bare is issue 15's target (<= 2 with the new lakehouse).
"""

from __future__ import annotations

import argparse
import itertools
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

REPO = Path(__file__).resolve().parent.parent

#: Progress lines of `replab replay` (their first words) -> the step they start. Order matters for the breakdown.
STEPS: tuple[tuple[str, str], ...] = (
    ("Spark session", "spark_start"),
    ("trace gate", "trace_gate"),
    ("MLflow runs", "mlflow_runs"),
    ("replay ", "replay"),
    ("windows", "windows"),
    ("output gate", "output_gate"),
    ("Delta tables", "delta_writes"),
    ("MLflow", "mlflow_logging"),
    ("lakehouse:", "exit"),  # the comparison is printed; then the summary lines and the Spark stop
)

BARE = """
import time
t0 = time.monotonic()
from storage.session import get_spark
spark = get_spark("replab-bench-bare")
t1 = time.monotonic()
spark.stop()
print(f"start {t1 - t0:.3f} stop {time.monotonic() - t1:.3f}")
"""


@dataclass
class FixedCostRow:
    what: str  # bare, replay-new, replay-existing
    seconds: float
    steps: dict[str, float] = field(default_factory=dict)
    jobs: dict[str, int] = field(default_factory=dict)  # Spark jobs started during each step
    ratio_to_bare: float | None = None
    load_avg_1m: float = 0.0
    load_avg_5m: float = 0.0


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


def _env(event_log: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    if event_log is not None:
        event_log.mkdir(parents=True, exist_ok=True)
        env["PYSPARK_SUBMIT_ARGS"] = (f"--conf spark.eventLog.enabled=true --conf spark.eventLog.compress=false "
                                      f"--conf spark.eventLog.dir={event_log} "
                                      "pyspark-shell")
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    env.setdefault("GX_ANALYTICS_ENABLED", "false")
    env.setdefault("MLFLOW_ENABLE_TELEMETRY", "false")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env["COLUMNS"] = "200"  # one progress line per step
    return env


def _load() -> tuple[float, float]:
    one, five, _ = os.getloadavg()
    return round(one, 2), round(five, 2)


def bare(workdir: Path, log=print) -> FixedCostRow:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", BARE], cwd=workdir, env=_env(), text=True, capture_output=True)
    seconds = time.monotonic() - started
    if proc.returncode:
        raise RuntimeError(f"bare session failed: {proc.stderr[-2000:]}")
    parts = proc.stdout.split()
    inner = {parts[i]: float(parts[i + 1]) for i in range(0, len(parts) - 1, 2) if parts[i] in
             ("start", "stop")}
    one, five = _load()
    row = FixedCostRow("bare", round(seconds, 2), inner,
                       load_avg_1m=one, load_avg_5m=five)
    log(f"bare session start + stop: {row.seconds:.1f} s ({inner}) load {one} {five}")
    return row


def replay(what: str, workdir: Path, trace: Path, lakehouse: Path, tracking_uri: str, log=print,
           profiles: dict[str, str] | None = None) -> FixedCostRow:
    """One replay; `profiles[what]` gets its Spark jobs, one Markdown row each (step, time, stages, query)."""
    cmd = [sys.executable, "-m", "pipelines", "replay", "--trace", str(trace), "--policy", "kafka-acks1",
           "--lakehouse", str(lakehouse), "--tracking-uri", tracking_uri,
           "--summary-json", str(workdir / f"{what}.json")]
    marks: list[tuple[str, float]] = [("spark_start", time.monotonic())]
    offset = time.time() - time.monotonic()  # event-log times are epoch milliseconds
    events = workdir / f"eventlog-{what}"
    proc = subprocess.Popen(cmd, cwd=workdir, env=_env(events), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, bufsize=1)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        now = time.monotonic()
        lines.append(line)
        text = line.strip().lstrip("[0123456789:] ").strip()
        for prefix, name in STEPS:
            if text.startswith(prefix) and name != "spark_start":
                marks.append((name, now))
                break
    stderr = proc.stderr.read() if proc.stderr else ""
    code = proc.wait()
    end = time.monotonic()
    if code:
        raise RuntimeError(f"{' '.join(cmd)} exited {code}: {stderr[-3000:]}\n{''.join(lines)[-2000:]}")
    marks.append(("end", end))
    steps: dict[str, float] = {}
    for (name, t), (_, t_next) in itertools.pairwise(marks):
        steps[name] = round(steps.get(name, 0.0) + t_next - t, 2)
    jobs: dict[str, int] = {}
    profile = [f"### {what}", "", "| step | job | at s | seconds | stages | SQL query | what |",
               "|---|---:|---:|---:|---:|---:|---|"]
    for job in spark_jobs(events):
        name = next((n for n, t in reversed(marks) if t + offset <= job.start), marks[0][0])
        jobs[name] = jobs.get(name, 0) + 1
        profile.append(f"| {name} | {job.job_id} | {job.start - offset - marks[0][1]:.1f} | "
                       f"{job.end - job.start:.2f} | {job.stages} | {job.sql} | {job.what} |")
    one, five = _load()
    row = FixedCostRow(what, round(end - marks[0][1], 2), steps, jobs, load_avg_1m=one, load_avg_5m=five)
    if profiles is not None:
        profiles[what] = "\n".join(profile)
    log(f"{what}: {row.seconds:.1f} s  " + "  ".join(f"{k} {v:.1f}" for k, v in steps.items()) +
        f"  load {one} {five}; {sum(jobs.values())} Spark jobs: {jobs}")
    return row


@dataclass
class SparkJob:
    job_id: int
    start: float  # epoch seconds
    end: float
    stages: int
    sql: str  # the SQL execution the job belongs to (AQE runs each query stage of one query as its own job)
    what: str  # Spark's description (Delta names its internal queries) or the call site


def spark_jobs(event_log: Path) -> list[SparkJob]:
    """Every Spark job of the run's event log, in submission order."""
    jobs: dict[int, SparkJob] = {}
    for path in event_log.rglob("*"):
        if not path.is_file():
            continue
        for line in path.read_text(errors="replace").splitlines():
            if '"SparkListenerJobStart"' in line:
                e = json.loads(line)
                props = e.get("Properties") or {}
                what = (props.get("spark.job.description") or props.get("callSite.short") or "?")
                what = what.replace("|", "/").replace("<br/>", " ").replace(str(REPO) + "/", "")[:90]
                start = e["Submission Time"] / 1000
                jobs[e["Job ID"]] = SparkJob(e["Job ID"], start, start, len(e.get("Stage Infos", [])),
                                             props.get("spark.sql.execution.id", ""), what)
            elif '"SparkListenerJobEnd"' in line:
                e = json.loads(line)
                if e["Job ID"] in jobs:
                    jobs[e["Job ID"]].end = e["Completion Time"] / 1000
    return sorted(jobs.values(), key=lambda j: (j.start, j.job_id))


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
            for r in (new, existing):
                r.ratio_to_bare = round(r.seconds / b.seconds, 2)
            rows += [b, new, existing]
            log(f"replay into a new lakehouse / bare = {new.ratio_to_bare:.2f}; into an existing one = "
                f"{existing.ratio_to_bare:.2f}")
    finally:
        if workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    return rows


def markdown(rows: list[FixedCostRow]) -> str:
    names = [n for _, n in STEPS]
    lines = ["| what | wall s | / bare | " + " | ".join(names) + " | Spark jobs | load 1m, 5m |",
             "|---|---:|---:|" + "---:|" * len(names) + "---:|---|"]
    for r in rows:
        cells = [f"{r.steps[n]:.1f}" + (f" ({r.jobs[n]})" if r.jobs.get(n) else "") if n in r.steps else ""
                 for n in names]
        ratio = f"{r.ratio_to_bare:.2f}" if r.ratio_to_bare is not None else ""
        lines.append(f"| {r.what} | {r.seconds:.1f} | {ratio} | " + " | ".join(cells) +
                     f" | {sum(r.jobs.values()) if r.what != 'bare' else ''} | {r.load_avg_1m}, {r.load_avg_5m} |")
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
