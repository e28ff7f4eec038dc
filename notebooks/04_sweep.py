# Databricks notebook source
# MAGIC %md
# MAGIC # replab 04: from one trace to probabilities (a sweep)
# MAGIC
# MAGIC One replay says what a policy did on one trace. A sweep runs many seeds of a scenario (random faults,
# MAGIC jitter, load) as ONE Spark job: each task generates its seeds' traces in-process, checks them with the
# MAGIC trace gate's rules and replays them under every policy; only per-seed, per-policy figures come back (tables
# MAGIC `sweep_results` and `sweeps`). Per policy, with 95 % intervals (scipy.stats):
# MAGIC
# MAGIC - **P(loss)**: the probability of losing at least one acknowledged message in a trace (Wilson), and per
# MAGIC   day of cluster life;
# MAGIC - the **mean acked_lost**, **availability** and **unavailable partition-seconds** (Student t);
# MAGIC - the **ack p99** latency: the median over seeds of each seed's p99 (bootstrap).
# MAGIC
# MAGIC With an `slo`, the cheapest policy whose intervals meet every term is recommended (`replab recommend`).
# MAGIC (`engine/sweep/estimates.py` documents the methods; `replab sweep` is the same job from the command line.)
# MAGIC
# MAGIC | parameter | default | meaning |
# MAGIC |---|---|---|
# MAGIC | `scenario` | `flaky-network` | a scenario with random faults, so that seeds differ |
# MAGIC | `seeds`, `first_seed` | `200` / `3` locally, `0` | how many seeds |
# MAGIC | `scale` | `1` / `0.1` locally | scenario scale |
# MAGIC | `policies` | `kafka-acks1;kafka-acks-all;kafka-durable` | `;`-separated policy strings |
# MAGIC | `slo` | empty | e.g. `p_loss<=0.05,availability>=0.999`: recommend the cheapest policy meeting it |
# MAGIC | `mlflow` | `true` on Databricks | one MLflow experiment: a parent run for the sweep, a child run per policy |

# COMMAND ----------

import os
import sys

try:
    import pipelines  # noqa: F401  (Databricks Git folders put the repository root on sys.path)
except ImportError:  # a plain `python notebooks/04_sweep.py` from a checkout that is not pip-installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pandas as pd

from pipelines.notebook_env import notebook_env, split_list

env = notebook_env(globals(), "04_sweep")
spark = env.spark

# COMMAND ----------

from replay.policies import parse_policy

scenario = env.param("scenario", "flaky-network")
seeds = int(env.param("seeds", "200" if env.on_databricks else "3"))
first_seed = int(env.param("first_seed", "0"))
scale = float(env.param("scale", "1" if env.on_databricks else "0.1"))
labels = split_list(env.param("policies", "kafka-acks1;kafka-acks-all;kafka-durable"))
policies = [parse_policy(p) for p in labels]
slo = env.param("slo", "")
use_mlflow = env.flag("mlflow", env.on_databricks)
tracking_uri = env.param("tracking_uri", "") or None
workdir = env.workdir

# COMMAND ----------

# MAGIC %md
# MAGIC ## Run the sweep
# MAGIC Results go to `<workdir>/lakehouse` (tables `sweeps`, `sweep_results`; a re-run replaces the sweep's rows) and
# MAGIC `<workdir>/04_sweep` (`sweep.json`, `sweep.csv`).

# COMMAND ----------

from pipelines.sweep_job import print_sweep
from engine.sweep.run import SweepRequest, run_sweep

sweep = run_sweep(spark, SweepRequest(scenario=scenario, seeds=seeds, policies=policies, labels=labels,
                                      scale=scale, first_seed=first_seed, out=str(env.out), lakehouse=str(workdir / "lakehouse"),
                                      tracking_uri=tracking_uri, mlflow=use_mlflow))
print_sweep(sweep)
estimates = pd.DataFrame([e.row() for e in sweep.estimates])
per_seed = pd.DataFrame(sweep.rows)[["seed", "label", "status", "produced", "acked_lost", "availability",
                                     "ack_latency_p99_ms", "unavailable_partition_seconds"]]
env.show(estimates, "estimates with 95% intervals")
env.show(per_seed, "per seed")
print(f"results: {sweep.json_path}, {sweep.csv_path}" + (f"; MLflow experiment {sweep.experiment}"
                                                         if sweep.experiment else ""))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Recommendation
# MAGIC With an `slo`: a term is met when the whole 95 % interval is on its side; the cheapest policy meeting every
# MAGIC term (brokers, then copies per message, then replication bytes) is recommended.

# COMMAND ----------

from engine.recommend import parse_slo, recommend

recommendation = recommend(sweep.estimates, parse_slo(slo)) if slo else None
if recommendation is not None:
    from pipelines.recommend_job import print_recommendation
    from report.terminal import console

    print_recommendation(recommendation, console())

# COMMAND ----------

# MAGIC ## Plot
# MAGIC The estimate is the dot, the 95 % interval the bar. Wide bars mean: add seeds.

# COMMAND ----------

import matplotlib.pyplot as plt
import numpy as np


def bars(ax, estimate, low, high, label):
    y = np.arange(len(estimates))
    est = estimates[estimate].astype(float).to_numpy()
    lo = np.nan_to_num(est - estimates[low].astype(float).to_numpy(), nan=0.0)
    hi = np.nan_to_num(estimates[high].astype(float).to_numpy() - est, nan=0.0)
    ax.errorbar(est, y, xerr=[lo, hi], fmt="o", capsize=4, color="#1f77b4")
    ax.set_yticks(y, estimates["label"])
    ax.set_xlabel(label)
    ax.grid(True, axis="x", alpha=0.3)


fig, axes = plt.subplots(1, 3, figsize=(15, 1.5 + 0.6 * len(estimates)), sharey=True)
bars(axes[0], "p_loss", "p_loss_low", "p_loss_high", "P(at least one acked message lost)")
axes[0].set_xlim(-0.02, 1.02)
axes[0].invert_yaxis()  # the first policy on top, as in the table (the axes share y)
bars(axes[1], "mean_acked_lost", "mean_acked_lost_low", "mean_acked_lost_high",
     "mean acked & lost (messages per trace)")
bars(axes[2], "availability", "availability_low", "availability_high", "mean availability (acked / produced)")
fig.suptitle(f"{sweep.scenario} (scale {sweep.scale:g}), {len(sweep.seeds)} seeds: estimates and 95% intervals")
fig.tight_layout()
env.show_figure(fig, "sweep")
