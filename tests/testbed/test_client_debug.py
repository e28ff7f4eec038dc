"""`replab testbed run --client-debug`: the Kafka producers' librdkafka debug log, one line per event with its Unix
time, in the cluster's folder; refused for RocketMQ policies before anything starts. A real librdkafka producer,
pointed at a port nothing listens on (it logs its broker threads and connection attempts)."""

from __future__ import annotations

import re
import time

from pipelines.cli import main


def test_the_debug_log_holds_librdkafkas_events_with_their_instants(tmp_path):
    from confluent_kafka import Producer

    from replay.policies import parse_policy
    from testbed.clients import close_debug_log, debug_logging, producer_config

    log = tmp_path / "librdkafka-replab-p0.log"
    config = producer_config(parse_policy("kafka-durable"), "127.0.0.1:1") | debug_logging("broker,eos", log)
    before = time.time()
    producer = Producer(config)
    producer.produce("replab-p0", b"x")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and "IDEMPSTATE" not in (log.read_text() if log.exists() else ""):
        producer.poll(0.1)
    producer.purge()
    producer.flush(1)
    lines = log.read_text().splitlines()
    events = [re.match(r"(\d+\.\d{6}) (\w+) \[", line) for line in lines]
    assert lines and all(events), lines[:3]
    assert {"BROKER", "IDEMPSTATE"} <= {m[2] for m in events}  # broker threads; the idempotent producer's states
    assert all(before - 1 <= float(m[1]) <= time.time() + 1 for m in events)
    handler = config["logger"].handlers[0]
    close_debug_log(config)
    assert handler.stream is None and not config["logger"].handlers  # the file is closed once flushed


def test_rocketmq_runs_refuse_it_before_starting_anything(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["testbed", "run", "--scenario", "testbed-rmq-dledger-leader-crash", "--policy", "dledger",
                 "--out", str(out), "--no-tables", "--client-debug", "msg"])
    assert code == 2
    assert "--client-debug" in capsys.readouterr().err
    assert not out.exists()
