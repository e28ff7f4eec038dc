"""A real Apache Kafka cluster in KRaft mode for one testbed run (SPEC §12): one dedicated controller plus N
brokers, each a small-heap JVM in its own network namespace (`testbed.netns`), with the Jolokia agent on the
node's address for the sampler.

Faults are real: crash = SIGKILL, restart = the same broker started again on its data, shutdown = SIGTERM
(Kafka's controlled shutdown), isolate/heal = blackhole routes between the broker and every other node.
Every process is started in its own process group and carries `-Dreplab.testbed=<tag>` on its command line;
`KafkaCluster` is a context manager that kills every group it started (on success, failure and Ctrl-C) before
the network goes away.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from testbed.jars import KafkaJars, TestbedUnavailable, java_binary
from testbed.netns import Network

CONTROLLER = "controller"
CONTROLLER_ID = 1000
BROKER_PORT = 9092
CONTROLLER_PORT = 9093
JOLOKIA_PORT = 8778
MARKER = "-Dreplab.testbed="
#: Small heaps and a fast start: the machine has 2 cores shared by everything else.
JVM_FLAGS = ("-Xms64m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:CICompilerCount=1",
             "-Djava.net.preferIPv4Stack=true", "-Djava.awt.headless=true",
             # the log's stamps in UTC, so that an instant read from a broker's log is on the recorder's clock
             "-Duser.timezone=UTC")

LOG4J2 = """\
status = error
# Kafka's own shutdown hook runs the controlled shutdown: log4j must not stop logging before it (its hook would).
shutdownHook = disable
appender.file.type = File
appender.file.name = file
appender.file.fileName = ${sys:replab.testbed.log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.file.ref = file
logger.controller.name = kafka.controller
logger.controller.level = INFO
logger.state.name = state.change.logger
logger.state.level = INFO
# The evidence for the recorded shutdown/restart instants (README, Testbed): the broker's registration,
# fencing and controlled-shutdown states, the controller's answers, and every log truncation.
logger.lifecycle.name = kafka.server.BrokerLifecycleManager
logger.lifecycle.level = INFO
logger.cluster.name = org.apache.kafka.controller.ClusterControlManager
logger.cluster.level = INFO
logger.replication.name = org.apache.kafka.controller.ReplicationControlManager
logger.replication.level = INFO
logger.heartbeat.name = org.apache.kafka.controller.BrokerHeartbeatManager
logger.heartbeat.level = INFO
logger.unifiedlog.name = org.apache.kafka.storage.internals.log.UnifiedLog
logger.unifiedlog.level = INFO
"""


def _cluster_id() -> str:
    """A random cluster id in Kafka's form (URL-safe base64 of 16 bytes). Never one starting with '-': the format
    tool would take it for an option (one id in 64 did, and the run failed)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def broker_name(broker: int) -> str:
    return f"broker-{broker}"


@dataclass(frozen=True)
class BrokerSettings:
    """Broker- and controller-level settings a policy fixes (SPEC §12): one cluster serves policies that agree."""

    replica_lag_time_max_ms: int
    session_timeout_ms: int
    eligible_leader_replicas: bool
    #: Followers fetch at this cadence (replica.fetch.wait.max.ms with a large replica.fetch.min.bytes): the
    #: scenario's fetch_interval_ms, so that a follower's lag is the scenario's, not whatever a idle
    #: loopback network gives (sub-millisecond, far below what the 50 ms sampler can see).
    fetch_wait_ms: int = 500


class NodeProcesses:
    """What every testbed cluster does with its nodes (Kafka's, RocketMQ's): one JVM per node in its own process
    group and network namespace, killed by group, and the network removed, whenever the run ends."""

    procs: dict[str, subprocess.Popen]
    started_pgids: list[int]
    #: the node each running or past JVM's process group belongs to (for the CPU shares)
    node_of_pgid: dict[int, str]
    network: Network | None
    workdir: Path
    tag: str
    java: str
    #: the system's name and the node log whose tail explains a node's exit
    SYSTEM: ClassVar[str] = "Kafka"
    NODE_LOG: ClassVar[str] = "server.log"

    def _files(self) -> None:
        """Write the cluster-wide files (logging configuration) into the fresh workdir."""
        raise NotImplementedError

    def _nodes(self) -> list[str]:
        """Every node's name, in start order (each gets a network namespace)."""
        raise NotImplementedError

    def _start_all(self) -> None:
        raise NotImplementedError

    def _launch(self, name: str, cmd: list[str], log: Path) -> subprocess.Popen:
        proc = start_group(cmd, log)
        self.procs[name] = proc
        self.started_pgids.append(proc.pid)
        self.node_of_pgid[proc.pid] = name
        return proc

    def is_up(self, broker: int) -> bool:
        proc = self.procs.get(broker_name(broker))
        return proc is not None and proc.poll() is None

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                log = self.workdir / name / self.NODE_LOG
                tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log.exists() else []
                raise TestbedUnavailable(f"{self.SYSTEM} {name} exited with code {proc.returncode}: "
                                         f"{' | '.join(tail)}")

    def crash(self, broker: int) -> None:
        self._kill(broker_name(broker), signal.SIGKILL)

    def __enter__(self):
        self.java = java_binary()
        # A new cluster every run: data a previous run left in the same folder is not this cluster's.
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._files()
        self.network = Network(self.tag, self._nodes())
        self.network.__enter__()
        try:
            self._start_all()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for name in list(self.procs):
            self._kill(name, signal.SIGKILL)
        for pgid in self.started_pgids:  # anything a JVM may have forked
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        if self.network is not None:
            self.network.close()

    def address(self, name: str) -> str:
        assert self.network is not None
        return self.network.address(name)

    def _kill(self, name: str, sig: int) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None:
            stop_group(proc, sig)

    def isolate(self, broker: int) -> None:
        assert self.network is not None
        self.network.isolate(broker_name(broker))

    def heal(self, broker: int) -> None:
        assert self.network is not None
        self.network.heal(broker_name(broker))


@dataclass
class KafkaCluster(NodeProcesses):
    jars: KafkaJars
    brokers: list[int]
    settings: BrokerSettings
    workdir: Path
    tag: str
    network: Network | None = None
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    #: every process group this run started, dead or alive (the teardown and the tests check them all)
    started_pgids: list[int] = field(default_factory=list)
    node_of_pgid: dict[int, str] = field(default_factory=dict)
    cluster_id: str = field(default_factory=lambda: _cluster_id())

    # ------------------------------------------------------------------------------------------ lifecycle
    def _files(self) -> None:
        (self.workdir / "log4j2.properties").write_text(LOG4J2)

    def _nodes(self) -> list[str]:
        return [CONTROLLER, *(broker_name(b) for b in self.brokers)]

    def _start_all(self) -> None:
        self._format_all()
        for name in self._nodes():
            self._start(name)

    # ------------------------------------------------------------------------------------------ addresses
    @property
    def bootstrap(self) -> str:
        return ",".join(f"{self.address(broker_name(b))}:{BROKER_PORT}" for b in self.brokers)

    def jolokia_url(self, broker: int) -> str:
        return f"http://{self.address(broker_name(broker))}:{JOLOKIA_PORT}/jolokia/"

    # ------------------------------------------------------------------------------------------ configs
    def _properties(self, name: str) -> Path:
        node_dir = self.workdir / name
        node_dir.mkdir(parents=True, exist_ok=True)
        addr = self.address(name)
        voters = f"{CONTROLLER_ID}@{self.address(CONTROLLER)}:{CONTROLLER_PORT}"
        common = {
            "controller.quorum.voters": voters,
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(node_dir / "data"),
        }
        if name == CONTROLLER:
            props = {"process.roles": "controller", "node.id": CONTROLLER_ID,
                     "listeners": f"CONTROLLER://{addr}:{CONTROLLER_PORT}",
                     "broker.session.timeout.ms": self.settings.session_timeout_ms, **common}
        else:
            n = len(self.brokers)
            props = {
                "process.roles": "broker", "node.id": int(name.split("-")[1]),
                "listeners": f"PLAINTEXT://{addr}:{BROKER_PORT}",
                "advertised.listeners": f"PLAINTEXT://{addr}:{BROKER_PORT}",
                "inter.broker.listener.name": "PLAINTEXT",
                "replica.lag.time.max.ms": self.settings.replica_lag_time_max_ms,
                "replica.fetch.wait.max.ms": self.settings.fetch_wait_ms,
                "replica.fetch.min.bytes": 64 * 1024 * 1024,
                # replab elects only on failure (SPEC §3.2 rule 8): no preferred-leader rebalancing.
                "auto.leader.rebalance.enable": "false",
                "auto.create.topics.enable": "false",
                "offsets.topic.replication.factor": min(3, n), "offsets.topic.num.partitions": 1,
                "transaction.state.log.replication.factor": min(3, n), "transaction.state.log.min.isr": 1,
                "group.initial.rebalance.delay.ms": 0,
                "num.network.threads": 2, "num.io.threads": 2, "background.threads": 2,
                **common,
            }
        path = node_dir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return path

    def _format_all(self) -> None:
        elr = 1 if self.settings.eligible_leader_replicas else 0
        jobs = []
        for name in [CONTROLLER, *(broker_name(b) for b in self.brokers)]:
            cmd = [self.java, "-Xmx128m", "-XX:TieredStopAtLevel=1", "-cp", self.jars.classpath,
                   "kafka.tools.StorageTool", "format", "-t", self.cluster_id, "-c", str(self._properties(name)),
                   "--feature", f"eligible.leader.replicas.version={elr}"]
            jobs.append((name, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                                start_new_session=True)))
            self.started_pgids.append(jobs[-1][1].pid)
        for name, proc in jobs:
            out, _ = proc.communicate(timeout=120)
            if proc.returncode != 0:
                raise TestbedUnavailable(f"kafka-storage format failed for {name}: {out.strip().splitlines()[-1:]}")

    # ------------------------------------------------------------------------------------------ processes
    def _start(self, name: str) -> None:
        assert self.network is not None
        node_dir = self.workdir / name
        addr = self.address(name)
        cmd = [*self.network.exec_prefix(name), self.java, *JVM_FLAGS, f"{MARKER}{self.tag}",
               f"-Dreplab.testbed.log={node_dir / 'server.log'}",
               f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
               f"-javaagent:{self.jars.agent}=host={addr},port={JOLOKIA_PORT},discoveryEnabled=false",
               "-cp", self.jars.classpath, "kafka.Kafka", str(node_dir / "server.properties")]
        self._launch(name, cmd, node_dir / "stdout.log")

    # ------------------------------------------------------------------------------------------ faults
    def shutdown_begin(self, broker: int) -> subprocess.Popen:
        """SIGTERM: Kafka's controlled shutdown; the caller reaps the process (it takes a few seconds)."""
        proc = self.procs.pop(broker_name(broker))
        os.killpg(proc.pid, signal.SIGTERM)
        self._stopping = getattr(self, "_stopping", {})
        self._stopping[broker] = proc
        return proc

    def stopping(self, broker: int) -> subprocess.Popen | None:
        """The process of a broker in controlled shutdown (SIGTERM sent, not yet reaped), if any."""
        return getattr(self, "_stopping", {}).get(broker)

    def restart(self, broker: int) -> None:
        stopping = getattr(self, "_stopping", {}).pop(broker, None)
        if stopping is not None:
            try:
                stopping.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(stopping.pid, signal.SIGKILL)
                stopping.wait()
        self._start(broker_name(broker))

    # ------------------------------------------------------------------------------------------ readiness
    def wait_ready(self, timeout_s: float = 90.0) -> None:
        """Every broker registered and unfenced (visible in the metadata), every Jolokia agent answering."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "socket.timeout.ms": 2000})
        deadline = time.monotonic() + timeout_s
        while True:
            self.check_alive()
            try:
                md = admin.list_topics(timeout=2)
                if set(md.brokers) >= set(self.brokers):
                    break
            except Exception:  # the cluster is still coming up: ask again
                pass
            if time.monotonic() > deadline:
                raise TestbedUnavailable(f"the Kafka cluster was not ready after {timeout_s:.0f} s "
                                         f"(logs in {self.workdir})")
            time.sleep(0.5)


def start_group(cmd: list[str], log: Path) -> subprocess.Popen:
    """Start `cmd` in its own process group (its pid is the group id), output appended to `log`."""
    out = open(log, "ab")  # noqa: SIM115 (the child keeps it open)
    try:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    finally:
        out.close()


def stop_group(proc: subprocess.Popen, sig: int, timeout_s: float = 30) -> None:
    """Signal the process group `proc` leads and reap it (SIGKILL if it outlives `timeout_s`)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout_s)


def marked_java_pids(tag: str) -> list[int]:
    """Pids of processes whose command line carries this run's marker (tests check none is left)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"{MARKER}{tag}".encode() in cmdline:
            out.append(int(entry.name))
    return out
