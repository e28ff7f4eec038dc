"""Generator benchmark (SPEC §10: >= 2 million events/s on local[2]): events/s for 1 M, 10 M (and 100 M) events.

    python -m bench.generate_bench                      # 1 M and 10 M events
    python -m bench.generate_bench --with-100m          # and 100 M (about a minute, ~0.5 GB on disk)
    python -m bench.generate_bench --sizes 2e6 --json out.json

Each size generates the `steady-state` scenario (6 brokers, keyed Zipf load, GC pauses) with --scale chosen so
that the trace holds about that many events, on local[2], after a warm-up generation (the SparkSession start
and the first Python workers are not counted). The figure is events written / wall seconds of
`generate_trace` (plan, Spark job, Parquet files, rename). Peak memory: the driver's Python process
(ru_maxrss), the driver JVM (VmHWM) and the largest Python worker; the trace never passes through the driver,
so its memory stays flat while the trace grows 100×. The load average is printed: the machine may be shared;
"events per CPU-s" divides by the CPU time of replab's own processes (driver, JVM, Python workers), so twice
that figure is what local[2] reaches with both cores to itself.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.procs import cpu_seconds as _cpu_seconds
from bench.procs import emit
from bench.procs import vm_hwm_mb as _vm_hwm_mb
from bench.procs import worker_peak_mb as _worker_peak_mb
from generators.generate import generate_trace
from generators.library import resolve_scenario
from generators.model import Scenario

DEFAULT_SIZES = (1_000_000, 10_000_000)


@dataclass(frozen=True)
class BenchRow:
    target_events: int
    scale: float
    events: int
    files: int
    seconds: float
    events_per_s: float
    bytes_on_disk: int
    driver_python_peak_mb: float
    driver_jvm_peak_mb: float | None
    worker_peak_mb: float | None
    cpu_seconds: float | None
    load_avg_1m: float

    @property
    def events_per_cpu_s(self) -> float | None:
        """Events per CPU-second of replab's own processes (driver, JVM, workers): the rate local[2] would
        reach with both cores to itself (x2), whatever else runs on a shared machine."""
        return self.events / self.cpu_seconds if self.cpu_seconds else None


def scale_for(scenario: Scenario, events: int) -> float:
    """--scale giving about `events` events: produce grows with scale², reports with scale."""
    wl = scenario.workload
    per_scale2 = wl.rate_per_s * wl.duration_s  # produce events at scale 1
    per_scale = sum(wl.duration_s * 1000.0 / scenario.replication.for_broker(b).fetch_interval_ms
                    for b in scenario.broker_ids)
    return (-per_scale + math.sqrt(per_scale**2 + 4 * per_scale2 * events)) / (2 * per_scale2)


def run(sizes=DEFAULT_SIZES, *, scenario: str = "steady-state", seed: int = 1, workdir: str | None = None,
        log=print) -> list[BenchRow]:
    from storage.session import get_spark

    spark = get_spark("replab-bench-generate", master="local[2]", shuffle_partitions=2)
    jvm_pid = getattr(getattr(spark.sparkContext._gateway, "proc", None), "pid", None)
    sc = resolve_scenario(scenario)
    root = Path(workdir or tempfile.mkdtemp(prefix="replab-bench-gen-"))
    rows = []
    try:
        # JVM, both Python workers, imports and key tables: several small tasks before anything is timed.
        generate_trace(spark, sc, seed=seed, scale=0.05, out=root / "warmup", target_events_per_chunk=3000)
        for target in sizes:
            scale = scale_for(sc, int(target))
            out = root / f"trace-{int(target)}"
            cpu_before = _cpu_seconds(jvm_pid)
            started = time.monotonic()
            result = generate_trace(spark, sc, seed=seed, scale=scale, out=out)
            seconds = time.monotonic() - started
            cpu = _cpu_seconds(jvm_pid) - cpu_before
            row = BenchRow(
                target_events=int(target), scale=round(scale, 4), events=result.events, files=len(result.chunks),
                seconds=round(seconds, 2), events_per_s=round(result.events / seconds),
                bytes_on_disk=sum(c.file_bytes for c in result.chunks),
                driver_python_peak_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                driver_jvm_peak_mb=round(_vm_hwm_mb(jvm_pid), 1) if jvm_pid else None,
                worker_peak_mb=_worker_peak_mb(jvm_pid), cpu_seconds=round(cpu, 2),
                load_avg_1m=round(os.getloadavg()[0], 2),
            )
            rows.append(row)
            log(f"{row.events:>12,} events  {row.seconds:7.2f} s  {row.events_per_s / 1e6:6.2f} M events/s  "
                f"{row.files:4d} files  {row.bytes_on_disk / 1e6:8.1f} MB  driver py {row.driver_python_peak_mb} MB "
                f"jvm {row.driver_jvm_peak_mb} MB  worker {row.worker_peak_mb} MB  cpu {row.cpu_seconds} s  "
                f"load {row.load_avg_1m}")
            shutil.rmtree(out)
    finally:
        if workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    return rows


def markdown(rows: list[BenchRow]) -> str:
    lines = ["| events | seconds | events/s | events per CPU-s | files | MB on disk | driver Python peak MB | "
             "driver JVM peak MB | worker peak MB | load avg |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        per_cpu = f"{r.events_per_cpu_s / 1e6:.2f} M" if r.events_per_cpu_s else "n/a"
        lines.append(f"| {r.events:,} | {r.seconds:.1f} | {r.events_per_s / 1e6:.2f} M | {per_cpu} | {r.files} | "
                     f"{r.bytes_on_disk / 1e6:.0f} | {r.driver_python_peak_mb:.0f} | "
                     f"{r.driver_jvm_peak_mb or float('nan'):.0f} | {r.worker_peak_mb or float('nan'):.0f} | "
                     f"{r.load_avg_1m:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.generate_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=None, help="comma-separated event counts (default 1e6,1e7)")
    parser.add_argument("--with-100m", action="store_true", help="also 100 M events")
    parser.add_argument("--scenario", default="steady-state")
    parser.add_argument("--workdir", default=None, help="where traces go (default: a temp folder, removed)")
    parser.add_argument("--json", default=None, metavar="FILE", help="write the rows as JSON")
    args = parser.parse_args(argv)
    sizes = [int(float(s)) for s in args.sizes.split(",")] if args.sizes else list(DEFAULT_SIZES)
    if args.with_100m:
        sizes.append(100_000_000)
    rows = run(sizes, scenario=args.scenario, workdir=args.workdir)
    return emit(rows, markdown(rows), args.json)


if __name__ == "__main__":
    raise SystemExit(main())
