"""Drive a real RocketMQ cluster through a scenario and record what happened (SPEC §12), as `testbed.record` does
for Kafka; the recording has the same shape (`testbed.observe.Recording`), so comparison, trace writing and
publishing are shared.

One cluster serves every policy of a run: each policy gets its own topic (groups × queues_per_group queues,
created on every member of every group) and its own `DefaultMQProducer` (send timeout, retries, route poll,
ordered sends) in the client harness (`harness/ReplabHarness.java`), all in one MQClientInstance, so one route
poll schedule stands for the run: the trace's `route_poll_phase_us`.

What is recorded:
- produce events as sent (the harness's instant before the first producer's send, µs from the run's start);
- faults at the signal (crash = SIGKILL, shutdown = SIGTERM); `restart` when the NameServer's route lists the
  broker again (it registered); the election that follows a leader's loss, from the NameServer's route polled
  every 50 ms (the instant the successor registered as master), kept in comparison.json;
- `replicate` events, DLedger: from each node's DLedger ledger end index, read from its entry index file every
  SAMPLE_MS (32-byte entries: magic, pos, size, index, term). The file is what DLedger itself appends to before it
  acknowledges anything, so a node at ledger end index L holds entries 0..L exactly; a message's entry is found
  from its commit log offset (the send result's offset message id, or the verifying consumer's read), which lies
  inside its entry's [pos, pos + size). upto_us is the earliest send instant among the entries above L, − 1 µs;
- `replicate` events, master/slave: from each slave's acknowledged commit log offset, read every 50 ms through the
  admin API (GET_BROKER_HA_STATUS): the master's HAConnection.slaveAckOffset for the slave, and the slave's own
  commit log max offset (what it reports as that ack right after each append, DefaultHAClient), the larger of the
  two. The ack offset is the very number a SYNC_MASTER waits on before it answers (GroupTransferService compares
  it with the message's end), and a slave at offset O holds every byte below O, so a message is on the slave
  exactly when it ends at or below O (its end is the next message's commit log offset in the group, from the send
  results and the verifying consumer's read). upto_us is the earliest send instant among the messages past O, − 1 µs;
- per policy and message: the send result (SendStatus, or the exception and response code, the queue, the
  broker) and whether the verifying consumer read it after every fault healed (fate).
"""

from __future__ import annotations

import bisect
import json
import logging
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replay.policies import DLedgerPolicy, RocketMQControllerPolicy, RocketMQPolicy
from schemas.errors import BadInput
from schemas.trace import Kind
from testbed.cluster import broker_name
from testbed.jars import TestbedUnavailable
from testbed.observe import Delivery, Recording, Sample, Transition, now_us
from testbed.record import inject
from testbed.rocketmq.cluster import Group, MasterSlave, RocketMQCluster
from testbed.schedule import Schedule, topic_of

log = logging.getLogger(__name__)

SAMPLE_MS = 50
INDEX_ENTRY = struct.Struct(">iqiqq")  # DLedgerMmapFileStore: magic, pos, size, index, term (32 bytes)
#: How long the harness may take to start, find every route and report ready (JVM start on a loaded machine).
READY_S = 180.0
#: Sends before the clock starts (msg id -1, skipped by the verifying consumer's reading), at the schedule's mean
#: rate until the cluster answers every send within a second for 3 s (the harness's WARM_* constants): at least
#: WARMUP_MS, at most WARMUP_MAX_MS. A just-started 5-node DLedger group on two cores timed out the first ~15 s
#: of the seed layout's sends after three seconds of warm-up.
WARMUP_MS = 3000
WARMUP_MAX_MS = 90_000
#: SendStatus values that fail a send (SPEC §3.7 R-2), with replab's error labels.
FAILED_STATUS = {"FLUSH_DISK_TIMEOUT": "flush_disk_timeout", "FLUSH_SLAVE_TIMEOUT": "flush_slave_timeout",
                 "SLAVE_NOT_AVAILABLE": "slave_not_available"}
#: org.apache.rocketmq.remoting.protocol.ResponseCode.IN_SYNC_REPLICAS_NOT_ENOUGH
IN_SYNC_REPLICAS_NOT_ENOUGH = 218
#: org.apache.rocketmq.client.common.ClientErrorCode.ACCESS_BROKER_TIMEOUT: the last attempt used up the send timeout
ACCESS_BROKER_TIMEOUT = 10002


def error_label(send: dict[str, Any]) -> str:
    """replab's error label (SPEC §4.1) for a send that ended with an exception: the send timeout (sendMsgTimeout,
    replab's delivery_timeout_ms) ran out, a majority did not answer, or no reachable master took it."""
    if send.get("code") == IN_SYNC_REPLICAS_NOT_ENOUGH:
        return "in_sync_replicas_not_enough"
    if send.get("code") == ACCESS_BROKER_TIMEOUT or "timeout" in (send.get("message") or "").lower():
        return "delivery_timeout"
    return "no_route"  # no route, connection refused, not master: no reachable master for the message's group


@dataclass
class LedgerEnd:
    ts_us: int
    broker: int
    end_index: int  # -1: nothing appended yet


@dataclass
class RocketMQRecording(Recording):
    """A Kafka `Recording` plus what only RocketMQ has: ledger ends, entry positions, the clients' and the
    NameServer's routes."""

    groups: list[Group] = field(default_factory=list)
    queues_per_group: int = 0
    ledger: list[LedgerEnd] = field(default_factory=list)
    entries: dict[int, dict[int, tuple[int, int]]] = field(default_factory=dict)  # broker -> index -> (pos, size)
    clo: dict[int, int] = field(default_factory=dict)  # msg_id -> commit log offset (any policy's copy)
    clo_ids: dict[tuple[str, int], int] = field(default_factory=dict)  # (group, commit log offset) -> msg_id
    store_us: dict[int, int] = field(default_factory=dict)  # msg_id -> the broker's store timestamp (ms), in µs
    client_start_us: int = 0
    route_requests: list[dict[str, Any]] = field(default_factory=list)
    client_routes: list[dict[str, Any]] = field(default_factory=list)
    ns_routes: list[dict[str, Any]] = field(default_factory=list)
    route_refresh_ms: int = 30000
    elections: list[dict[str, Any]] = field(default_factory=list)
    master_slave: bool = False  # classic master/slave or controller mode: progress from the HA state
    controller: bool = False
    #: master/slave: the harness's raw HA lines, from which `slave_acks` derives each slave's acknowledged offset
    ha: list[dict[str, Any]] = field(default_factory=list)
    broker_of_ip: dict[str, int] = field(default_factory=dict)  # the HA lines name brokers by IP: trace broker
    #: the harness's warm-up: sends answered in time, failed or slow, its length, and whether the cluster settled
    warm: dict[str, Any] | None = None

    @property
    def route_poll_phase_us(self) -> int:
        """When the client's scheduled route polls fall, modulo the poll interval, µs from the run's start: the
        polls the harness saw (MQClientInstance schedules the first 10 ms after start, then every interval)."""
        period = self.route_refresh_ms * 1000
        polls = [r["t"] for r in self.route_requests if r["thread"].startswith("MQClientFactoryScheduledThread")]
        first = polls[0] if polls else self.client_start_us + 10_000
        return first % period


class IndexSampler(threading.Thread):
    """Every node's DLedger ledger end index every SAMPLE_MS, read from its entry index file (module docstring)."""

    def __init__(self, cluster: RocketMQCluster, rec: RocketMQRecording, node_of: dict[int, int],
                 state: dict[int, str], stop: threading.Event) -> None:
        super().__init__(daemon=True, name="testbed-rmq-index")
        self.cluster, self.rec, self.node_of, self.state, self.stop_event = cluster, rec, node_of, state, stop
        self.end: dict[int, int] = {b: -1 for b in node_of}

    def run(self) -> None:
        while not self.stop_event.is_set():
            start = time.monotonic()
            self.sample_all()
            self.stop_event.wait(max(0.0, SAMPLE_MS / 1000 - (time.monotonic() - start)))

    def sample_all(self) -> list[LedgerEnd]:
        out = []
        for b in self.node_of:
            if self.state.get(b) == "down":
                continue
            end = self.read(b)
            if end is not None:
                s = LedgerEnd(now_us() - self.rec.t0_us, b, end)
                self.rec.ledger.append(s)
                out.append(s)
        return out

    def read(self, b: int) -> int | None:
        """The ledger end index: the last entry of the contiguous run of entries from index 0 (scanning on from
        the last end read, back to the start if that entry is gone)."""
        path = self.cluster.index_file(self.node_of[b])
        entries = self.rec.entries.setdefault(b, {})
        try:
            with open(path, "rb") as f:
                end = self.end[b]
                if end >= 0:
                    f.seek(end * INDEX_ENTRY.size)
                    head = f.read(INDEX_ENTRY.size)
                    if len(head) < INDEX_ENTRY.size or INDEX_ENTRY.unpack(head)[0] == 0:
                        end = -1  # truncated
                f.seek((end + 1) * INDEX_ENTRY.size)
                while True:
                    chunk = f.read(INDEX_ENTRY.size * 4096)
                    n = 0
                    for magic, pos, size, index, _term in INDEX_ENTRY.iter_unpack(chunk[:len(chunk) // 32 * 32]):
                        if magic == 0:
                            break
                        entries[index] = (pos, size)
                        n += 1
                    end += n
                    if n < 4096:
                        break
        except OSError:
            return None
        self.end[b] = end
        return end


def _read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line cut short by a killed harness
    return out


def _wait_line(path: Path, proc, ev: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for d in _read_lines(path):
            if d.get("ev") == ev:
                return d
        if proc.poll() is not None:
            raise TestbedUnavailable(f"the RocketMQ client harness exited ({proc.returncode}) before '{ev}' "
                                     f"(log: {path.parent})")
        time.sleep(0.2)
    raise TestbedUnavailable(f"the RocketMQ client harness did not report '{ev}' in {timeout_s:.0f} s")


def _shape(p: DLedgerPolicy | RocketMQPolicy | RocketMQControllerPolicy,
           n_brokers: int) -> tuple[int, int | None, int, int, str, MasterSlave | None]:
    """What the policies of one run must agree on, the cluster they share (SPEC §3.3-3.5 layouts): group size,
    groups (None: as many as fit), queues per group, route poll, flush, and the masters' settings (None: DLedger)."""
    if isinstance(p, DLedgerPolicy):
        return p.group_size, None, p.queues_per_group, p.route_refresh_ms, p.flush.value, None
    size = 1 + p.slaves_per_master
    if isinstance(p, RocketMQControllerPolicy):
        ms = MasterSlave("SYNC_MASTER", p.in_sync_replicas, p.slave_timeout_ms, controller=True,
                         all_ack_in_sync_state_set=p.all_ack_in_sync_state_set,
                         min_insync_replicas=p.min_insync_replicas,
                         ha_max_time_slave_not_catchup_ms=p.ha_max_time_slave_not_catchup_ms,
                         controller_heartbeat_timeout_ms=p.controller_heartbeat_timeout_ms,
                         enable_elect_unclean_master=p.enable_elect_unclean_master)
    else:
        ms = MasterSlave(p.broker_role.value, p.in_sync_replicas, p.slave_timeout_ms)
    return size, p.groups, p.queues_per_group, p.route_refresh_ms, p.flush.value, ms


def groups_of(policies: list, n_brokers: int) -> tuple[list[Group], int, int, MasterSlave | None]:
    """The broker groups the policies lay out (SPEC §3.3 master/slave, §3.4 DLedger, §3.5 controller mode), their
    queues per group, route poll and (master/slave, controller mode) the masters' settings; policies of one run
    share the cluster, so they must agree on all of it."""
    for i, p in enumerate(policies):
        if not isinstance(p, DLedgerPolicy | RocketMQPolicy | RocketMQControllerPolicy):
            raise BadInput(f"--policy #{i + 1} ({p.canonical()}): the RocketMQ testbed runs dledger, rocketmq and "
                           f"rocketmq-controller policies", rule="testbed-policy")
    shapes = {_shape(p, n_brokers) for p in policies}
    if len(shapes) > 1:
        raise BadInput("the policies of one testbed run share one cluster and one client: they must agree on "
                       "the family, the layout (group_size, or slaves_per_master and groups), the brokers' "
                       "settings (broker_role, in_sync_replicas, slave_timeout_ms, the controller's), "
                       "queues_per_group, route_refresh_ms and flush; run them separately", rule="testbed-policy")
    size, n_groups, qpg, refresh, _, ms = shapes.pop()
    n_groups = n_brokers // size if n_groups is None else n_groups
    if n_groups < 1 or n_groups * size > n_brokers:
        raise BadInput(f"{n_groups} group(s) of {size} > {n_brokers} brokers", rule="testbed-policy")
    groups = [Group(f"g{g}", tuple(range(g * size, (g + 1) * size))) for g in range(n_groups)]
    return groups, qpg, refresh, ms


def run_cluster(schedule: Schedule, policies: list[DLedgerPolicy], workdir: Path, tag: str, *,
                progress=print) -> RocketMQRecording:
    from testbed.rocketmq.jars import ensure_jars

    groups, qpg, refresh, ms = groups_of(policies, len(schedule.brokers))
    jars = ensure_jars(log=progress)
    t = time.monotonic()
    sync = policies[0].flush.value == "sync"
    with RocketMQCluster(jars, groups, workdir, tag, flush_sync=sync, master_slave=ms) as cluster:
        rec = RocketMQRecording(schedule, policies, 0, groups=groups, queues_per_group=qpg, route_refresh_ms=refresh,
                                master_slave=ms is not None, controller=ms is not None and ms.controller)
        rec.tag = tag
        try:
            record(cluster, rec, policies, progress=progress, t_start=t)
        finally:
            rec.pgids = list(cluster.started_pgids)
    rec.wall_s["cluster_total"] = time.monotonic() - t
    return rec


def record(cluster: RocketMQCluster, rec: RocketMQRecording, policies: list[DLedgerPolicy], *, progress,
           t_start: float) -> None:
    schedule, work = rec.schedule, cluster.workdir
    topics = [topic_of(i) for i in range(len(policies))]
    n_queues = len(rec.groups) * rec.queues_per_group
    # A classic slave takes its topics from its master (SlaveSynchronize); DLedger replicates none, and a
    # controller-mode group's master is elected later: every member.
    brokers = ",".join(cluster.broker_addr(b) for b in cluster.brokers
                       if not rec.master_slave or rec.controller or cluster.is_master(b))
    deadline = time.monotonic() + READY_S
    while True:  # the brokers take their time to listen: create the topics until every member took them
        proc = cluster.harness("topics", "--brokers", brokers,
                               *[a for tp in topics for a in ("--topic", f"{tp}:{rec.queues_per_group}")],
                               out=work / "topics.jsonl")
        if cluster.reap(proc, 60) == 0:
            break
        cluster.check_alive()
        if time.monotonic() > deadline:
            raise TestbedUnavailable(f"could not create the topics on every broker in {READY_S:.0f} s ({work})")
        time.sleep(2)

    sched = work / "schedule.txt"
    keys = schedule.produce["key"].to_pylist()
    with open(sched, "w") as f:
        for ts, mid, size, key in zip(schedule.produce["ts_us"].to_pylist(), schedule.produce["msg_id"].to_pylist(),
                                      schedule.produce["size_bytes"].to_pylist(), keys, strict=True):
            f.write(f"{ts} {mid} {size} {key or ''}\n")
    spec = [f"{tp}:{p.delivery_timeout_ms}:{p.retry_times_when_send_failed}:{p.route_refresh_ms}:"
            f"{str(getattr(p, 'ordered', False)).lower()}" for tp, p in zip(topics, policies, strict=True)]
    out = work / "client.jsonl"
    producer = cluster.harness("produce", "--schedule", str(sched), "--duration-us", str(schedule.duration_us),
                               "--queues", str(n_queues), "--warmup-ms", str(WARMUP_MS),
                               "--warmup-max-ms", str(WARMUP_MAX_MS),
                               *[a for s in spec for a in ("--producer", s)],
                               *(("--ha", ",".join(cluster.broker_addr(b) for b in cluster.brokers))
                                 if rec.master_slave else ()),
                               out=out, stdin=True)
    try:
        ready = _wait_line(out, producer, "ready", READY_S + WARMUP_MAX_MS / 1000)
        rec.warm = {k: ready.get(k) for k in ("warmed", "warm_failed", "warm_ms", "settled")}
        progress(f"client warm-up: {ready.get('warm_ms', 0) / 1000:.1f} s, {ready.get('warmed')} sends answered within "
                 f"a second, {ready.get('warm_failed')} failed"
                 + ("" if ready.get("settled") else " (did not settle: the run starts on a cluster still slow)"))
        _wait_masters(cluster, out, producer, READY_S)
        if rec.master_slave:
            _wait_slaves(cluster, out, producer, READY_S)
        node_of = _label_leaders(cluster, rec, out)
        rec.wall_s["cluster_start"] = time.monotonic() - t_start
        ms = cluster.master_slave
        kind = "DLedger" if ms is None else "controller-mode" if ms.controller else ms.broker_role
        progress(f"RocketMQ {cluster.jars.version}: NameServer + {len(cluster.brokers)} {kind} brokers ready in "
                 f"{rec.wall_s['cluster_start']:.1f} s (masters: "
                 f"{', '.join(f'{g.name}=node {node_of[g.members[0]]}' for g in rec.groups)})")
        _drive(cluster, rec, producer, node_of, progress)
    finally:
        if producer.poll() is None:
            cluster.reap(producer, 1)
    _parse_client(cluster, rec, out, node_of)

    progress("restarting every broker, then reading every queue back")
    for b in cluster.brokers:
        if not cluster.is_up(b):
            cluster.restart(b)
    _wait_all_registered(cluster, topics, READY_S)
    reads = work / "read.jsonl"
    rc = cluster.reap(cluster.harness("read", *[a for tp in topics for a in ("--topic", tp)], out=reads), 180)
    if rc != 0:
        log.warning("the verifying consumer exited with %d: some queue was not read to its end", rc)
    _parse_reads(rec, reads, topics)


def _wait_masters(cluster: RocketMQCluster, out: Path, proc, timeout_s: float) -> None:
    """Until the NameServer lists a master (brokerId 0) for every group."""
    deadline = time.monotonic() + timeout_s
    names = {g.name for g in cluster.groups}
    while time.monotonic() < deadline:
        routes = [d for d in _read_lines(out) if d.get("ev") == "ns_route"]
        if routes and all("0" in routes[-1]["route"].get(n, {}) for n in names):
            return
        if proc.poll() is not None:
            raise TestbedUnavailable("the RocketMQ client harness exited while waiting for the groups' masters")
        cluster.check_alive()
        time.sleep(0.3)
    raise TestbedUnavailable(f"no master elected in every DLedger group after {timeout_s:.0f} s")


def _wait_slaves(cluster: RocketMQCluster, out: Path, proc, timeout_s: float) -> None:
    """Until every group's master has an HA connection from each of its slaves. A slave learns its master's address
    from its own registration with the NameServer (at start, then every 30 s), so a slave that registered before
    its master connects only at its next registration: a SYNC_MASTER answers FLUSH_SLAVE_TIMEOUT until then."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        last: dict[str, dict[str, Any]] = {}
        for d in _read_lines(out):
            if d.get("ev") == "ha":
                last[d["addr"]] = d
        if all(any(last.get(cluster.broker_addr(b), {}).get("master")
                   and len(last[cluster.broker_addr(b)].get("acks", {})) >= len(g.members) - 1 for b in g.members)
               for g in cluster.groups):
            return
        if proc.poll() is not None:
            raise TestbedUnavailable("the RocketMQ client harness exited while waiting for the slaves to connect")
        cluster.check_alive()
        time.sleep(0.3)
    raise TestbedUnavailable(f"not every slave connected to its master after {timeout_s:.0f} s")


def _label_leaders(cluster: RocketMQCluster, rec: RocketMQRecording, out: Path) -> dict[int, int]:
    """Trace broker id -> cluster node. DLedger elects whichever member it elects first; SPEC §3.4 has the group's
    first broker lead at time 0, so the trace calls the elected node that broker and the others the rest, in
    order (a preferred leader would instead take its leadership back when it returns, which the model has not)."""
    route = [d for d in _read_lines(out) if d.get("ev") == "ns_route"][-1]["route"]
    node_of = {}
    for g in rec.groups:
        leader = cluster.broker_of_addr(route[g.name]["0"])
        rest = [m for m in g.members if m != leader]
        node_of.update(dict(zip(g.members, [leader, *rest], strict=True)))
    return node_of


def _drive(cluster: RocketMQCluster, rec: RocketMQRecording, producer, node_of: dict[int, int], progress) -> None:
    schedule = rec.schedule
    state = {b: "up" for b in node_of}
    stop = threading.Event()
    sampler = IndexSampler(cluster, rec, node_of, state, stop)
    by_trace_id = ByTraceId(cluster, node_of)
    rec.t0_us = now_us() + 300_000
    assert producer.stdin is not None
    producer.stdin.write(f"{rec.t0_us}\n")
    producer.stdin.flush()
    if not rec.master_slave:  # master/slave progress comes from the harness's HA lines
        sampler.start()
    start = time.monotonic()
    try:
        for f_ts, kind, b in schedule.faults:
            _sleep_until(rec.t0_us + f_ts)
            if kind in (Kind.CRASH, Kind.SHUTDOWN, Kind.ISOLATE) and not rec.master_slave:
                sampler.sample_all()  # every follower's position right before the fault
            # The signal's instant, taken before it is sent: reaping a killed JVM takes a while on a loaded
            # machine, and the NameServer drops a SIGKILLed master within milliseconds. An isolation holds only
            # once its blackhole routes are in place (tens of ms): its instant is taken after them, as Kafka's
            # testbed takes every fault's, else a commit made before the cut counts as the successor's.
            signal_us = now_us() - rec.t0_us
            inject(by_trace_id, kind, b, state)
            if kind is Kind.ISOLATE:
                signal_us = now_us() - rec.t0_us
            rec.faults.append((signal_us, kind, b))
            if kind is Kind.RESTART:
                rec.transitions.append(Transition(len(rec.faults) - 1, kind, b, rec.faults[-1][0]))
            progress(f"{kind.label} broker {b} (node {node_of[b]}) at {f_ts / 1e6:.1f} s")
        _sleep_until(rec.t0_us + schedule.duration_us)
        longest = max(p.delivery_timeout_ms for p in rec.policies)
        if cluster.reap(producer, longest / 1000 + 30) != 0:
            log.warning("the client harness did not end cleanly (see %s)", cluster.workdir)
    finally:
        stop.set()
        cluster.restore_priorities()
        if sampler.is_alive():
            sampler.join(timeout=5)
    rec.wall_s["trace"] = time.monotonic() - start


@dataclass
class ByTraceId:
    """The cluster's faults addressed by trace broker id (`_label_leaders`), for the shared `testbed.record.inject`."""

    cluster: RocketMQCluster
    node_of: dict[int, int]

    def crash(self, b: int) -> None:
        self.cluster.crash(self.node_of[b])

    def shutdown_begin(self, b: int) -> None:
        self.cluster.shutdown(self.node_of[b])

    def restart(self, b: int) -> None:
        self.cluster.restart_low_priority(self.node_of[b])

    def isolate(self, b: int) -> None:
        self.cluster.isolate(self.node_of[b])

    def heal(self, b: int) -> None:
        self.cluster.heal(self.node_of[b])


def _sleep_until(target_us: int) -> None:
    while (left := target_us - now_us()) > 0:
        time.sleep(min(left / 1e6, 0.05))


def _queue_index(rec: RocketMQRecording, group: str, queue: int) -> int:
    g = next(i for i, gr in enumerate(rec.groups) if gr.name == group)
    return g * rec.queues_per_group + queue


def _parse_client(cluster: RocketMQCluster, rec: RocketMQRecording, out: Path, node_of: dict[int, int]) -> None:
    from replay.local import msg_rank

    trace_of = {n: b for b, n in node_of.items()}
    lines = _read_lines(out)
    n_queues = len(rec.groups) * rec.queues_per_group
    ids = rec.schedule.produce["msg_id"].to_numpy()
    default_queue = dict(zip(ids.tolist(), (msg_rank(ids) % n_queues).tolist(), strict=True))
    rec.deliveries = [{} for _ in rec.policies]
    rec.partition = [dict(default_queue) for _ in rec.policies]
    rec.warmup = [0 for _ in rec.policies]
    t0 = rec.t0_us
    for d in lines:
        ev = d.get("ev")
        if ev == "send":
            i, mid = d["p"], d["id"]
            if i == 0 or mid not in rec.sent_us:
                rec.sent_us[mid] = min(rec.sent_us.get(mid, d["sent"] - t0), d["sent"] - t0)
            if "status" in d:
                rec.partition[i][mid] = _queue_index(rec, d["broker"], d["queue"])
                error = FAILED_STATUS.get(d["status"])
                rec.deliveries[i][mid] = Delivery(d["done"] - t0, error, d["offset"], None)
                if d.get("clo", -1) >= 0:
                    rec.clo[mid] = d["clo"]
                    rec.clo_ids[(d["broker"], d["clo"])] = mid
            elif "error" in d:
                rec.deliveries[i][mid] = Delivery(d["done"] - t0, error_label(d), None, None)
            # else: sent and still unanswered when the harness stopped (pending)
        elif ev == "client_start":
            rec.client_start_us = d["t"] - t0
        elif ev == "route_request":
            rec.route_requests.append({**d, "t": d["t"] - t0})
        elif ev == "client_route":
            rec.client_routes.append({**d, "t": d["t"] - t0})
        elif ev == "ns_route":
            route = {g: {i: trace_of.get(cluster.broker_of_addr(a), -1) for i, a in ids_.items()}
                     for g, ids_ in d["route"].items()}
            rec.ns_routes.append({"t": d["t"] - t0, "route": route})
        elif ev == "ha":
            rec.ha.append({**d, "t": d["t"] - t0})
    if rec.master_slave:
        rec.broker_of_ip = {cluster.address(broker_name(n)): trace_of.get(n, n) for n in cluster.brokers}
    rec.elections = elections(rec)
    for tr in rec.transitions:  # a restarted broker is back when the NameServer lists it again (registered)
        tr.listed_us = next((r["t"] for r in rec.ns_routes if r["t"] >= tr.signal_us
                             and any(tr.broker in ids.values() for ids in r["route"].values())), None)
        if tr.listed_us is None:
            # Not listed again before the trace ended (a DLedger broker's restart, its commit log recovery, took
            # 40 s on a loaded machine): past the end, so the trace keeps the broker down to its end.
            tr.listed_us = rec.schedule.duration_us + 1


def slave_acks(rec: RocketMQRecording) -> list[LedgerEnd]:
    """Each slave's acknowledged offset over time (module docstring), from the harness's HA lines: at every line,
    the larger of the last ack its master reported for it and its own last max offset."""
    def broker(addr: str) -> int | None:
        return rec.broker_of_ip.get(addr.lstrip("/").rsplit(":", 1)[0])

    master_ack: dict[int, int] = {}
    own: dict[int, int] = {}
    out = []
    for d in sorted(rec.ha, key=lambda d: d["t"]):
        b = broker(d["addr"])
        if b is None:
            continue
        changed = []
        if d.get("master"):
            out.append(LedgerEnd(d["t"], b, d.get("max", -1)))  # for `fill_samples`
            for addr, ack in d.get("acks", {}).items():
                s = broker(addr)
                # -1: a connection whose slave has not reported yet (handshake); the master knows nothing of it
                # (AutoSwitchHAService.maybeExpandInSyncStateSet waits for the report), so it is no progress
                if s is not None and ack >= 0 and master_ack.get(s) != ack:
                    master_ack[s] = ack
                    changed.append(s)
        elif "max" in d:
            own[b] = d["max"]
            changed.append(b)
        for s in changed:
            out.append(LedgerEnd(d["t"], s, max(master_ack.get(s, -1), own.get(s, -1))))
    return out


def elections(rec: RocketMQRecording) -> list[dict[str, Any]]:
    """Each crash, shutdown or isolation of a group's master with the instant its successor registered as master
    (the NameServer's route, polled every 50 ms) and the instant the dead master left the route."""
    out = []
    for t, kind, b in rec.faults:
        if kind not in (Kind.CRASH, Kind.SHUTDOWN, Kind.ISOLATE):
            continue
        group = next((g.name for g in rec.groups if b in g.members), None)
        before = [r for r in rec.ns_routes if r["t"] <= t]
        if group is None or not before or before[-1]["route"].get(group, {}).get("0") != b:
            continue
        after = [r for r in rec.ns_routes if r["t"] > t]
        dropped = next((r["t"] for r in after if r["route"].get(group, {}).get("0") != b), None)
        new = next((r for r in after if r["route"].get(group, {}).get("0") not in (None, b)), None)
        out.append({"kind": kind.label, "broker": b, "group": group, "fault_us": t, "master_dropped_us": dropped,
                    "new_master": None if new is None else new["route"][group]["0"],
                    "new_master_registered_us": None if new is None else new["t"],
                    "election_ms": None if new is None else (new["t"] - t) / 1000})
    return out


def _wait_all_registered(cluster: RocketMQCluster, topics: list[str], timeout_s: float) -> None:
    """After the trace, every broker restarted: each group with a master before the verifying consumer reads."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        cluster.check_alive()
        probe = cluster.workdir / "probe.jsonl"
        proc = cluster.harness("route", "--topic", topics[0], out=probe)
        cluster.reap(proc, 30)
        routes = [d for d in _read_lines(probe) if d.get("ev") == "ns_route"]
        if routes and all("0" in routes[-1]["route"].get(g.name, {}) for g in cluster.groups):
            return  # the consumer reads each group from its master
        time.sleep(1)
    log.warning("not every broker registered again %.0f s after the trace; reading what is there", timeout_s)


def _parse_reads(rec: RocketMQRecording, path: Path, topics: list[str]) -> None:
    rec.reads = [{} for _ in topics]
    index = {tp: i for i, tp in enumerate(topics)}
    for d in _read_lines(path):
        if d.get("ev") != "read" or d.get("id") is None or d["id"] < 0:
            continue
        i = index[d["topic"]]
        q = _queue_index(rec, d["broker"], d["queue"])
        rec.reads[i].setdefault(d["id"], (q, d["offset"], d["store_ms"]))
        rec.clo_ids.setdefault((d["broker"], d["clo"]), d["id"])
        rec.store_us.setdefault(d["id"], d["store_ms"] * 1000 - rec.t0_us)


# ------------------------------------------------------------------------------------------------ the trace
def replicate_events(rec: RocketMQRecording) -> list[tuple[int, int, int]]:
    return _slave_events(rec) if rec.master_slave else _ledger_events(rec)


def _slave_events(rec: RocketMQRecording) -> list[tuple[int, int, int]]:
    """(ts_us, slave, upto_us) from the slaves' acknowledged offsets (module docstring)."""
    from testbed.trace_writer import away_at

    away = away_at(rec.state_faults())
    sizes = dict(zip(rec.schedule.produce["msg_id"].to_pylist(), rec.schedule.produce["size_bytes"].to_pylist(),
                     strict=True))
    by_group: dict[str, tuple[list[int], list[int]]] = {}
    for g in rec.groups:
        offsets = sorted((clo, mid) for (grp, clo), mid in rec.clo_ids.items() if grp == g.name)
        # A message ends where the group's next one starts; the last one's stored size is its body plus the
        # headers and properties (under 300 bytes here).
        ends = [offsets[k + 1][0] if k + 1 < len(offsets) else clo + sizes.get(mid, 0) + 300
                for k, (clo, mid) in enumerate(offsets)]
        suffix = [1 << 62] * (len(offsets) + 1)
        for k in range(len(offsets) - 1, -1, -1):
            mid = offsets[k][1]
            suffix[k] = min(suffix[k + 1], _instant(rec, mid) if mid in rec.sent_us else 1 << 62)
        by_group[g.name] = (ends, suffix)
    out: list[tuple[int, int, int]] = []
    last: dict[int, int] = {}
    acked = slave_acks(rec)  # from the raw HA lines, so that a recorded run is read by the current rules
    dated = _dated_at_master_loss(rec, acked, away)
    for ts, s in sorted([*((s.ts_us, s) for s in acked), *dated], key=lambda e: e[0]):
        if ts < 0 or s.end_index < 0 or away(s.broker, ts):
            continue
        g = next(gr for gr in rec.groups if s.broker in gr.members)
        if g.members[0] == s.broker and not rec.controller:
            continue  # a classic master never follows; a controller-mode group's trace broker 0 may
        ends, suffix = by_group[g.name]
        k = bisect.bisect_right(ends, s.end_index)
        upto = ts if suffix[k] >= 1 << 62 else min(ts, suffix[k] - 1)
        upto = max(0, upto, last.get(s.broker, 0))
        last[s.broker] = upto
        out.append((ts, s.broker, upto))
    return out


#: Faults after which a master sends its slaves nothing more: a killed process, a cut network.
_MASTER_SILENT = (Kind.CRASH, Kind.POWER_LOSS, Kind.ISOLATE)


def _dated_at_master_loss(rec: RocketMQRecording, acked: list[LedgerEnd], away) -> list[tuple[int, LedgerEnd]]:
    """Each surviving slave's first sample after its master crashed or was cut off, dated 1 µs before that fault.

    From the fault until a master registers again the slave receives nothing (HAClient reads only from its
    master), so what that sample shows is what the slave held when its master went: sampled every SAMPLE_MS, the
    last sample before the fault can trail it by a whole period, and the messages acknowledged in that period
    would read as lost under the successor (SPEC §3.5 rule 3: it holds what it had replicated)."""
    out: list[tuple[int, LedgerEnd]] = []
    for t, kind, b in rec.state_faults():
        if kind not in _MASTER_SILENT:
            continue
        for g in rec.groups:
            if b not in g.members or _master_at(rec, g.name, t) != b:
                continue
            back = next((r["t"] for r in rec.ns_routes if r["t"] > t
                         and _master_at(rec, g.name, r["t"]) not in (None, b)), 1 << 62)
            for slave in g.members:
                first = min((s for s in acked if s.broker == slave and t < s.ts_us < back
                             and s.end_index >= 0 and not away(slave, s.ts_us)),
                            key=lambda s: s.ts_us, default=None)
                if first is not None and slave != b:
                    out.append((t - 1, first))
    return out


def _ledger_events(rec: RocketMQRecording) -> list[tuple[int, int, int]]:
    """(ts_us, broker, upto_us) from the ledger ends (module docstring), for every member that is up and not cut
    off, the real master included: after a crash the model elects by SPEC §3.4 rule 3 (longest log, ties in group
    order), which need not be the member DLedger's vote chose, and the model's follower is then the real master,
    whose ledger end holds every entry (upto_us = the sample instant). The model ignores the report of the member
    it has leading (SPEC §2.2)."""
    from testbed.trace_writer import away_at

    away = away_at(rec.state_faults())
    out: list[tuple[int, int, int]] = []
    by_group: dict[str, tuple[list[int], list[int], list[int]]] = {}
    for g in rec.groups:
        # Every entry any member recorded: index -> pos; the messages inside by commit log offset.
        pos: dict[int, tuple[int, int]] = {}
        for b in g.members:
            pos.update(rec.entries.get(b, {}))
        offsets = sorted((clo, mid) for (grp, clo), mid in rec.clo_ids.items() if grp == g.name)
        keys = [c for c, _ in offsets]
        idx = sorted(pos)
        instants = []
        for i in idx:
            p, size = pos[i]
            lo, hi = bisect.bisect_left(keys, p), bisect.bisect_left(keys, p + size)
            sent = [_instant(rec, offsets[k][1]) for k in range(lo, hi) if offsets[k][1] in rec.sent_us]
            instants.append(min(sent) if sent else None)
        # suffix minimum: the earliest send instant among entries from each index on
        suffix: list[int] = [0] * len(idx)
        best = 1 << 62
        for k in range(len(idx) - 1, -1, -1):
            if instants[k] is not None:
                best = min(best, instants[k])
            suffix[k] = best
        by_group[g.name] = (idx, suffix, list(g.members))
    last: dict[int, int] = {}
    for s in sorted(rec.ledger, key=lambda s: s.ts_us):
        if s.ts_us < 0:
            continue  # read while the clock was being started
        if away(s.broker, s.ts_us):
            continue
        g = next(gr for gr in rec.groups if s.broker in gr.members)
        idx, suffix, _ = by_group[g.name]
        k = bisect.bisect_right(idx, s.end_index)
        upto = s.ts_us if k >= len(idx) or suffix[k] >= 1 << 62 else min(s.ts_us, suffix[k] - 1)
        upto = max(0, upto, last.get(s.broker, 0))
        last[s.broker] = upto
        out.append((s.ts_us, s.broker, upto))
    return out


def _instant(rec: RocketMQRecording, mid: int) -> int:
    """A message's instant for upto_us: its send, unless it reached the broker more than HELD_BACK_US later (its
    store timestamp says when: the client's pool or the broker's queue held it), then that arrival − HELD_BACK_US
    (as `testbed.trace_writer` does for Kafka's LogAppendTime)."""
    from testbed.trace_writer import HELD_BACK_US

    stored = rec.store_us.get(mid)
    return rec.sent_us[mid] if stored is None else max(rec.sent_us[mid], stored - HELD_BACK_US)


def _master_at(rec: RocketMQRecording, group: str, ts_us: int) -> int | None:
    before = [r for r in rec.ns_routes if r["t"] <= ts_us]
    if not before:
        return None
    m = before[-1]["route"].get(group, {}).get("0")
    return m if m is not None and m >= 0 else None


def fill_samples(rec: RocketMQRecording, policies: int) -> None:
    """`Sample`s for the shared failover measure (`testbed.compare.failover_ms`): which queues each broker led."""
    for s in [*rec.ledger, *(slave_acks(rec) if rec.master_slave else [])]:
        leads = set()
        for gi, g in enumerate(rec.groups):
            if _master_at(rec, g.name, s.ts_us) == s.broker:
                leads = {(topic_of(i), gi * rec.queues_per_group + q) for i in range(policies)
                         for q in range(rec.queues_per_group)}
        rec.samples.append(Sample(s.ts_us, s.broker, {}, leads))

