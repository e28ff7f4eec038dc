"""Where RocketMQ messages go (SPEC §3.3 rules 1-3, §3.4 rules 1-2): the groups' brokers, and the router built on
the control plane's timelines (`replay/rocketmq/control.py`, whose docstring holds the modelling choices C1-C9 and
R-1; C2, C4, C5 and C8 are the routing ones).

Replay units are broker groups and replay independently, in one shuffle, so where a message goes is decided here,
before any unit is replayed, from the produce events and the fault timeline alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from replay.events import PartitionEvents
from replay.policies import DLedgerPolicy, Policy, RocketMQPolicy
from replay.rocketmq.control import (
    C_ARRIVE,
    C_LAST,
    C_POLL,
    INF,
    KEY,
    GroupTimeline,
    RouteClock,
    group_timeline,
    key_of,
    pack_delay,
)
from schemas.errors import BadInput
from schemas.trace import Kind, Manifest
from schemas.units import MS


def group_members(policy: Policy, manifest: Manifest) -> list[tuple[int, ...]]:
    """Brokers of every group, master (or initial leader) first (SPEC §3.3 `groups`, §3.4 `group_size`)."""
    ordered = sorted(manifest.broker_ids)
    if isinstance(policy, DLedgerPolicy):
        size = policy.group_size
        groups = len(ordered) // size
    else:
        size = 1 + policy.slaves_per_master
        groups = policy.groups if policy.groups is not None else len(ordered) // size
    if groups < 1 or groups * size > len(ordered):
        raise BadInput(f"policy {policy.canonical()}: {groups} group(s) of {size} brokers need {max(groups, 1) * size}"
                       f" brokers; the trace has {len(ordered)}", rule="policy-value")
    return [tuple(ordered[g * size: (g + 1) * size]) for g in range(groups)]


@dataclass
class RouteModel:
    groups: list[tuple[int, ...]]
    timelines: list[GroupTimeline]
    #: per group: sorted keys from which a majority is available, as half-open key intervals [start, end)
    quorum_intervals: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    #: the route polls' phase and R-5's refetches, the same for every group (the engines replay them too)
    clock: RouteClock = field(default_factory=RouteClock)
    #: R-5: poll instant whose route held no queue -> when a fresh, non-empty route replaced it
    refetch_after: dict[int, int] = field(default_factory=dict)


def refetches(policy: Policy, timelines: list[GroupTimeline], clock: RouteClock,
              duration_us: int) -> dict[int, int]:
    """SPEC §3.7 R-5. A route holds the queues of the groups with a registered master (brokerId 0:
    `MQClientInstance.topicRouteData2TopicPublishInfo` skips a broker name without one), so a poll that falls
    after a group's master was dropped (`RouteInfoManager.onChannelDestroy`) and before its successor registered
    leaves the group out. When no group is left the route holds no queue and every send asks the NameServer again
    (`DefaultMQProducerImpl.tryToFindTopicPublishInfo` refetches while `TopicPublishInfo.ok()` is false); the
    first fresh route with a queue replaces the cached one, new masters included, until the next poll. Here that
    fetch is taken at the first instant after such a poll at which any group has a registered master (after that
    instant's events), as if a send were made then. Returns {poll instant: refetch instant}."""
    r = policy.route_refresh_ms * MS
    out: dict[int, int] = {}
    first = clock.poll_at(1, policy.route_refresh_ms)
    for poll in range(first, duration_us + 1, r):
        k = key_of(poll, C_LAST)
        if any(tl.registered[tl.at(np.array([k]))[0]] for tl in timelines):
            continue
        found = INF
        for tl in timelines:
            later = np.flatnonzero((tl.keys > k) & tl.registered)
            if len(later):
                found = min(found, int(tl.keys[later[0]]))
        if found < key_of(poll + r, 0):
            out[poll] = found // KEY
    return out


def route_model(policy: Policy, manifest: Manifest, control: PartitionEvents) -> RouteModel:
    groups = group_members(policy, manifest)
    control = control.sorted()
    clock = RouteClock(manifest.route_poll_phase_us)
    timelines = [group_timeline(policy, g, control, manifest.duration_us, clock) for g in groups]
    # Registration does not depend on what clients know: the refetches found on the first pass are final.
    refetch_after = refetches(policy, timelines, clock, manifest.duration_us)
    if refetch_after:
        clock = RouteClock(clock.phase_us, tuple(sorted(set(refetch_after.values()))))
        timelines = [group_timeline(policy, g, control, manifest.duration_us, clock) for g in groups]
    intervals = []
    for tl in timelines:
        change = np.flatnonzero(np.diff(np.concatenate([[False], tl.quorum, [False]]).astype(np.int8)))
        bounds = np.append(tl.keys, INF)
        starts, ends = bounds[change[0::2]], bounds[change[1::2]]
        intervals.append((starts, ends))
    return RouteModel(groups, timelines, intervals, clock, refetch_after)


def java_string_hashcode(keys: list[str | None]) -> np.ndarray:
    """Java `String.hashCode()` (UTF-16 code units, int32 wrap-around) of each key."""
    out = np.zeros(len(keys), dtype=np.int32)
    for i, key in enumerate(keys):  # keys are short; per-key loop over code units, in Python ints mod 2^32
        h = 0
        for u in np.frombuffer((key or "").encode("utf-16-le"), dtype="<u2").tolist():
            h = (31 * h + u) & 0xFFFFFFFF
        out[i] = h - (1 << 32) if h >= 1 << 31 else h
    return out


def java_hash_mod(keys: list[str | None], count: np.ndarray) -> np.ndarray:
    """SelectMessageQueueByHash: `abs(key.hashCode() % count)` with Java's truncated remainder (SPEC §3.3 rule 2).

    Equal to abs(hashCode) % count for every hash but Integer.MIN_VALUE, where this form stays non-negative.
    """
    distinct = sorted({k for k in keys if k})
    codes = dict(zip(distinct, java_string_hashcode(distinct).astype(np.int64).tolist(), strict=True))
    h = np.array([codes.get(k, 0) if k else 0 for k in keys], dtype=np.int64)
    return np.abs(np.fmod(h, np.maximum(count, 1)))


@dataclass
class Routed:
    unit: np.ndarray  # int32 group
    partition: np.ndarray  # int32 queue, -1 when the send failed in routing (no_route)
    #: int64 time from the produce to the arrival at `unit`, with the attempts there whose entries stay behind
    #: (C3: `control.pack_delay`)
    delay_us: np.ndarray


def route_messages(policy: Policy, model: RouteModel, ts_us: np.ndarray, msg_rank: np.ndarray,
                   keys: list[str | None]) -> Routed:
    """SPEC §3.3 rules 1-3 (and §3.4 rules 1-2) for a batch of produce events, vectorized over messages."""
    n = len(ts_us)
    ts = np.asarray(ts_us, dtype=np.int64)
    rank = np.asarray(msg_rank, dtype=np.int64)
    qpg = policy.queues_per_group
    n_groups = len(model.groups)
    # Rule 1: the route of a send is the last poll strictly before it; the route at 0 holds every group (C4).
    # Routes are few (one per poll): work on route ids, with per-route tables of groups and positions.
    poll = model.clock.last_poll(ts, policy.route_refresh_ms)
    polls, rid = np.unique(poll, return_inverse=True)
    masks = np.ones((len(polls), n_groups), dtype=bool)
    later = polls > 0
    for g, tl in enumerate(model.timelines):
        masks[later, g] = tl.registered[tl.at(key_of(polls[later], C_LAST))]
    empty = ~masks.any(axis=1)[rid]
    if empty.any():
        # C8: an empty route is fetched again at the send; after R-5's refetch the fresh route holds until the
        # next poll
        e_ts = ts[empty]
        fetched = np.array([model.refetch_after.get(int(p), INF) for p in poll[empty]], dtype=np.int64)
        after = e_ts > fetched
        query = np.where(after, key_of(fetched, C_POLL), key_of(e_ts, int(Kind.PRODUCE)))
        fresh = np.zeros((int(empty.sum()), n_groups), dtype=bool)
        for g, tl in enumerate(model.timelines):
            fresh[:, g] = tl.registered[tl.at(query)]
        extra, inv = np.unique(fresh, axis=0, return_inverse=True)
        rid[empty] = len(masks) + inv.reshape(-1)
        masks = np.concatenate([masks, extra])
    route_pos = np.cumsum(masks, axis=1) - 1  # route position of each group (valid where masks)
    group_table = np.zeros((len(masks), max(n_groups, 1)), dtype=np.int64)
    r_i, g_i = np.nonzero(masks)
    group_table[r_i, route_pos[r_i, g_i]] = g_i
    count = masks.sum(axis=1)[rid] * qpg
    ordered_keyed = np.zeros(n, dtype=bool)
    if isinstance(policy, RocketMQPolicy) and policy.ordered:
        ordered_keyed = np.array([bool(k) for k in keys], dtype=bool)
    # Rule 2: round robin by msg_id order; ordered keyed sends by Java hashCode.
    idx = rank % np.maximum(count, 1)
    if ordered_keyed.any():
        sel = np.flatnonzero(ordered_keyed)
        idx[sel] = java_hash_mod([keys[i] for i in sel], count[sel])

    def group_at(i: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Group of route position i (a queue index) in each row's route."""
        return group_table[rid[rows], i // qpg]

    rows = np.arange(n)
    no_groups = count == 0
    first_group = np.where(no_groups, (rank % (n_groups * qpg)) // qpg, 0)
    ok_rows = rows[~no_groups]
    first_group[ok_rows] = group_at(idx[ok_rows], ok_rows)
    unit = first_group.copy()
    part = np.full(n, -1, dtype=np.int64)
    delay = np.zeros(n, dtype=np.int64)
    # Rule 3: attempts, all at once unless a DLedger group cannot commit (C2).
    active = ok_rows
    cur_idx = idx.copy()
    at_us = ts.copy()
    code = np.full(n, int(Kind.PRODUCE), dtype=np.int64)
    attempts_left = np.full(n, policy.retry_times_when_send_failed, dtype=np.int64)
    deadline = ts + policy.delivery_timeout_ms * MS
    dledger = isinstance(policy, DLedgerPolicy)
    wait_us = policy.max_wait_ack_ms * MS if dledger else 0
    # C3: the attempts appended and retried (DLedger, no commit within max_wait_ack_ms), as (row, group, bit k):
    # the one that arrived at the group k × max_wait_ack_ms after the produce (its entry stays in that group's log)
    kept_rows: list[np.ndarray] = []
    kept_groups: list[np.ndarray] = []
    kept_bits: list[np.ndarray] = []
    while len(active):
        g = group_at(cur_idx[active], active)
        k = key_of(at_us[active], code[active])
        writable = np.zeros(len(active), dtype=bool)
        refused = np.zeros(len(active), dtype=bool)
        commit_ok = np.ones(len(active), dtype=bool)
        for gi, tl in enumerate(model.timelines):
            sel = g == gi
            if not sel.any():
                continue
            at = tl.at(k[sel])
            writable[sel] = tl.writable[at]
            refused[sel] = tl.refused[at]
            if dledger:
                starts, ends = model.quorum_intervals[gi]
                last_k = key_of(at_us[active][sel] + wait_us, int(Kind.REPLICATE))
                j = np.searchsorted(ends, k[sel], side="right")  # first interval ending after k
                okj = j < len(starts)
                commit_ok[sel] = okj & (starts[np.minimum(j, max(len(starts) - 1, 0))] <= last_k) if len(starts) \
                    else False
        taken = writable & commit_ok & ~refused
        rows_taken = active[taken]
        unit[rows_taken] = g[taken]
        part[rows_taken] = g[taken] * qpg + cur_idx[rows_taken] % qpg
        delay[rows_taken] = at_us[rows_taken] - ts[rows_taken]
        failed = ~taken
        no_retry = ordered_keyed[active] & failed
        # a DLedger attempt without quorum fails max_wait_ack later, a refusal (C9) at once; the retry needs time
        # left (C2, C5)
        waited = writable & ~refused
        next_at = at_us[active] + np.where(waited, wait_us, 0)
        can_retry = failed & ~no_retry & (attempts_left[active] > 0) & (next_at < deadline[active])
        last_try = failed & ~can_retry & writable  # taken but refused or uncommittable, no retry left: it ends here
        rows_last = active[last_try]
        unit[rows_last] = g[last_try]
        part[rows_last] = g[last_try] * qpg + cur_idx[rows_last] % qpg
        delay[rows_last] = at_us[rows_last] - ts[rows_last]
        nxt = active[can_retry]
        kept = can_retry & waited
        if dledger and kept.any():
            rows_kept = active[kept]
            kept_rows.append(rows_kept)
            kept_groups.append(g[kept])
            kept_bits.append(np.left_shift(1, (at_us[rows_kept] - ts[rows_kept]) // wait_us))
        if len(nxt):
            cur_idx[nxt] = _next_queue(cur_idx[nxt], route_pos[rid[nxt], g[can_retry]], count[nxt], qpg)
            code[nxt] = np.where(waited[can_retry], C_ARRIVE, code[nxt])
            at_us[nxt] = next_at[can_retry]
            attempts_left[nxt] -= 1
        active = nxt
    if kept_rows:
        rows, groups, bits = np.concatenate(kept_rows), np.concatenate(kept_groups), np.concatenate(kept_bits)
        # a send that failed in routing is replayed where its first entry stays (its first group otherwise)
        order = np.lexsort((bits, rows))
        first = order[np.r_[True, rows[order][1:] != rows[order][:-1]]]
        unrouted = first[part[rows[first]] < 0]
        unit[rows[unrouted]] = groups[unrouted]
        here = groups == unit[rows]  # the copies in the group that replays the send
        mask = np.zeros(n, dtype=np.int64)
        np.bitwise_or.at(mask, rows[here], bits[here])
        sent = np.flatnonzero(mask)
        delay[sent] = pack_delay(delay[sent], mask[sent])
    return Routed(unit.astype(np.int32), part.astype(np.int32), delay)


def _next_queue(idx: np.ndarray, pos: np.ndarray, count: np.ndarray, qpg: int) -> np.ndarray:
    """The next queue in route order whose group differs from the failed one (at route position `pos`); the next
    queue if none does (C5)."""
    n_route = count // qpg
    other = n_route > 1
    nxt_pos = np.where(other, pos + 1, pos) % np.maximum(n_route, 1)
    out = (idx + 1) % np.maximum(count, 1)
    out[other] = nxt_pos[other] * qpg
    return out
