"""Drive a real Kafka cluster through a scenario and record what happened (SPEC §12).

One cluster serves every policy of a run: each policy gets its own topic (its partitions, replication factor,
min ISR, unclean election, LogAppendTime timestamps) and its own confluent-kafka producer (its acks, timeouts,
retry backoff, idempotence), and every producer sends every produce event of the scenario at its time. The
faults hit all topics at once, so one recorded trace (`DIR/trace/`) stands for all policies; policies that
need different broker-level settings (replica.lag.time.max.ms, the session timeout, ELR) need separate runs.

What is recorded:
- produce events as sent (the wall-clock instant of the first producer's send, µs from the run's start);
- faults at the instant the broker really changed state, seen from outside (`Transition`): crash, isolate and
  heal when the signal was sent or the routes changed; `shutdown` when the cluster metadata first shows the
  broker leading nothing (the controller has moved its leaderships away: SPEC §2.2's instant), or when its
  process exits if that comes first (its Jolokia agent stops with the JVM's shutdown hooks at SIGTERM, so the
  broker's own view is not readable then); `restart` when the
  new JVM reports BrokerState RUNNING (registered with the controller and unfenced). The raw instants (signal,
  leads nothing, exit, RUNNING, listed in the metadata) go to comparison.json;
- `replicate` events from follower log end offsets sampled through Jolokia every `SAMPLE_MS` (SPEC §3.2
  rule 5: a follower holding offsets < LEO holds every message its leader appended before the record at
  offset LEO, so upto_us = that record's send instant − 1 µs (its append time − HELD_BACK_US if its producer
  held it back), at most the sample instant; see `replicate_events`);
- per policy and message: the delivery report (status, error, ack instant, offset, LogAppendTime) and whether
  the verifying consumer read it after every fault healed and every broker came back (fate).

Messages go to the partition SPEC §3.2 rule 1 gives (the real producer is told the partition): the trace
carries no partition, and the real default partitioner (CRC32 for keys, sticky batches without) would make the
two sides disagree for reasons that have nothing to do with replication.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import logging
import threading
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from replay.policies import Acks, KafkaPolicy, Policy
from schemas.errors import BadInput
from schemas.trace import EVENT_ARROW_SCHEMA, Broker, Kind, Manifest
from testbed.cluster import BrokerSettings, KafkaCluster, broker_name

log = logging.getLogger(__name__)

SAMPLE_MS = 50
TOPIC_PREFIX = "replab-p"
#: SPEC §12: crash, restart, shutdown, isolate and heal are injected; the rest needs a filesystem that drops
#: unsynced writes, which this testbed does not have.
SUPPORTED_FAULTS = (Kind.CRASH, Kind.RESTART, Kind.SHUTDOWN, Kind.ISOLATE, Kind.HEAL)


# ------------------------------------------------------------------------------------------------ the plan
@dataclass
class Schedule:
    """What to do: the scenario's produce events and faults (its replicate events are the cluster's business)."""

    scenario: str
    trace_id: str
    brokers: tuple[Broker, ...]
    duration_us: int
    produce: pa.Table  # ts_us, msg_id, key, size_bytes, producer_id in time order
    faults: list[tuple[int, Kind, int]]  # (ts_us, kind, broker) in SPEC §2.2 order
    #: the scenario's follower fetch cadence, given to the real followers (replica.fetch.wait.max.ms)
    fetch_ms: int
    generator: dict[str, Any]


def schedule_from_scenario(spec: str, seed: int = 0) -> Schedule:
    from generators.generate import build_plan, chunk_table
    from generators.library import resolve_scenario

    scenario = resolve_scenario(spec)
    plan = build_plan(scenario, seed, 1.0)
    tables = [chunk_table(plan, c)[0] for c in range(plan.n_chunks)]
    events = pa.concat_tables(tables)
    produce = events.filter(pa.compute.equal(events["kind"], "produce")).select(
        ["ts_us", "msg_id", "key", "size_bytes", "producer_id"])
    faults = [(int(t), Kind(int(k)), int(b))
              for t, k, b in zip(plan.fault_ts_us, plan.fault_kind, plan.fault_broker, strict=True)]
    for _, kind, _ in faults:
        if kind not in SUPPORTED_FAULTS:
            raise BadInput(f"the testbed injects crash, restart, shutdown, isolate and heal; {kind.label} needs a "
                           f"filesystem that drops unsynced writes (out of scope, SPEC §12)",
                           file=f"scenario {scenario.name}", rule="testbed-fault")
    fetch_ms = max(1, round(scenario.replication.default.fetch_interval_ms))
    return Schedule(scenario.name, f"{scenario.name}-recorded-s{seed}", tuple(scenario.brokers), plan.duration_us,
                    produce, faults, fetch_ms, {"scenario": scenario.name, "seed": seed, "testbed": True})


def broker_settings(policies: list[Policy], fetch_ms: int) -> BrokerSettings:
    """The cluster-level settings the policies share; policies that differ there need separate runs."""
    for i, p in enumerate(policies):
        if not isinstance(p, KafkaPolicy):
            raise BadInput(f"--policy #{i + 1} ({p.canonical()}): the testbed runs Kafka policies only "
                           f"(RocketMQ follows, SPEC §12)", rule="testbed-policy")
        if p.controller.value != "kraft":
            raise BadInput(f"--policy #{i + 1} ({p.canonical()}): the testbed cluster runs KRaft, not ZooKeeper",
                           rule="testbed-policy")
    settings = {BrokerSettings(p.replica_lag_time_max_ms, p.session_timeout_ms, p.eligible_leader_replicas, fetch_ms)
                for p in policies}
    if len(settings) > 1:
        raise BadInput("the policies of one testbed run share one cluster, so they must agree on "
                       "replica_lag_time_max_ms, controller and eligible_leader_replicas; run them separately",
                       rule="testbed-policy")
    return settings.pop()


# ------------------------------------------------------------------------------------------------ what is seen
@dataclass
class Delivery:
    report_us: int
    error: str | None  # librdkafka's error name, None when acknowledged
    offset: int | None
    append_ms: int | None


@dataclass
class Sample:
    ts_us: int
    broker: int
    leo: dict[tuple[str, int], int]
    leads: set[tuple[str, int]]


#: org.apache.kafka.metadata.BrokerState: RUNNING once the controller has unfenced the broker.
BROKER_RUNNING = 3
#: How long a watcher waits for a shutdown or restart to take effect before the signal instant stands.
WATCH_S = 90.0


@dataclass
class Transition:
    """The observable instants of one shutdown or restart, µs from the run's start (kept in comparison.json)."""

    index: int  # in Recording.faults
    kind: Kind
    broker: int
    signal_us: int  # SIGTERM sent, or the new JVM started
    leads_nothing_us: int | None = None  # shutdown: the metadata (admin API) first shows it leading nothing
    exit_us: int | None = None  # shutdown: its process exited
    running_us: int | None = None  # restart: its BrokerState is RUNNING (registered and unfenced)
    listed_us: int | None = None  # restart: the metadata lists it among the live brokers (after RUNNING)

    @property
    def state_us(self) -> int:
        """The instant recorded in the trace: SPEC §2.2's `shutdown` moves leadership at ts_us, `restart` has the
        broker back (able to lead and to rejoin the ISR) at ts_us."""
        if self.kind is Kind.SHUTDOWN:
            seen = [t for t in (self.leads_nothing_us, self.exit_us) if t is not None]
        else:
            seen = [t for t in (self.running_us, self.listed_us) if t is not None]
        return min(seen) if seen else self.signal_us

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind.label, "broker": self.broker, "signal_us": self.signal_us,
                "leads_nothing_us": self.leads_nothing_us, "exit_us": self.exit_us,
                "running_us": self.running_us, "listed_us": self.listed_us,
                "recorded_us": self.state_us}


@dataclass
class Recording:
    schedule: Schedule
    policies: list[KafkaPolicy]
    t0_us: int
    sent_us: dict[int, int] = field(default_factory=dict)  # msg_id -> send instant
    partition: list[dict[int, int]] = field(default_factory=list)  # per policy: msg_id -> partition
    deliveries: list[dict[int, Delivery]] = field(default_factory=list)  # per policy
    faults: list[tuple[int, Kind, int]] = field(default_factory=list)  # as injected (signal instants)
    transitions: list[Transition] = field(default_factory=list)  # shutdowns and restarts as observed
    samples: list[Sample] = field(default_factory=list)
    reads: list[dict[int, tuple[int, int, int]]] = field(default_factory=list)  # msg_id -> (partition, offset, ms)
    replicas: list[dict[int, tuple[int, ...]]] = field(default_factory=list)  # per policy: partition -> brokers
    warmup: list[int] = field(default_factory=list)  # per policy: records at the head of each partition (`_warm_up`)
    wall_s: dict[str, float] = field(default_factory=dict)
    pgids: list[int] = field(default_factory=list)  # every process group the cluster started
    tag: str = ""

    def state_faults(self) -> list[tuple[int, Kind, int]]:
        """The faults at the instants the brokers changed state (`Transition`), in trace order. A broker's
        instant never passes its next fault's signal, so every broker's sequence stays valid (SPEC §2.3)."""
        moved = self._moved()
        out = [(moved[j], kind, b) for j, (_, kind, b) in enumerate(self.faults)]
        return sorted(out, key=lambda f: (f[0], _FAULT_ORDER[f[1]]))

    def _moved(self) -> list[int]:
        state = {tr.index: tr.state_us for tr in self.transitions}
        out = []
        for j, (t, _, b) in enumerate(self.faults):
            t = state.get(j, t)
            nxt = [ft for ft, _, fb in self.faults[j + 1:] if fb == b]
            out.append(min(t, nxt[0]) if nxt else t)
        return out

    def fault_instants(self) -> list[dict[str, Any]]:
        """Every fault as injected and as recorded in the trace, with the raw instants behind it (µs from the
        run's start): the evidence for the trace's shutdown and restart instants, kept in comparison.json."""
        by_index = {tr.index: tr for tr in self.transitions}
        moved = self._moved()
        out = []
        for j, (t, kind, b) in enumerate(self.faults):
            tr = by_index.get(j)
            row = tr.as_json() if tr is not None else {"kind": kind.label, "broker": b, "signal_us": t}
            row["recorded_us"] = moved[j]
            out.append(row)
        return out


#: SPEC §2.2: crash, power_loss, disk_loss, shutdown, isolate; then restart, heal.
_FAULT_ORDER = {Kind.CRASH: 0, Kind.POWER_LOSS: 1, Kind.DISK_LOSS: 2, Kind.SHUTDOWN: 3, Kind.ISOLATE: 4,
                Kind.RESTART: 5, Kind.HEAL: 6}


def topic_of(index: int) -> str:
    return f"{TOPIC_PREFIX}{index}"


def idempotent(policy: KafkaPolicy) -> bool:
    """SPEC §3.1: producers never duplicate. librdkafka allows idempotence with acks=all only."""
    return policy.acks is Acks.ALL


#: Requests in flight per broker connection for the idempotent (acks=all) producer. A Kafka broker reads one
#: request per connection at a time (it mutes the channel until the response is sent: KafkaChannel's
#: MUTED_AND_RESPONSE_PENDING), and it answers an acks=all produce once the high watermark passes, so a second
#: request in flight gains one loopback round trip. librdkafka 2.16's broker threads busy-poll while an idempotent
#: producer has more than one request in flight: at 200 messages/s and a 1 s follower fetch that took 1.6 cores of
#: this 2-core machine from the brokers being measured (the fast testbed case: 96 → 43-45 CPU-s in all, observed
#: acks=all ack p50 8.6-8.7 → 5.1 s; bench/HISTORY.md). The acks=1 producer does not spin; it keeps the default.
IDEMPOTENT_IN_FLIGHT = 1


def producer_config(policy: KafkaPolicy, bootstrap: str) -> dict[str, Any]:
    acks = {Acks.ZERO: "0", Acks.ONE: "1", Acks.ALL: "all"}[policy.acks]
    in_flight = {"max.in.flight.requests.per.connection": IDEMPOTENT_IN_FLIGHT} if idempotent(policy) else {}
    return {
        "bootstrap.servers": bootstrap,
        "acks": acks,
        "request.timeout.ms": policy.request_timeout_ms,
        "delivery.timeout.ms": policy.delivery_timeout_ms,
        "retry.backoff.ms": policy.retry_backoff_ms,
        "retry.backoff.max.ms": max(policy.retry_backoff_ms, getattr(policy, "retry_backoff_max_ms", 1000)),
        "enable.idempotence": idempotent(policy),
        "linger.ms": 0,
        "topic.metadata.refresh.interval.ms": policy.metadata_max_age_ms,
        "log_level": 0,
        **in_flight,
    }


def _partitions(policy: KafkaPolicy, table: pa.Table) -> np.ndarray:
    from replay.kafka.routing import kafka_route
    from replay.local import msg_rank

    return kafka_route(table["key"].combine_chunks(), msg_rank(table["msg_id"].to_numpy()), policy.partitions)


class Sampler(threading.Thread):
    """One broker's per-partition log end offset and leadership every SAMPLE_MS, through its Jolokia agent
    (one thread per broker, so that a slow or dying JVM does not delay the others' samples)."""

    REQUEST = json.dumps([
        {"type": "read", "mbean": f"kafka.log:type=Log,name=LogEndOffset,topic={TOPIC_PREFIX}*,*",
         "attribute": "Value"},
        # A partition's InSyncReplicasCount is non-zero only on its leader (kafka.cluster.Partition).
        {"type": "read", "mbean": f"kafka.cluster:type=Partition,name=InSyncReplicasCount,topic={TOPIC_PREFIX}*,*",
         "attribute": "Value"},
    ]).encode()

    def __init__(self, cluster: KafkaCluster, rec: Recording, state: dict[int, str], broker: int,
                 stop: threading.Event) -> None:
        super().__init__(daemon=True, name=f"testbed-sampler-{broker}")
        self.cluster, self.rec, self.state, self.broker, self.stop_event = cluster, rec, state, broker, stop

    def run(self) -> None:
        while not self.stop_event.is_set():
            start = time.monotonic()
            if self.state.get(self.broker) != "down":
                sample = self.read(self.broker)
                if sample is not None:
                    self.rec.samples.append(sample)  # list.append is atomic under the GIL
            self.stop_event.wait(max(0.0, SAMPLE_MS / 1000 - (time.monotonic() - start)))

    def read(self, broker: int) -> Sample | None:
        req = urllib.request.Request(self.cluster.jolokia_url(broker), data=self.REQUEST,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=0.5) as resp:
                body = json.loads(resp.read())
        except (OSError, ValueError, http.client.HTTPException):
            return None  # the broker is starting or stopping
        ts = _now_us() - self.rec.t0_us
        leo, leads = {}, set()
        for i, part in enumerate(body):
            for mbean, attrs in (part.get("value") or {}).items():
                props = dict(kv.split("=", 1) for kv in mbean.split(":", 1)[1].split(","))
                key = (props["topic"], int(props["partition"]))
                if i == 0:
                    leo[key] = int(attrs["Value"])
                elif int(attrs["Value"]) > 0:
                    leads.add(key)
        return Sample(ts, broker, leo, leads)


def _now_us() -> int:
    return time.time_ns() // 1000


class TransitionWatcher(threading.Thread):
    """Watches one shutdown or restart from outside until it has taken effect (`Transition`): the cluster
    metadata (admin API) for leadership and live brokers, the broker's BrokerState metric (Jolokia) and, for a
    shutdown, its process. Polls every SAMPLE_MS on its own thread, so that the producers keep their times."""

    STATE = json.dumps({"type": "read", "mbean": "kafka.server:name=BrokerState,*", "attribute": "Value"}).encode()

    def __init__(self, cluster: KafkaCluster, rec: Recording, tr: Transition, topics: set[str]) -> None:
        super().__init__(daemon=True, name=f"testbed-watch-{tr.kind.label}-{tr.broker}")
        self.cluster, self.rec, self.tr, self.topics = cluster, rec, tr, topics

    def _now(self) -> int:
        return _now_us() - self.rec.t0_us

    def broker_state(self) -> int | None:
        req = urllib.request.Request(self.cluster.jolokia_url(self.tr.broker), data=self.STATE,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=0.5) as resp:
                values = (json.loads(resp.read()).get("value") or {}).values()
        except (OSError, ValueError, http.client.HTTPException, AttributeError):
            return None  # the JVM is starting or gone
        return next((int(v["Value"]) for v in values if isinstance(v, dict) and "Value" in v), None)

    def done(self) -> bool:
        tr = self.tr
        if tr.kind is Kind.SHUTDOWN:
            return tr.exit_us is not None
        return tr.running_us is not None and tr.listed_us is not None

    def run(self) -> None:
        from confluent_kafka.admin import AdminClient

        tr, b = self.tr, self.tr.broker
        admin = AdminClient({"bootstrap.servers": self.cluster.bootstrap, "log_level": 0,
                             "socket.timeout.ms": 2000})
        proc = self.cluster.stopping(b) if tr.kind is Kind.SHUTDOWN else None
        deadline = time.monotonic() + WATCH_S
        while not self.done() and time.monotonic() < deadline:
            start = time.monotonic()
            try:
                self.poll(admin, proc)
            except Exception as exc:  # metadata while brokers change state: ask again
                log.debug("watching %s of broker %d: %s", tr.kind.label, b, exc)
            time.sleep(max(0.0, SAMPLE_MS / 1000 - (time.monotonic() - start)))
        if tr.state_us == tr.signal_us:
            log.warning("%s of broker %d: no state change seen in %.0f s; the trace keeps the signal instant",
                        tr.kind.label, b, WATCH_S)

    def poll(self, admin, proc) -> None:
        tr, b = self.tr, self.tr.broker
        if tr.kind is Kind.SHUTDOWN:
            if proc is None or proc.poll() is not None:
                tr.exit_us = self._now()
                return
            if tr.leads_nothing_us is None:
                md = admin.list_topics(timeout=1)
                parts = [pm for t in self.topics if t in md.topics for pm in md.topics[t].partitions.values()]
                if parts and all(pm.leader != b for pm in parts):
                    tr.leads_nothing_us = self._now()
        else:
            if tr.running_us is None:
                if self.broker_state() == BROKER_RUNNING:
                    tr.running_us = self._now()
            elif tr.listed_us is None and b in admin.list_topics(timeout=1).brokers:
                tr.listed_us = self._now()


# ------------------------------------------------------------------------------------------------ the run
def record(cluster: KafkaCluster, schedule: Schedule, policies: list[KafkaPolicy], *, progress=print) -> Recording:
    """Create the topics, drive the producers and the faults, heal, read everything back."""
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

    producers = [ResilientProducer(Producer, producer_config(p, cluster.bootstrap)) for p in policies]
    parts = [_partitions(p, schedule.produce) for p in policies]
    ts = schedule.produce["ts_us"].to_numpy()
    msg = schedule.produce["msg_id"].to_numpy()
    size = schedule.produce["size_bytes"].to_numpy()
    keys = schedule.produce["key"].to_pylist()
    rec.partition = [dict(zip(msg.tolist(), pp.tolist(), strict=True)) for pp in parts]
    rec.deliveries = [{} for _ in policies]
    for pr in producers:  # connect and fetch metadata before the clock starts
        pr.list_topics(timeout=10)
    rec.warmup = [_warm_up(pr, topic_of(i), p.partitions) if idempotent(p) else 0
                  for i, (p, pr) in enumerate(zip(policies, producers, strict=True))]

    callback_errors: list[str] = []

    def on_delivery(i: int, msg_id: int, err, m) -> None:
        # Never raise into librdkafka's poll (it turns a Python exception into a SystemError there).
        try:
            now = _now_us() - rec.t0_us
            tstype, tsval = m.timestamp()
            offset = m.offset() if err is None else None
            rec.deliveries[i][msg_id] = Delivery(now, None if err is None else str(err.name()),
                                                 offset if offset is not None and offset >= 0 else None,
                                                 tsval if err is None and tstype != 0 else None)
        except BaseException as exc:  # recorded, reported after the run
            callback_errors.append(f"message {msg_id}: {type(exc).__name__}: {exc}")

    state = {b: "up" for b in cluster.brokers}
    watchers: list[TransitionWatcher] = []
    stop = threading.Event()
    samplers = [Sampler(cluster, rec, state, b, stop) for b in cluster.brokers]
    rec.t0_us = _now_us()
    start = time.monotonic()
    for sampler in samplers:
        sampler.start()
    try:
        fi, n = 0, len(ts)
        for j in range(n + 1):
            due = int(ts[j]) if j < n else schedule.duration_us
            while fi < len(schedule.faults) and schedule.faults[fi][0] <= due:
                f_ts, kind, broker = schedule.faults[fi]
                _wait_until(rec.t0_us + f_ts, producers)
                if kind in (Kind.CRASH, Kind.SHUTDOWN, Kind.ISOLATE):
                    # Every follower's position right before the fault: what it fetched between the last
                    # periodic sample and the fault decides what an acks=1 leader loses (SPEC §3.2 rule 9).
                    for b in cluster.brokers:
                        sample = samplers[0].read(b) if state.get(b) != "down" else None
                        if sample is not None:
                            rec.samples.append(sample)
                _inject(cluster, kind, broker, state)
                rec.faults.append((_now_us() - rec.t0_us, kind, broker))
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
            _wait_until(rec.t0_us + due, producers)
            mid = int(msg[j])
            rec.sent_us[mid] = _now_us() - rec.t0_us
            value = _payload(mid, int(size[j]))
            for i, pr in enumerate(producers):
                pr.produce(topic_of(i), value=value, key=keys[j], partition=int(parts[i][j]),
                           on_delivery=functools.partial(on_delivery, i, mid))
                pr.poll(0)
        _wait_until(rec.t0_us + schedule.duration_us, producers)
    finally:
        stop.set()
        for sampler in samplers:
            sampler.join(timeout=5)
    rec.wall_s["trace"] = time.monotonic() - start
    if callback_errors:
        raise RuntimeError(f"{len(callback_errors)} delivery reports could not be read, first: {callback_errors[0]}")
    # SPEC §4.1 judges at duration_us: nothing more is sent; what was queued but never sent is absent.
    for pr in producers:
        pr.purge(in_queue=True, in_flight=False)
        pr.flush(10)
    # A restart late in the trace takes effect after it: wait for its instant (after the flush, so that the
    # producers are not left unpolled meanwhile).
    for w in watchers:
        w.join(timeout=WATCH_S)

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


#: The msg_id of the warm-up records (`_warm_up`); the verifying consumer skips them.
WARMUP_MSG_ID = -1


def _warm_up(producer: ResilientProducer, topic: str, partitions: int, timeout_s: float = 60.0) -> int:
    """Deliver one record to every partition before the clock starts; returns the records per partition (1).

    On a just-created topic an idempotent producer's first request to a partition can fail (the leader is not
    ready yet) while its second is appended: the broker accepts any first sequence from a producer it has no
    state for (`ProducerAppendInfo.checkSequence`: "accept writes with any sequence number"), the retried first
    batch is then out of order, and librdkafka reported it delivered without an offset although no broker had
    it: an acknowledged write the verifying consumer never reads, that no fault caused (seen in
    `testbed-leader-crash`: a partition's first message reported without an offset, its second at offset 0).
    One acknowledged record per partition first gives every partition the producer's state in order.
    """
    reports: dict[int, Any] = {}
    for part in range(partitions):
        producer.produce(topic, value=_payload(WARMUP_MSG_ID, 1), partition=part,
                         on_delivery=lambda err, m, part=part: reports.__setitem__(part, (err, m.offset())))
    producer.flush(timeout_s)
    bad = {p: r for p, r in reports.items() if r[0] is not None or r[1] != 0}
    if len(reports) != partitions or bad:
        missing = sorted(set(range(partitions)) - set(reports))
        raise RuntimeError(f"{topic}: the warm-up records were not delivered at offset 0 in {timeout_s:.0f} s "
                           f"(missing partitions {missing}, failed {bad})")
    return 1


def _payload(msg_id: int, size: int) -> bytes:
    head = f"{msg_id}:".encode()
    return head + b"x" * max(0, size - len(head))


class ResilientProducer:
    """A confluent-kafka producer that an application would recreate after a fatal error.

    An idempotent producer whose acknowledged writes were truncated (unclean election) gets a fatal
    OUT_OF_ORDER_SEQUENCE_NUMBER and refuses every later call: its queued messages fail (their delivery
    reports carry the error) and a new producer with the same settings takes the following sends.
    """

    def __init__(self, factory, config: dict[str, Any]) -> None:
        self.factory, self.config = factory, config
        self.producer = factory(config)
        self.fatal: list[str] = []
        self.retired: list[Any] = []  # polled at the end, for the delivery reports of what they held

    def _renew(self, exc: Exception) -> None:
        from confluent_kafka import KafkaError, KafkaException

        err = exc.args[0] if exc.args else None
        # produce() on a producer already in the fatal state raises a plain _FATAL error (fatal() is False).
        if not (isinstance(exc, KafkaException) and err is not None
                and (err.fatal() or err.code() == KafkaError._FATAL)):
            raise exc
        self.fatal.append(err.name())
        old = self.producer
        with contextlib.suppress(Exception):
            old.purge(in_queue=True, in_flight=True)
            old.poll(0)
        self.retired.append(old)
        self.producer = self.factory(self.config)

    def produce(self, *args, **kwargs) -> None:
        from confluent_kafka import KafkaException

        for _ in range(3):
            try:
                self.producer.produce(*args, **kwargs)
                return
            except BufferError:
                self.poll(0.01)
            except KafkaException as exc:
                self._renew(exc)

    def poll(self, timeout: float = 0) -> None:
        from confluent_kafka import KafkaException

        try:
            self.producer.poll(timeout)
        except KafkaException as exc:
            self._renew(exc)

    def list_topics(self, timeout: float):
        return self.producer.list_topics(timeout=timeout)

    def purge(self, **kwargs) -> None:
        with contextlib.suppress(Exception):
            self.producer.purge(**kwargs)

    def flush(self, timeout: float) -> None:
        from confluent_kafka import KafkaException

        for p in [*self.retired, self.producer]:
            with contextlib.suppress(KafkaException):
                p.flush(timeout)


#: After a crash or an isolation, how long apart the followers' log ends are read until two reads agree, and for
#: how long at most. A fetch response the leader sent before the fault may still be on its way or being appended
#: when the first read comes (a CI run read 5 records short of what the successor held); the followers cannot fetch
#: anything newer from a dead or cut-off leader, and no successor is elected this soon (9 s here).
SETTLE_MS, SETTLE_MAX_MS = 100, 1000


def settled_reads(sampler: Sampler, brokers: list[int], producers) -> list[Sample]:
    """The brokers' samples once two reads SETTLE_MS apart give the same log ends (or at SETTLE_MAX_MS)."""
    deadline = _now_us() + SETTLE_MAX_MS * 1000
    last = [s for s in (sampler.read(b) for b in brokers) if s is not None]
    while _now_us() < deadline:
        _wait_until(_now_us() + SETTLE_MS * 1000, producers)
        now = [s for s in (sampler.read(b) for b in brokers) if s is not None]
        if [(s.broker, s.leo) for s in now] == [(s.broker, s.leo) for s in last]:
            return now
        last = now
    return last


def _wait_until(target_us: int, producers) -> None:
    while True:
        left = target_us - _now_us()
        if left <= 0:
            return
        for pr in producers:
            pr.poll(0)
        time.sleep(min(left / 1e6, 0.002))


def _inject(cluster: KafkaCluster, kind: Kind, broker: int, state: dict[int, str]) -> None:
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


def read_back(bootstrap: str, topic: str, partitions: int) -> dict[int, tuple[int, int, int]]:
    """Every record of every partition from the beginning to the high watermark: msg_id -> (partition,
    offset, LogAppendTime ms). The verifying consumer of SPEC §12."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"replab-verify-{topic}-{time.time_ns()}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest", "log_level": 0,
                         "isolation.level": "read_uncommitted"})
    out: dict[int, tuple[int, int, int]] = {}
    try:
        highs = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
        todo = {p for p, h in highs.items() if h > 0}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in todo])
        deadline = time.monotonic() + 60
        while todo and time.monotonic() < deadline:
            for m in consumer.consume(500, timeout=1.0):
                if m.error():
                    continue
                mid = int(m.value().split(b":", 1)[0])
                if mid != WARMUP_MSG_ID:
                    out.setdefault(mid, (m.partition(), m.offset(), m.timestamp()[1]))
                if m.offset() + 1 >= highs[m.partition()]:
                    todo.discard(m.partition())
        if todo:
            raise RuntimeError(f"{topic}: partitions {sorted(todo)} not read to their high watermark in 60 s")
    finally:
        consumer.close()
    return out


# ------------------------------------------------------------------------------------------------ the trace
def _away_at(faults: list[tuple[int, Kind, int]]):
    """broker -> sorted (ts_us, away?) transitions: down or isolated brokers send no replicate event."""
    trans: dict[int, list[tuple[int, bool]]] = defaultdict(list)
    for t, kind, b in faults:
        trans[b].append((t, kind not in (Kind.RESTART, Kind.HEAL)))

    def away(b: int, t: int) -> bool:
        state = False
        for ft, a in trans.get(b, ()):
            if ft <= t:
                state = a
        return state
    return away


def replicate_events(rec: Recording) -> list[tuple[int, int, int]]:
    """(ts_us, broker, upto_us) from the samples: one per follower sample (module docstring).

    A follower whose log end is LEO in a partition holds every record below LEO and not the record at LEO. The
    trace gives messages their send instants (SPEC §12: produce events as sent) and SPEC §2 reads upto_us as
    "every message its leader appended at or before it", so upto_us is the instant of the record at offset
    LEO − 1 µs (`_instant`), capped at the sample. Its LogAppendTime (ms) says which record held offset LEO at
    the sample (offsets are reused after a truncation): the latest appended by then, else the next one to come.
    The append time alone trails the send by the request's trip, so a record the follower lacked could read as
    held (a CI run predicted no acked loss under acks=1 where the cluster lost the one record a late fetch left).
    The broker's upto_us is the minimum over the partitions it follows (of every topic: a follower fetches all
    of them from a leader in one request, so they share a position in time). Records truncated later are known
    from the producers' delivery reports (offset and append time), the others from the verifying consumer.
    """
    # (topic, partition, offset) -> [(append_us, instant_us)] of every record seen at that offset
    known: dict[tuple[str, int, int], list[tuple[int, int]]] = defaultdict(list)
    for i, deliveries in enumerate(rec.deliveries):
        for mid, d in deliveries.items():
            if d.offset is not None and d.append_ms is not None:
                known[(topic_of(i), rec.partition[i][mid], d.offset)].append(
                    _instant(d.append_ms * 1000 - rec.t0_us, rec.sent_us[mid]))
    for i, reads in enumerate(rec.reads):
        for mid, (p, off, ms) in reads.items():
            known[(topic_of(i), p, off)].append(_instant(ms * 1000 - rec.t0_us, rec.sent_us[mid]))
    replicas = {(topic_of(i), p): set(r) for i, reps in enumerate(rec.replicas) for p, r in reps.items()}
    away = _away_at(rec.state_faults())

    out = []
    leads: dict[int, set[tuple[str, int]]] = {}  # each broker's latest view of what it leads
    last: dict[int, int] = {}
    for s in sorted(rec.samples, key=lambda s: s.ts_us):
        leads[s.broker] = s.leads
        if away(s.broker, s.ts_us):
            continue
        upto, follows = s.ts_us, False
        for key, leo in s.leo.items():
            if s.broker not in replicas.get(key, ()) or key in s.leads:
                continue
            leaders = {b for b, ls in leads.items() if key in ls and b != s.broker and not away(b, s.ts_us)}
            if not leaders:
                continue  # no reachable leader: nothing to fetch from (SPEC §2.2)
            follows = True
            at_leo = _record_at(known.get((*key, leo), []), s.ts_us)
            if at_leo is not None:
                upto = min(upto, at_leo - 1)
        if not follows:
            continue
        upto = max(0, min(upto, s.ts_us), last.get(s.broker, 0))
        last[s.broker] = upto
        out.append((s.ts_us, s.broker, upto))
    return out


#: A record that reached its leader later than this after its send was held back by its producer, not delayed
#: on the way: the idempotent acks=all producer keeps at most 5 requests in flight, each waiting for a follower
#: fetch (up to fetch_interval_ms), so under load its records reach the leader seconds after their send.
HELD_BACK_US = 100_000


def _instant(append_us: int, sent_us: int) -> tuple[int, int]:
    """(append_us, the record's instant for upto_us). The instant is its send, the time the trace gives it, unless
    its producer held it back (HELD_BACK_US): the leader had no such record then, and its followers share one
    upto_us with every other topic's (one trace serves every policy), so a follower of that topic would read as
    seconds behind the records it had in the others. Then the instant is its append time − HELD_BACK_US."""
    return append_us, max(sent_us, append_us - HELD_BACK_US)


def _record_at(records: list[tuple[int, int]], ts_us: int) -> int | None:
    """The instant of the record at one offset as of ts_us, from every (append_us, instant_us) seen there: the
    latest appended by then, else the first appended after (the follower is caught up and that record is next)."""
    before = [r for r in records if r[0] <= ts_us]
    if before:
        return max(before)[1]
    return min(records)[1] if records else None


def write_trace(rec: Recording, out: Path) -> Manifest:
    """DIR/trace/ in the SPEC §2 format: manifest.json and events/part-000000.parquet."""
    sch = rec.schedule
    # The run is judged where the producers stopped (SPEC §4.1: at duration_us; the testbed purges what is
    # still queued then). A state change seen after that (a restart whose JVM was RUNNING only after the trace
    # ended) is outside the observed window: it stays in comparison.json, not in the trace.
    duration = max(sch.duration_us, max(rec.sent_us.values(), default=0))
    faults = [f for f in rec.state_faults() if f[0] <= duration]
    rows: list[tuple] = []
    for mid, t in rec.sent_us.items():
        rows.append((t, Kind.PRODUCE, None, mid))
    for t, kind, b in faults:
        rows.append((t, kind, b, None))
    reps = []
    for t, b, upto in replicate_events(rec):
        if t <= duration:
            reps.append((t, b, upto))
    produce = {int(m): j for j, m in enumerate(sch.produce["msg_id"].to_pylist())}
    keys = sch.produce["key"].to_pylist()
    sizes = sch.produce["size_bytes"].to_pylist()
    prods = sch.produce["producer_id"].to_pylist()
    cols: dict[str, list] = {n: [] for n in EVENT_ARROW_SCHEMA.names}
    events = [(t, int(k), m if m is not None else -1, b if b is not None else -1, "f", m, b) for t, k, b, m in rows]
    events += [(t, int(Kind.REPLICATE), -1, b, "r", upto, b) for t, b, upto in reps]
    events.sort(key=lambda e: (e[0], e[1], e[2], e[3]))
    for t, k, _, _, what, val, b in events:
        kind = Kind(k)
        cols["ts_us"].append(t)
        cols["kind"].append(kind.label)
        if kind is Kind.PRODUCE:
            j = produce[val]
            cols["broker"].append(None)
            cols["msg_id"].append(val)
            cols["key"].append(keys[j])
            cols["size_bytes"].append(sizes[j])
            cols["producer_id"].append(prods[j])
            cols["upto_us"].append(None)
        else:
            cols["broker"].append(b)
            cols["msg_id"].append(None)
            cols["key"].append(None)
            cols["size_bytes"].append(None)
            cols["producer_id"].append(None)
            cols["upto_us"].append(val if what == "r" else None)
    table = pa.Table.from_pydict(cols, schema=EVENT_ARROW_SCHEMA)
    manifest = Manifest(sch.trace_id, sch.brokers, duration, None, sch.generator)
    (out / "events").mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out / "events" / "part-000000.parquet")
    manifest.write(out)
    return manifest


def run_cluster(schedule: Schedule, policies: list[KafkaPolicy], workdir: Path, tag: str, *,
                progress=print) -> Recording:
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
        rec = record(cluster, schedule, policies, progress=progress)
        rec.wall_s["cluster_start"] = started
        rec.pgids = list(cluster.started_pgids)
        rec.tag = tag
    rec.wall_s["cluster_total"] = time.monotonic() - t
    return rec
