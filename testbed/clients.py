"""The confluent-kafka clients of a testbed run: one producer per policy (its acks, timeouts, retry backoff,
idempotence), the warm-up before the clock starts, and the verifying consumer that reads every record back."""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from replay.policies import Acks, KafkaPolicy


def idempotent(policy: KafkaPolicy) -> bool:
    """SPEC §3.1: producers never duplicate. librdkafka allows idempotence with acks=all only."""
    return policy.acks is Acks.ALL


#: The producer settings a policy does not name, at the defaults of Kafka 4.1's Java producer (ProducerConfig),
#: which is what users run: no compression. `linger.ms`, `batch.size` and `max.in.flight.requests.per.connection`
#: are policy parameters (Kafka 4.1 defaults 5, 16384, 5; `replay/policies.py`) and set from the policy, since
#: librdkafka's own defaults differ (batch.size 1 MB).
CLIENT_DEFAULTS: dict[str, Any] = {
    "compression.type": "none",
}
#: librdkafka's statistics callback cadence (its rtt, int_latency and outbuf_latency windows are this long).
STATS_INTERVAL_MS = 1000


def producer_config(policy: KafkaPolicy, bootstrap: str, stats_cb=None) -> dict[str, Any]:
    """The producer of one policy: its acks, timeouts and backoff, idempotence with acks=all (SPEC §3.1), the
    rest at `CLIENT_DEFAULTS`; with `stats_cb`, librdkafka's statistics every STATS_INTERVAL_MS."""
    acks = {Acks.ZERO: "0", Acks.ONE: "1", Acks.ALL: "all"}[policy.acks]
    stats = {"statistics.interval.ms": STATS_INTERVAL_MS, "stats_cb": stats_cb} if stats_cb is not None else {}
    return {
        **CLIENT_DEFAULTS,
        # the policy's client settings (SPEC §3.7 K-6, K-7): what the replay predicts with is what the producer runs
        "linger.ms": policy.linger_ms,
        "batch.size": policy.batch_size,
        "max.in.flight.requests.per.connection": policy.max_in_flight_requests_per_connection,
        "bootstrap.servers": bootstrap,
        "acks": acks,
        "request.timeout.ms": policy.request_timeout_ms,
        "delivery.timeout.ms": policy.delivery_timeout_ms,
        "retry.backoff.ms": policy.retry_backoff_ms,
        "retry.backoff.max.ms": max(policy.retry_backoff_ms, getattr(policy, "retry_backoff_max_ms", 1000)),
        "enable.idempotence": idempotent(policy),
        "topic.metadata.refresh.interval.ms": policy.metadata_max_age_ms,
        "log_level": 0,
        **stats,
    }


def debug_logging(contexts: str, path: Path) -> dict[str, Any]:
    """Producer settings that log librdkafka's `debug` contexts (e.g. "eos,msg,broker") to `path`, one line per
    event with its Unix time: what the client did request by request (which partition a freed slot went to, a
    partition's drain after its leader changed), which its statistics only sum up. The lines reach the file when
    the producer is polled, as every testbed producer is."""
    logger = logging.getLogger(f"replab.testbed.librdkafka.{path}")
    logger.handlers.clear()
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(created).6f %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    return {"debug": contexts, "log_level": 7, "logger": logger}


def close_debug_log(config: dict[str, Any]) -> None:
    """Close the file `debug_logging` opened for a producer's config, once the producer is flushed."""
    logger = config.get("logger")
    if logger is not None:
        for handler in list(logger.handlers):
            handler.close()
            logger.removeHandler(handler)


def partitions_of(policy: KafkaPolicy, table: pa.Table) -> np.ndarray:
    from replay.kafka.routing import kafka_route
    from replay.local import msg_rank

    return kafka_route(table["key"].combine_chunks(), msg_rank(table["msg_id"].to_numpy()), policy.partitions)


#: The msg_id of the warm-up records (`warm_up`); the verifying consumer skips them.
WARMUP_MSG_ID = -1


def warm_up(producer: ResilientProducer, topic: str, partitions: int, timeout_s: float = 60.0) -> int:
    """Deliver one record to every partition before the clock starts; returns the records per partition (1).

    On a just-created topic an idempotent producer's first request to a partition can fail (the leader is not
    ready yet) while its second is appended: the broker accepts any first sequence from a producer it has no
    state for (`ProducerAppendInfo.checkSequence`: "accept writes with any sequence number"), the retried first
    batch is then out of order, and librdkafka reported it delivered without an offset although no broker had
    it: an acknowledged write the verifying consumer never reads, that no fault caused (a partition's first
    message reported without an offset, its second at offset 0).
    One acknowledged record per partition first gives every partition the producer's state in order.
    """
    reports: dict[int, Any] = {}
    for part in range(partitions):
        producer.produce(topic, value=payload(WARMUP_MSG_ID, 1), partition=part,
                         on_delivery=lambda err, m, part=part: reports.__setitem__(part, (err, m.offset())))
    producer.flush(timeout_s)
    bad = {p: r for p, r in reports.items() if r[0] is not None or r[1] != 0}
    if len(reports) != partitions or bad:
        missing = sorted(set(range(partitions)) - set(reports))
        raise RuntimeError(f"{topic}: the warm-up records were not delivered at offset 0 in {timeout_s:.0f} s "
                           f"(missing partitions {missing}, failed {bad})")
    return 1


def payload(msg_id: int, size: int) -> bytes:
    head = f"{msg_id}:".encode()
    return head + b"x" * max(0, size - len(head))


class ResilientProducer:
    """A confluent-kafka producer that an application would recreate after a fatal error.

    An idempotent producer whose acknowledged writes were truncated (unclean election) gets a fatal
    OUT_OF_ORDER_SEQUENCE_NUMBER and refuses every later call. The application sees every message it still held
    fail then: the producer is purged and every message it has not reported is reported failed with the fatal
    error at that instant (a fatal producer's own purge reports are not served reliably: a poll raises first).
    A new producer with the same settings takes the following sends.
    """

    def __init__(self, factory, config: dict[str, Any]) -> None:
        self.factory, self.config = factory, config
        self.producer = factory(config)
        self.fatal: list[str] = []
        self.retired: list[Any] = []  # polled at the end, for the delivery reports of what they held
        self.held: dict[int, Any] = {}  # the current producer's messages not reported yet: key -> on_delivery
        self._sent = 0

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
        held, self.held = self.held, {}
        failed = KafkaError(KafkaError._FATAL, f"held by a producer that failed fatally: {err.str()}")
        for on_delivery in held.values():
            on_delivery(failed, None)
        self.retired.append(old)
        self.producer = self.factory(self.config)

    def produce(self, *args, on_delivery, **kwargs) -> None:
        from confluent_kafka import KafkaException

        key = self._sent
        self._sent += 1

        def report(err, msg) -> None:
            # a report of a message already failed with its producer (after `_renew`) is not the application's
            if self.held.pop(key, None) is not None:
                on_delivery(err, msg)

        for _ in range(3):
            try:
                self.producer.produce(*args, on_delivery=report, **kwargs)
                self.held[key] = on_delivery
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

