"""Shared fixtures: one SparkSession for the whole test session (startup costs ~8 s on 2 cores).

`make test` runs the fast suite on two pytest-xdist workers (`--dist loadfile`): each worker has its own
SparkSession, and a test file is one unit of work, so its module-scoped fixtures are built once. A session-scoped
fixture is built once per worker that needs it, so files that share one (SHARED_FIXTURE_FILES) are scheduled as
one unit by `pytest_xdist_make_scheduler` below. (`--dist loadgroup` would do that with marks, but pytest-xdist 3.8
marks its groups on `Item._nodeid`, which pytest 9 no longer reads.)
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_SCENARIOS = REPO / "tests" / "scenarios"
_STARTED = time.monotonic()  # conftest is imported as the session starts: the wall time of the summary

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_ENABLE_TELEMETRY", "false")
# Two xdist workers' sessions and the JVMs their tests start (CLIs, spark-submit) share the machine's memory; the
# tests' data is small, and a 4 GB heap per JVM let the kernel's OOM killer in on a 24 GB machine under load.
os.environ.setdefault("REPLAB_DRIVER_MEMORY", "3g")


#: Test files that read one session-scoped fixture, scheduled on one xdist worker so it is built once:
#: `k2_mlflow_replay` (below) is a full replay with MLflow, about a minute on 2 busy cores.
SHARED_FIXTURE_FILES: dict[str, str] = {
    path: "k2_mlflow_replay" for path in ("tests/engine/test_tracking.py", "tests/report/test_compare.py",
                                          "tests/report/test_browser.py")
}


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, except that the files of SHARED_FIXTURE_FILES form one unit of work."""
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedFixtureScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return SHARED_FIXTURE_FILES.get(path, path)

    return SharedFixtureScheduling(config, log)


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    from storage.session import cached_jars, get_spark, jars_dir

    os.environ["REPLAB_WAREHOUSE_DIR"] = str(tmp_path_factory.mktemp("warehouse"))
    if cached_jars():
        session = get_spark("replab-tests", master="local[2]", shuffle_partitions=2, ui=False)
    else:  # a fresh clone: one worker resolves Delta's jars from Maven Central, the other waits and reuses them
        jars_dir().mkdir(parents=True, exist_ok=True)
        with open(jars_dir() / ".resolving.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            session = get_spark("replab-tests", master="local[2]", shuffle_partitions=2, ui=False)
    yield session
    session.stop()


@pytest.fixture
def lakehouse(tmp_path) -> Path:
    return tmp_path / "lakehouse"


class SparkNotStarted(Exception):
    """Raised by `spark_start_spy` in place of starting Spark."""


@dataclass
class SparkStartSpy:
    #: `short_lived` as each `get_spark` call asked for it (a JVM on C1 only, `storage.session.C1_ONLY`).
    asked: list[bool] = field(default_factory=list)
    started: type[Exception] = SparkNotStarted


@pytest.fixture
def spark_start_spy(monkeypatch) -> SparkStartSpy:
    """`storage.session.get_spark` replaced by a spy that records how a CLI asked for its session, then raises
    `spy.started`: what the command decided before Spark starts, without starting it."""
    import storage.session

    spy = SparkStartSpy()

    def get_spark(app_name="replab", **kwargs):
        spy.asked.append(kwargs.get("short_lived", False))
        raise SparkNotStarted(app_name)

    monkeypatch.setattr(storage.session, "get_spark", get_spark)
    return spy


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
    terminalreporter.write_line(f"{sum(per_file.values()):9.1f}s  total (summed over workers), "
                                f"{time.monotonic() - _STARTED:.1f}s wall")


# ------------------------------------------------------------------------------------------------ k2 with MLflow
# A golden scenario replayed once with MLflow on, shared by the tracking, compare and browser tests.
# Session-scoped rather than module-scoped: those files read the same store, and a replay through `run_replay`
# (trace gate, replay, output gate, Delta writes, MLflow) takes minutes on a loaded 2-core machine. Tests that
# change the store (re-runs) say so and only leave it in a state every other test accepts: one FINISHED run per
# policy.
K2 = SHARED_SCENARIOS / "k2-acks1-leader-crash"


@dataclass
class MlflowReplay:
    trace: Path
    expected: list[dict[str, Any]]  # tests/scenarios/<name>/expected.json: hand-derived, not program output
    policies: list[Any]
    report: Any  # engine.plan.ReplayReport
    tracking_uri: str
    store: Path
    lakehouse: Path
    experiment: str

    def canonical(self, case: dict[str, Any]) -> str:
        from replay.policies import parse_policy

        return parse_policy(case["policy"]).canonical()


@pytest.fixture(scope="session")
def k2_mlflow_replay(spark, tmp_path_factory) -> MlflowReplay:
    from engine.plan import ReplayRequest
    from engine.replay import run_replay
    from replay.policies import parse_policy
    from report.figures import run_figures

    root = tmp_path_factory.mktemp("k2-mlflow")
    expected = json.loads((K2 / "expected.json").read_text())
    policies = [parse_policy(case["policy"]) for case in expected]
    uri = f"sqlite:///{root / 'mlflow.db'}"
    report = run_replay(spark, ReplayRequest(trace=str(K2), policies=policies, lakehouse=str(root / "lakehouse"),
                                             tracking_uri=uri, figures=run_figures))
    return MlflowReplay(K2, expected, policies, report, uri, root, root / "lakehouse", report.experiment)
