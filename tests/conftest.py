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
