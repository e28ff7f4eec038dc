"""Kafka routing (SPEC §3.2 rule 1): `Utils.murmur2` over Arrow string buffers, and the partition of each message."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.kafka.routing import kafka_route, murmur2


def murmur2_scalar(data: bytes) -> int:
    """Kafka's `org.apache.kafka.common.utils.Utils.murmur2`, transcribed line by line (int32 arithmetic)."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    length = len(data)
    h = (0x9747B28C ^ length) & mask
    for i in range(length // 4):
        k = int.from_bytes(data[4 * i: 4 * i + 4], "little")
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = ((h * m) & mask) ^ k
    tail, base = length % 4, length & ~3
    if tail == 3:
        h ^= data[base + 2] << 16
    if tail >= 2:
        h ^= data[base + 1] << 8
    if tail >= 1:
        h ^= data[base]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h - (1 << 32) if h >= 1 << 31 else h


def test_murmur2_matches_kafkas_utils_test():
    # Kafka's clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java, testMurmur2
    cases = {"21": -973932308, "foobar": -790332482, "a-little-bit-long-string": -985981536,
             "a-little-bit-longer-string": -1486304829,
             "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971, "abc": 479470107}
    assert murmur2(list(cases)).tolist() == list(cases.values())
    assert [murmur2_scalar(k.encode()) for k in cases] == list(cases.values())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(max_size=40)), max_size=30), st.integers(0, 5))
def test_murmur2_of_an_arrow_slice_is_kafkas_per_key(keys, start):
    """Any keys (multi-byte UTF-8, empty, null as empty), read from a sliced Arrow array (its buffers' offset)."""
    arr = pa.array(["pad"] * start + keys, pa.string()).slice(start)
    expected = [murmur2_scalar((k or "").encode("utf-8")) for k in keys]
    assert murmur2(arr).tolist() == expected
    assert murmur2(keys).tolist() == expected


def test_kafka_route_keyed_and_unkeyed():
    keys = pa.array(["21", None, "", "foobar", "21"], pa.string())
    rank = np.array([0, 1, 2, 3, 4])
    to_positive = [murmur2_scalar(b"21") & 0x7FFFFFFF, murmur2_scalar(b"foobar") & 0x7FFFFFFF]
    # keyed messages by murmur2; null and empty keys round-robin by msg_id rank (SPEC §3.2 rule 1)
    assert kafka_route(keys, rank, 12).tolist() == [to_positive[0] % 12, 1, 2, to_positive[1] % 12,
                                                    to_positive[0] % 12]
