"""What the recorder sees of a real Kafka cluster while a scenario runs (SPEC §12): the recording and its
observers (the per-broker samplers, the shutdown and restart watchers).

What is recorded:
- produce events as sent (the wall-clock instant of the first producer's send, µs from the run's start);
- faults at the instant the broker really changed state, seen from outside (`Transition`): crash, isolate and
  heal when the signal was sent or the routes changed; `shutdown` when the broker's own log shows it turned
  follower of the partitions it led (the controller has moved its leaderships away: SPEC §2.2's instant; same
  clock, `testbed.instruments.resigned_at`), else when the cluster metadata first shows it leading nothing or
  its process exits, whichever comes first (its Jolokia agent stops with the JVM's shutdown hooks at SIGTERM, so
  its metrics are not readable then); `restart` when the
  new JVM reports BrokerState RUNNING (registered with the controller and unfenced). The raw instants (signal,
  leads nothing, exit, RUNNING, listed in the metadata) go to comparison.json;
- `replicate` events from follower log end offsets sampled through Jolokia every `SAMPLE_MS` (SPEC §3.2
  rule 5: a follower holding offsets < LEO holds every message its leader appended before the record at
  offset LEO, so upto_us = that record's send instant − 1 µs (its append time − HELD_BACK_US if its producer
  held it back), at most the sample instant; see `replicate_events`);
- per policy and message: the delivery report (status, error, ack instant, offset, LogAppendTime) and whether
  the verifying consumer read it after every fault healed and every broker came back (fate).
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any, ClassVar

from replay.policies import KafkaPolicy
from schemas.trace import Kind
from testbed.cluster import JOLOKIA_PORT, KafkaCluster, broker_name
from testbed.instruments import (
    BROKER_METRICS_MS,
    BrokerMetrics,
    ClientStats,
    CpuMeter,
    broker_metric_requests,
    parse_broker_metrics,
)
from testbed.schedule import TOPIC_PREFIX, Schedule

log = logging.getLogger(__name__)

SAMPLE_MS = 50


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
    resigned_us: int | None = None  # shutdown: its own log shows it turned follower of what it led
    running_us: int | None = None  # restart: its BrokerState is RUNNING (registered and unfenced)
    listed_us: int | None = None  # restart: the metadata lists it among the live brokers (after RUNNING)

    @property
    def state_us(self) -> int:
        """The instant recorded in the trace: SPEC §2.2's `shutdown` moves leadership at ts_us, `restart` has the
        broker back (able to lead and to rejoin the ISR) at ts_us."""
        if self.kind is Kind.SHUTDOWN:
            if self.resigned_us is not None:
                return self.resigned_us
            seen = [t for t in (self.leads_nothing_us, self.exit_us) if t is not None]
        else:
            seen = [t for t in (self.running_us, self.listed_us) if t is not None]
        return min(seen) if seen else self.signal_us

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind.label, "broker": self.broker, "signal_us": self.signal_us,
                "leads_nothing_us": self.leads_nothing_us, "exit_us": self.exit_us, "resigned_us": self.resigned_us,
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
    warmup: list[int] = field(default_factory=list)  # per policy: records at the head of each partition (`warm_up`)
    wall_s: dict[str, float] = field(default_factory=dict)
    pgids: list[int] = field(default_factory=list)  # every process group the cluster started
    broker_metrics: list[BrokerMetrics] = field(default_factory=list)  # request metrics, every BROKER_METRICS_MS
    client_stats: list[list[ClientStats]] = field(default_factory=list)  # per policy: librdkafka's statistics
    cpu: CpuMeter | None = None  # over the trace: from the clock's start to duration_us
    tag: str = ""

    def state_faults(self) -> list[tuple[int, Kind, int]]:
        """The faults at the instants the brokers changed state (`Transition`), in trace order. A broker's
        instant never passes its next fault's signal, so every broker's sequence stays valid (SPEC §2.3)."""
        moved = self._moved()
        out = [(moved[j], kind, b) for j, (_, kind, b) in enumerate(self.faults)]
        return sorted(out, key=lambda f: (f[0], FAULT_ORDER[f[1]]))

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
FAULT_ORDER = {Kind.CRASH: 0, Kind.POWER_LOSS: 1, Kind.DISK_LOSS: 2, Kind.SHUTDOWN: 3, Kind.ISOLATE: 4,
                Kind.RESTART: 5, Kind.HEAL: 6}


class Jolokia:
    """One keep-alive HTTP connection to a broker's Jolokia agent; a list of read requests goes in one POST.
    Used from one thread only."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.conn: http.client.HTTPConnection | None = None

    def post(self, body: bytes, timeout: float = 0.5) -> Any:
        for attempt in range(2):  # a kept connection the agent closed: connect once more
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
            try:
                self.conn.request("POST", "/jolokia/", body, {"Content-Type": "application/json"})
                return json.loads(self.conn.getresponse().read())
            except (OSError, ValueError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise
        return None


class Sampler(threading.Thread):
    """One broker's per-partition log end offset and leadership every SAMPLE_MS, through its Jolokia agent
    (one thread per broker, so that a slow or dying JVM does not delay the others' samples): one batched POST on
    a kept connection per sample, with the brokers' request metrics added once every BROKER_METRICS_MS."""

    READS: ClassVar[list[dict[str, Any]]] = [
        {"type": "read", "mbean": f"kafka.log:type=Log,name=LogEndOffset,topic={TOPIC_PREFIX}*,*",
         "attribute": "Value"},
        # A partition's InSyncReplicasCount is non-zero only on its leader (kafka.cluster.Partition).
        {"type": "read", "mbean": f"kafka.cluster:type=Partition,name=InSyncReplicasCount,topic={TOPIC_PREFIX}*,*",
         "attribute": "Value"},
    ]
    REQUEST = json.dumps(READS).encode()
    WITH_METRICS = json.dumps(READS + broker_metric_requests()).encode()

    def __init__(self, cluster: KafkaCluster, rec: Recording, state: dict[int, str], broker: int,
                 stop: threading.Event) -> None:
        super().__init__(daemon=True, name=f"testbed-sampler-{broker}")
        self.cluster, self.rec, self.state, self.broker, self.stop_event = cluster, rec, state, broker, stop
        self.local = threading.local()

    def run(self) -> None:
        metrics_at = 0.0
        while not self.stop_event.is_set():
            start = time.monotonic()
            if self.state.get(self.broker) != "down":
                # due once a BROKER_METRICS_MS, tried once: a failed read is not retried with them (the log end
                # offsets come first)
                metrics = start - metrics_at >= BROKER_METRICS_MS / 1000
                metrics_at = start if metrics else metrics_at
                sample = self.read(self.broker, metrics=metrics)
                if sample is not None:
                    self.rec.samples.append(sample)  # list.append is atomic under the GIL
            self.stop_event.wait(max(0.0, SAMPLE_MS / 1000 - (time.monotonic() - start)))

    def _client(self, broker: int) -> Jolokia:
        clients = self.local.__dict__.setdefault("clients", {})
        if broker not in clients:
            clients[broker] = Jolokia(self.cluster.address(broker_name(broker)), JOLOKIA_PORT)
        return clients[broker]

    def read(self, broker: int, metrics: bool = False) -> Sample | None:
        try:
            body = self._client(broker).post(self.WITH_METRICS if metrics else self.REQUEST)
        except (OSError, ValueError, http.client.HTTPException):
            return None  # the broker is starting or stopping
        ts = now_us() - self.rec.t0_us
        leo, leads = {}, set()
        for i, part in enumerate(body[:2]):
            for mbean, attrs in (part.get("value") or {}).items():
                props = dict(kv.split("=", 1) for kv in mbean.split(":", 1)[1].split(","))
                key = (props["topic"], int(props["partition"]))
                if i == 0:
                    leo[key] = int(attrs["Value"])
                elif int(attrs["Value"]) > 0:
                    leads.add(key)
        if metrics:
            self.rec.broker_metrics.append(BrokerMetrics(ts, broker, parse_broker_metrics(body[2:])))
        return Sample(ts, broker, leo, leads)


def now_us() -> int:
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
        return now_us() - self.rec.t0_us

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


#: After a crash or an isolation, how long apart the followers' log ends are read until two reads agree, and for
#: how long at most. A fetch response the leader sent before the fault may still be on its way or being appended
#: when the first read comes (the first read can be records short of what the successor holds); the followers
#: cannot fetch anything newer from a dead or cut-off leader, and no successor is elected this soon (9 s here).
SETTLE_MS, SETTLE_MAX_MS = 100, 1000


def settled_reads(sampler: Sampler, brokers: list[int], producers) -> list[Sample]:
    """The brokers' samples once two reads SETTLE_MS apart give the same log ends (or at SETTLE_MAX_MS)."""
    deadline = now_us() + SETTLE_MAX_MS * 1000
    last = [s for s in (sampler.read(b) for b in brokers) if s is not None]
    while now_us() < deadline:
        wait_until(now_us() + SETTLE_MS * 1000, producers)
        now = [s for s in (sampler.read(b) for b in brokers) if s is not None]
        if [(s.broker, s.leo) for s in now] == [(s.broker, s.leo) for s in last]:
            return now
        last = now
    return last


def wait_until(target_us: int, producers) -> None:
    while True:
        left = target_us - now_us()
        if left <= 0:
            return
        for pr in producers:
            pr.poll(0)
        time.sleep(min(left / 1e6, 0.002))


