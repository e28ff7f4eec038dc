"""Where the time of a testbed run goes, from Kafka's and librdkafka's own instruments (SPEC §12):

- the brokers' request metrics (`kafka.network:type=RequestMetrics`) for Produce and FetchFollower and the
  produce purgatory's size, read through Jolokia in the sampler's batched read once every BROKER_METRICS_MS;
- librdkafka's statistics callback per producer (per broker: rtt, int_latency, outbuf_latency; per partition:
  msgq_cnt, xmit_msgq_cnt);
- the CPU share of every process the run started and of this one (its librdkafka threads apart), from
  /proc/<pid>/stat, and the machine's load average;
- the instant a broker in controlled shutdown resigned its leaderships, from its own log (same clock).

An acks=all acknowledgement, as these instruments split it: int_latency (queued in the client until its batch
is made) + outbuf_latency (the request waits for a slot among the requests in flight) + rtt, which is the
broker's Produce TotalTimeMs (RequestQueueTimeMs + LocalTimeMs, the leader's append, + RemoteTimeMs, waiting in
the produce purgatory until the followers' fetches move the high watermark past it, + ResponseQueueTimeMs +
ResponseSendTimeMs) plus the network.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import re
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replay.policies import Acks, KafkaPolicy
from schemas.trace import DEFAULT_CLIENT_ROUND_TRIP_US

#: The components of a request's time at the broker (kafka.network.RequestChannel's updateRequestMetrics).
REQUEST_TIMES = ("RequestQueueTimeMs", "LocalTimeMs", "RemoteTimeMs", "ResponseQueueTimeMs", "ResponseSendTimeMs",
                 "TotalTimeMs")
REQUESTS = ("Produce", "FetchFollower")
HISTOGRAM_ATTRS = ("Count", "Mean", "50thPercentile", "99thPercentile", "Max")
PURGATORIES = ("Produce", "Fetch")
#: How often the brokers' request metrics ride along with the sampler's read.
BROKER_METRICS_MS = 1000


def broker_metric_requests() -> list[dict[str, Any]]:
    """Jolokia read requests for the request metrics and purgatory sizes (exact names: no MBean query)."""
    reqs = [{"type": "read", "mbean": f"kafka.network:type=RequestMetrics,name={name},request={request}",
             "attribute": list(HISTOGRAM_ATTRS)} for request in REQUESTS for name in REQUEST_TIMES]
    reqs += [{"type": "read", "mbean": "kafka.server:type=DelayedOperationPurgatory,name=PurgatorySize,"
              f"delayedOperation={op}", "attribute": "Value"} for op in PURGATORIES]
    return reqs


def metric_keys() -> list[str]:
    """The names `parse_broker_metrics` gives the answers of `broker_metric_requests`, in order."""
    return ([f"{request}.{name}" for request in REQUESTS for name in REQUEST_TIMES]
            + [f"PurgatorySize.{op}" for op in PURGATORIES])


def parse_broker_metrics(answers: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, ans in zip(metric_keys(), answers, strict=True):
        value = ans.get("value") if ans.get("status") == 200 else None
        if value is None:
            continue
        out[key] = value if isinstance(value, dict) else float(value)
    return out


@dataclass
class BrokerMetrics:
    ts_us: int
    broker: int
    values: dict[str, Any]


# ------------------------------------------------------------------------------------------------ librdkafka
@dataclass
class ClientStats:
    """One librdkafka statistics report, reduced: per broker (node id) the window's rtt, int_latency and
    outbuf_latency (avg, p50, p99 in ms; cnt requests), and the producer's queued and in-transmit messages."""

    ts_us: int
    brokers: dict[int, dict[str, dict[str, float]]]
    msgq: int  # messages waiting in the partitions' queues
    xmit_msgq: int  # messages in the broker threads' transmit queues
    inflight: int  # requests sent, awaiting a response (waitresp_cnt)


def parse_client_stats(ts_us: int, raw: str) -> ClientStats:
    doc = json.loads(raw)
    brokers: dict[int, dict[str, dict[str, float]]] = {}
    inflight = 0
    for b in (doc.get("brokers") or {}).values():
        node = int(b.get("nodeid", -1))
        if node < 0:
            continue  # the bootstrap entries
        inflight += int(b.get("waitresp_cnt", 0))
        brokers[node] = {k: {"avg_ms": b[k]["avg"] / 1000, "p50_ms": b[k]["p50"] / 1000,
                             "p99_ms": b[k]["p99"] / 1000, "cnt": b[k]["cnt"]}
                         for k in ("rtt", "int_latency", "outbuf_latency") if k in b}
    msgq = xmit = 0
    for t in (doc.get("topics") or {}).values():
        for p in (t.get("partitions") or {}).values():
            if int(p.get("partition", -1)) >= 0:
                msgq += int(p.get("msgq_cnt", 0))
                xmit += int(p.get("xmit_msgq_cnt", 0))
    return ClientStats(ts_us, brokers, msgq, xmit, inflight)


def summarize_client(stats: list[ClientStats], until_us: int) -> dict[str, Any]:
    """Per component, the count-weighted mean of the windows' averages and the median of their p99 (over every
    broker), in the windows ending before until_us (the steady state before the first fault)."""
    out: dict[str, Any] = {}
    windows = [s for s in stats if s.ts_us <= until_us]
    for comp in ("int_latency", "outbuf_latency", "rtt"):
        rows = [b[comp] for s in windows for b in s.brokers.values() if comp in b and b[comp]["cnt"] > 0]
        n = sum(r["cnt"] for r in rows)
        out[comp] = {"mean_ms": round(sum(r["avg_ms"] * r["cnt"] for r in rows) / n, 2) if n else None,
                     "p99_ms": round(statistics.median(r["p99_ms"] for r in rows), 2) if rows else None,
                     "samples": n}
    out["msgq_max"] = max((s.msgq for s in stats), default=0)
    out["xmit_msgq_max"] = max((s.xmit_msgq for s in stats), default=0)
    out["inflight_mean"] = round(statistics.fmean(s.inflight for s in windows), 2) if windows else None
    return out


def summarize_brokers(metrics: list[BrokerMetrics], since_us: int, until_us: int) -> dict[str, Any]:
    """Per request and component, the mean time over the requests the brokers served in [since_us, until_us]
    (from each broker's cumulative Count and Mean: Σ ΔCount·ΔMean-weighted), and the largest p99 the brokers'
    histograms report at the end of the window; the produce purgatory's mean and largest size."""
    by_broker: dict[int, list[BrokerMetrics]] = {}
    for m in metrics:
        if since_us <= m.ts_us <= until_us:
            by_broker.setdefault(m.broker, []).append(m)
    out: dict[str, Any] = {}
    for request in REQUESTS:
        for name in REQUEST_TIMES:
            key = f"{request}.{name}"
            total = count = 0.0
            p99 = []
            for series in by_broker.values():
                have = [m.values[key] for m in series if isinstance(m.values.get(key), dict)]
                if len(have) < 2:
                    continue
                for a, b in itertools.pairwise(have):
                    if b["Count"] >= a["Count"]:
                        total += b["Mean"] * b["Count"] - a["Mean"] * a["Count"]
                        count += b["Count"] - a["Count"]
                    else:  # a restarted broker's counters start again
                        total += b["Mean"] * b["Count"]
                        count += b["Count"]
                p99.append(have[-1]["99thPercentile"])
            out[key] = {"mean_ms": round(total / count, 2) if count else None,
                        "p99_ms": round(max(p99), 2) if p99 else None, "requests": int(count)}
    for op in PURGATORIES:
        sizes = [m.values[f"PurgatorySize.{op}"] for s in by_broker.values() for m in s
                 if f"PurgatorySize.{op}" in m.values]
        out[f"PurgatorySize.{op}"] = {"mean": round(statistics.fmean(sizes), 2) if sizes else None,
                                      "max": max(sizes) if sizes else None}
    return out


def client_round_trip_us(rec: Any) -> int:
    """The recorded trace's `client_round_trip_us` (SPEC §3.7 K-7, §12.1): the median, over every broker's
    statistics window of the acks=0 and acks=1 producers ending before the first fault, of librdkafka's `rtt`
    p50 (request sent to response read, µs). Those producers' requests are answered at the leader's append;
    an acks=all request's rtt also holds its wait in the produce purgatory and, behind it, the connection's
    next requests' wait in the broker's socket, which K-6 models apart. After a fault requests wait on elections
    and reconnects, which the model has separately, so only the steady windows before it count.

    A run with acks=all producers only: the brokers' own part of a Produce round trip, TotalTimeMs −
    RemoteTimeMs (request queue, the leader's append, response queue and send; the purgatory wait out), mean over
    the same steady span; the network's share, which no instrument isolates, is left out. Without either (no
    Kafka policy, no windows): DEFAULT_CLIENT_ROUND_TRIP_US."""
    kafka = [i for i, p in enumerate(rec.policies) if isinstance(p, KafkaPolicy)]
    if not kafka:
        return DEFAULT_CLIENT_ROUND_TRIP_US  # RocketMQ: its model has no round trip term
    first_fault = min((t for t, _, _ in rec.faults), default=rec.schedule.duration_us)
    p50s = [b["rtt"]["p50_ms"] for i in kafka if rec.policies[i].acks is not Acks.ALL and i < len(rec.client_stats)
            for s in rec.client_stats[i] if s.ts_us <= first_fault
            for b in s.brokers.values() if "rtt" in b and b["rtt"]["cnt"] > 0]
    if p50s:
        return round(statistics.median(p50s) * 1000)
    brokers = summarize_brokers(rec.broker_metrics, 0, first_fault)
    total, remote = brokers["Produce.TotalTimeMs"]["mean_ms"], brokers["Produce.RemoteTimeMs"]["mean_ms"]
    if total is None or remote is None:
        return DEFAULT_CLIENT_ROUND_TRIP_US
    return max(0, round((total - remote) * 1000))


# ------------------------------------------------------------------------------------------------ CPU
def _ticks(stat: str) -> tuple[int, int, str]:
    """(pgrp, utime + stime in clock ticks, comm) from a /proc/<pid>/stat line."""
    head, rest = stat.rsplit(")", 1)
    fields = rest.split()
    return int(fields[2]), int(fields[11]) + int(fields[12]), head.split("(", 1)[1]


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (0 once it is gone)."""
    raw = _read(f"/proc/{pid}/stat")
    return _ticks(raw)[1] / os.sysconf("SC_CLK_TCK") if raw else 0.0


def thread_ids() -> set[int]:
    return {int(t) for t in os.listdir(f"/proc/{os.getpid()}/task")}


@dataclass
class CpuMeter:
    """CPU seconds per process group the run started (the controller, every broker incarnation) and of this
    process (librdkafka's threads, named rdk:*, apart), sampled every `every_s` on its own thread: a process's
    last reading before it died counts. Also the machine's 1-minute load average at every sample."""

    groups: dict[int, str]  # pgid -> node name, kept up to date by the caller
    threads: dict[int, str] = field(default_factory=dict)  # this process's threads by name (`label_threads`)
    every_s: float = 1.0
    first: dict[tuple[str, int], int] = field(default_factory=dict)
    last: dict[tuple[str, int], int] = field(default_factory=dict)
    load: list[float] = field(default_factory=list)
    t_start: float = 0.0
    t_end: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self) -> None:
        seen: dict[tuple[str, int], int] = {}
        groups = dict(self.groups)
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            raw = _read(f"/proc/{entry}/stat")
            if raw is None:
                continue
            pgrp, ticks, _ = _ticks(raw)
            if pgrp in groups:
                seen[(groups[pgrp], int(entry))] = ticks
        me = os.getpid()
        for tid in os.listdir(f"/proc/{me}/task"):
            raw = _read(f"/proc/{me}/task/{tid}/stat")
            if raw is None:
                continue
            _, ticks, comm = _ticks(raw)
            name = self.threads.get(int(tid)) or ("librdkafka" if comm.startswith("rdk:") else "python")
            key = (name, int(tid))
            seen[key] = ticks
        for key, ticks in seen.items():
            self.first.setdefault(key, ticks)
            self.last[key] = ticks
        raw = _read("/proc/loadavg")
        if raw:
            self.load.append(float(raw.split()[0]))

    def __getstate__(self) -> dict[str, Any]:
        """Its readings only: a stopped meter goes into the run's recording (`testbed.job.RECORDING`)."""
        state = dict(self.__dict__)
        state["_stop"], state["_thread"] = None, None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _stop=threading.Event())

    def label_threads(self, label: str, before: set[int]) -> None:
        """Name this process's threads started since `before` (`thread_ids`), e.g. one producer's."""
        for tid in thread_ids() - before:
            self.threads[tid] = label

    def start(self) -> None:
        self.t_start = time.monotonic()
        self.sample()

        def loop() -> None:
            while not self._stop.wait(self.every_s):
                self.sample()

        self._thread = threading.Thread(target=loop, daemon=True, name="testbed-cpu")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.sample()
        self.t_end = time.monotonic()

    def shares(self) -> dict[str, Any]:
        """CPU share per node (1.0 = one core busy for the whole window) and the load average seen."""
        wall = max(1e-9, self.t_end - self.t_start)
        hz = os.sysconf("SC_CLK_TCK")
        per: dict[str, float] = {}
        for key, ticks in self.last.items():
            per[key[0]] = per.get(key[0], 0.0) + (ticks - self.first[key]) / hz / wall
        return {"cpu_share": {k: round(v, 3) for k, v in sorted(per.items())},
                "cpu_share_total": round(sum(per.values()), 3), "cores": os.cpu_count(),
                "load_1m": {"mean": round(statistics.fmean(self.load), 2) if self.load else None,
                            "max": max(self.load, default=None)}, "wall_s": round(wall, 1)}


# ------------------------------------------------------------------------------------------------ broker logs
#: ReplicaManager.applyDelta's line when a broker applies metadata that makes it follower of partitions it led
#: (in a controlled shutdown: the controller has moved its leaderships away).
RESIGNED = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] \w+ .*Transitioning \d+ partition\(s\) to "
                      r"local followers")


def log_instant_us(stamp: str) -> int:
    """A log4j `[%d]` stamp (the JVM runs in UTC, `testbed.cluster.JVM_FLAGS`) as µs since the epoch."""
    t = dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=dt.UTC)
    return int(t.timestamp() * 1_000_000)


def resigned_at(log: Path, after_us: int, before_us: int | None = None) -> int | None:
    """The first instant in [after_us, before_us] (epoch µs: the SIGTERM and the process's exit) the broker's
    log shows it turning follower; None when it led nothing (a later line is its next incarnation's)."""
    if not log.exists():
        return None
    for line in log.read_text(errors="replace").splitlines():
        m = RESIGNED.match(line)
        if m:
            t = log_instant_us(m.group(1))
            if before_us is not None and t > before_us:
                return None
            if t >= after_us - 1000:  # the log's clock has millisecond resolution
                return max(t, after_us)
    return None


# ------------------------------------------------------------------------------------------------ per case
def case_instruments(rec: Any, i: int) -> dict[str, Any]:
    """What comparison.json carries per (scenario, policy) beside SPEC §12's figures: the client's and the
    brokers' split of the time, in the steady state before the first fault and over the whole trace, and the
    CPU shares (the brokers serve every policy of the run, so their figures are the run's)."""
    duration = rec.schedule.duration_us
    first_fault = min((t for t, _, _ in rec.faults), default=duration)
    stats = rec.client_stats[i] if rec.client_stats else []
    return {"client_steady": summarize_client(stats, first_fault),
            "client_run": summarize_client(stats, duration),
            "brokers_steady": summarize_brokers(rec.broker_metrics, 0, first_fault),
            "brokers_run": summarize_brokers(rec.broker_metrics, 0, duration),
            "cpu": rec.cpu.shares() if rec.cpu is not None else None}


def series(rec: Any) -> dict[str, Any]:
    """Every instrument reading of the run (DIR/instruments.json), µs from the run's start."""
    return {"broker_metrics": [{"ts_us": m.ts_us, "broker": m.broker, **m.values} for m in rec.broker_metrics],
            "client_stats": [[{"ts_us": s.ts_us, "brokers": s.brokers, "msgq": s.msgq, "xmit_msgq": s.xmit_msgq,
                               "inflight": s.inflight} for s in stats] for stats in rec.client_stats]}


def flat(d: dict[str, Any], prefix: str = "instruments") -> dict[str, float]:
    """Every number of a `case_instruments` summary under a dotted key (MLflow metrics)."""
    out: dict[str, float] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}"
        if isinstance(v, dict):
            out.update(flat(v, key))
        elif isinstance(v, int | float) and not isinstance(v, bool):
            out[key] = float(v)
    return out
