"""The testbed's instruments (testbed.instruments) on real inputs: librdkafka's own statistics, a broker log
line as Kafka writes it, the brokers' cumulative request metrics across a restart, this process's CPU."""

from __future__ import annotations

import time

from testbed.instruments import (
    BrokerMetrics,
    CpuMeter,
    broker_metric_requests,
    log_instant_us,
    metric_keys,
    parse_broker_metrics,
    parse_client_stats,
    resigned_at,
    summarize_brokers,
    summarize_client,
)


def test_librdkafka_statistics_are_read():
    """A real producer's statistics (no broker answers: only the bootstrap entry, which is not a node)."""
    from confluent_kafka import Producer

    raw: list[str] = []
    p = Producer({"bootstrap.servers": "127.0.0.1:1", "statistics.interval.ms": 100, "stats_cb": raw.append,
                  "log_level": 0})
    p.produce("t", b"x")
    deadline = time.monotonic() + 5
    while len(raw) < 2 and time.monotonic() < deadline:
        p.poll(0.1)
    p.purge()
    s = parse_client_stats(7, raw[-1])
    assert (s.ts_us, s.brokers, s.inflight) == (7, {}, 0)
    # the message waits in its topic's unassigned queue (partition -1), not a partition's
    assert s.msgq == 0


def test_client_summary_weights_windows_by_requests():
    def window(ts, avg, p99, cnt):
        comp = {"avg_ms": avg, "p50_ms": avg, "p99_ms": p99, "cnt": cnt}
        return parse_stats_like(ts, {0: {"rtt": comp, "int_latency": comp, "outbuf_latency": comp}})

    stats = [window(1, 10.0, 20.0, 1), window(2, 30.0, 40.0, 3), window(99, 1000.0, 2000.0, 5)]
    out = summarize_client(stats, until_us=50)
    assert out["rtt"] == {"mean_ms": 25.0, "p99_ms": 30.0, "samples": 4}


def parse_stats_like(ts, brokers):
    from testbed.instruments import ClientStats

    return ClientStats(ts, brokers, 0, 0, 1)


def test_broker_metrics_sum_over_a_restart():
    """Cumulative Count and Mean per broker: the window's mean over the requests served in it; a restarted
    broker's counters start again and are added, not subtracted."""
    def m(ts, broker, count, mean, p99=5.0):
        return BrokerMetrics(ts, broker, {"Produce.TotalTimeMs": {"Count": count, "Mean": mean,
                                                                  "99thPercentile": p99}})

    series = [m(0, 0, 100, 10.0), m(1, 0, 200, 20.0), m(2, 0, 10, 50.0, p99=80.0),  # restarted at 2
              m(0, 1, 0, 0.0), m(1, 1, 10, 100.0)]
    out = summarize_brokers(series, 0, 10)["Produce.TotalTimeMs"]
    # broker 0: (4000 − 1000) over 100 requests, then 500 over 10; broker 1: 1000 over 10
    assert out["requests"] == 120 and out["mean_ms"] == round(4500 / 120, 2) and out["p99_ms"] == 80.0


def test_jolokia_answers_are_matched_to_their_requests():
    answers = [{"status": 200, "value": {"Count": i, "Mean": 1.0}} for i in range(len(broker_metric_requests()))]
    answers[-1] = {"status": 404, "error": "no such mbean"}
    answers[-2] = {"status": 200, "value": 3}
    out = parse_broker_metrics(answers)
    keys = metric_keys()
    assert out[keys[0]]["Count"] == 0 and out[keys[-2]] == 3.0 and keys[-1] not in out


def test_resignation_read_from_the_broker_log(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(
        "[2026-11-28 20:00:01,000] INFO [Broker id=0] Transitioning 8 partition(s) to local followers. "
        "(state.change.logger)\n"
        "[2026-11-28 20:00:20,068] INFO [BrokerLifecycleManager id=0] Beginning controlled shutdown. "
        "(kafka.server.BrokerLifecycleManager)\n"
        "[2026-11-28 20:00:20,137] INFO [Broker id=0] Transitioning 8 partition(s) to local followers. "
        "(state.change.logger)\n")
    signal = log_instant_us("2026-11-28 20:00:20,050")
    assert resigned_at(log, signal) - signal == 87_000  # not the start-up line before the signal
    assert resigned_at(log, log_instant_us("2026-11-28 20:00:30,000")) is None
    # exited before any such line: it led nothing (a line after the exit is a restarted broker's)
    assert resigned_at(log, signal, before_us=log_instant_us("2026-11-28 20:00:20,100")) is None
    assert resigned_at(tmp_path / "absent.log", signal) is None


def test_cpu_meter_sees_this_process_work():
    meter = CpuMeter({}, every_s=0.1)
    meter.start()
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        pass
    meter.stop()
    shares = meter.shares()
    # at least a little of a core on a loaded machine, at most every core (other threads of this process count)
    assert 0.02 <= shares["cpu_share"]["python"] <= shares["cores"] + 0.2
    assert shares["load_1m"]["max"] is not None and shares["wall_s"] >= 0.5


def test_summaries_flatten_to_metric_keys():
    from testbed.instruments import flat

    out = flat({"cpu": {"cpu_share": {"broker-0": 0.2}, "cores": 2, "load_1m": {"max": None}},
                "client_steady": {"rtt": {"mean_ms": 4.5, "samples": 3}}})
    assert out == {"instruments.cpu.cpu_share.broker-0": 0.2, "instruments.cpu.cores": 2.0,
                   "instruments.client_steady.rtt.mean_ms": 4.5, "instruments.client_steady.rtt.samples": 3.0}
