"""One episode → a short trace through the generator → every policy's verdict (the replay kernels).

The episode's events are in real time, over minutes to days; the trace keeps their order and their
simultaneity but **compresses the long quiet stretches**: a gap between consecutive event instants becomes
min(gap, `max_gap_s`) of trace time (at least `settle_s` after a restart or heal plus the follower's
catch-up, so the replica is back in sync before the next fault, as the model's recovery time says it is).
Nothing in a quiet stretch changes the replicas' state after the policies' timers have fired (the largest,
the producer's delivery timeout and the route refresh, are shorter than the default `max_gap_s`), so
compression keeps every verdict on *whether* an acknowledged message is lost. Two figures do scale with
real time and are corrected: unavailable time (each compressed gap adds its missing real time to every
partition unavailable at the gap's end) and message counts (the trace runs at `trace_rate_per_s`; counts are
scaled to the scenario's rate). Messages acknowledged during the missing real time of a compressed gap are
not replayed, so acknowledged-lost *counts* are a lower bound; the probability of loss is not affected.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from engine.durability.episodes import HEAL, RESTART, Episode
from generators.generate import build_plan, chunk_table, manifest_for
from generators.model import FaultKind, Faults, Scenario, ScheduledFault
from replay.events import split_trace_table
from replay.families import family_of
from replay.local import replay_local
from replay.policies import Policy
from schemas.outcomes import Fate, Status

US = 1_000_000


@dataclass(frozen=True)
class TraceShape:
    """How an episode becomes a trace."""

    trace_rate_per_s: float = 50.0
    lead_s: float = 10.0
    max_gap_s: float = 150.0
    settle_s: float = 5.0
    tail_s: float = 30.0


@dataclass(frozen=True)
class Verdict:
    """One policy's judgement of one episode (messages at the scenario's real rate)."""

    lost: bool
    acked_lost: float
    unavailable_s: float  # of the average partition, real time
    failed_committed: float


def base_scenario(scenario: Scenario) -> Scenario:
    """The scenario's cluster, workload and follower behaviour, without its own faults and stalls."""
    rep = dataclasses.replace(scenario.replication, stalls=(),
                              default=dataclasses.replace(scenario.replication.default, slow_follower=None))
    return dataclasses.replace(scenario, replication=rep, faults=Faults())


def episode_scenario(base: Scenario, episode: Episode, shape: TraceShape, index: int
                     ) -> tuple[Scenario, list[tuple[float, float]]]:
    """The episode as a scenario with scheduled faults, and its compressed gaps (trace end in s, real s lost)."""
    speed = base.replication.default.catchup_speed
    instants = sorted({t for t, _, _ in episode.events})
    trace_at: dict[float, float] = {}
    gaps: list[tuple[float, float]] = []
    now, prev = shape.lead_s, None
    down_since: dict[int, float] = {}
    for t in instants:
        if prev is not None:
            gap = t - prev
            settle = 0.0
            for tt, kind, b in episode.events:
                if tt == prev and kind in (RESTART, HEAL):
                    # the replica must catch up what it missed: (trace time it was away) / (speed − 1)
                    away = now - down_since.get(b, 0.0) if kind == RESTART else now - down_since.get(b, now)
                    settle = max(settle, shape.settle_s + away / (speed - 1))
            step = max(min(gap, shape.max_gap_s), min(settle, gap) if gap > 0 else 0.0, 1e-3)
            if gap > step:
                gaps.append((now + step, gap - step))
            now += step
        trace_at[t] = now
        for tt, kind, b in episode.events:
            if tt == t and kind not in (RESTART, HEAL):
                down_since[b] = 0.0 if kind == "disk_loss" else now  # a lost disk refetches everything
        prev = t
    faults = tuple(ScheduledFault(round(trace_at[t] * 1000.0, 3), FaultKind(kind), (b,), False)
                   for t, kind, b in episode.events)
    duration = now + shape.tail_s
    wl = dataclasses.replace(base.workload, duration_s=duration, rate_per_s=shape.trace_rate_per_s)
    name = f"{base.name}-episode-{index}"
    return dataclasses.replace(base, name=name, workload=wl, faults=Faults(faults, ())), gaps


def layout_cost(scenario: Scenario, policy: Policy) -> tuple[int, float]:
    """(brokers used, copies per message) of a policy on the scenario's cluster: its cost, as a sweep reports it."""
    base = base_scenario(scenario)
    short = dataclasses.replace(base, workload=dataclasses.replace(base.workload, duration_s=1.0))
    layout = family_of(policy).layout(policy, manifest_for(build_plan(short, 0, 1.0)))
    return layout.brokers_used, float(layout.replicas_per_message)


def judge_episode(base: Scenario, episode: Episode, policies: Sequence[Policy], shape: TraceShape, index: int,
                  seed: int, real_rate_per_s: float) -> list[Verdict]:
    """Generate the episode's trace in-process and replay it under every policy (same trace for all)."""
    scenario, gaps = episode_scenario(base, episode, shape, index)
    plan = build_plan(scenario, seed, 1.0)
    manifest = manifest_for(plan)
    table = pa.concat_tables([chunk_table(plan, c)[0] for c in range(plan.n_chunks)])
    scale = real_rate_per_s / shape.trace_rate_per_s
    split = split_trace_table(table)  # policy-free: once per episode, not once per policy
    out = []
    for policy in policies:
        fam = family_of(policy)
        layout = fam.layout(policy, manifest)
        results = replay_local(policy, manifest, table, engine="kernel", split=split)
        acked_lost = failed_committed = 0
        unavailable_us = 0.0
        partitions = 0
        for u, res in zip(layout.units, results, strict=True):
            parts = len(fam.partitions_of(policy, layout, u))
            partitions += parts
            status, fate = res.messages.records.status, res.messages.fate
            committed = fate == Fate.COMMITTED
            acked_lost += int(((status == Status.ACKED) & ~committed).sum())
            failed_committed += int(((status == Status.FAILED) & committed).sum())
            spans = np.array(res.unavailable, dtype=np.int64).reshape(-1, 2)
            unavailable_us += float(np.clip(spans[:, 1] - spans[:, 0], 0, None).sum()) * parts
            for end_s, missing_s in gaps:
                at = int(end_s * US) - 1
                if len(spans) and bool(((spans[:, 0] <= at) & (at < spans[:, 1])).any()):
                    unavailable_us += missing_s * US * parts
        out.append(Verdict(acked_lost > 0, acked_lost * scale, unavailable_us / US / max(partitions, 1),
                           failed_committed * scale))
    return out
