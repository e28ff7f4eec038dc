"""Plots drawn in worker processes (`report.render`): the same PNG bytes as drawn here, in job order, and no worker
left behind: after the batch, after a failing job, after the parent was killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pandas as pd
import pytest

from report import plots
from report.render import MIN_PARALLEL_JOBS, FigureJob, Renderer, RenderFailed, png_of

PNG = b"\x89PNG\r\n\x1a\n"


def _jobs(n: int) -> list[FigureJob]:
    """n different plots (each its own data and title), so that an out-of-order result cannot pass."""
    jobs = []
    for i in range(n):
        q = pd.DataFrame({"policy": ["p"] * 3, "quantile": [0.0, 0.5, 1.0], "latency_ms": [0.1, 1.0 + i, 9.0 + i]})
        jobs.append(FigureJob(plots.latency_cdf, {"quantiles": q, "policies": ["p"], "title": f"plot {i}"}))
    return jobs


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        state = stat.read().rsplit(")", 1)[1].split()[0]
    return state != "Z"


def test_workers_draw_the_same_pngs_in_job_order_and_are_gone_after():
    jobs = _jobs(MIN_PARALLEL_JOBS + 1)
    here = [png_of(job) for job in jobs]
    assert len(set(here)) == len(jobs)
    with Renderer(len(jobs), workers=2) as renderer:
        assert renderer.parallel
        pids = renderer.pids
        assert len(pids) == 2
        got = renderer.render(jobs)
    assert got == here and all(png[:8] == PNG for png in got)
    assert not any(_alive(pid) for pid in pids)


def test_a_small_batch_is_drawn_here():
    jobs = _jobs(2)
    with Renderer(len(jobs), workers=2) as renderer:
        assert not renderer.parallel and renderer.pids == []
        assert renderer.render(jobs) == [png_of(job) for job in jobs]


def test_a_failing_job_raises_and_leaves_no_worker():
    jobs = _jobs(MIN_PARALLEL_JOBS)
    jobs[3] = FigureJob(plots.latency_cdf, {"quantiles": pd.DataFrame({"nope": [1]}), "policies": ["p"]})
    with pytest.raises(RenderFailed, match="exited with code 1"), Renderer(len(jobs), workers=2) as renderer:
        pids = renderer.pids
        renderer.render(jobs)
    assert not any(_alive(pid) for pid in pids)


def test_workers_die_with_a_killed_parent(tmp_path):
    """A driver killed (SIGKILL: no `with` block ends) while its workers wait for their jobs."""
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, time
        from report.render import Renderer
        with Renderer(100, workers=2) as r:
            print(" ".join(map(str, r.pids)), flush=True)
            time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(pid) for pid in pids)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids)


def test_a_report_folder_in_the_working_directory_does_not_shadow_the_package(tmp_path, monkeypatch):
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "__init__.py").write_text("raise ImportError('the wrong report package')\n")
    monkeypatch.chdir(tmp_path)
    jobs = _jobs(MIN_PARALLEL_JOBS)
    with Renderer(len(jobs), workers=2) as renderer:
        assert renderer.parallel
        assert renderer.render(jobs) == [png_of(job) for job in jobs]
