"""The round trip a recorded Kafka trace carries (`testbed.instruments.client_round_trip_us`, SPEC §3.7 K-7): from
librdkafka's own `rtt` statistic of the producers the produce purgatory does not hold, in the steady windows
before the first fault. No cluster: scripted statistics windows and broker metrics."""

from __future__ import annotations

import pyarrow as pa

from replay.policies import parse_policy
from schemas.trace import DEFAULT_CLIENT_ROUND_TRIP_US, Broker, Kind, Manifest
from testbed.instruments import BrokerMetrics, ClientStats, client_round_trip_us
from testbed.observe import Recording
from testbed.schedule import Schedule
from testbed.trace_writer import write_trace

ACKS1, ACKS_ALL = "kafka-acks1", "kafka:acks=all,min_insync_replicas=2"
FAULT_US = 3_000_000


def _window(ts_us: int, rtt: dict[int, tuple[float, int]]) -> ClientStats:
    """One statistics window: per broker (rtt p50 in ms, requests answered in the window)."""
    brokers = {b: {"rtt": {"avg_ms": p50, "p50_ms": p50, "p99_ms": p50, "cnt": cnt}} for b, (p50, cnt) in rtt.items()}
    return ClientStats(ts_us, brokers, 0, 0, 0)


def _recording(policies: list[str], stats: list[list[ClientStats]], faults=((FAULT_US, Kind.CRASH, 0),)):
    produce = pa.table({"ts_us": pa.array([10], pa.int64()), "msg_id": pa.array([1], pa.int64()),
                        "key": pa.array(["k"]), "size_bytes": pa.array([100], pa.int32()),
                        "producer_id": pa.array([0], pa.int32())})
    schedule = Schedule("s", "s-recorded", (Broker(0, "r0"), Broker(1, "r1"), Broker(2, "r2")), 5_000_000,
                        produce, list(faults), 1000, {"scenario": "s"})
    rec = Recording(schedule, [parse_policy(p) for p in policies], 0)
    rec.sent_us = {1: 10}
    rec.faults = list(faults)
    rec.client_stats = stats
    return rec


def _acks1_windows() -> list[ClientStats]:
    return [
        _window(1_000_000, {0: (4.0, 10), 1: (2.0, 5), 2: (0.0, 0)}),  # broker 2 answered nothing: no reading
        _window(2_000_000, {0: (3.0, 7), 1: (9.0, 1)}),
        _window(3_500_000, {1: (500.0, 3), 2: (400.0, 2)}),  # after the crash: requests wait on the election
    ]


def test_the_median_of_the_acks1_producers_steady_windows_is_written_into_the_manifest(tmp_path):
    # acks=1 windows before the crash: p50s 4, 2, 3 and 9 ms -> median 3.5 ms. The acks=all producer's rtt (its
    # requests wait in the produce purgatory) and the windows after the crash stay out: with either the median
    # would be 3.0 or 4.0 ms.
    acks_all = [_window(1_000_000, {0: (0.5, 100), 1: (0.5, 100)}), _window(2_000_000, {0: (0.5, 100)})]
    rec = _recording([ACKS1, ACKS_ALL], [_acks1_windows(), acks_all])
    assert client_round_trip_us(rec) == 3_500
    manifest = write_trace(rec, tmp_path / "trace")
    assert manifest.client_round_trip_us == 3_500
    assert Manifest.read(tmp_path / "trace").client_round_trip_us == 3_500


def test_without_a_fault_every_window_counts():
    rec = _recording([ACKS1], [_acks1_windows()], faults=())
    assert client_round_trip_us(rec) == 6_500  # 2, 3, 4, 9, 400, 500


def test_acks_all_only_takes_the_brokers_own_part_of_a_produce_round_trip():
    # Cumulative Produce metrics of one broker: 100 requests by the crash, 6 ms of them outside the purgatory
    # (TotalTimeMs 300, RemoteTimeMs 294); the 100 after the crash (1,700 and 706 ms) stay out.
    def m(ts_us: int, count: int, total: float, remote: float) -> BrokerMetrics:
        return BrokerMetrics(ts_us, 0, {"Produce.TotalTimeMs": {"Count": count, "Mean": total, "99thPercentile": 0},
                                        "Produce.RemoteTimeMs": {"Count": count, "Mean": remote,
                                                                 "99thPercentile": 0}})

    rec = _recording([ACKS_ALL, ACKS_ALL], [[_window(1_000_000, {0: (0.5, 100)})], []])
    rec.broker_metrics = [m(0, 0, 0.0, 0.0), m(2_000_000, 100, 300.0, 294.0), m(4_000_000, 200, 1000.0, 500.0)]
    assert client_round_trip_us(rec) == 6_000
    rec.broker_metrics = []  # no broker metrics either: the default
    assert client_round_trip_us(rec) == DEFAULT_CLIENT_ROUND_TRIP_US


def test_rocketmq_recordings_keep_the_default(tmp_path):
    rec = _recording(["dledger"], [[]])
    assert client_round_trip_us(rec) == DEFAULT_CLIENT_ROUND_TRIP_US
    write_trace(rec, tmp_path / "trace")
    assert "client_round_trip_us" not in (tmp_path / "trace" / "manifest.json").read_text()
