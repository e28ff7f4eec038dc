"""The seed articles' closing question, answered by replaying: a 5-broker DLedger cluster (one group of 5, 50
queues) against Kafka configurations on the same 5 machines, under one and two broker failures.

    .venv/bin/python -m studies.dledger_vs_kafka [--scale 1] [--seed 1] [--phase-thin 20]

Traces come from the scenario library (`dledger5-single-failure`, `dledger5-double-failure`: 5000 msg/s for
180 s; broker 0 crashes at 60 s, broker 1 at 75 s in the double case) and are replayed without Spark by the
vectorized kernels (`replay.local.replay_local`). Unavailability is normalized per partition/queue, so both
families read as "seconds of a whole-topic outage": a DLedger group's outage counts for each of its 50 queues.

RocketMQ clients learn a new DLedger leader from their route, polled every 30 s from 0 (SPEC §3.7 R-1; a poll
that finds no master leaves the route empty and sends fetch it again until the new leader registers, R-5), so the
DLedger outage depends on where the failure falls between two polls: the phase table replays the same trace with
the producers' polls moved (the manifest's `route_poll_phase_us`, SPEC §2) so that the failures fall 0, 2, …,
28 s after a poll, and gives the best, worst and mean topic outage. Outages depend
on the fault timeline only, so the phase sweep keeps every k-th produce and report (`--phase-thin`; the library
scale would shrink the timeline too).
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from generators.generate import build_plan, chunk_table, manifest_for
from generators.library import scenario_files
from generators.scenario import load_scenario_file
from replay.families import family_of
from replay.local import replay_local
from replay.policies import parse_policy
from schemas.outcomes import Error, Fate, Status

SCENARIOS = ("dledger5-single-failure", "dledger5-double-failure")
POLICIES = (
    "dledger:group_size=5,queues_per_group=50",
    "kafka:partitions=50,replication_factor=5,min_insync_replicas=3",
    "kafka:partitions=50,replication_factor=5,min_insync_replicas=3,delivery_timeout_ms=3000",
    "kafka:partitions=50,replication_factor=3,min_insync_replicas=2",
    "kafka:partitions=50,replication_factor=5,min_insync_replicas=2",
    "kafka:partitions=50,replication_factor=3,acks=1",
)


@dataclass
class Figures:
    policy: str
    produced: int
    acked: int
    acked_lost: int
    failed_committed: int
    errors: dict[str, int]
    topic_outage_s: float  # unavailable partition (queue) seconds / partitions (queues)
    p50_ms: float
    p99_ms: float
    max_ms: float

    @property
    def availability(self) -> float:
        return self.acked / self.produced if self.produced else float("nan")


def load_trace(name: str, seed: int = 1, scale: float = 1.0):
    plan = build_plan(load_scenario_file(scenario_files()[name]), seed, scale)
    table = pa.concat_tables([chunk_table(plan, c)[0] for c in range(plan.n_chunks)])
    return manifest_for(plan), table


def figures(policy_text: str, manifest, table) -> Figures:
    policy = parse_policy(policy_text)
    results = replay_local(policy, manifest, table, engine="kernel")
    fam = family_of(policy)
    layout = fam.layout(policy, manifest)
    partitions = fam.partition_count(policy, layout)
    per_unit = partitions // len(layout.units)  # queues a RocketMQ group's outage stands for (1 for Kafka)
    status = np.concatenate([r.messages.records.status for r in results])
    error = np.concatenate([r.messages.records.error for r in results])
    fate = np.concatenate([r.messages.fate for r in results])
    latency = np.concatenate([r.messages.records.ack_us - r.messages.records.produce_us for r in results])
    acked = status == Status.ACKED
    outage = sum(e - s for r in results for s, e in r.unavailable) / 1e6 * per_unit / partitions
    lat = latency[acked] / 1000 if acked.any() else np.zeros(1)
    errors = {Error(int(e)).label: int(c) for e, c in zip(*np.unique(error[status == Status.FAILED],
                                                                      return_counts=True), strict=True)}
    return Figures(policy_text, len(status), int(acked.sum()), int((acked & (fate != Fate.COMMITTED)).sum()),
                   int(((status == Status.FAILED) & (fate == Fate.COMMITTED)).sum()), errors, outage,
                   float(np.percentile(lat, 50)), float(np.percentile(lat, 99)), float(lat.max()))


POLL_PHASES_S = tuple(range(0, 30, 2))


def polled_before(manifest, table: pa.Table, since_poll_s: int, period_ms: int):
    """The same trace with the producers' route polls (every `period_ms`) moved (SPEC §2 `route_poll_phase_us`)
    so that each instant of the trace falls `since_poll_s` seconds later after its last poll than with polls
    from 0."""
    period_us = period_ms * 1000
    return dataclasses.replace(manifest, route_poll_phase_us=(-since_poll_s * 1_000_000) % period_us), table


def thinned(table: pa.Table, every: int) -> pa.Table:
    """Every `every`-th produce and report, all faults: the same fault timeline with fewer messages."""
    kind = table.column("kind")
    steady = pc.or_(pc.equal(kind, "produce"), pc.equal(kind, "replicate"))
    keep = pc.or_(pc.invert(steady), pa.array(np.arange(table.num_rows) % every == 0))
    return table.filter(keep)


def poll_phase_outages(policy_text: str, manifest, table, phases_s=POLL_PHASES_S) -> dict[int, float]:
    """Topic outage (s) of `policy_text` with the failures falling each phase (s) after a route poll."""
    period_ms = parse_policy(policy_text).route_refresh_ms
    return {s: figures(policy_text, *polled_before(manifest, table, s, period_ms)).topic_outage_s
            for s in phases_s}


def phase_row(name: str, policy_text: str, outages: dict[int, float]) -> str:
    values = list(outages.values())
    per = ", ".join(f"{s}: {v:.2f}" for s, v in outages.items())
    return (f"| {name} | `{policy_text}` | {min(values):.2f} | {max(values):.2f} | {sum(values) / len(values):.2f} "
            f"| {per} |")


def table_rows(name: str, rows: list[Figures]) -> str:
    out = [f"### {name}", "", "| policy | availability | acked lost | failed (errors) | topic outage s | "
           "ack p50 ms | ack p99 ms | ack max ms |", "|---|---|---|---|---|---|---|---|"]
    for f in rows:
        errs = ", ".join(f"{k} {v}" for k, v in f.errors.items()) or "0"
        out.append(f"| `{f.policy}` | {f.availability:.4f} | {f.acked_lost} | {errs} | {f.topic_outage_s:.2f} | "
                   f"{f.p50_ms:.1f} | {f.p99_ms:.1f} | {f.max_ms:.1f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--phase-thin", type=int, default=20)
    args = ap.parse_args()
    for name in SCENARIOS:
        manifest, table = load_trace(name, args.seed, args.scale)
        print(table_rows(f"{name} (seed {args.seed}, {table.num_rows} events)",
                         [figures(p, manifest, table) for p in POLICIES]))
        print()
    print(f"### DLedger topic outage (s) over the route-poll phase (failures s seconds after a poll; every "
          f"{args.phase_thin}th produce and report)")
    print()
    print("| trace | policy | best | worst | mean | by s since the last poll |")
    print("|---|---|---|---|---|---|")
    for name in SCENARIOS:
        manifest, table = load_trace(name, args.seed, args.scale)
        print(phase_row(name, POLICIES[0], poll_phase_outages(POLICIES[0], manifest, thinned(table, args.phase_thin))))


if __name__ == "__main__":
    main()
