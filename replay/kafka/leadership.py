"""Who leads each partition over a trace, for P_b of SPEC §3.7 K-6, and when an unclean election happens, for
SPEC §3.7 K-8 (`replay.kafka.pipeline.Leadership`).

A partition's engines see only its own events, but the pipeline of SPEC §3.7 K-6 needs how many partitions its
leader leads at each instant, and K-8 when any partition of the topic elects uncleanly. The trace's faults decide
both: each partition is replayed by the reference interpreter (rules 2, 6, 8-11, K-3, K-4: the elections the
engines make) on the trace's fault events alone, once per replica order (partitions with the same replicas in the
same order have the same leaders), and the leaders of its state rows are kept, with the instants of its unclean
elections (rule 8). Left out with the writes and follower fetches: a follower's fall behind (rule 6) and its
return to the ISR after a restart (rule 7), which only change who leads at a later election, and which
elections are unclean.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache

import numpy as np

from replay.events import PartitionEvents
from replay.kafka.pipeline import Leadership
from replay.policies import KafkaPolicy
from schemas.units import MS


def leadership(policy: KafkaPolicy, replicas: Mapping[int, Sequence[int]], control: PartitionEvents,
               duration_us: int) -> Leadership:
    """Every partition's leaders over the trace (module docstring); `control`: the trace's fault events (no
    produce, no `replicate`), `replicas`: each partition's replicas in assignment order."""
    from replay.kafka.reference.interpreter import KafkaReference

    faults = PartitionEvents(control.produce_ts[:0], control.produce_msg[:0], control.produce_size[:0],
                             control.broker_ts, control.broker_kind, control.broker_id, control.broker_upto)
    # Without writes only the faults and their fencing deadlines (rule 6) change leaders: replaying past the last
    # deadline would only run idle ISR check ticks
    last = int(control.broker_ts.max()) if len(control.broker_ts) else 0
    horizon = min(duration_us, last + 2 * policy.session_timeout_ms * MS)
    by_order: dict[tuple[int, ...], list[tuple[int, int | None]]] = {}
    unclean: set[int] = set()
    for reps in replicas.values():
        order = tuple(reps)
        if order not in by_order:
            ref = KafkaReference(policy, 0, order, horizon)
            rows = ref.run(faults).states
            changes = [(r.ts_us, r.leader) for r in rows]
            by_order[order] = [c for i, c in enumerate(changes) if i == 0 or c[1] != changes[i - 1][1]]
            unclean.update(ref.unclean_us)
    return Leadership.of([by_order[tuple(replicas[p])] for p in sorted(replicas)], sorted(unclean))


@lru_cache(maxsize=64)
def _cached(policy: KafkaPolicy, replicas: tuple[tuple[int, ...], ...], faults: tuple[bytes, bytes, bytes],
            n: int, duration_us: int) -> Leadership:
    ts, kind, who = (np.frombuffer(b, dtype=dt) for b, dt in zip(faults, (np.int64, np.int8, np.int64), strict=True))
    z = np.zeros(0, dtype=np.int64)
    control = PartitionEvents(z, z, z, ts, kind, who, np.zeros(n, dtype=np.int64))
    return leadership(policy, dict(enumerate(replicas)), control, duration_us)


def cached_leadership(policy: KafkaPolicy, replicas: Sequence[Sequence[int]], control: PartitionEvents,
                      duration_us: int) -> Leadership:
    """`leadership`, computed once per policy, layout and fault timeline: every unit's engines ask for it."""
    faults = (control.broker_ts.tobytes(), control.broker_kind.tobytes(), control.broker_id.tobytes())
    return _cached(policy, tuple(tuple(r) for r in replicas), faults, len(control.broker_ts), duration_us)
