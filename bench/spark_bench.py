"""Spark replay benchmark (SPEC §10), every figure from one run on the same trace, on local[2]:

- **floor**: the bare Spark job any pipeline on this data pays: read the events, give each a partition (produce
  events by a hash of the key, broker events by broker), shuffle by partition, sort by time within it, write one
  row per message (Delta, with message_outcomes' table properties: file statistics on the same columns).
- **one policy**: the replay core for `kafka-durable`: route, fan broker events out, one shuffle, chunked kernels,
  and write message_outcomes into a new lakehouse as `replab replay` writes it (`Lakehouse.replace_run`): the same
  output as the floor, with the replay's work in between.
  Target: ≤ 1.25 × floor.
- **Kafka presets**: the same for the Kafka presets together (the issue's target: ≤ 2.5 × one policy).
- **all presets**: the same for every preset of conf/policies.yaml (Kafka and RocketMQ families) in one pass,
  one Delta write of every message outcome. Target: ≤ 2.5 × one policy.
- **full replay, one policy / all presets**: `run_replay` as `replab replay --no-mlflow` runs it: trace gate,
  replay, windows, output gate, every Delta table of the run protocol (the price of the lakehouse).

    python -m bench.spark_bench                       # 1 M events (steady-state), all of the above
    python -m bench.spark_bench --sizes 1e6,1e7 --full one   # the scale check (SPEC §10): time at
                                                        # 10 M / time at 1 M per job (<= 11), peak memory
    python -m bench.spark_bench --skip-full --json out.json

Traces are the library's `steady-state` scenario at the scale giving the requested event count, generated
once per size before anything is timed; a warm-up replay of a small trace precedes the timings (JVM start,
Python workers, imports). Wall seconds and CPU seconds of replab's own processes are both reported (the machine
may be shared: see bench/procs.py).
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.procs import WorkerPeak, cpu_seconds, driver_python_peak_mb, emit, jvm_pid, load_average, vm_hwm_mb

ONE_POLICY = "kafka-durable"


@dataclass(frozen=True)
class Row:
    job: str
    policies: int
    events: int
    messages: int
    seconds: float
    cpu_seconds: float
    events_per_s: float
    load_avg_1m: float
    jvm_peak_mb: float | None  # the driver JVM's peak RSS so far (VmHWM: never decreases within the run)
    worker_peak_mb: float | None  # the largest Python worker's peak RSS during this job (sampled)
    driver_python_peak_mb: float | None = None  # this Python process's peak RSS so far
    error: str | None = None  # the job failed (the session with it): the run stops after this row


def floor_job(spark, trace: Path, out: str) -> int:
    """Read, partition (key hash / broker), shuffle by partition, sort by time, write one row per message."""
    from pyspark.sql import functions as F

    from storage.trace_loader import read_events_spark

    _, events = read_events_spark(spark, trace)
    partitions = 12
    part = F.when(F.col("kind") == "produce", F.pmod(F.hash(F.coalesce("key", F.col("msg_id").cast("string"))),
                                                    F.lit(partitions))).otherwise(F.col("broker") % partitions)
    rows = (events.withColumn("partition", part).repartition("partition")
            .sortWithinPartitions("partition", "ts_us", "msg_id")
            .where(F.col("kind") == "produce")
            .select("msg_id", "key", "producer_id", "partition", F.col("ts_us").alias("produce_us")))
    _outcomes_like_table(spark, out, rows.schema)
    rows.write.format("delta").mode("append").save(out)
    return spark.read.format("delta").load(out).count()


def _outcomes_like_table(spark, path: str, schema) -> None:
    """A new Delta table of `schema` with message_outcomes' properties (`schemas.tables`: which columns get file
    statistics, compaction), so that the floor writes its rows as the replay writes its outcomes."""
    from dataclasses import replace

    from schemas.tables import TABLES
    from storage.lakehouse import create_table

    ddl = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in schema.fields)
    create_table(spark, path, replace(TABLES["message_outcomes"], name="floor", ddl=ddl, partition_by=(),
                                      description="the bench's floor: one row per message"))


def replay_core(spark, trace: Path, policy_texts: list[str], out: str) -> int:
    """The replay core of `replab replay` for these policies, writing message_outcomes (no gates, no windows)."""
    from engine.plan import policy_runs
    from engine.replay import replay_frames
    from replay.policies import parse_policy
    from storage.lakehouse import Lakehouse
    from storage.trace_loader import read_events_spark

    manifest, events = read_events_spark(spark, trace)
    runs = policy_runs([parse_policy(p) for p in policy_texts], manifest)
    frames = replay_frames(spark, manifest, events, runs)
    lakehouse = Lakehouse(out, spark, create=False)
    try:
        lakehouse.replace_run("message_outcomes", [r.run_id for r in runs], frames.outcomes.message_outcomes)
    finally:
        frames.release()
    return lakehouse.read("message_outcomes").count()


def full_replay(spark, trace: Path, policy_texts: list[str], lakehouse: str) -> int:
    from engine.plan import ReplayRequest
    from engine.replay import run_replay
    from replay.policies import parse_policy

    report = run_replay(spark, ReplayRequest(str(trace), [parse_policy(p) for p in policy_texts],
                                             lakehouse=lakehouse, mlflow=False))
    return sum(int(s["produced"]) for s in report.summaries)


def run(sizes: list[int], *, full: str = "all", log=print) -> list[Row]:
    """`full`: which full replays to time besides the floor and the replay cores: "all" (one policy and every
    preset), "one" (one policy) or "none"."""
    from bench.generate_bench import scale_for
    from generators.generate import generate_trace
    from generators.library import resolve_scenario
    from replay.policies import parse_policy, presets
    from storage.session import get_spark

    spark = get_spark("replab-bench-spark", master="local[2]", shuffle_partitions=4)
    pid = jvm_pid(spark)
    everything = list(presets())
    kafka = [name for name in everything if parse_policy(name).family == "kafka"]
    root = Path(tempfile.mkdtemp(prefix="replab-bench-spark-"))
    scenario = resolve_scenario("steady-state")
    rows: list[Row] = []
    try:
        warm = root / "warm"
        generate_trace(spark, scenario, seed=1, scale=0.05, out=warm)
        replay_core(spark, warm, everything, str(root / "warm-out"))
        floor_job(spark, warm, str(root / "warm-floor"))
        for size in sizes:
            trace = root / f"trace-{size}"
            result = generate_trace(spark, scenario, seed=1, scale=scale_for(scenario, size), out=trace)
            jobs = [("floor", [], floor_job), (f"replay core: {ONE_POLICY}", [ONE_POLICY], replay_core),
                    (f"replay core: the {len(kafka)} Kafka presets", kafka, replay_core),
                    (f"replay core: all {len(everything)} presets", everything, replay_core)]
            if full in ("one", "all"):
                jobs.append((f"full replay: {ONE_POLICY}", [ONE_POLICY], full_replay))
            if full == "all":
                jobs.append((f"full replay: all {len(everything)} presets", everything, full_replay))
            for i, (name, policies, job) in enumerate(jobs):
                out = str(root / f"out-{size}-{i}")
                n_policies = len(policies)
                cpu0, t0 = cpu_seconds(pid), time.monotonic()
                error = None
                with WorkerPeak(pid) as workers:
                    try:
                        messages = job(spark, trace, out) if job is floor_job else job(spark, trace, policies, out)
                    except Exception as exc:  # e.g. out of memory: the row says so, and the session is gone
                        messages, error = 0, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
                seconds, cpu = time.monotonic() - t0, cpu_seconds(pid) - cpu0
                row = Row(name, n_policies, result.events, messages, round(seconds, 2), round(cpu, 2),
                          round(result.events / seconds), load_average(),
                          round(vm_hwm_mb(pid), 1) if pid else None, round(workers.peak_mb, 1),
                          round(driver_python_peak_mb(), 1), error)
                rows.append(row)
                log(f"{row.events:>11,} events  {name:34s} {row.seconds:8.2f} s  cpu {row.cpu_seconds:8.2f} s  "
                    f"{row.messages:>11,} outcome rows  load {row.load_avg_1m}  jvm {row.jvm_peak_mb} MB  "
                    f"worker {row.worker_peak_mb} MB" + (f"  FAILED {error}" if error else ""))
                shutil.rmtree(out, ignore_errors=True)
                if error:
                    return rows
            shutil.rmtree(trace, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows


def ratios(rows: list[Row]) -> list[str]:
    """The SPEC §10 ratios per trace size, on wall time and on CPU time."""
    out = []
    for events in sorted({r.events for r in rows}):
        at = [r for r in rows if r.events == events]
        floor = next((r for r in at if r.job == "floor"), None)
        one = next((r for r in at if r.job == f"replay core: {ONE_POLICY}"), None)
        if floor and one:
            out.append(f"{events:,} events: one policy / floor = {one.seconds / floor.seconds:.2f}× wall, "
                       f"{one.cpu_seconds / floor.cpu_seconds:.2f}× CPU (target ≤ 1.25×)")
        for many in (r for r in at if r.job.startswith("replay core:") and r.policies > 1):
            if one:
                out.append(f"{events:,} events: {many.job.split(': ', 1)[1]} / one policy = "
                           f"{many.seconds / one.seconds:.2f}× wall, {many.cpu_seconds / one.cpu_seconds:.2f}× CPU "
                           "(target for the Kafka presets ≤ 2.5×)")
    sizes = sorted({r.events for r in rows})
    for small, large in itertools.pairwise(sizes):
        for job in dict.fromkeys(r.job for r in rows):
            a = next((r for r in rows if r.events == small and r.job == job), None)
            b = next((r for r in rows if r.events == large and r.job == job), None)
            if a and b and not (a.error or b.error):
                out.append(f"{job}: time at {large:,} / time at {small:,} events = {b.seconds / a.seconds:.2f}× "
                           f"wall, {b.cpu_seconds / a.cpu_seconds:.2f}× CPU for {large / small:.2f}× the events "
                           "(target ≤ 11× for 10×)")
    return out


def markdown(rows: list[Row]) -> str:
    lines = ["| events | job | policies | seconds | CPU s | events/s | outcome rows | load avg | driver JVM peak MB "
             "| Python worker peak MB | driver Python peak MB |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.events:,} | {r.job} | {r.policies} | {r.seconds:.1f} | {r.cpu_seconds:.1f} | "
                     f"{r.events_per_s:,.0f} | {r.messages:,} | {r.load_avg_1m:.1f} | {r.jvm_peak_mb} | "
                     f"{r.worker_peak_mb} | {r.driver_python_peak_mb} |" + (f" FAILED: {r.error}" if r.error else ""))
    return "\n".join(lines + [""] + [f"- {line}" for line in ratios(rows)])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.spark_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1e6", help="comma-separated event counts (default 1e6)")
    parser.add_argument("--full", choices=("all", "one", "none"), default="all",
                        help="full replays to time: one policy and every preset (all), one policy, or none")
    parser.add_argument("--skip-full", action="store_true", help="only the floor and the replay cores (--full none)")
    parser.add_argument("--json", default=None, metavar="FILE")
    args = parser.parse_args(argv)
    rows = run([int(float(s)) for s in args.sizes.split(",")], full="none" if args.skip_full else args.full)
    emit(rows, markdown(rows), args.json)
    return 1 if any(r.error for r in rows) else 0  # a failed job is a failed benchmark (bench.run says so)


if __name__ == "__main__":
    raise SystemExit(main())
