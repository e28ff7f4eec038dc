"""Replay a small trace without Spark: route, split by unit, run an engine per unit.

Used by golden and differential tests and by the benchmark's reference figure. The Spark job routes with the
same family functions (`replay/families.py`) and runs the same engines inside its groups.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np
import pyarrow as pa

from replay.events import PartitionEvents, hosted_rows, split_trace_table
from replay.families import engine_context, family_of
from replay.family import Layout, RouteInput, RouteOutput
from replay.policies import Policy
from replay.results import PartitionResult
from schemas.trace import CONTROL_KINDS, Manifest


def msg_rank(msg_id: np.ndarray) -> np.ndarray:
    """Index of each message in msg_id order over the whole trace (SPEC §3.2 rule 1, §3.3 rule 2)."""
    order = np.argsort(msg_id, kind="stable")
    rank = np.empty(len(msg_id), dtype=np.int64)
    rank[order] = np.arange(len(msg_id))
    return rank


def control_events(events: PartitionEvents) -> PartitionEvents:
    """The broker events that are not replication progress: the small fault timeline routing may need."""
    keep = np.isin(events.broker_kind, [int(k) for k in CONTROL_KINDS])
    return PartitionEvents(events.produce_ts[:0], events.produce_msg[:0], events.produce_size[:0],
                           events.broker_ts[keep], events.broker_kind[keep], events.broker_id[keep],
                           events.broker_upto[keep])


class SplitTrace:
    """A trace split once for replay under several policies (`split_trace_table`, its control events, message
    ranks and keys), with what policies of one trace share, built on first use: the routing of every family
    routing key and layout (`Family.routing_key`: equal keys route every message identically), each routed
    unit's produce events, and each replica set's broker events (`hosted_rows`). The shared events are the ones
    a policy's own split would give, row for row: subsets of ordered arrays keep their order."""

    def __init__(self, table: pa.Table) -> None:
        self.produce, self.broker = split_trace_table(table)
        self.control = control_events(self.broker)
        self.rank = msg_rank(self.produce["msg_id"])
        self.keys = pa.array(list(self.produce["key"]), pa.string())
        self._routes: dict[Hashable, tuple[RouteOutput, dict[int, PartitionEvents]]] = {}
        self._hosted: dict[frozenset[int], PartitionEvents] = {}

    def route(self, policy: Policy, manifest: Manifest, layout: Layout
              ) -> tuple[RouteOutput, dict[int, PartitionEvents]]:
        """The routing of `policy` and each unit's produce events (with their payload), broker events empty."""
        fam = family_of(policy)
        key = (fam.name, fam.routing_key(policy), layout.units, tuple(layout.replicas[u] for u in layout.units))
        if key not in self._routes:
            produce = self.produce
            routed = fam.route(policy, manifest, layout, self.control,
                               RouteInput(produce["ts_us"], self.rank, self.keys))
            delay = routed.delay_us if routed.delay_us is not None else np.zeros(len(routed.unit), dtype=np.int64)
            # one stable sort by unit instead of a mask per unit: each unit's rows keep the trace's order
            order = np.argsort(routed.unit, kind="stable")
            bounds = np.searchsorted(routed.unit[order], np.asarray(layout.units), side="left")
            ends = np.searchsorted(routed.unit[order], np.asarray(layout.units), side="right")
            empty = PartitionEvents.empty()
            units = {}
            for u, a, b in zip(layout.units, bounds, ends, strict=True):
                rows = order[a:b]
                payload = {"part": routed.partition[rows].astype(np.int64), "delay": delay[rows].astype(np.int64)}
                units[u] = PartitionEvents(produce["ts_us"][rows], produce["msg_id"][rows],
                                           produce["size_bytes"][rows], empty.broker_ts, empty.broker_kind,
                                           empty.broker_id, empty.broker_upto, payload).sorted()
            self._routes[key] = (routed, units)
        return self._routes[key]

    def hosted(self, replicas: tuple[int, ...]) -> PartitionEvents:
        """The broker events a unit with these replicas reads (`hosted_rows`), produces empty."""
        key = frozenset(replicas)
        if key not in self._hosted:
            rows, b = hosted_rows(self.broker.broker_id, replicas), self.broker
            self._hosted[key] = PartitionEvents(b.produce_ts, b.produce_msg, b.produce_size, b.broker_ts[rows],
                                                b.broker_kind[rows], b.broker_id[rows], b.broker_upto[rows]).sorted()
        return self._hosted[key]

    def unit(self, produce: PartitionEvents, replicas: tuple[int, ...]) -> PartitionEvents:
        """A unit's events: its routed produces and its replicas' broker events, in replay order (each part was
        put in order when it was built, and the order of one does not involve the other)."""
        b = self.hosted(replicas)
        return PartitionEvents(produce.produce_ts, produce.produce_msg, produce.produce_size, b.broker_ts,
                               b.broker_kind, b.broker_id, b.broker_upto, produce.payload)


def _unit_events(policy: Policy, manifest: Manifest, split: SplitTrace
                 ) -> tuple[dict[int, PartitionEvents], Layout, RouteOutput, dict]:
    fam = family_of(policy)
    layout = fam.layout(policy, manifest)
    routed, produce = split.route(policy, manifest, layout)
    # the unit's replicas' broker events only, as the Spark job sends them: merging every broker event of the
    # trace again in each unit costs a large share of a fault trace's kernel time (see bench/)
    out = {u: split.unit(produce[u], layout.replicas[u]) for u in layout.units}
    return out, layout, routed, engine_context(policy, manifest, split.control)


def unit_events(policy: Policy, manifest: Manifest, table: pa.Table, split: SplitTrace | None = None
                ) -> tuple[dict[int, PartitionEvents], dict]:
    """Events of every replay unit of `policy`, and the routing (msg_id -> partition) for outputs. `split`:
    `SplitTrace(table)` when the caller replays the same trace under several policies (it is policy-free)."""
    split = split if split is not None else SplitTrace(table)
    out, layout, routed, context = _unit_events(policy, manifest, split)
    partition_of = dict(zip(split.produce["msg_id"].tolist(), routed.partition.tolist(), strict=True))
    return out, {"layout": layout, "partition_of": partition_of, "context": context}


def replay_local(policy: Policy, manifest: Manifest, table: pa.Table, engine: str = "kernel",
                 chunks: list[int] | None = None,
                 split: SplitTrace | None = None) -> list[PartitionResult]:
    """Replay every unit of a trace with the reference interpreter or the vectorized kernel.

    `chunks`: time cut points; the kernel then advances chunk by chunk with carried state (SPEC §10 scale).
    `split`: see `unit_events`.
    """
    fam = family_of(policy)
    events, layout, _, context = _unit_events(policy, manifest, split if split is not None else SplitTrace(table))
    results = []
    for u in layout.units:
        if engine == "reference":
            results.append(fam.reference(policy, u, layout.replicas[u], events[u], manifest.duration_us,
                                         **context))
            continue
        replay = fam.kernel(policy, u, layout.replicas[u], manifest.duration_us, **context)
        start = 0
        for cut in [*(chunks or []), manifest.duration_us + 1]:
            replay.advance(events[u].slice_time(start, cut), cut)
            start = cut
        results.append(replay.finish())
    return results
