"""What a benchmark measures about its own processes: CPU time and peak memory of this Python process, the
driver JVM it started and the JVM's Python workers. The machine may be shared: CPU seconds of replab's own
processes say what a run costs whatever else is running (events per CPU-second × 2 is what local[2] reaches with
both cores to itself).
"""

from __future__ import annotations

import json
import os
import resource
import threading
from dataclasses import asdict
from pathlib import Path


def jvm_pid(spark) -> int | None:
    return getattr(getattr(spark.sparkContext._gateway, "proc", None), "pid", None)


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def vm_hwm_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def descendants(root: int | None) -> list[int]:
    """Processes under `root` (this Spark session's Python daemon and workers; other sessions on the machine have
    their own JVM and are not counted)."""
    if root is None:
        return []
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(proc.name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def worker_peak_mb(jvm_pid: int | None) -> float | None:
    peaks = [p for p in (vm_hwm_mb(pid) for pid in descendants(jvm_pid)) if p is not None]
    return max(peaks) if peaks else None


class WorkerPeak:
    """The largest peak RSS (VmHWM) of any process under the JVM while the block runs, sampled every `every_s`:
    Python workers may exit before the block ends, taking their own VmHWM with them."""

    def __init__(self, jvm_pid: int | None, every_s: float = 0.5) -> None:
        self.jvm_pid, self.every_s, self.peak_mb = jvm_pid, every_s, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        self.peak_mb = max(self.peak_mb, worker_peak_mb(self.jvm_pid) or 0.0)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._sample()

    def __enter__(self) -> WorkerPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def driver_python_peak_mb() -> float:
    """Peak RSS of this Python process (the driver's Python side) so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def proc_cpu_seconds(pid: int) -> float:
    """CPU time so far of one process and its reaped children (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime, stime, cutime, cstime


def cpu_seconds(jvm_pid: int | None) -> float:
    """CPU time so far of this process, the driver JVM and the Python workers (with their reaped children)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    total = own.ru_utime + own.ru_stime
    tick = os.sysconf("SC_CLK_TCK")
    for pid in ([jvm_pid] if jvm_pid else []) + descendants(jvm_pid):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15]) / tick  # utime, stime, cutime, cstime
    return total


def emit(rows: list, table_markdown: str, json_path: str | None) -> int:
    """A benchmark's end: its Markdown table on stdout and, if asked, its rows (dataclasses) as JSON."""
    print(table_markdown)
    if json_path:
        Path(json_path).write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    return 0
