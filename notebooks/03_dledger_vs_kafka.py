# Databricks notebook source
# MAGIC %md
# MAGIC # replab 03: a 5-broker DLedger cluster against Kafka
# MAGIC
# MAGIC The seed articles end on a question: RocketMQ on DLedger (Raft) with **5 brokers, one group of 5 replicas,
# MAGIC one topic of 50 queues** — which Kafka configuration on the same 5 machines gives the **same performance,
# MAGIC availability and consistency**?
# MAGIC
# MAGIC Traces come from the scenario library: `dledger5-single-failure` (5000 msg/s for 180 s, broker 0 crashes at
# MAGIC 60 s and is back at 120 s) and `dledger5-double-failure` (broker 1 also crashes, at 75 s, back at 135 s).
# MAGIC Both are replayed under DLedger and five Kafka configurations (`studies/dledger_vs_kafka.py`'s list, the same
# MAGIC one its README table uses), through the full Spark pipeline. What the rules predict (SPEC §3.2, §3.4, §3.7):
# MAGIC
# MAGIC - DLedger loses nothing it acknowledged, but the whole topic stops for each election: followers notice the
# MAGIC   loss of a leader 6000 ms after its last 2 s heartbeat, the vote takes 650 ms, and producers learn the new
# MAGIC   leader at their next route poll (every 30 s from 0, SPEC §3.7 R-1), or, when that poll found no master
# MAGIC   and the route was left empty, as soon as it registers: from about 7.15 s to about 30 s per leader
# MAGIC   lost, depending on where the failure falls between two polls (`studies/dledger_vs_kafka.py` prints the
# MAGIC   best, worst and mean over the poll phase);
# MAGIC - Kafka fails over **partition by partition**: only the partitions led by the crashed broker stop, for the
# MAGIC   session timeout plus the client switch (9.1 s with KRaft);
# MAGIC - `min_insync_replicas` decides whether two failures refuse writes (RF 3 with min ISR 2 can lose its quorum
# MAGIC   on partitions where both failed brokers are replicas), and `acks=1` trades acknowledged messages for latency.
# MAGIC
# MAGIC Parameters: `scenarios` (`;`-separated), `seed` (`1`), `scale` (`1` on Databricks, `0.2` locally: fault
# MAGIC times scale with the trace, timeouts do not, so keep the outage (60 s × scale) longer than 9.1 s),
# MAGIC `workdir`, `mlflow`.

# COMMAND ----------

import os
import sys

try:
    import pipelines  # noqa: F401  (Databricks Git folders put the repository root on sys.path)
except ImportError:  # a plain `python notebooks/03_dledger_vs_kafka.py` from a checkout that is not pip-installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pandas as pd
from pyspark.sql import functions as F

from studies.dledger_vs_kafka import POLICIES, SCENARIOS
from pipelines.notebook_env import notebook_env, split_list

env = notebook_env(globals(), "03_dledger_vs_kafka")
spark = env.spark

# COMMAND ----------

scenarios = split_list(env.param("scenarios", ";".join(SCENARIOS)))
seed = int(env.param("seed", "1"))
scale = float(env.param("scale", "1" if env.on_databricks else "0.2"))
use_mlflow = env.flag("mlflow", env.on_databricks)
workdir = env.workdir
DLEDGER = POLICIES[0]
print(f"scenarios {scenarios}, seed {seed}, scale {scale:g}; DLedger: {DLEDGER}; Kafka: {list(POLICIES[1:])}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Replays
# MAGIC One pass per trace, all six policies together. "topic outage" is unavailable partition (queue) seconds divided
# MAGIC by the 50 partitions (queues): seconds of a whole-topic outage, comparable between the families (a DLedger
# MAGIC group's outage counts for each of its 50 queues).

# COMMAND ----------

from generators.generate import generate_trace
from generators.library import resolve_scenario
from storage.lakehouse import Lakehouse
from engine.plan import ReplayRequest
from engine.replay import run_replay
from report.figures import run_figures
from replay.policies import parse_policy

lakehouse = Lakehouse(workdir / "lakehouse", spark, create=False)
policies = [parse_policy(p) for p in POLICIES]
rows = []
for name in scenarios:
    generated = generate_trace(spark, resolve_scenario(name), seed=seed, scale=scale,
                               out=workdir / "traces" / f"{name}-s{seed}-x{scale:g}")
    report = run_replay(spark, ReplayRequest(trace=str(generated.trace_dir), policies=policies,
                                             lakehouse=str(lakehouse.root), mlflow=use_mlflow,
                                             experiment=generated.manifest.trace_id, figures=run_figures),
                        progress=lambda text, name=name: print(f"[{name}] {text}"))
    errors = (lakehouse.read("message_outcomes")
              .where(F.col("run_id").isin([r.run_id for r in report.runs]) & (F.col("status") == "failed"))
              .groupBy("run_id", "error").count().collect())
    by_run = {}
    for e in errors:
        by_run.setdefault(e["run_id"], []).append(f"{e['error']} {e['count']}")
    for run, s in zip(report.runs, report.summaries):
        rows.append({
            "scenario": name, "policy": run.canonical, "family": run.policy.family, "run_id": run.run_id,
            "availability": s["availability"], "acked_lost": s["acked_lost"], "failed": s["failed"],
            "errors": ", ".join(sorted(by_run.get(run.run_id, []))) or "-",
            "failed_committed": s["failed_committed"],
            "topic_outage_s": s["unavailable_partition_seconds"] / run.partitions,
            "ack_p50_ms": s["ack_latency_p50_ms"], "ack_p99_ms": s["ack_latency_p99_ms"],
            "ack_max_ms": s["ack_latency_max_ms"], "replicas_per_message": s["replicas_per_message"],
        })
figures = pd.DataFrame(rows)
figures.to_csv(env.out / "dledger_vs_kafka.csv", index=False)
for name in scenarios:
    env.show(figures[figures["scenario"] == name].drop(columns=["scenario", "family", "run_id"]), name)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Which Kafka configuration matches DLedger?
# MAGIC Each Kafka configuration against DLedger on the same trace, on the three axes of the question. The
# MAGIC tolerances below decide "the same"; change them and re-run the cell.
# MAGIC
# MAGIC - **consistency**: no acknowledged message lost whenever DLedger lost none;
# MAGIC - **availability**: availability within `AVAILABILITY_TOLERANCE` of DLedger's, or better;
# MAGIC - **performance**: steady-state ack latency (p50) within `LATENCY_FACTOR` × DLedger's, or better. The p99 is
# MAGIC   shown too, but under a failure it measures how long clients wait through a failover (Kafka's producers
# MAGIC   retry until the new leader answers; DLedger's sends fail at once with `no_route` while there is no leader,
# MAGIC   which shows in availability instead).

# COMMAND ----------

AVAILABILITY_TOLERANCE = 0.005
LATENCY_FACTOR = 1.5

verdicts = []
for name in scenarios:
    in_scenario = figures[figures["scenario"] == name].set_index("policy")
    dledger = in_scenario.loc[parse_policy(DLEDGER).canonical()]
    for policy, k in in_scenario[in_scenario["family"] == "kafka"].iterrows():
        verdicts.append({
            "scenario": name, "kafka": policy,
            "consistency": bool(dledger["acked_lost"] > 0 or k["acked_lost"] == 0),
            "availability": bool(k["availability"] >= dledger["availability"] - AVAILABILITY_TOLERANCE),
            "performance": bool(k["ack_p50_ms"] <= dledger["ack_p50_ms"] * LATENCY_FACTOR),
            "availability_vs_dledger": k["availability"] - dledger["availability"],
            "topic_outage_vs_dledger_s": k["topic_outage_s"] - dledger["topic_outage_s"],
            "p50_vs_dledger_ms": k["ack_p50_ms"] - dledger["ack_p50_ms"],
            "p99_vs_dledger_ms": k["ack_p99_ms"] - dledger["ack_p99_ms"],
        })
verdicts = pd.DataFrame(verdicts)
verdicts["all_three"] = verdicts["consistency"] & verdicts["availability"] & verdicts["performance"]
verdicts.to_csv(env.out / "verdicts.csv", index=False)
env.show(verdicts, "Kafka against DLedger (True = the same or better)")

matching = sorted(set(verdicts["kafka"]) - set(verdicts.loc[~verdicts["all_three"], "kafka"]))
print("Kafka configurations that match DLedger on every scenario and axis:")
for policy in matching:
    print(f"  {policy}")
if not matching:
    print("  none within these tolerances")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Availability against latency

# COMMAND ----------

import matplotlib.pyplot as plt

fig, axes = plt.subplots(1, len(scenarios), figsize=(7 * len(scenarios), 6.5), squeeze=False)
for ax, name in zip(axes[0], scenarios):
    data = figures[figures["scenario"] == name].reset_index(drop=True)
    for i, r in data.iterrows():
        marker = "*" if r["family"] == "dledger" else "o"
        ax.scatter(r["ack_p99_ms"], r["topic_outage_s"], s=160 if marker == "*" else 70, marker=marker,
                   color=plt.cm.tab10(i), edgecolors="black", zorder=3,
                   label=f"{r['policy']} (lost {r['acked_lost']:,})")
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlabel("ack latency p99 (ms, symlog): the wait through a failover")
    ax.set_ylabel("topic outage (s, unavailable partition-seconds / 50)")
    ax.set_title(name)
    ax.grid(True, alpha=0.3)
    # Below the axes: the policy strings are long, and inside they would hide the points.
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=1, frameon=False)
fig.tight_layout()
env.show_figure(fig, "outage_vs_latency")
