"""Where the driver JVM's CPU goes in a small replay in a session that stays up (SPEC §10's fixed cost).

    python -m bench.jvm_profile                          # 4 replays of a 3-message trace in one session
    python -m bench.jvm_profile --codegen-cache 100      # with Spark's default codegen cache, for comparison
    python -m bench.jvm_profile --json out.json --out bench/results/warm-replay-jvm-profile.md

One process replays the fixed-cost benchmark's three-message trace (`bench.fixed_cost_bench.write_tiny_trace`,
kafka-acks1, MLflow on, each replay into a new lakehouse) `--replays` times in one SparkSession, with Java Flight
Recorder sampling the driver JVM (`JAVA_TOOL_OPTIONS`; local mode: the executors' task threads are in that JVM).
For each replay: wall seconds, CPU seconds of the JVM and of this Python driver, and how many classes Spark's code
generation compiled (its CodegenMetrics). The JVM's execution samples of the later replays (the first pays the
cold JVM) are put in categories by the frames on their stack, first match wins (CATEGORIES): what a replay's 90
small Spark jobs cost beyond their data. JFR prints times of day only: a run across midnight loses the samples
after it.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from bench.procs import emit, load_average
from bench.spark_profile import command_env

#: (category, a regular expression over the sample's stack frames): the first that matches names the sample.
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("codegen: compiling (Janino, its class lookups)",
     r"org\.codehaus\.(janino|commons)|CodeGenerator\$\.doCompile|ParentClassLoader"),
    ("codegen: generating source (per task, then the cache)",
     r"codegen\.Generate\w+Projection|codegen\.GeneratePredicate|codegen\.GenerateOrdering|CodeGenerator\$"
     r"|WholeStageCodegenExec\.doCodeGen"),
    ("task deserialization", r"java\.io\.ObjectInputStream"),
    ("task and closure serialization", r"java\.io\.ObjectOutputStream"),
    ("Delta log (snapshots, commits, statistics)",
     r"org\.apache\.spark\.sql\.delta\.(Snapshot|DeltaLog|SnapshotManagement|Checkpoint|OptimisticTransaction"
     r"|stats)"),
    ("Parquet writes", r"parquet\.hadoop|FileFormatWriter|ParquetOutputWriter"),
    ("Parquet reads", r"ParquetFileFormat|VectorizedParquet|ParquetFooterReader"),
    ("analysis", r"analysis\.Analyzer|HybridAnalyzer|CheckAnalysis"),
    ("optimizer", r"optimizer\.Optimizer|SparkOptimizer"),
    ("physical planning and AQE", r"SparkStrategies|QueryPlanner|prepareForExecution|AdaptiveSparkPlanExec"),
    ("Arrow and Python exchange", r"\.arrow\.|execution\.python\.|PythonRunner"),
    ("scheduler", r"DAGScheduler|TaskSchedulerImpl|TaskSetManager"),
    ("listeners (UI status store)", r"LiveListenerBus|AppStatusListener|ElementTrackingStore|AsyncEventQueue"),
    ("py4j (calls from Python)", r"py4j"),
)

CHILD = """
import datetime as dt, os, sys, time
from pathlib import Path
from bench.fixed_cost_bench import write_tiny_trace
from bench.procs import jvm_pid
from engine.plan import ReplayRequest
from engine.replay import run_replay
from replay.policies import parse_policy
from report.figures import run_figures
from storage.session import get_spark

root, count, cache = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
trace = write_tiny_trace(root / "trace")
spark = get_spark("replab-bench-jvm", extra_conf={"spark.sql.codegen.cache.maxEntries": cache} if cache else None)
compilation = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
pid = jvm_pid(spark)
tick = os.sysconf("SC_CLK_TCK")

def jvm_cpu():
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / tick

for i in range(count):
    c0, j0, p0, t0 = compilation.getCount(), jvm_cpu(), time.process_time(), time.monotonic()
    start = dt.datetime.now().strftime("%H:%M:%S.%f")[:-3]
    run_replay(spark, ReplayRequest(trace=str(trace), policies=[parse_policy("kafka-acks1")],
                                    lakehouse=str(root / f"lh{i}"), tracking_uri=f"sqlite:///{root}/mlflow.db",
                                    figures=run_figures))
    end = dt.datetime.now().strftime("%H:%M:%S.%f")[:-3]
    print("REPLAY", i, start, end, round(time.monotonic() - t0, 3), round(jvm_cpu() - j0, 2),
          round(time.process_time() - p0, 2), compilation.getCount() - c0, flush=True)
spark.stop()
"""


@dataclass
class Replay:
    index: int
    start: str  # local time of day, as JFR prints its samples' times
    end: str
    seconds: float
    jvm_cpu_s: float
    python_cpu_s: float
    compiled_classes: int


@dataclass
class JvmProfile:
    replays: list[Replay]
    codegen_cache: str  # "" = replab's session setting
    samples: int = 0  # the JVM's execution samples within the later replays
    categories: dict[str, int] = field(default_factory=dict)
    load_avg_1m: float = 0.0


def stacks(jfr_text: str) -> list[tuple[str, list[str]]]:
    """(time of day, frames top first) of each jdk.ExecutionSample printed by `jfr print`."""
    out: list[tuple[str, list[str]]] = []
    for block in jfr_text.split("jdk.ExecutionSample {")[1:]:
        when = re.search(r"startTime = (\S+)", block)
        frames = re.findall(r"^\s{4}(\S[^(\n]*)\(", block, flags=re.MULTILINE)
        if when:
            out.append((when.group(1), frames))
    return out


def categorize(samples: list[tuple[str, list[str]]], windows: list[tuple[str, str]]) -> collections.Counter:
    compiled = [(name, re.compile(rx)) for name, rx in CATEGORIES]
    counts: collections.Counter = collections.Counter()
    for when, frames in samples:
        if not any(lo <= when <= hi for lo, hi in windows):
            continue
        text = "\n".join(frames)
        counts[next((name for name, rx in compiled if rx.search(text)), "other")] += 1
    return counts


def markdown(profile: JvmProfile) -> str:
    lines = ["# The driver JVM in a three-message replay, session kept up (python -m bench.jvm_profile)", "",
             f"Codegen cache: {profile.codegen_cache or 'replab default'}; load average {profile.load_avg_1m}.", "",
             "| replay | wall s | JVM CPU s | Python CPU s | classes compiled |", "|---:|---:|---:|---:|---:|"]
    lines += [f"| {r.index} | {r.seconds:.1f} | {r.jvm_cpu_s:.1f} | {r.python_cpu_s:.1f} | {r.compiled_classes} |"
              for r in profile.replays]
    lines += ["", f"JFR execution samples of replays 1-{len(profile.replays) - 1}: {profile.samples}", "",
              "| where the JVM was | samples | share |", "|---|---:|---:|"]
    for name, n in sorted(profile.categories.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {name} | {n} | {100 * n / max(1, profile.samples):.1f} % |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.jvm_profile", description=__doc__.splitlines()[0])
    parser.add_argument("--replays", type=int, default=4, help="replays in the one session (the first is cold)")
    parser.add_argument("--codegen-cache", default="", help="spark.sql.codegen.cache.maxEntries (default: replab's)")
    parser.add_argument("--json", default=None, metavar="FILE")
    parser.add_argument("--out", default=None, metavar="FILE", help="the Markdown profile")
    args = parser.parse_args(argv)
    if args.replays < 2:
        parser.error("--replays must be >= 2 (the first replay is the cold one)")
    jfr = shutil.which("jfr") or str(Path(os.environ.get("JAVA_HOME", "/usr")) / "bin" / "jfr")
    work = Path(tempfile.mkdtemp(prefix="replab-jvm-profile-"))
    try:
        recording = work / "replay.jfr"
        env = {**command_env(), "JAVA_TOOL_OPTIONS":
               f"-XX:StartFlightRecording=filename={recording},settings=profile,dumponexit=true"}
        proc = subprocess.run([sys.executable, "-c", CHILD, str(work), str(args.replays), args.codegen_cache],
                              env=env, text=True, capture_output=True, cwd=Path(__file__).resolve().parent.parent)
        if proc.returncode:
            print(proc.stderr[-4000:], file=sys.stderr)
            return proc.returncode
        replays = [Replay(int(f[1]), f[2], f[3], float(f[4]), float(f[5]), float(f[6]), int(f[7]))
                   for f in (line.split() for line in proc.stdout.splitlines() if line.startswith("REPLAY "))]
        printed = subprocess.run([jfr, "print", "--events", "jdk.ExecutionSample", "--stack-depth", "64",
                                  str(recording)], text=True, capture_output=True, check=True).stdout
        counts = categorize(stacks(printed), [(r.start, r.end) for r in replays[1:]])
        profile = JvmProfile(replays, args.codegen_cache, sum(counts.values()), dict(counts), load_average())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = markdown(profile)
    if args.out:
        Path(args.out).write_text(text)
    return emit([profile], text, args.json)


if __name__ == "__main__":
    sys.exit(main())
