"""Drive a real Kafka cluster through a scenario and record what happened (SPEC §12).

One cluster serves every policy of a run: each policy gets its own topic (its partitions, replication factor,
min ISR, unclean election, LogAppendTime timestamps) and its own confluent-kafka producer (its acks, timeouts,
retry backoff, idempotence), and every producer sends every produce event of the scenario at its time. The
faults hit all topics at once, so one recorded trace (`DIR/trace/`) stands for all policies; policies that
need different broker-level settings (replica.lag.time.max.ms, the session timeout, ELR) need separate runs.

The recorder's parts: `testbed.schedule` (what to do), `testbed.clients` (producers, the verifying consumer),
`testbed.observe` (samplers and watchers, the recording), `testbed.trace_writer` (DIR/trace/).

Messages go to the partition SPEC §3.2 rule 1 gives (the real producer is told the partition): the trace
carries no partition, and the real default partitioner (CRC32 for keys, sticky batches without) would make the
two sides disagree for reasons that have nothing to do with replication.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from pathlib import Path

from replay.policies import KafkaPolicy
from schemas.errors import BadInput
from schemas.trace import Kind, Manifest
from testbed.clients import (
    ResilientProducer,
    close_debug_log,
    debug_logging,
    idempotent,
    partitions_of,
    payload,
    producer_config,
    read_back,
    warm_up,
)
from testbed.cluster import KafkaCluster, broker_name
from testbed.instruments import CpuMeter, parse_client_stats, resigned_at, thread_ids
from testbed.observe import (
    WATCH_S,
    Delivery,
    Recording,
    Sampler,
    Transition,
    TransitionWatcher,
    now_us,
    settled_reads,
    wait_until,
)
from testbed.schedule import Schedule, broker_settings, topic_of

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------ the run
def record(cluster: KafkaCluster, schedule: Schedule, policies: list[KafkaPolicy], *, client_debug: str | None = None,
           progress=print) -> Recording:
    """Create the topics, drive the producers and the faults, heal, read everything back; with `client_debug`, each
    producer's librdkafka debug log in the cluster's folder (`testbed.clients.debug_logging`)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from replay.families import family_of

    manifest = Manifest(schedule.trace_id, schedule.brokers, schedule.duration_us)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
    rec = Recording(schedule, policies, 0)
    topics = []
    for i, p in enumerate(policies):
        layout = family_of(p).layout(p, manifest)
        replicas = {u: tuple(layout.replicas[u]) for u in layout.units}
        rec.replicas.append(replicas)
        topics.append(NewTopic(topic_of(i), num_partitions=p.partitions,
                               replica_assignment=[list(replicas[u]) for u in sorted(replicas)],
                               config={"min.insync.replicas": str(p.min_insync_replicas),
                                       "unclean.leader.election.enable": str(p.unclean_leader_election).lower(),
                                       "message.timestamp.type": "LogAppendTime"}))
    for topic, fut in admin.create_topics(topics, request_timeout=30).items():
        try:
            fut.result()
        except Exception as exc:
            raise RuntimeError(f"creating topic {topic}: {exc}") from exc
    _wait_leaders(admin, policies, timeout_s=60)

    rec.client_stats = [[] for _ in policies]

    def on_stats(i: int, raw: str) -> None:
        try:
            rec.client_stats[i].append(parse_client_stats(now_us() - rec.t0_us, raw))
        except Exception as exc:  # never raise into librdkafka's poll
            callback_errors.append(f"statistics of producer {i}: {type(exc).__name__}: {exc}")

    callback_errors: list[str] = []
    rec.cpu = CpuMeter(cluster.node_of_pgid)
    producers, configs = [], []
    for i, p in enumerate(policies):
        before = thread_ids()
        config = producer_config(p, cluster.bootstrap, functools.partial(on_stats, i))
        if client_debug:
            config |= debug_logging(client_debug, cluster.workdir / f"librdkafka-{topic_of(i)}.log")
        configs.append(config)
        producers.append(ResilientProducer(Producer, config))
        # connect and fetch metadata before the clock starts; then its broker threads exist and get its name in
        # the CPU shares
        producers[-1].list_topics(timeout=10)
        rec.cpu.label_threads(f"librdkafka-{topic_of(i)}", before)
    parts = [partitions_of(p, schedule.produce) for p in policies]
    ts = schedule.produce["ts_us"].to_numpy()
    msg = schedule.produce["msg_id"].to_numpy()
    size = schedule.produce["size_bytes"].to_numpy()
    keys = schedule.produce["key"].to_pylist()
    rec.partition = [dict(zip(msg.tolist(), pp.tolist(), strict=True)) for pp in parts]
    rec.deliveries = [{} for _ in policies]
    rec.warmup = [warm_up(pr, topic_of(i), p.partitions) if idempotent(p) else 0
                  for i, (p, pr) in enumerate(zip(policies, producers, strict=True))]

    def on_delivery(i: int, msg_id: int, err, m) -> None:
        # Never raise into librdkafka's poll (it turns a Python exception into a SystemError there).
        try:
            now = now_us() - rec.t0_us
            # (no message: one its producer held when it failed fatally, `ResilientProducer`)
            tstype, tsval = m.timestamp() if m is not None else (0, None)
            offset = m.offset() if err is None and m is not None else None
            rec.deliveries[i][msg_id] = Delivery(now, None if err is None else str(err.name()),
                                                 offset if offset is not None and offset >= 0 else None,
                                                 tsval if err is None and tstype != 0 else None)
        except BaseException as exc:  # recorded, reported after the run
            callback_errors.append(f"message {msg_id}: {type(exc).__name__}: {exc}")

    state = {b: "up" for b in cluster.brokers}
    watchers: list[TransitionWatcher] = []
    stop = threading.Event()
    samplers = [Sampler(cluster, rec, state, b, stop) for b in cluster.brokers]
    for stats in rec.client_stats:  # the warm-up's windows are not the run's
        stats.clear()
    rec.t0_us = now_us()
    start = time.monotonic()
    rec.cpu.start()
    for sampler in samplers:
        sampler.start()
    try:
        fi, n = 0, len(ts)
        for j in range(n + 1):
            due = int(ts[j]) if j < n else schedule.duration_us
            while fi < len(schedule.faults) and schedule.faults[fi][0] <= due:
                f_ts, kind, broker = schedule.faults[fi]
                wait_until(rec.t0_us + f_ts, producers)
                if kind in (Kind.CRASH, Kind.SHUTDOWN, Kind.ISOLATE):
                    # Every follower's position right before the fault: what it fetched between the last
                    # periodic sample and the fault decides what an acks=1 leader loses (SPEC §3.2 rule 9).
                    for b in cluster.brokers:
                        sample = samplers[0].read(b) if state.get(b) != "down" else None
                        if sample is not None:
                            rec.samples.append(sample)
                inject(cluster, kind, broker, state)
                rec.faults.append((now_us() - rec.t0_us, kind, broker))
                if kind in (Kind.CRASH, Kind.ISOLATE):
                    # Once the leader is dead or cut off its followers fetch nothing more from it, so their log
                    # ends read right after the fault are what they held at it (a fetch answered between the
                    # sample above and the fault included): recorded at the fault's instant − 1 µs. Without
                    # this, a fetch in that gap made the prediction lose what the successor had.
                    for sample in settled_reads(samplers[0], [b for b in cluster.brokers
                                                               if b != broker and state.get(b) == "up"], producers):
                        sample.ts_us = rec.faults[-1][0] - 1
                        rec.samples.append(sample)
                if kind in (Kind.SHUTDOWN, Kind.RESTART):
                    tr = Transition(len(rec.faults) - 1, kind, broker, rec.faults[-1][0])
                    rec.transitions.append(tr)
                    watchers.append(TransitionWatcher(cluster, rec, tr, set(map(topic_of, range(len(policies))))))
                    watchers[-1].start()
                progress(f"{kind.label} broker {broker} at {f_ts / 1e6:.1f} s")
                fi += 1
            if j == n:
                break
            wait_until(rec.t0_us + due, producers)
            mid = int(msg[j])
            rec.sent_us[mid] = now_us() - rec.t0_us
            value = payload(mid, int(size[j]))
            for i, pr in enumerate(producers):
                pr.produce(topic_of(i), value=value, key=keys[j], partition=int(parts[i][j]),
                           on_delivery=functools.partial(on_delivery, i, mid))
                pr.poll(0)
        wait_until(rec.t0_us + schedule.duration_us, producers)
    finally:
        rec.cpu.stop()
        stop.set()
        for sampler in samplers:
            sampler.join(timeout=5)
    rec.wall_s["trace"] = time.monotonic() - start
    if callback_errors:
        raise RuntimeError(f"{len(callback_errors)} delivery reports could not be read, first: {callback_errors[0]}")
    # SPEC §4.1 judges at duration_us: nothing more is sent; what was queued but never sent is absent.
    for pr, config in zip(producers, configs, strict=True):
        pr.purge(in_queue=True, in_flight=False)
        pr.flush(10)
        close_debug_log(config)
    # A restart late in the trace takes effect after it: wait for its instant (after the flush, so that the
    # producers are not left unpolled meanwhile).
    for w in watchers:
        w.join(timeout=WATCH_S)
    for tr in rec.transitions:
        if tr.kind is Kind.SHUTDOWN:
            at = resigned_at(cluster.workdir / broker_name(tr.broker) / "server.log", rec.t0_us + tr.signal_us,
                             None if tr.exit_us is None else rec.t0_us + tr.exit_us)
            tr.resigned_us = None if at is None else at - rec.t0_us

    progress("healing and restarting every broker, then reading every partition back")
    for b, s in list(state.items()):
        if s == "isolated":
            cluster.heal(b)
        elif s == "down":
            cluster.restart(b)
        state[b] = "up"
    cluster.wait_ready(timeout_s=90)
    _wait_settled(admin, policies, timeout_s=60)
    rec.reads = [read_back(cluster.bootstrap, topic_of(i), p.partitions) for i, p in enumerate(policies)]
    return rec


def inject(cluster, kind: Kind, broker: int, state: dict[int, str]) -> None:
    """One fault on `cluster` (Kafka's, or RocketMQ's through its trace-id view), and the broker's new state."""
    if kind is Kind.CRASH:
        state[broker] = "down"
        cluster.crash(broker)
    elif kind is Kind.SHUTDOWN:
        state[broker] = "down"
        cluster.shutdown_begin(broker)
    elif kind is Kind.RESTART:
        cluster.restart(broker)
        state[broker] = "up"
    elif kind is Kind.ISOLATE:
        state[broker] = "isolated"
        cluster.isolate(broker)
    elif kind is Kind.HEAL:
        cluster.heal(broker)
        state[broker] = "up"


def _wait_leaders(admin, policies: list[KafkaPolicy], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        md = admin.list_topics(timeout=5)
        ok = all(topic_of(i) in md.topics and len(md.topics[topic_of(i)].partitions) == p.partitions
                 and all(pm.leader >= 0 for pm in md.topics[topic_of(i)].partitions.values())
                 for i, p in enumerate(policies))
        if ok:
            return
        time.sleep(0.3)
    raise RuntimeError("the testbed topics have no leaders after creation")


def _wait_settled(admin, policies: list[KafkaPolicy], timeout_s: float) -> None:
    """Every partition led and its ISR full again (or the timeout: offline partitions stay offline)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            md = admin.list_topics(timeout=5)
            pms = [pm for i in range(len(policies)) for pm in md.topics[topic_of(i)].partitions.values()]
            if all(pm.leader >= 0 and len(pm.isrs) == len(pm.replicas) for pm in pms):
                return
        except Exception:  # metadata while brokers rejoin: ask again
            pass
        time.sleep(0.5)
    log.warning("partitions not fully in sync %.0f s after recovery; reading what is committed", timeout_s)


def run_cluster(schedule: Schedule, policies: list[KafkaPolicy], workdir: Path, tag: str, *,
                client_debug: str | None = None, progress=print) -> Recording:
    from testbed.jars import ensure_jars

    settings = broker_settings(policies, schedule.fetch_ms)
    for i, p in enumerate(policies):
        if p.replication_factor > len(schedule.brokers):
            raise BadInput(f"--policy #{i + 1} ({p.canonical()}): replication_factor {p.replication_factor} > "
                           f"{len(schedule.brokers)} brokers", rule="testbed-policy")
    jars = ensure_jars(log=progress)
    t = time.monotonic()
    with KafkaCluster(jars, [b.id for b in schedule.brokers], settings, workdir, tag) as cluster:
        cluster.wait_ready()
        started = time.monotonic() - t
        progress(f"Kafka {jars.version}: controller + {len(schedule.brokers)} brokers ready in {started:.1f} s "
                 f"({', '.join(cluster.address(broker_name(b)) for b in cluster.brokers)})")
        rec = record(cluster, schedule, policies, client_debug=client_debug, progress=progress)
        rec.wall_s["cluster_start"] = started
        rec.pgids = list(cluster.started_pgids)
        rec.tag = tag
    rec.wall_s["cluster_total"] = time.monotonic() - t
    return rec
