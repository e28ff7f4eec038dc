"""SPEC §9 invariants as output-gate checks (`expectations.output_gate.NamedCheck`): each is a DataFrame of the
rows that break it, so a failure names the run, partition and rows. The high-watermark monotonicity invariant
is part of the output gate itself (SPEC §7).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from expectations.output_gate import NamedCheck
from replay.invariants import durability_covered
from storage.session import local_frame


def checks(spark, runs: Sequence[Any], message_outcomes, partition_states, control) -> list[NamedCheck]:
    """`runs`: engine.replay.PolicyRun; `control`: the trace's fault timeline (replay.events)."""
    from pyspark.sql import functions as F

    covered = [(r.run_id, p) for r in runs
               for u in durability_covered(r.policy, r.layout.replicas, control) for p in r.unit_partitions[u]]
    out = []

    acked_lost = (F.col("status") == "acked") & (F.col("fate") != "committed")

    def acked_lost_where_guaranteed():
        guaranteed = local_frame(spark, covered or [("", -1)], "run_id STRING, `partition` INT")
        return (message_outcomes.join(F.broadcast(guaranteed), ["run_id", "partition"], "left_semi")
                .where(acked_lost).select("run_id", "partition", "msg_id", "ack_us", "fate"))

    if covered:
        # The same rows as a condition on an outcome row, for the gate's screen (a few runs: one test per run).
        partitions: dict[str, list[int]] = {}
        for run_id, p in covered:
            partitions.setdefault(run_id, []).append(p)
        in_guaranteed = F.lit(False)
        for run_id, parts in partitions.items():
            in_guaranteed |= (F.col("run_id") == run_id) & F.col("partition").isin(*parts)
        out.append(NamedCheck(
            "no_acked_loss_when_guaranteed", acked_lost_where_guaranteed,
            "no acknowledged message lost under acks=all, min ISR >= 2, clean election, with at most one replica "
            "out at a time and no power loss (SPEC §9)", screen=in_guaranteed & acked_lost))

    def two_leaders_in_one_epoch():
        return (partition_states.where(F.col("leader").isNotNull())
                .groupBy("run_id", "partition", "leader_epoch")
                .agg(F.countDistinct("leader").alias("leaders"), F.min("ts_us").alias("ts_us"))
                .where(F.col("leaders") > 1))

    out.append(NamedCheck("one_leader_per_epoch", two_leaders_in_one_epoch,
                          "one leader per partition at a time: a leader epoch has exactly one leader (SPEC §9)"))
    return out
