"""Where Kafka messages and replicas go: the partitioner and the replica assignment (SPEC §3.2).

Pure functions over arrays (vectorized: one pass per 4-byte block of the longest key, not per message).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replay.policies import Assignment
from schemas.errors import BadInput

_M = np.uint32(0x5BD1E995)
_SEED = np.uint32(0x9747B28C)


def _key_matrix(keys: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Each key's UTF-8 bytes as a zero-padded row (width a multiple of 4), read from the Arrow string buffers
    (no Python loop per key); a null key is empty."""
    keys = keys.cast(pa.large_string())
    n = len(keys)
    valid = keys.is_valid().to_numpy(zero_copy_only=False)
    _, offsets_buf, data_buf = keys.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int64)[keys.offset: keys.offset + n + 1]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, dtype=np.uint8)
    lengths = np.where(valid, np.diff(offsets), 0)
    width = int(((lengths.max() if n else 0) + 3) // 4 * 4) or 4
    buf = np.zeros((n, width), dtype=np.uint8)
    total = int(lengths.sum())
    if total:
        rows = np.repeat(np.arange(n), lengths)
        col = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)  # byte index within its key
        buf[rows, col] = data[offsets[:-1][rows] + col]
    return buf, lengths


def murmur2(keys: pa.Array | list[str | None]) -> np.ndarray:
    """Kafka's `Utils.murmur2` of each key's UTF-8 bytes, as int32 (seed 0x9747b28c)."""
    if not isinstance(keys, pa.Array):
        keys = pa.array(keys, pa.string())
    if len(keys) == 0:
        return np.zeros(0, dtype=np.int32)
    buf, lengths = _key_matrix(keys)
    n = len(keys)
    with np.errstate(over="ignore"):
        h = _SEED ^ lengths.astype(np.uint32)
        words = buf.view("<u4")  # little-endian 4-byte blocks, as Kafka assembles them
        for block in range(words.shape[1]):
            active = lengths // 4 > block
            k = words[:, block] * _M
            k ^= k >> np.uint32(24)
            k *= _M
            h = np.where(active, (h * _M) ^ k, h)
        tail = lengths % 4
        base = (lengths // 4) * 4
        rows = np.arange(n)
        t = np.zeros(n, dtype=np.uint32)
        for extra in (2, 1, 0):
            has = tail > extra
            t ^= np.where(has, buf[rows, np.minimum(base + extra, buf.shape[1] - 1)].astype(np.uint32)
                          << np.uint32(8 * extra), np.uint32(0))
        h = np.where(tail > 0, (h ^ t) * _M, h)
        h ^= h >> np.uint32(13)
        h *= _M
        h ^= h >> np.uint32(15)
    return h.view(np.int32)


def kafka_partition_for_keys(keys: pa.Array | list[str | None], partitions: int) -> np.ndarray:
    """`toPositive(murmur2(key)) % partitions` (SPEC §3.2 rule 1); meaningful for keyed messages only."""
    return ((murmur2(keys).view(np.uint32) & np.uint32(0x7FFFFFFF)) % np.uint32(partitions)).astype(np.int32)


def kafka_route(keys: pa.Array | pa.ChunkedArray, msg_rank: np.ndarray, partitions: int) -> np.ndarray:
    """Partition of each message: keyed by murmur2; unkeyed round-robin by msg_id order (SPEC §3.2 rule 1).

    `msg_rank` is the message's index in msg_id order over the whole trace; unkeyed message i goes to
    partition i mod partitions (replab's documented stand-in for the sticky partitioner). Keys are hashed once
    per distinct value.
    """
    out = (np.asarray(msg_rank, dtype=np.int64) % partitions).astype(np.int32)
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if len(keys) == 0 or keys.null_count == len(keys):
        return out
    encoded = keys.dictionary_encode()
    distinct = encoded.dictionary
    by_key = kafka_partition_for_keys(distinct, partitions)
    idx = encoded.indices.to_numpy(zero_copy_only=False)
    valid = ~np.asarray(encoded.indices.is_null().to_numpy(zero_copy_only=False))
    nonempty = pc.binary_length(distinct).to_numpy(zero_copy_only=False) > 0
    keyed = valid.copy()
    keyed[valid] = nonempty[idx[valid].astype(np.int64)]
    out[keyed] = by_key[idx[keyed].astype(np.int64)]
    return out


def kafka_assignment(partitions: int, replication_factor: int, brokers: tuple[int, ...],
                     assignment: Assignment) -> list[tuple[int, ...]]:
    """Replica list of every partition, preferred leader first (SPEC §3.2 `assignment`)."""
    n = len(brokers)
    if replication_factor > n:
        raise BadInput(f"replication_factor={replication_factor} needs at least that many brokers; the trace has "
                       f"{n}", rule="policy-value")
    ordered = sorted(brokers)
    out = []
    shift = 0
    for p in range(partitions):
        if assignment is Assignment.SEED:
            out.append(tuple(ordered[(p + j) % n] for j in range(replication_factor)))
            continue
        # AdminUtils.assignReplicasToBrokersRackUnaware with fixed start index 0 and initial shift 0.
        if p > 0 and p % n == 0:
            shift += 1
        first = p % n
        replicas = [ordered[first]]
        for j in range(replication_factor - 1):
            replicas.append(ordered[(first + 1 + (shift + j) % (n - 1)) % n])
        out.append(tuple(replicas))
    return out
