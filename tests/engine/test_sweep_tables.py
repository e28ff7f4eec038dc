"""The sweep's Delta tables survive a kill: a `replab sweep` process killed (SIGKILL) while its Spark job runs,
then run again, ends with the same `sweeps` and `sweep_results` as an uninterrupted sweep (slow suite);
re-running replaces the sweep's rows (no duplicates)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
ARGS = ["--scenario", "demo", "--seeds", "4", "--scale", "0.02", "--policy", "kafka-acks1", "--policy",
        "kafka-durable", "--no-mlflow"]
TIMES = ("started_at", "finished_at")


def _rows(lh: Path, name: str) -> list[dict]:
    rows = DeltaTable(str(lh / name)).to_pyarrow_table().to_pylist()
    return sorted(({k: v for k, v in r.items() if k not in TIMES} for r in rows),
                  key=lambda r: (r.get("seed", 0), r.get("policy", "")))


def _writes(lh: Path, name: str) -> int:
    return sum(h["operation"] == "WRITE" for h in DeltaTable(str(lh / name)).history())


def _sweep(lh: Path, out: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "pipelines", "sweep", *ARGS, "--lakehouse", str(lh),
                             "--out", str(out)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


@dataclass
class CleanSweep:
    """One uninterrupted sweep, run in this process; its rows as first written."""

    lakehouse: Path
    request: Any
    sweep_id: str
    rows: dict[str, list[dict]]


@pytest.fixture(scope="module")
def clean_sweep(spark, tmp_path_factory) -> CleanSweep:
    from engine.sweep.run import SweepRequest, run_sweep
    from replay.policies import parse_policy

    root = tmp_path_factory.mktemp("sweep-clean")
    request = SweepRequest(scenario="demo", seeds=4, scale=0.02,
                           policies=[parse_policy("kafka-acks1"), parse_policy("kafka-durable")],
                           labels=["kafka-acks1", "kafka-durable"], lakehouse=str(root / "lakehouse"),
                           out=str(root / "out"), mlflow=False)
    first = run_sweep(spark, request)
    lh = Path(request.lakehouse)
    rows = {name: _rows(lh, name) for name in ("sweeps", "sweep_results")}
    for name in rows:
        assert _writes(lh, name) == 1, name
    assert len(rows["sweep_results"]) == 8
    return CleanSweep(lh, request, first.sweep_id, rows)


def test_rerun_replaces_the_sweeps_rows(spark, clean_sweep):
    """Re-running replaces the sweep's rows: same rows, one more commit per table, no duplicates."""
    from engine.sweep.run import run_sweep

    again = run_sweep(spark, clean_sweep.request)
    assert again.sweep_id == clean_sweep.sweep_id
    for name, rows in clean_sweep.rows.items():
        assert _rows(clean_sweep.lakehouse, name) == rows
        assert _writes(clean_sweep.lakehouse, name) == 2


@pytest.mark.slow  # two `replab sweep` processes (two JVMs); the fast suite keeps the re-run above
def test_killed_sweep_rerun_equals_uninterrupted(clean_sweep, tmp_path):
    killed_lh = tmp_path / "killed"
    proc = _sweep(killed_lh, tmp_path / "out1")
    try:
        deadline = time.monotonic() + 600
        for line in proc.stdout:  # wait until the Spark job is running, then kill the whole process group
            if "one Spark job" in line or time.monotonic() > deadline:
                break
        time.sleep(2)
        assert proc.poll() is None, "the sweep ended before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    for name in ("sweeps", "sweep_results"):  # nothing of the killed sweep is visible
        path = killed_lh / name
        assert not (path / "_delta_log").is_dir() or not DeltaTable(str(path)).to_pyarrow_table().num_rows

    rerun = _sweep(killed_lh, tmp_path / "out1")
    output, _ = rerun.communicate(timeout=1200)
    assert rerun.returncode == 0, output
    for name, rows in clean_sweep.rows.items():
        assert _rows(killed_lh, name) == rows, name
        assert _writes(killed_lh, name) == 1
