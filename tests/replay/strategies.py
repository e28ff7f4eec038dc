"""Hypothesis strategies: valid random traces (SPEC §2.3) and policies, for differential tests."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import strategies as st

from replay.policies import KafkaPolicy, parse_policy
from schemas.trace import EVENT_ARROW_SCHEMA, Manifest
from schemas.units import MS


@st.composite
def traces(draw, max_brokers: int = 4, max_events: int = 60, duration_ms: int = 40_000,
           kinds: tuple[str, ...] | None = None, tails_ms: tuple[int, ...] | None = None):
    """A valid trace: per-broker fault state machines, replication reports only while up and reachable (with
    non-decreasing upto since the last restart), bursts of produces, same-instant collisions on a coarse grid.
    Validity is judged in SPEC §2.2's same-instant order (faults, then restarts and heals, then reports), not in
    row order: a broker changes fault state at most once per instant, and not after reporting at that instant
    (else "crash, restart, crash" at one instant would crash a down broker, which the trace gate rejects).
    `kinds` (event kinds to sample from, repeated for weight) and `tails_ms` (time after the last event) default
    to the mix the Kafka tests were written with."""
    n = draw(st.integers(2, max_brokers))
    grid = draw(st.sampled_from([1, 10, 100, 1000]))  # coarse grids make same-instant events common
    rows = []
    up = [True] * n
    iso = [False] * n
    last_upto = [0] * n
    touched = [-1] * n  # the last instant a broker changed state or reported
    msg_id = 0
    t = 0
    for _ in range(draw(st.integers(1, max_events))):
        t += draw(st.integers(0, 3000)) // grid * grid
        if t > duration_ms:
            break
        ts = t * MS
        b = draw(st.integers(0, n - 1))
        kind = draw(st.sampled_from(list(kinds) if kinds else ["produce"] * 6 + ["replicate"] * 6 + [
            "crash", "power_loss", "disk_loss", "shutdown", "restart", "isolate", "heal"]))
        if kind not in ("produce", "replicate") and touched[b] == ts:
            continue
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
                touched[b] = ts
        elif kind in ("crash", "power_loss", "disk_loss", "shutdown"):
            if up[b]:
                up[b] = False
                rows.append((ts, kind, b, None, None, None, None, None))
                touched[b] = ts
        elif kind == "restart":
            if not up[b]:
                up[b] = True
                last_upto[b] = draw(st.integers(0, ts))  # a new incarnation may start anywhere
                rows.append((ts, kind, b, None, None, None, None, None))
                touched[b] = ts
        elif kind == "isolate":
            if not iso[b]:
                iso[b] = True
                rows.append((ts, kind, b, None, None, None, None, None))
                touched[b] = ts
        elif kind == "heal" and iso[b]:
            iso[b] = False
            rows.append((ts, kind, b, None, None, None, None, None))
            touched[b] = ts
    cols = list(zip(*rows, strict=True)) if rows else [[] for _ in range(8)]
    table = pa.table({f.name: pa.array(list(c), f.type) for f, c in zip(EVENT_ARROW_SCHEMA, cols, strict=True)},
                     schema=EVENT_ARROW_SCHEMA)
    duration = max(duration_ms, t) * MS + draw(st.sampled_from([ms * MS for ms in tails_ms or (0, 7, 30_000)]))
    manifest = Manifest("hyp", tuple(__import__("schemas.trace").trace.Broker(i, f"r{i % 2}") for i in range(n)),
                        duration)
    return manifest, table


#: Kafka faults that the v1.1 rules turn on (SPEC §3.7): isolations that heal before or after their fencing
#: deadline (9 s KRaft, 18 s ZooKeeper) while other replicas fail, and long refusals (backoff cap), so few
#: events spread over a longer trace.
KAFKA_FAULT_KINDS = ("produce",) * 5 + ("replicate",) * 5 + (
    "isolate", "isolate", "isolate", "heal", "heal", "crash", "disk_loss", "shutdown", "restart", "restart")


def kafka_traces():
    return st.one_of(traces(), traces(max_brokers=4, max_events=45, duration_ms=60_000, kinds=KAFKA_FAULT_KINDS,
                                      tails_ms=(0, 7, 30_000)))


@st.composite
def kafka_policies(draw, n_brokers: int) -> KafkaPolicy:
    rf = draw(st.integers(1, n_brokers))
    params = {
        "partitions": draw(st.integers(1, 3)),
        "replication_factor": rf,
        "acks": draw(st.sampled_from(["0", "1", "all", "all"])),
        "min_insync_replicas": draw(st.integers(1, 4)),  # above the replication factor too (SPEC §3.7 K-1)
        "unclean_leader_election": draw(st.booleans()),
        "eligible_leader_replicas": draw(st.booleans()),
        "strict_min_isr": draw(st.booleans()),
        "controller": draw(st.sampled_from(["kraft", "zookeeper"])),
        "replica_lag_time_max_ms": draw(st.sampled_from([2000, 5000, 30000])),
        "request_timeout_ms": draw(st.sampled_from([1000, 3000, 30000])),
        "delivery_timeout_ms": draw(st.sampled_from([2000, 8000, 20000, 120000])),
        "retry_backoff_ms": draw(st.sampled_from([100, 700, 2000])),
        # 100 against 100 is v1's constant backoff; 5000 is reached after several refusals (SPEC §3.7 K-2)
        "retry_backoff_max_ms": draw(st.sampled_from([100, 1000, 5000])),
        "metadata_max_age_ms": draw(st.sampled_from([3000, 12000, 300000])),
        "client_failover_ms": draw(st.sampled_from([0, 100, 1500])),
        "assignment": draw(st.sampled_from(["seed", "kafka"])),
        # the client's pipeline (SPEC §3.7 K-6, K-7): a linger longer than a fetch gap, one-message batches
        "linger_ms": draw(st.sampled_from([0, 5, 300])),
        "batch_size": draw(st.sampled_from([100, 16384])),
        "max_in_flight_requests_per_connection": draw(st.sampled_from([1, 2, 5])),
    }
    per_request = draw(st.sampled_from([None, 1, 2]))
    if per_request is not None:
        params["partitions_per_request"] = per_request
    flush = draw(st.sampled_from(["os", "sync", "interval"]))
    if flush == "sync":
        params["flush"] = "sync"
    elif flush == "interval":
        params["flush_interval_ms"] = draw(st.sampled_from([10, 1000, 7000]))
    return parse_policy("kafka:" + ",".join(f"{k}={v}" for k, v in params.items()))


# ------------------------------------------------------------------------------------ RocketMQ families
def _flush_params(draw, intervals: list[int]) -> dict:
    flush = draw(st.sampled_from(["default", "sync", "interval", "null"]))
    if flush == "sync":
        return {"flush": "sync"}
    if flush == "interval":
        return {"flush_interval_ms": draw(st.sampled_from(intervals))}
    if flush == "null":
        return {"flush_interval_ms": "null"}
    return {}


def _client_params(draw) -> dict:
    return {
        "queues_per_group": draw(st.integers(1, 3)),
        "retry_times_when_send_failed": draw(st.integers(0, 2)),
        # short polls put faults at every phase of the route poll (SPEC §3.7 R-1), long ones after the trace
        "route_refresh_ms": draw(st.sampled_from([300, 700, 1000, 5000, 30000])),
        "delivery_timeout_ms": draw(st.sampled_from([800, 3000, 9000])),
    }


def _policy(family: str, params: dict):
    return parse_policy(family + ":" + ",".join(f"{k}={v}" for k, v in params.items()))


@st.composite
def rocketmq_policies(draw, n_brokers: int):
    s = draw(st.integers(0, min(2, n_brokers - 1)))
    params = {
        "slaves_per_master": s,
        "broker_role": draw(st.sampled_from(["ASYNC_MASTER", "SYNC_MASTER", "SYNC_MASTER"])),
        "in_sync_replicas": draw(st.integers(1, 3)),
        "flush_least_bytes": draw(st.sampled_from([0, 2500, 16384])),
        "flush_thorough_interval_ms": draw(st.sampled_from([1000, 10000])),
        "slave_timeout_ms": draw(st.sampled_from([400, 3000])),
        "slave_not_available": draw(st.booleans()),  # SPEC §3.7 R-6: 4.x's answer at once, or 5.x's wait
        "ordered": draw(st.booleans()),
        "reconcile": draw(st.sampled_from(["master_wins", "union"])),
        **_client_params(draw), **_flush_params(draw, [10, 500, 3000]),
    }
    return _policy("rocketmq", params)


@st.composite
def dledger_policies(draw, n_brokers: int):
    params = {
        # one group of every broker half the time: elections in single-group layouts
        "group_size": draw(st.one_of(st.just(min(5, n_brokers)), st.integers(1, min(5, n_brokers)))),
        "heartbeat_ms": draw(st.sampled_from([300, 2000])),
        "max_heartbeat_leak": draw(st.integers(1, 3)),
        "vote_delay_ms": draw(st.sampled_from([0, 650])),
        "vote_wait_ms": draw(st.sampled_from([0, 2500])),
        "max_wait_ack_ms": draw(st.sampled_from([300, 2500])),
        **_client_params(draw), **_flush_params(draw, [1, 10, 700]),
    }
    return _policy("dledger", params)


@st.composite
def controller_policies(draw, n_brokers: int):
    params = {
        "slaves_per_master": draw(st.integers(0, min(2, n_brokers - 1))),
        "flush_least_bytes": draw(st.sampled_from([0, 2500, 16384])),
        "ha_max_time_slave_not_catchup_ms": draw(st.sampled_from([2000, 15000])),
        "check_sync_state_set_period_ms": draw(st.sampled_from([700, 5000])),
        "ha_housekeeping_interval_ms": draw(st.sampled_from([1000, 4000, 20000])),  # C-1
        "in_sync_replicas": draw(st.integers(1, 3)),
        "all_ack_in_sync_state_set": draw(st.sampled_from([False, True, True])),  # slave losses under allAck
        "min_insync_replicas": draw(st.integers(1, 3)),
        "enable_elect_unclean_master": draw(st.booleans()),
        "controller_heartbeat_timeout_ms": draw(st.sampled_from([1000, 10000])),
        "controller_scan_ms": draw(st.sampled_from([300, 5000])),
        "slave_timeout_ms": draw(st.sampled_from([400, 3000])),
        **_client_params(draw), **_flush_params(draw, [10, 500, 3000]),
    }
    return _policy("rocketmq-controller", params)


ROCKETMQ_POLICY_STRATEGIES = {"rocketmq": rocketmq_policies, "dledger": dledger_policies,
                              "rocketmq-controller": controller_policies}


#: A mix for broker groups: more faults and restarts (quorum losses, elections), short tails (pending sends).
GROUP_KINDS = ("produce",) * 7 + ("replicate",) * 6 + (
    "crash", "crash", "power_loss", "disk_loss", "shutdown", "restart", "restart", "restart", "isolate", "heal")


#: Crashes without many restarts and steady sends: groups that lose their majority while the leader is up
#: (DLedger max_wait_ack failover to another group).
QUORUM_KINDS = ("produce",) * 8 + ("replicate",) * 3 + ("crash",) * 3 + ("restart", "isolate")


#: Leaders cut off and back (DLedger leaders that keep taking writes, R-4; controller zombies, R-1) and slaves that
#: crash under allAckInSyncStateSet (C-1).
ISOLATION_KINDS = ("produce",) * 7 + ("replicate",) * 5 + ("isolate",) * 3 + ("heal",) * 3 + (
    "crash", "power_loss", "restart", "restart")


def group_traces(max_brokers: int = 6, max_events: int = 70):
    return st.one_of(traces(max_brokers=max_brokers, max_events=max_events),
                     traces(max_brokers=max_brokers, max_events=max_events, duration_ms=10_000, kinds=GROUP_KINDS,
                            tails_ms=(0, 1, 1500, 7000)),
                     traces(max_brokers=max_brokers, max_events=max_events, duration_ms=8_000, kinds=QUORUM_KINDS,
                            tails_ms=(0, 1, 3000)),
                     traces(max_brokers=max_brokers, max_events=max_events, duration_ms=12_000,
                            kinds=ISOLATION_KINDS, tails_ms=(0, 1, 2500, 9000)))


def event_table(events) -> pa.Table:
    """A trace table from hand-written events: (ts_us, kind, broker | msg_id[, upto_us]); produce events carry
    msg_id, size 1 and producer 0, no key (the pinned regressions' notation)."""
    rows = []
    for e in events:
        ts, kind, who = e[:3]
        produce = kind == "produce"
        rows.append({"ts_us": ts, "kind": kind, "broker": None if produce else who, "msg_id": who if produce else None,
                     "key": None, "size_bytes": 1 if produce else None, "producer_id": 0 if produce else None,
                     "upto_us": e[3] if kind == "replicate" else None})
    return pa.Table.from_pylist(rows, schema=EVENT_ARROW_SCHEMA)

