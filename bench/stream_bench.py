"""Stream-mode benchmark (SPEC §10: >= 200 000 events/s end to end in stream mode on local[2]).

    python -m bench.stream_bench                              # 1 M events, kafka-acks1, 4 files per micro-batch
    python -m bench.stream_bench --sizes 2e6 --policy kafka-durable --files-per-trigger 2 --json out.json

Each size generates the `steady-state` scenario (6 brokers, keyed Zipf load, GC pauses) with --scale chosen so that
the trace holds about that many events, in files of `--events-per-file` events, then replays it with
`run_stream_replay` (`replab replay --mode stream`) on local[2] into a fresh lakehouse, after a warm-up replay of a
small trace (the SparkSession start and the first Python workers are not counted). Reported:

- end to end: events / wall seconds of the whole call (trace gate, stream, windows, output gate, Delta tables),
  the figure SPEC §10 asks for;
- stream: events / wall seconds from the query's start to the end of the end-of-trace micro-batch, its writes
  included (source, watermark, routing, transformWithStateInPandas on RocksDB, per-batch Delta appends, each
  group's final rows written into the checkpoint by its task);
- per-CPU: events per CPU-second of this Spark session's processes (driver, JVM, Python workers), since the machine may
  be shared (the load average is printed): twice that figure is what local[2] reaches with both cores to itself;
- the profile: the time before the stream (trace gate, runs marked), the stream, the publishing after it (windows,
  output gate, Delta tables), and per micro-batch the time the sink reports for computing it (source, routing,
  state store, kernels; in the last one also the final rows the tasks write) and for writing it (the watermarks
  append, late rows), beside Spark's own figures for the trigger (a StreamingQueryListener: triggerExecution,
  queryPlanning, walCommit, commitOffsets).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.generate_bench import scale_for
from bench.procs import cpu_seconds, emit
from generators.generate import generate_trace
from generators.library import resolve_scenario

DEFAULT_SIZES = (1_000_000,)


#: The sink's line per micro-batch (engine.stream.sink.StreamSink._report)
BATCH_LINE = re.compile(r"micro-batch (\d+): .*?([\d,]+) rows in, .*replayed in ([\d.]+) s, written in ([\d.]+) s")


@dataclass
class MicroBatch:
    batch: int
    rows_in: int
    replayed_seconds: float  # the sink's action: source, routing, state store, kernels (and the tasks' final rows)
    written_seconds: float  # the sink's Delta appends (watermarks, late rows)
    trigger_seconds: float | None = None  # Spark's whole trigger (StreamingQueryProgress.durationMs)
    planning_seconds: float | None = None
    log_seconds: float | None = None  # the offsets write-ahead log and the commit log


class _Progress:
    """Spark's per-trigger durations, by batch id (a StreamingQueryListener on the session)."""

    def __init__(self, spark) -> None:
        from pyspark.sql.streaming import StreamingQueryListener

        self.spark, self.by_batch = spark, {}
        outer = self

        class Listener(StreamingQueryListener):
            def onQueryStarted(self, event) -> None:
                pass

            def onQueryProgress(self, event) -> None:
                outer.by_batch[event.progress.batchId] = dict(event.progress.durationMs)

            def onQueryIdle(self, event) -> None:
                pass

            def onQueryTerminated(self, event) -> None:
                pass

        self.listener = Listener()

    def __enter__(self) -> _Progress:
        self.spark.streams.addListener(self.listener)
        return self

    def __exit__(self, *exc) -> None:
        self.spark.streams.removeListener(self.listener)


@dataclass(frozen=True)
class StreamBenchRow:
    target_events: int
    events: int
    files: int
    files_per_trigger: int
    policy: str
    seconds: float
    stream_seconds: float
    micro_batches: int
    events_per_s: float
    stream_events_per_s: float
    cpu_seconds: float
    load_avg_1m: float
    before_stream_seconds: float = 0.0
    publish_seconds: float = 0.0
    batches: list[MicroBatch] = field(default_factory=list)

    @property
    def events_per_cpu_s(self) -> float:
        return self.events / self.cpu_seconds if self.cpu_seconds else float("nan")


@dataclass
class Timed:
    seconds: float
    stream_seconds: float
    before_stream_seconds: float
    publish_seconds: float
    batches: list[MicroBatch]


def replay(spark, trace: Path, lakehouse: Path, policy: str, files_per_trigger: int) -> Timed:
    """One stream replay, timed: the whole call and its phases, from the progress lines and Spark's listener."""
    from engine.plan import ReplayRequest
    from engine.stream.query import run_stream_replay
    from replay.policies import parse_policy

    marks: dict[str, float] = {}
    batches: list[MicroBatch] = []

    def progress(text: str) -> None:
        now = time.monotonic()
        if text.startswith("stream replay of"):
            marks["stream"] = now
        elif text.startswith("micro-batch"):
            m = BATCH_LINE.match(text)
            if m is None:
                raise ValueError(f"unexpected micro-batch line: {text!r}")
            batches.append(MicroBatch(int(m[1]), int(m[2].replace(",", "")), float(m[3]), float(m[4])))
        elif text.startswith("the watermark passed"):
            marks["end"] = now
        elif text.startswith("windows, output gate"):
            marks["publish"] = now

    started = time.monotonic()
    with _Progress(spark) as spark_progress:
        run_stream_replay(spark, ReplayRequest(trace=str(trace), policies=[parse_policy(policy)],
                                               lakehouse=str(lakehouse), mode="stream", mlflow=False),
                          progress=progress, files_per_trigger=files_per_trigger)
        ended = time.monotonic()
        for b in batches:
            d = spark_progress.by_batch.get(b.batch)
            if d:
                b.trigger_seconds = d.get("triggerExecution", 0) / 1000
                b.planning_seconds = d.get("queryPlanning", 0) / 1000
                b.log_seconds = (d.get("walCommit", 0) + d.get("commitOffsets", 0)) / 1000
    return Timed(ended - started, marks["end"] - marks["stream"], marks["stream"] - started,
                 ended - marks["publish"], batches)


def run(sizes=DEFAULT_SIZES, *, policy: str = "kafka-acks1", events_per_file: int = 250_000,
        files_per_trigger: int = 4, seed: int = 1, workdir: str | None = None, log=print) -> list[StreamBenchRow]:
    from storage.session import get_spark

    spark = get_spark("replab-bench-stream", master="local[2]", shuffle_partitions=2)
    jvm_pid = getattr(getattr(spark.sparkContext._gateway, "proc", None), "pid", None)
    sc = resolve_scenario("steady-state")
    root = Path(workdir or tempfile.mkdtemp(prefix="replab-bench-stream-"))
    rows = []
    try:
        warmup = root / "warmup"
        generate_trace(spark, sc, seed=seed, scale=0.02, out=warmup, target_events_per_chunk=2000)
        replay(spark, warmup, root / "warmup-lakehouse", policy, files_per_trigger)
        for target in sizes:
            trace = root / f"trace-{int(target)}"
            result = generate_trace(spark, sc, seed=seed, scale=scale_for(sc, int(target)), out=trace,
                                    target_events_per_chunk=events_per_file)
            cpu_before = cpu_seconds(jvm_pid)
            t = replay(spark, trace, root / f"lakehouse-{int(target)}", policy, files_per_trigger)
            row = StreamBenchRow(
                target_events=int(target), events=result.events, files=len(result.chunks),
                files_per_trigger=files_per_trigger, policy=policy, seconds=round(t.seconds, 2),
                stream_seconds=round(t.stream_seconds, 2), micro_batches=len(t.batches),
                events_per_s=round(result.events / t.seconds),
                stream_events_per_s=round(result.events / t.stream_seconds),
                cpu_seconds=round(cpu_seconds(jvm_pid) - cpu_before, 2), load_avg_1m=round(os.getloadavg()[0], 2),
                before_stream_seconds=round(t.before_stream_seconds, 2), publish_seconds=round(t.publish_seconds, 2),
                batches=t.batches)
            rows.append(row)
            log(f"{row.events:>12,} events  {row.policy}  end to end {row.seconds:7.1f} s = "
                f"{row.events_per_s:,.0f} events/s  stream {row.stream_seconds:6.1f} s = "
                f"{row.stream_events_per_s:,.0f} events/s  ({row.micro_batches} micro-batches of "
                f"{row.files_per_trigger} files)  {row.events_per_cpu_s:,.0f} events per CPU-s  "
                f"load {row.load_avg_1m}; before the stream {row.before_stream_seconds:.1f} s, publishing "
                f"{row.publish_seconds:.1f} s")
            shutil.rmtree(trace)
    finally:
        if workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    return rows


def _sec(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}"


def markdown(rows: list[StreamBenchRow]) -> str:
    lines = ["| events | policy | files (per micro-batch) | end to end s | end-to-end events/s | stream s | "
             "stream events/s | events per CPU-s | load avg |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.events:,} | {r.policy} | {r.files} ({r.files_per_trigger}) | {r.seconds:.1f} | "
                     f"{r.events_per_s:,.0f} | {r.stream_seconds:.1f} | {r.stream_events_per_s:,.0f} | "
                     f"{r.events_per_cpu_s:,.0f} | {r.load_avg_1m:.1f} |")
    for r in rows:
        lines += ["", f"{r.events:,} events: before the stream (trace gate, runs marked) "
                  f"{r.before_stream_seconds:.1f} s, stream {r.stream_seconds:.1f} s, publishing (windows, output "
                  f"gate, Delta tables) {r.publish_seconds:.1f} s, of {r.seconds:.1f} s", "",
                  "| micro-batch | rows in | computed s (source, routing, state, kernels) | written s (Delta) | "
                  "Spark trigger s | planning s | offsets + commit log s |", "|---:|---:|---:|---:|---:|---:|---:|"]
        for b in r.batches:
            lines.append(f"| {b.batch} | {b.rows_in:,} | {b.replayed_seconds:.2f} | {b.written_seconds:.2f} | "
                         f"{_sec(b.trigger_seconds)} | {_sec(b.planning_seconds)} | {_sec(b.log_seconds)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stream_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=None, help="comma-separated event counts (default 1e6)")
    parser.add_argument("--policy", default="kafka-acks1")
    parser.add_argument("--events-per-file", type=int, default=250_000)
    parser.add_argument("--files-per-trigger", type=int, default=4)
    parser.add_argument("--workdir", default=None, help="where traces go (default: a temp folder, removed)")
    parser.add_argument("--json", default=None, metavar="FILE", help="write the rows as JSON")
    args = parser.parse_args(argv)
    sizes = [int(float(s)) for s in args.sizes.split(",")] if args.sizes else list(DEFAULT_SIZES)
    rows = run(sizes, policy=args.policy, events_per_file=args.events_per_file,
               files_per_trigger=args.files_per_trigger, workdir=args.workdir)
    return emit(rows, markdown(rows), args.json)


if __name__ == "__main__":
    raise SystemExit(main())
