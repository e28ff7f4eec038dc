"""Figures RocketMQ users ask about, as pure functions over a run's message outcomes (numpy arrays, one row per
message, in any order). The Spark layer can call them per run on the collected outcome columns (or per partition
of a run grouped by run_id, since every figure is a sum over keys or messages).

- Per-key order (reference B.4): an ordered producer sends a key to `hash % queue count`; when the route loses
  or regains a group, the count changes and the key moves to another queue, while its older messages still sit
  in the old one: consumers may read them out of order. `key_order` counts, over the messages consumers will
  read (fate committed), the keys whose messages span several queues and the queue switches in produce order.
- Send statuses (reference B.2): SEND_OK and every failure label, so FLUSH_SLAVE_TIMEOUT / SLAVE_NOT_AVAILABLE /
  FLUSH_DISK_TIMEOUT / IN_SYNC_REPLICAS_NOT_ENOUGH show up, and how many of each were stored anyway
  (failed but committed, SPEC §4.1: the client saw an error, consumers will read the message).
- Stranded (SPEC §4.1): acknowledged and committed but unreadable at the end, e.g. sitting on a down master whose
  group has no failover (SPEC §3.3 rule 5), per queue.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from schemas.outcomes import Error, Fate, Status


@dataclass(frozen=True)
class KeyOrder:
    keys: int  # distinct keys among the counted messages
    keys_split: int  # keys whose messages sit in more than one queue
    queue_switches: int  # consecutive (produce order) messages of a key in different queues
    messages_after_switch: int  # messages sent after their key's first switch (their order is at risk)


def key_order(key: np.ndarray, produce_order: np.ndarray, partition: np.ndarray,
              include: np.ndarray | None = None) -> KeyOrder:
    """Per-key FIFO breaks when ordered keys are remapped (reference B.4).

    `key`: key ids or strings (None / "" / negative ids = unkeyed, ignored); `produce_order`: msg_id or
    produce_us; `partition`: the queue (negative = never routed, ignored); `include`: which messages to count
    (default: all; pass `fate == committed` for what consumers will read).
    """
    key = np.asarray(key)
    if key.dtype == object or key.dtype.kind in "US":
        keyed = np.array([k is not None and k != "" for k in key.tolist()], dtype=bool)
        key = np.unique(np.where(keyed, key.astype(str), ""), return_inverse=True)[1]
    else:
        keyed = key >= 0
    sel = keyed & (np.asarray(partition) >= 0)
    if include is not None:
        sel &= np.asarray(include, dtype=bool)
    k, o, p = key[sel], np.asarray(produce_order)[sel], np.asarray(partition)[sel]
    if len(k) == 0:
        return KeyOrder(0, 0, 0, 0)
    order = np.lexsort((o, k))
    k, p = k[order], p[order]
    same_key = k[1:] == k[:-1]
    switch = same_key & (p[1:] != p[:-1])
    first = np.r_[True, ~same_key]  # first message of each key
    group = np.cumsum(first) - 1
    switched_keys = np.zeros(group[-1] + 1, dtype=bool)
    switched_keys[group[1:][switch]] = True
    # a message comes after its key's first switch when the key has switched at or before it
    switch_at = np.r_[0, switch.astype(np.int64)]  # never set on a key's first message
    cum = np.cumsum(switch_at)
    after = cum - cum[np.flatnonzero(first)][group] > 0
    return KeyOrder(int(group[-1] + 1), int(switched_keys.sum()), int(switch.sum()), int(after.sum()))


def send_statuses(status: np.ndarray, error: np.ndarray) -> dict[str, int]:
    """Count of each outcome as RocketMQ names it: SEND_OK (acked), PENDING, and each failure's error label."""
    status, error = np.asarray(status), np.asarray(error)
    out = {"SEND_OK": int((status == Status.ACKED).sum()), "PENDING": int((status == Status.PENDING).sum())}
    failed = status == Status.FAILED
    for e in Error:
        if e is not Error.NONE:
            out[e.label.upper()] = int((failed & (error == e)).sum())
    return out


def failed_committed_by_error(status: np.ndarray, error: np.ndarray, fate: np.ndarray) -> dict[str, int]:
    """Failed sends that consumers will read anyway (SPEC §4.1), by error: the indeterminate writes."""
    status, error, fate = np.asarray(status), np.asarray(error), np.asarray(fate)
    hit = (status == Status.FAILED) & (fate == Fate.COMMITTED)
    counts = {e.label: int((hit & (error == e)).sum()) for e in Error if e is not Error.NONE}
    return {label: n for label, n in counts.items() if n}


def stranded_by_partition(status: np.ndarray, fate: np.ndarray, readable_at_end: np.ndarray,
                          partition: np.ndarray) -> dict[int, int]:
    """Acknowledged, committed and not readable at the end (SPEC §4.1), per queue."""
    hit = (np.asarray(status) == Status.ACKED) & (np.asarray(fate) == Fate.COMMITTED) & ~np.asarray(
        readable_at_end, dtype=bool)
    parts, counts = np.unique(np.asarray(partition)[hit], return_counts=True)
    return {int(p): int(c) for p, c in zip(parts, counts)}


def rocketmq_metrics(key, msg_id, partition, status, error, fate, readable_at_end) -> dict[str, float]:
    """One flat dict per run (MLflow metric names): order, statuses, indeterminate and stranded messages."""
    fate = np.asarray(fate)
    order = key_order(key, msg_id, partition, include=fate == Fate.COMMITTED)
    out: dict[str, float] = {
        "ordered_keys": order.keys, "ordered_keys_split": order.keys_split,
        "ordered_queue_switches": order.queue_switches,
        "ordered_messages_after_switch": order.messages_after_switch,
        "stranded": sum(stranded_by_partition(status, fate, readable_at_end, partition).values()),
    }
    out.update({f"status_{k.lower()}": v for k, v in send_statuses(status, error).items()})
    out.update({f"failed_committed_{k}": v for k, v in failed_committed_by_error(status, error, fate).items()})
    return out
