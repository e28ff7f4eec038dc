"""spark-submit on a real standalone cluster (SPEC §6.2): `make dist`'s zip, a master and a worker on 127.0.0.1.

The test starts a Spark master and one worker (1 core, 1 GiB) from the pyspark install, each in its own process
group, submits `pipelines/replay_job.py` with the zip on `--py-files` and Delta's jars on `--jars` (the ones the
session factory cached; `--packages` on a machine that has none yet), and reads back the Delta tables the job
wrote: the run summary of the golden scenario k2-acks1-leader-crash must equal its expected.json (derived by hand
from SPEC §3.2). Python workers on the cluster run the venv's interpreter (PYSPARK_PYTHON) and import replab from
the zip: the zip comes before site-packages on their path, and the editable install's finder comes last.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
K2 = REPO / "tests" / "scenarios" / "k2-acks1-leader-crash"
START_TIMEOUT_S = 120
SUBMIT_TIMEOUT_S = 900


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,  # the executors' Python workers: the venv's, with numpy/pyarrow/...
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_DAEMON_MEMORY": "256m",  # master and worker daemons only schedule; the default is 1 GiB each
    })
    env.pop("PYSPARK_GATEWAY_PORT", None)
    env.pop("PYSPARK_GATEWAY_SECRET", None)
    return env


@dataclass
class Daemon:
    name: str
    proc: subprocess.Popen
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        # The daemon was started in its own session: its process group holds the JVM and anything it forked.
        pgid = os.getpgid(self.proc.pid)
        os.killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait(timeout=30)


def start_daemon(name: str, args: list[str], log: Path) -> Daemon:
    with log.open("w") as out:
        proc = subprocess.Popen([str(spark_home() / "bin" / "spark-class"), *args], stdout=out,
                                stderr=subprocess.STDOUT, env=cluster_env(), start_new_session=True)
    return Daemon(name, proc, log)


def wait_for(daemon: Daemon, marker: str, timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if marker in daemon.text():
            return
        if daemon.proc.poll() is not None:
            pytest.fail(f"{daemon.name} exited with {daemon.proc.returncode}:\n{daemon.text()[-3000:]}")
        time.sleep(0.5)
    pytest.fail(f"{daemon.name} did not log {marker!r} within {timeout_s} s:\n{daemon.text()[-3000:]}")


@dataclass
class Standalone:
    url: str
    work_dir: Path


@pytest.fixture(scope="module")
def standalone(tmp_path_factory) -> Iterator[Standalone]:
    root = tmp_path_factory.mktemp("standalone")
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    daemons: list[Daemon] = []
    try:
        master = start_daemon("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
                                         str(port), "--webui-port", str(free_port())], root / "master.log")
        daemons.append(master)
        wait_for(master, "I have been elected leader")
        worker = start_daemon("worker", ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores",
                                         "1", "--memory", "1g", "--webui-port", str(free_port()), "--work-dir",
                                         str(root / "work"), url], root / "worker.log")
        daemons.append(worker)
        wait_for(worker, "Successfully registered with master")
        yield Standalone(url, root / "work")
    finally:
        for daemon in reversed(daemons):
            daemon.stop()


@pytest.fixture(scope="module")
def dist_zip(tmp_path_factory) -> Path:
    from pipelines.dist import build_zip

    path, entries = build_zip(tmp_path_factory.mktemp("dist"))
    assert entries > 50
    return path


def test_zip_alone_carries_the_packages_and_their_data(dist_zip):
    """Imported from the zip only (no repo on the path, the editable install's finder removed), replab finds its
    presets and its scenario library: what an executor, or a driver outside a checkout, has."""
    probe = f"""
import sys
sys.path = [p for p in sys.path if p not in ("", {str(REPO)!r})]
sys.meta_path = [f for f in sys.meta_path if "editable" not in getattr(f, "__module__", "").lower()
                 and "editable" not in type(f).__name__.lower() and "editable" not in str(f).lower()]
sys.path.insert(0, {str(dist_zip)!r})
import pipelines, replay.policies, generators.library
assert pipelines.__file__.startswith({str(dist_zip)!r}), pipelines.__file__
presets = replay.policies.presets()
scenarios = generators.library.scenario_files()
print(len(presets), len(scenarios), "demo" in scenarios)
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd="/")
    assert out.returncode == 0, out.stderr
    presets, scenarios, has_demo = out.stdout.split()
    assert int(presets) >= 10 and int(scenarios) >= 20 and has_demo == "True"


@pytest.mark.slow  # master, worker and driver JVMs on 2 cores: ~3 minutes; the fast suite keeps the zip test above
def test_replay_job_on_a_standalone_cluster(spark, standalone, dist_zip, tmp_path):
    from replay.policies import parse_policy
    from storage.session import cached_jars, delta_package, jars_dir

    case = next(c for c in json.loads((K2 / "expected.json").read_text()) if c["policy"] == "kafka:partitions=1,acks=1")
    lakehouse = tmp_path / "lakehouse"
    summary_json = tmp_path / "summary.json"
    jars = cached_jars()  # the spark fixture has resolved (or found) them
    delta = ["--jars", ",".join(jars)] if jars else ["--packages", delta_package(), "--conf",
                                                      f"spark.jars.ivy={jars_dir() / 'ivy'}"]
    cmd = [str(spark_home() / "bin" / "spark-submit"), "--master", standalone.url, "--py-files", str(dist_zip),
           *delta, "--driver-memory", "1g", "--executor-memory", "1g", "--total-executor-cores", "1",
           "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=2",
           "pipelines/replay_job.py", "--trace", str(K2), "--policy", "kafka-acks1:partitions=1", "--no-mlflow",
           "--lakehouse", str(lakehouse), "--summary-json", str(summary_json)]
    out = subprocess.run(cmd, cwd=REPO, env=cluster_env(), capture_output=True, text=True, timeout=SUBMIT_TIMEOUT_S,
                         start_new_session=True)
    assert out.returncode == 0, f"spark-submit exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-6000:]}"
    if jars:
        # The factory must not resolve Delta again under spark-submit (no Ivy resolution in the driver's log).
        assert "resolving dependencies" not in out.stderr
    # The work ran on the cluster's executor (its folder under the worker's work dir), not in the driver.
    assert list(standalone.work_dir.glob("app-*/*/stderr"))

    run_id = json.loads(summary_json.read_text())[0]["run_id"]
    assert parse_policy("kafka-acks1:partitions=1").canonical() == parse_policy(case["policy"]).canonical()
    delta_read = spark.read.format("delta")
    runs = delta_read.load(str(lakehouse / "runs")).collect()
    assert [(r.run_id, r.status) for r in runs] == [(run_id, "succeeded")]
    summary = delta_read.load(str(lakehouse / "run_summary")).where(f"run_id = '{run_id}'").collect()
    assert len(summary) == 1
    for field, value in case["summary"].items():
        assert summary[0][field] == pytest.approx(value, abs=1e-9), field
    outcomes = {r.msg_id: r for r in delta_read.load(str(lakehouse / "message_outcomes")).collect()}
    for msg_id, expected in case["messages"].items():
        for field, value in expected.items():
            assert outcomes[int(msg_id)][field] == value, (msg_id, field)
