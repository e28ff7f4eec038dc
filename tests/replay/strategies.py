"""Hypothesis strategies: valid random traces (SPEC §2.3) and policies, for differential tests."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import strategies as st

from replay.policies import KafkaPolicy, parse_policy
from schemas.trace import EVENT_ARROW_SCHEMA, Manifest

MS = 1000


@st.composite
def traces(draw, max_brokers: int = 4, max_events: int = 60, duration_ms: int = 40_000):
    """A valid trace: per-broker fault state machines, replication reports only while up and reachable (with
    non-decreasing upto since the last restart), bursts of produces, same-instant collisions on a coarse grid."""
    n = draw(st.integers(2, max_brokers))
    grid = draw(st.sampled_from([1, 10, 100, 1000]))  # coarse grids make same-instant events common
    rows = []
    up = [True] * n
    iso = [False] * n
    last_upto = [0] * n
    msg_id = 0
    t = 0
    for _ in range(draw(st.integers(1, max_events))):
        t += draw(st.integers(0, 3000)) // grid * grid
        if t > duration_ms:
            break
        ts = t * MS
        b = draw(st.integers(0, n - 1))
        kind = draw(st.sampled_from(["produce"] * 6 + ["replicate"] * 6 + [
            "crash", "power_loss", "disk_loss", "shutdown", "restart", "isolate", "heal"]))
        if kind == "produce":
            for _ in range(draw(st.integers(1, 4))):
                msg_id += 1
                key = draw(st.one_of(st.none(), st.sampled_from(["a", "b", "k1", "k22", "zz"])))
                rows.append((ts, "produce", None, msg_id, key, draw(st.integers(1, 3000)), 0, None))
        elif kind == "replicate":
            if up[b] and not iso[b]:
                upto = draw(st.integers(last_upto[b], ts)) if draw(st.booleans()) else ts - draw(
                    st.integers(0, min(ts - last_upto[b], 50 * MS)))
                upto = max(upto, last_upto[b])
                last_upto[b] = upto
                rows.append((ts, "replicate", b, None, None, None, None, upto))
        elif kind in ("crash", "power_loss", "disk_loss", "shutdown"):
            if up[b]:
                up[b] = False
                rows.append((ts, kind, b, None, None, None, None, None))
        elif kind == "restart":
            if not up[b]:
                up[b] = True
                last_upto[b] = draw(st.integers(0, ts))  # a new incarnation may start anywhere
                rows.append((ts, kind, b, None, None, None, None, None))
        elif kind == "isolate":
            if not iso[b]:
                iso[b] = True
                rows.append((ts, kind, b, None, None, None, None, None))
        elif kind == "heal" and iso[b]:
            iso[b] = False
            rows.append((ts, kind, b, None, None, None, None, None))
    cols = list(zip(*rows)) if rows else [[] for _ in range(8)]
    table = pa.table({f.name: pa.array(list(c), f.type) for f, c in zip(EVENT_ARROW_SCHEMA, cols)},
                     schema=EVENT_ARROW_SCHEMA)
    duration = max(duration_ms, t) * MS + draw(st.sampled_from([0, 7 * MS, 30_000 * MS]))
    manifest = Manifest("hyp", tuple(__import__("schemas.trace").trace.Broker(i, f"r{i % 2}") for i in range(n)),
                        duration)
    return manifest, table


@st.composite
def kafka_policies(draw, n_brokers: int) -> KafkaPolicy:
    rf = draw(st.integers(1, n_brokers))
    params = {
        "partitions": draw(st.integers(1, 3)),
        "replication_factor": rf,
        "acks": draw(st.sampled_from(["0", "1", "all", "all"])),
        "min_insync_replicas": draw(st.integers(1, 3)),
        "unclean_leader_election": draw(st.booleans()),
        "eligible_leader_replicas": draw(st.booleans()),
        "strict_min_isr": draw(st.booleans()),
        "controller": draw(st.sampled_from(["kraft", "zookeeper"])),
        "replica_lag_time_max_ms": draw(st.sampled_from([2000, 5000, 30000])),
        "request_timeout_ms": draw(st.sampled_from([1000, 3000, 30000])),
        "delivery_timeout_ms": draw(st.sampled_from([2000, 8000, 20000, 120000])),
        "retry_backoff_ms": draw(st.sampled_from([100, 700, 2000])),
        "metadata_max_age_ms": draw(st.sampled_from([3000, 12000, 300000])),
        "client_failover_ms": draw(st.sampled_from([0, 100, 1500])),
        "assignment": draw(st.sampled_from(["seed", "kafka"])),
    }
    flush = draw(st.sampled_from(["os", "sync", "interval"]))
    if flush == "sync":
        params["flush"] = "sync"
    elif flush == "interval":
        params["flush_interval_ms"] = draw(st.sampled_from([10, 1000, 7000]))
    return parse_policy("kafka:" + ",".join(f"{k}={v}" for k, v in params.items()))
