"""A Spark standalone cluster on 127.0.0.1 for the benchmarks: one master and N workers of C cores each, from
pyspark's own `spark-class` (no Spark distribution to install), each in its own process group, stopped by
process group when the `with` block ends (also on failure).

    with standalone_cluster(workers=2, cores=1, work_dir=tmp) as cluster:
        spark = get_spark("bench", master=cluster.url)
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Cluster:
    url: str
    pids: list[int] = field(default_factory=list)  # master first, then the workers (process group leaders)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


def _wait_for(log: Path, needle: str, proc: subprocess.Popen, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while needle not in (log.read_text(errors="replace") if log.exists() else ""):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start (see {log})")
        time.sleep(0.5)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


@contextmanager
def standalone_cluster(*, workers: int = 2, cores: int = 1, memory: str = "2g",
                       work_dir: str | Path) -> Iterator[Cluster]:
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_WORKER_DIR": str(work / "worker"),
           "SPARK_LOCAL_DIRS": str(work / "local"), "SPARK_NO_DAEMONIZE": "1"}
    port = _free_port()
    url = f"spark://127.0.0.1:{port}"
    procs: list[subprocess.Popen] = []

    def start(args: list[str], log: Path) -> subprocess.Popen:
        out = log.open("w")
        proc = subprocess.Popen([_spark_class(), *args], stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        out.close()
        procs.append(proc)
        return proc

    try:
        log = work / "master.log"
        master = start(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                        "--webui-port", str(_free_port())], log)
        _wait_for(log, "I have been elected leader", master, "the Spark master")
        for i in range(workers):
            log = work / f"worker-{i}.log"
            worker = start(["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", str(cores),
                            "--memory", memory, "--webui-port", str(_free_port()), url], log)
            _wait_for(log, "Successfully registered with master", worker, f"Spark worker {i}")
        yield Cluster(url, [p.pid for p in procs])
    finally:
        for proc in reversed(procs):
            _stop(proc)
