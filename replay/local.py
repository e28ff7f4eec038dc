"""Replay a small trace without Spark: route, split by unit, run an engine per unit.

Used by golden and differential tests and by the benchmark's reference figure. The Spark job routes with the
same family functions (`replay/families.py`) and runs the same engines inside its groups.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from replay.events import PartitionEvents, hosted_rows, split_trace_table
from replay.families import engine_context, family_of
from replay.family import RouteInput
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


def unit_events(policy: Policy, manifest: Manifest, table: pa.Table,
                split: tuple[dict[str, np.ndarray], PartitionEvents] | None = None
                ) -> tuple[dict[int, PartitionEvents], dict]:
    """Events of every replay unit of `policy`, and the routing (msg_id -> partition) for outputs. `split`:
    `split_trace_table(table)` when the caller replays the same trace under several policies (it is policy-free)."""
    fam = family_of(policy)
    layout = fam.layout(policy, manifest)
    produce, broker_events = split if split is not None else split_trace_table(table)
    keys = pa.array(list(produce["key"]), pa.string())
    routed = fam.route(policy, manifest, layout, control_events(broker_events),
                       RouteInput(produce["ts_us"], msg_rank(produce["msg_id"]), keys))
    out = {}
    delay = routed.delay_us if routed.delay_us is not None else np.zeros(len(routed.unit), dtype=np.int64)
    for u in layout.units:
        sel = routed.unit == u
        payload = {"part": routed.partition[sel].astype(np.int64), "delay": delay[sel].astype(np.int64)}
        # the unit's replicas' broker events only, as the Spark job sends them: merging every broker event of the
        # trace again in each unit costs a large share of a fault trace's kernel time (see bench/)
        hosted = hosted_rows(broker_events.broker_id, layout.replicas[u])
        out[u] = PartitionEvents(produce["ts_us"][sel], produce["msg_id"][sel], produce["size_bytes"][sel],
                                 broker_events.broker_ts[hosted], broker_events.broker_kind[hosted],
                                 broker_events.broker_id[hosted], broker_events.broker_upto[hosted], payload).sorted()
    partition_of = dict(zip(produce["msg_id"].tolist(), routed.partition.tolist(), strict=True))
    context = engine_context(policy, manifest, control_events(broker_events))
    return out, {"layout": layout, "partition_of": partition_of, "context": context}


def replay_local(policy: Policy, manifest: Manifest, table: pa.Table, engine: str = "kernel",
                 chunks: list[int] | None = None,
                 split: tuple[dict[str, np.ndarray], PartitionEvents] | None = None) -> list[PartitionResult]:
    """Replay every unit of a trace with the reference interpreter or the vectorized kernel.

    `chunks`: time cut points; the kernel then advances chunk by chunk with carried state (SPEC §10 scale).
    `split`: see `unit_events`.
    """
    fam = family_of(policy)
    events, info = unit_events(policy, manifest, table, split)
    layout, context = info["layout"], info["context"]
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
