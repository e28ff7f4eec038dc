"""Shared fixtures: one SparkSession for the whole test session (startup costs ~8 s on 2 cores)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_SCENARIOS = REPO / "tests" / "scenarios"

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_ENABLE_TELEMETRY", "false")


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    from storage.session import get_spark

    os.environ["REPLAB_WAREHOUSE_DIR"] = str(tmp_path_factory.mktemp("warehouse"))
    session = get_spark("replab-tests", master="local[2]", shuffle_partitions=2, ui=False)
    yield session
    session.stop()


@pytest.fixture
def lakehouse(tmp_path) -> Path:
    return tmp_path / "lakehouse"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Print each test file's time (setup + call + teardown summed), slowest first: where the suite's time goes."""
    per_file: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            duration = getattr(report, "duration", None)
            nodeid = getattr(report, "nodeid", "")
            if duration is None or not nodeid or getattr(report, "when", None) not in ("setup", "call", "teardown"):
                continue
            path = nodeid.split("::", 1)[0]
            per_file[path] = per_file.get(path, 0.0) + duration
    if not per_file:
        return
    terminalreporter.write_sep("=", "time per test file (setup + call + teardown)")
    for path, seconds in sorted(per_file.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{seconds:9.1f}s  {path}")
    terminalreporter.write_line(f"{sum(per_file.values()):9.1f}s  total")
