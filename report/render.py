"""Drawing plots to PNG on every core: a replay's MLflow runs take three plots per policy (48 for the 16
presets), and drawing them one after another with matplotlib took most of the demo's MLflow step (about 0.25 s of
one core per plot, text layout and rasterising) while the JVM and the other core sat idle.

A `FigureJob` names a module-level drawing function (`report.plots`) and its arguments (small pandas frames,
strings, numbers), so that it can be sent to another process; `Renderer` draws jobs to PNG bytes in worker
processes (`python -m report.render`, one per core), or in this process when the batch is too small to repay their
start (about 1 s of importing matplotlib and pandas, overlapped with whatever the caller does between
`Renderer(...)` and `render`).

Workers are plain subprocesses fed pickles on stdin, not a multiprocessing pool: spawn and forkserver re-import
the parent's `__main__` in every worker (a spark-submit script without a main guard would run again), and fork
copies a driver that runs py4j, MLflow and thread-pool threads. The workers are killed when the `with` block
ends (also on error), and each asks Linux to kill it should this process die first.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Fewer jobs than this are drawn in this process: starting the workers costs about four plots' time.
MIN_PARALLEL_JOBS = 8


@dataclass(frozen=True)
class FigureJob:
    """One plot: `draw(**kwargs)` returns a matplotlib Figure. `draw` is module-level (picklable by name)."""

    draw: Callable[..., Any]
    kwargs: dict[str, Any] = field(default_factory=dict)


def png_of(job: FigureJob) -> bytes:
    from report.plots import png_bytes

    return png_bytes(job.draw(**job.kwargs))


def worker_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class RenderFailed(RuntimeError):
    """A plot worker exited without its PNGs (its own traceback went to stderr)."""


class Renderer:
    """`with Renderer(expected_jobs) as r: ...; pngs = r.render(jobs)`: workers start on entry when
    `expected_jobs` is worth them, so that their start overlaps the caller's own work before `render`."""

    def __init__(self, expected_jobs: int, workers: int | None = None) -> None:
        self.workers = min(workers or worker_count(), max(1, expected_jobs))
        self.parallel = self.workers > 1 and expected_jobs >= MIN_PARALLEL_JOBS
        self._procs: list[subprocess.Popen[bytes]] = []

    @property
    def pids(self) -> list[int]:
        """The running workers' process ids (none when drawing here)."""
        return [proc.pid for proc in self._procs]

    def __enter__(self) -> Renderer:
        if self.parallel:
            # The folder this `report` package was imported from, then this process's import path; -P: no working
            # directory in front of them (a `report` folder there would shadow this package in the worker).
            home = str(Path(__file__).resolve().parent.parent)
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([home, *(p for p in sys.path if p)])}
            command = [sys.executable, "-P", "-m", "report.render", str(os.getpid())]
            self._procs = [subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
                           for _ in range(self.workers)]
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None and not pipe.closed:
                    # A batch half-written to a worker that died has nowhere to be flushed to.
                    with contextlib.suppress(OSError):
                        pipe.close()
        self._procs = []

    def render(self, jobs: Sequence[FigureJob]) -> list[bytes]:
        """PNG bytes of each job, in order. Each worker gets every n-th job (the plots of a batch cost alike)."""
        if not self._procs:
            return [png_of(job) for job in jobs]
        procs = self._procs[:max(1, min(len(self._procs), len(jobs)))]
        n = len(procs)
        for i, proc in enumerate(procs):  # a worker reads its whole batch before drawing
            assert proc.stdin is not None
            try:
                proc.stdin.write(pickle.dumps(list(jobs[i::n]), protocol=pickle.HIGHEST_PROTOCOL))
                proc.stdin.close()
            except BrokenPipeError:  # it died first: its exit code says so below
                pass
        out: list[bytes] = [b""] * len(jobs)
        for i, proc in enumerate(procs):
            assert proc.stdout is not None
            data = proc.stdout.read()
            if proc.wait() != 0 or not data:
                raise RenderFailed(f"plot worker {proc.pid} exited with code {proc.returncode} (its error is above)")
            out[i::n] = pickle.loads(data)
        self.__exit__()  # the workers are done: a later `render` of this Renderer draws in this process
        return out


def _serve() -> None:
    """A worker: die with the parent (prctl PR_SET_PDEATHSIG), draw the pickled jobs on stdin, pickle the PNGs to
    stdout."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != int(sys.argv[1]):  # the parent died before prctl
            sys.exit(1)
    results = sys.stdout.buffer
    sys.stdout = sys.stderr  # whatever a library prints must not corrupt the pickle
    import report.plots  # noqa: F401  (matplotlib and pandas, while the parent prepares the jobs)

    jobs = pickle.load(sys.stdin.buffer)
    pngs = [png_of(job) for job in jobs]
    results.write(pickle.dumps(pngs, protocol=pickle.HIGHEST_PROTOCOL))
    results.flush()


if __name__ == "__main__":
    _serve()
