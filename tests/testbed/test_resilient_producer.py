"""`testbed.clients.ResilientProducer`: when its producer fails fatally, every message that producer held is
reported failed at that instant, once (in the real unclean-election run the fatal producer served none of its
in-flight messages' purge reports, which left them pending), and a new producer takes the next sends. Real
librdkafka producers, pointed at a port nothing listens on, so that what they are given stays queued."""

from __future__ import annotations

import pytest


def test_a_fatal_error_fails_what_the_producer_held_once_and_a_new_producer_continues():
    from confluent_kafka import KafkaError, KafkaException, Producer

    from testbed.clients import ResilientProducer

    config = {"bootstrap.servers": "127.0.0.1:9", "enable.idempotence": True, "log_level": 0,
              "message.timeout.ms": 600_000}
    rp = ResilientProducer(Producer, config)
    reports: list[tuple[int, str | None]] = []

    def on_delivery(mid: int):
        return lambda err, msg: reports.append((mid, None if err is None else err.name()))

    for mid in (1, 2, 3):
        rp.produce("t", value=b"x", partition=0, on_delivery=on_delivery(mid))
    first = rp.producer
    rp._renew(KafkaException(KafkaError(KafkaError._FATAL, "OUT_OF_ORDER_SEQUENCE_NUMBER", fatal=True)))
    # the purge's own reports where the old producer still serves them (here it does), else the fatal error
    assert sorted(m for m, _ in reports) == [1, 2, 3]
    assert {e for _, e in reports} <= {"_PURGE_QUEUE", "_FATAL"}
    assert rp.producer is not first and rp.retired == [first] and rp.fatal == ["_FATAL"]
    rp.produce("t", value=b"x", partition=0, on_delivery=on_delivery(4))
    first.poll(0.1)  # the old producer's own purge reports, if any, are not the application's any more
    assert len(reports) == 3 and list(rp.held) == [3]
    with pytest.raises(KafkaException):  # anything but a fatal error is the caller's
        rp._renew(KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT)))
    rp.purge(in_queue=True)


def test_messages_a_fatal_producer_never_reports_fail_with_the_fatal_error():
    """As in the real run: the old producer serves no purge report (here: it is not purged at all)."""
    from confluent_kafka import KafkaError, KafkaException, Producer

    from testbed.clients import ResilientProducer

    class Unreporting(Producer):
        def purge(self, *args, **kwargs) -> None:
            pass

    rp = ResilientProducer(Unreporting, {"bootstrap.servers": "127.0.0.1:9", "log_level": 0})
    reports: list[tuple[int, str]] = []
    for mid in (1, 2):
        rp.produce("t", value=b"x", partition=0,
                   on_delivery=lambda err, msg, mid=mid: reports.append((mid, err.name())))
    rp._renew(KafkaException(KafkaError(KafkaError._FATAL, "OUT_OF_ORDER_SEQUENCE_NUMBER", fatal=True)))
    assert sorted(reports) == [(1, "_FATAL"), (2, "_FATAL")] and rp.held == {}
    for p in rp.retired:
        Producer.purge(p, in_queue=True)
        p.poll(0.1)
    assert len(reports) == 2
