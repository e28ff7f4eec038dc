"""Where a `replab` command's time goes, step by step: the command runs in its own process with Spark's event log
on; each progress line it prints starts a step. For each step: its wall time, the Spark jobs it started, how much
of its wall time some Spark job was running (the rest is the driver alone: Python, planning, Delta's log, GX,
MLflow), the task time the jobs used (of 2 task slots on local[2]), the command's CPU seconds (driver, JVM, Python
workers) and the machine's CPU busy and I/O-wait shares, read from /proc/stat at each step's start.

Used by `bench.fixed_cost_bench` (a three-message replay) and `bench.replay_profile` (a scenario's trace).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.procs import descendants

REPO = Path(__file__).resolve().parent.parent

#: Progress lines of `replab replay` (their first words) -> the step they start. Order matters for the breakdown.
REPLAY_STEPS: tuple[tuple[str, str], ...] = (
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


def command_env(event_log: Path | None = None) -> dict[str, str]:
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


@dataclass
class SparkJob:
    job_id: int
    start: float  # epoch seconds
    end: float
    stages: int
    sql: str  # the SQL execution the job belongs to (AQE runs each query stage of one query as its own job)
    what: str  # Spark's description (Delta names its internal queries) or the call site
    stage_ids: tuple[int, ...] = ()
    tasks: int = 0
    task_s: float = 0.0  # executor run time of the job's tasks (Python UDF time included)
    task_cpu_s: float = 0.0  # JVM CPU time of those tasks (the Python workers' time is not in it)
    gc_s: float = 0.0
    spill_mb: float = 0.0


_STAGE_METRICS = {"internal.metrics.executorRunTime": ("task_s", 1e-3),
                  "internal.metrics.executorCpuTime": ("task_cpu_s", 1e-9),
                  "internal.metrics.jvmGCTime": ("gc_s", 1e-3),
                  "internal.metrics.diskBytesSpilled": ("spill_mb", 1 / 2**20)}


def spark_jobs(event_log: Path) -> list[SparkJob]:
    """Every Spark job of the run's event log, in submission order, with its completed stages' task metrics."""
    jobs: dict[int, SparkJob] = {}
    stages: dict[int, dict[str, float]] = {}
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
                                             props.get("spark.sql.execution.id", ""), what,
                                             tuple(e.get("Stage IDs", ())))
            elif '"SparkListenerJobEnd"' in line:
                e = json.loads(line)
                if e["Job ID"] in jobs:
                    jobs[e["Job ID"]].end = e["Completion Time"] / 1000
            elif '"SparkListenerStageCompleted"' in line:
                info = json.loads(line)["Stage Info"]
                metrics = {"tasks": float(info.get("Number of Tasks", 0))}
                for acc in info.get("Accumulables", ()):
                    if acc.get("Name") in _STAGE_METRICS:
                        name, unit = _STAGE_METRICS[acc["Name"]]
                        metrics[name] = float(acc.get("Value") or 0) * unit
                stages[info["Stage ID"]] = metrics
    for job in jobs.values():
        for stage_id in job.stage_ids:
            m = stages.get(stage_id)  # skipped stages (their shuffle output reused) never complete
            if m:
                job.tasks += int(m["tasks"])
                job.task_s += m.get("task_s", 0.0)
                job.task_cpu_s += m.get("task_cpu_s", 0.0)
                job.gc_s += m.get("gc_s", 0.0)
                job.spill_mb += m.get("spill_mb", 0.0)
    return sorted(jobs.values(), key=lambda j: (j.start, j.job_id))


def machine_cpu() -> tuple[int, int, int]:
    """(busy, iowait, total) clock ticks of every core since boot, from /proc/stat."""
    fields = [int(f) for f in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    busy = user + nice + system + irq + softirq + steal
    return busy, iowait, busy + idle + iowait


class TreeCpu:
    """CPU seconds of a process and everything under it, sampled every `every_s` in a thread: each process's
    last sample is kept, so workers and the JVM count after they exit (a child reaped by nobody is in no one's
    cutime). Processes shorter than one interval are missed."""

    def __init__(self, pid: int, every_s: float = 0.5) -> None:
        self.pid, self.every_s = pid, every_s
        self._last: dict[int, float] = {}
        self._jvms: set[int] = set()
        self._jit: dict[tuple[int, str], float] = {}  # (JVM pid, thread id) -> CPU s of a JIT compiler thread
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.seconds()

    def seconds(self) -> float:
        tick = os.sysconf("SC_CLK_TCK")
        for pid in [self.pid, *descendants(self.pid)]:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            with self._lock:
                self._last[pid] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
            if fields[0] != "Z":  # alive: a JVM among them has compiler threads to sample
                self._sample_jit(pid, tick)
        with self._lock:
            return sum(self._last.values())

    def _sample_jit(self, pid: int, tick: int) -> None:
        """HotSpot names its JIT compiler threads "C1 CompilerThre…" and "C2 CompilerThre…"."""
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() != "java":
                return
            threads = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            return
        with self._lock:
            self._jvms.add(pid)
        for task in threads:
            try:
                if "CompilerThre" not in (task / "comm").read_text():
                    continue
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            with self._lock:
                self._jit[(pid, task.name)] = (int(fields[11]) + int(fields[12])) / tick

    def jvm_seconds(self) -> float:
        """CPU seconds of the JVMs (the Spark driver; spark-submit's launcher JVM too)."""
        with self._lock:
            return sum(v for pid, v in self._last.items() if pid in self._jvms)

    def jit_seconds(self) -> float:
        """CPU seconds of the JVMs' JIT compiler threads (sampled: a thread's last sample counts)."""
        with self._lock:
            return sum(self._jit.values())

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        with self._lock:
            return sum(self._last.values())


@dataclass
class Mark:
    step: str
    at: float  # monotonic seconds
    machine: tuple[int, int, int]
    cpu_s: float  # the command's process tree


@dataclass
class StepProfile:
    step: str
    seconds: float
    jobs: int = 0
    in_jobs_s: float = 0.0  # wall time during which at least one of the step's jobs ran
    task_s: float = 0.0
    gc_s: float = 0.0
    spill_mb: float = 0.0
    cpu_s: float = 0.0  # the command's processes
    machine_busy: float = 0.0  # share of all cores' time busy (anything on the machine)
    machine_iowait: float = 0.0


@dataclass
class ProfiledCommand:
    seconds: float
    steps: list[StepProfile]
    jobs: list[tuple[str, float, SparkJob]] = field(default_factory=list)  # (step, start offset s, job)
    output: str = ""
    cpu_s: float = 0.0  # the command's processes
    jvm_cpu_s: float = 0.0  # of it, the JVMs
    jit_cpu_s: float = 0.0  # of that, the JIT compiler threads

    def step_seconds(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for s in self.steps:
            out[s.step] = round(out.get(s.step, 0.0) + s.seconds, 2)
        return out

    def step_jobs(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.steps:
            if s.jobs:
                out[s.step] = out.get(s.step, 0) + s.jobs
        return out


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def run_profiled(cmd: list[str], *, cwd: Path, event_log: Path,
                 steps: tuple[tuple[str, str], ...] = REPLAY_STEPS) -> ProfiledCommand:
    """Run `cmd` (a `python -m pipelines ...` command) and profile it by its progress lines."""
    first = steps[0][1]
    offset = time.time() - time.monotonic()  # event-log times are epoch seconds
    started = time.monotonic()
    err_path = event_log.with_name(event_log.name + ".stderr")
    err = err_path.open("w")  # a file, not a pipe: Spark's log would fill a pipe nobody reads until the end
    proc = subprocess.Popen(cmd, cwd=cwd, env=command_env(event_log), text=True, stdout=subprocess.PIPE,
                            stderr=err, bufsize=1)
    tree = TreeCpu(proc.pid)
    marks = [Mark(first, started, machine_cpu(), 0.0)]
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        now = time.monotonic()
        lines.append(line)
        text = line.strip().lstrip("[0123456789:] ").strip()
        for prefix, name in steps:
            if text.startswith(prefix) and name != first:
                marks.append(Mark(name, now, machine_cpu(), tree.seconds()))
                break
    code = proc.wait()
    end = time.monotonic()
    err.close()
    stderr = err_path.read_text(errors="replace")
    total_cpu = tree.stop()
    if code:
        raise RuntimeError(f"{' '.join(cmd)} exited {code}: {stderr[-3000:]}\n{''.join(lines)[-2000:]}")
    marks.append(Mark("end", end, machine_cpu(), total_cpu))
    jobs = spark_jobs(event_log)
    profiles = []
    placed: list[tuple[str, float, SparkJob]] = []
    for m, nxt in itertools.pairwise(marks):
        mine = [j for j in jobs if m.at + offset <= j.start < nxt.at + offset]
        busy, iowait, total = (b - a for a, b in zip(m.machine, nxt.machine, strict=True))
        profiles.append(StepProfile(
            m.step, round(nxt.at - m.at, 2), len(mine),
            round(union_seconds([(j.start, min(j.end, nxt.at + offset)) for j in mine]), 2),
            round(sum(j.task_s for j in mine), 2), round(sum(j.gc_s for j in mine), 2),
            round(sum(j.spill_mb for j in mine), 1), round(max(nxt.cpu_s - m.cpu_s, 0.0), 2),
            round(busy / total, 3) if total else 0.0, round(iowait / total, 3) if total else 0.0))
        placed += [(m.step, j.start - offset - started, j) for j in mine]
    return ProfiledCommand(round(end - started, 2), profiles, placed, "".join(lines), round(total_cpu, 1),
                           round(tree.jvm_seconds(), 1), round(tree.jit_seconds(), 1))


def steps_markdown(run: ProfiledCommand, slots: int = 2) -> str:
    lines = ["| step | wall s | Spark jobs | some job running s | driver alone s | task s (of slots × wall) | "
             "GC s | spilled MB | CPU s | machine busy | I/O wait |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in run.steps:
        use = s.task_s / (slots * s.seconds) if s.seconds else 0.0
        lines.append(f"| {s.step} | {s.seconds:.1f} | {s.jobs} | {s.in_jobs_s:.1f} | "
                     f"{max(s.seconds - s.in_jobs_s, 0.0):.1f} | {s.task_s:.1f} ({use:.0%}) | {s.gc_s:.1f} | "
                     f"{s.spill_mb:.0f} | {s.cpu_s:.1f} | {s.machine_busy:.0%} | {s.machine_iowait:.0%} |")
    return "\n".join(lines)


def jobs_markdown(run: ProfiledCommand, top: int | None = None) -> str:
    """Every job (or the `top` longest, in order of submission): step, start, seconds, stages, tasks, metrics."""
    chosen = run.jobs
    if top is not None:
        longest = sorted(run.jobs, key=lambda p: p[2].end - p[2].start, reverse=True)[:top]
        chosen = [p for p in run.jobs if p in longest]
    lines = ["| step | job | at s | seconds | stages | tasks | task s | GC s | spilled MB | SQL query | what |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for step, at, j in chosen:
        lines.append(f"| {step} | {j.job_id} | {at:.1f} | {j.end - j.start:.2f} | {j.stages} | {j.tasks} | "
                     f"{j.task_s:.1f} | {j.gc_s:.1f} | {j.spill_mb:.0f} | {j.sql} | {j.what} |")
    return "\n".join(lines)
