"""A real Apache RocketMQ cluster for one testbed run (SPEC §12): a NameServer and the policy's broker groups (DLedger
Raft groups, or a master and its slaves), each node a small-heap JVM in its own network namespace
(`testbed.netns`), as `testbed.cluster` runs Kafka.

Facts of RocketMQ 5.3.3 this follows: the broker needs `-Drocketmq.home.dir` and logs under `${user.home}` (each JVM
gets its own of both); with every jar on one classpath each process needs its own `-Drmq.logback.configurationFile`;
`brokerIP1` is set explicitly (the address the NameServer hands to clients); DLedger does not replicate topic
configuration, so topics are created on every member (`ReplabHarness topics`). `DLedgerCommitLog` copies only a
few settings into DLedger's own config (peers, group, self id, preferred leader, store paths, file sizes), so
DLedger's heartbeat interval and leak count stay at their defaults (2000 ms × 3).

Faults are real: crash = SIGKILL, restart = the same broker started again on its store, shutdown = SIGTERM.
Every process is started in its own process group and stopped by it (on success, failure and Ctrl-C: the
cluster is a context manager) before the network goes away.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from testbed.cluster import JVM_FLAGS, MARKER, NodeProcesses, broker_name, stop_group
from testbed.instruments import cpu_seconds
from testbed.netns import Network
from testbed.rocketmq.jars import RocketMQJars

NAMESRV = "namesrv"
#: What a broker prints on stdout once it serves (`BrokerStartup.start`).
BOOT_LINE = "boot success"
#: A restarting broker's CPU priority until it has booted (`RocketMQCluster.restart`): the lowest.
BOOT_NICENESS = 19
NAMESRV_PORT = 9876
BROKER_PORT = 10911
DLEDGER_PORT = 40911
HA_PORT = 10912  # the master's HA listener (listenPort + 1), which its slaves connect to
CONTROLLER_PORT = 9878  # the controller embedded in the NameServer listens on its own DLedger peer port
#: The broker maps its commit log (DLedger's data files take the same size): small files on a small machine.
MAPPED_FILE_BYTES = 64 * 1024 * 1024

LOGBACK = """\
<configuration>
  <appender name="file" class="ch.qos.logback.core.FileAppender">
    <file>${replab.testbed.log}</file>
    <encoder><pattern>%d{HH:mm:ss.SSS} %p %t %logger{20} - %m%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="file"/></root>
</configuration>
"""


def dledger_id(broker: int) -> str:
    return f"n{broker}"


@dataclass(frozen=True)
class Group:
    """One broker group (one brokerName): a DLedger Raft group of `members`, or (master/slave) `members[0]` the
    master (brokerId 0) and the rest its slaves (brokerId 1, 2, …), in the policy's layout order."""

    name: str
    members: tuple[int, ...]


@dataclass(frozen=True)
class MasterSlave:
    """Classic master/slave replication (SPEC §3.3): the masters' brokerRole and the SYNC_MASTER settings."""

    broker_role: str  # ASYNC_MASTER | SYNC_MASTER; in controller mode the controller assigns the roles
    in_sync_replicas: int  # MessageStoreConfig.inSyncReplicas: copies, master included, SYNC_MASTER waits for
    slave_timeout_ms: int  # MessageStoreConfig.slaveTimeout: the wait before FLUSH_SLAVE_TIMEOUT
    #: controller mode (SPEC §3.5): the controller embedded in the NameServer elects each group's master
    controller: bool = False
    all_ack_in_sync_state_set: bool = False
    min_insync_replicas: int = 1
    ha_max_time_slave_not_catchup_ms: int = 15000
    controller_heartbeat_timeout_ms: int = 10000
    enable_elect_unclean_master: bool = False


@dataclass
class RocketMQCluster(NodeProcesses):
    jars: RocketMQJars
    groups: list[Group]
    workdir: Path
    tag: str
    flush_sync: bool = False
    #: None: DLedger groups; else every group is a master and its slaves
    master_slave: MasterSlave | None = None
    network: Network | None = None
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    #: every process group this run started, dead or alive (the teardown and the tests check them all)
    started_pgids: list[int] = field(default_factory=list)
    node_of_pgid: dict[int, str] = field(default_factory=dict)
    _trace_over: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    SYSTEM: ClassVar[str] = "RocketMQ"
    NODE_LOG: ClassVar[str] = "stdout.log"  # startup failures are printed there, before logging starts

    @property
    def brokers(self) -> list[int]:
        return [b for g in self.groups for b in g.members]

    def group_of(self, broker: int) -> Group:
        return next(g for g in self.groups if broker in g.members)

    # ------------------------------------------------------------------------------------------ lifecycle
    def _files(self) -> None:
        (self.workdir / "logback.xml").write_text(LOGBACK)

    def _nodes(self) -> list[str]:
        return [NAMESRV, *(broker_name(b) for b in self.brokers)]

    def _start_all(self) -> None:
        for name in self._nodes():
            self._start(name)

    # ------------------------------------------------------------------------------------------ addresses
    @property
    def namesrv(self) -> str:
        return f"{self.address(NAMESRV)}:{NAMESRV_PORT}"

    def broker_addr(self, broker: int) -> str:
        return f"{self.address(broker_name(broker))}:{BROKER_PORT}"

    def broker_of_addr(self, addr: str) -> int | None:
        return next((b for b in self.brokers if self.broker_addr(b) == addr), None)

    def store(self, broker: int) -> Path:
        return self.workdir / broker_name(broker) / "store"

    def index_file(self, broker: int) -> Path:
        """The first file of the broker's DLedger entry index (DLedgerConfig: <store>/dledger-<selfId>/index)."""
        return self.store(broker) / f"dledger-{dledger_id(broker)}" / "index" / f"{0:020d}"

    # ------------------------------------------------------------------------------------------ configs
    def _config(self, name: str) -> Path:
        node_dir = self.workdir / name
        (node_dir / "home").mkdir(parents=True, exist_ok=True)
        if name == NAMESRV:
            props: dict[str, object] = {"listenPort": NAMESRV_PORT}
            ms = self.master_slave
            if ms is not None and ms.controller:
                props |= {"enableControllerInNamesrv": "true", "controllerDLegerGroup": "replab-controller",
                          "controllerDLegerPeers": f"n0-{self.controller_addr}", "controllerDLegerSelfId": "n0",
                          "controllerStorePath": node_dir / "controller",
                          "enableElectUncleanMaster": str(ms.enable_elect_unclean_master).lower()}
        else:
            b = int(name.split("-")[1])
            g = self.group_of(b)
            props = {
                "brokerClusterName": "replab", "brokerName": g.name, "listenPort": BROKER_PORT,
                "namesrvAddr": self.namesrv, "brokerIP1": self.address(name),
                "storePathRootDir": self.store(b), "storePathCommitLog": self.store(b) / "commitlog",
                **self._replication(b, g), "mappedFileSizeCommitLog": MAPPED_FILE_BYTES,
                "flushDiskType": "SYNC_FLUSH" if self.flush_sync else "ASYNC_FLUSH",
                "autoCreateTopicEnable": "false", "autoCreateSubscriptionGroup": "true",
                "sendMessageThreadPoolNums": 4, "pullMessageThreadPoolNums": 4,
                # the verifying consumer reads a queue in large pulls (32 messages by default)
                "maxTransferCountOnMessageInMemory": 1024, "maxTransferBytesOnMessageInMemory": 4 * 1024 * 1024,
            }
        path = node_dir / ("namesrv.conf" if name == NAMESRV else "broker.conf")
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return path

    def _replication(self, b: int, g: Group) -> dict[str, object]:
        ms = self.master_slave
        if ms is None:
            peers = ";".join(f"{dledger_id(m)}-{self.address(broker_name(m))}:{DLEDGER_PORT}" for m in g.members)
            return {"enableDLegerCommitLog": "true", "dLegerGroup": g.name, "dLegerPeers": peers,
                    "dLegerSelfId": dledger_id(b)}
        if ms.controller:
            # The controller assigns ids and roles (brokerId -1, every broker starts as a slave).
            return {"brokerId": -1, "brokerRole": "SLAVE", "enableControllerMode": "true",
                    "controllerAddr": self.controller_addr, "haListenPort": HA_PORT,
                    "inSyncReplicas": ms.in_sync_replicas, "minInSyncReplicas": ms.min_insync_replicas,
                    "allAckInSyncStateSet": str(ms.all_ack_in_sync_state_set).lower(),
                    "haMaxTimeSlaveNotCatchup": ms.ha_max_time_slave_not_catchup_ms,
                    "controllerHeartBeatTimeoutMills": ms.controller_heartbeat_timeout_ms,
                    "slaveTimeout": ms.slave_timeout_ms}
        broker_id = g.members.index(b)
        return {"brokerId": broker_id, "brokerRole": ms.broker_role if broker_id == 0 else "SLAVE",
                "haListenPort": HA_PORT, "inSyncReplicas": ms.in_sync_replicas,
                "slaveTimeout": ms.slave_timeout_ms}

    @property
    def controller_addr(self) -> str:
        return f"{self.address(NAMESRV)}:{CONTROLLER_PORT}"

    def is_master(self, broker: int) -> bool:
        """Master by configuration (classic master/slave: the group's first broker)."""
        ms = self.master_slave
        return ms is not None and not ms.controller and self.group_of(broker).members[0] == broker

    # ------------------------------------------------------------------------------------------ processes
    def _start(self, name: str, niceness: int = 0) -> None:
        assert self.network is not None
        node_dir = self.workdir / name
        conf = self._config(name)
        main = ("org.apache.rocketmq.namesrv.NamesrvStartup" if name == NAMESRV
                else "org.apache.rocketmq.broker.BrokerStartup")
        niced = ["nice", "-n", str(niceness)] if niceness else []
        cmd = [*niced, *self.network.exec_prefix(name), self.java, *JVM_FLAGS, "-XX:MaxDirectMemorySize=256m",
               f"{MARKER}{self.tag}", f"-Duser.home={node_dir / 'home'}", f"-Drocketmq.home.dir={node_dir}",
               f"-Drmq.logback.configurationFile={self.workdir / 'logback.xml'}",
               f"-Dreplab.testbed.log={node_dir / 'server.log'}", "-cp", self.jars.classpath, main, "-c", str(conf)]
        self._launch(name, cmd, node_dir / "stdout.log")

    # ------------------------------------------------------------------------------------------ faults
    def shutdown(self, broker: int) -> None:
        """SIGTERM: the broker unregisters and stops (about 15 s here); reaped before this returns."""
        self._kill(broker_name(broker), signal.SIGTERM)

    def restart(self, broker: int) -> None:
        """Start the broker again on its store (after the trace, to read every queue back: normal priority)."""
        self._start(broker_name(broker))

    def restart_low_priority(self, broker: int) -> None:
        """A restart during the trace: the broker boots at the lowest CPU priority until it prints its boot line,
        or the trace ends (`restore_priorities`).

        A broker's boot (class loading, JIT compilation, the commit log's recovery after a crash) takes many
        CPU-seconds (written to `<node>/priority.log`); on two cores shared by every broker it starved the seed
        layout's leader (its appends took twice as long and the client's 3 s send timeout expired), which a broker
        restarting on its own host never does."""
        name = broker_name(broker)
        booted = self._boot_lines(name)
        self._start(name, niceness=BOOT_NICENESS)
        threading.Thread(target=self._restore_priority, args=(name, self.procs[name], booted), daemon=True,
                         name=f"renice-{name}").start()

    def restore_priorities(self) -> None:
        """The trace is over: every broker still booting at low priority gets the normal one now."""
        self._trace_over.set()

    def _boot_lines(self, name: str) -> int:
        log = self.workdir / name / self.NODE_LOG
        return log.read_text(errors="replace").count(BOOT_LINE) if log.exists() else 0

    def _restore_priority(self, name: str, proc: subprocess.Popen, booted: int) -> None:
        """Every thread of the JVM back to niceness 0 once its stdout has one more boot line than before the
        restart, the trace is over or the JVM exited: `nice` and `ip netns exec` exec the JVM, so the process's
        pid is the JVM's; niceness is per thread on Linux."""
        while proc.poll() is None and not self._trace_over.is_set() and self._boot_lines(name) <= booted:
            time.sleep(0.1)
        cpu_s = cpu_seconds(proc.pid)
        for task in Path(f"/proc/{proc.pid}/task").glob("*"):
            with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
                os.setpriority(os.PRIO_PROCESS, int(task.name), 0)
        state = "booted" if self._boot_lines(name) > booted else "exited" if proc.poll() is not None else "trace over"
        with open(self.workdir / name / "priority.log", "a") as log:
            log.write(f"{time.time():.3f} {state} after {cpu_s:.1f} CPU-s at niceness {BOOT_NICENESS}; "
                      f"niceness 0 from now\n")

    # ------------------------------------------------------------------------------------------ the harness
    def harness(self, mode: str, *args: str, out: Path, stdin=None) -> subprocess.Popen:
        """The client harness (root namespace: it reaches every node over the bridge) in its own process group."""
        cmd = [self.java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.net.preferIPv4Stack=true",
               f"{MARKER}{self.tag}", f"-Duser.home={self.workdir / 'client-home'}",
               f"-Drmq.logback.configurationFile={self.workdir / 'logback.xml'}",
               f"-Dreplab.testbed.log={self.workdir / 'client.log'}",
               "-cp", self.jars.harness_classpath, "ReplabHarness", mode, "--namesrv", self.namesrv, *args,
               "--out", str(out)]
        log = open(self.workdir / f"harness-{mode}.log", "ab")  # noqa: SIM115 (the child keeps it open)
        try:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, text=True,
                                    start_new_session=True)
        finally:
            log.close()
        self.procs[f"harness-{mode}-{proc.pid}"] = proc
        self.started_pgids.append(proc.pid)
        return proc

    def reap(self, proc: subprocess.Popen, timeout_s: float) -> int:
        """Wait for a harness process; killed (its group) if it outlives `timeout_s`."""
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop_group(proc, signal.SIGKILL)
            rc = -9
        self.procs = {k: p for k, p in self.procs.items() if p is not proc}
        return rc

