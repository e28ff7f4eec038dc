# Databricks notebook source
# MAGIC %md
# MAGIC # replab 01: one scenario under every replication policy
# MAGIC
# MAGIC Generate a trace of a cluster's life from a scenario of the library (or point at an existing trace), replay
# MAGIC it under every preset of `conf/policies.yaml` in one pass, and compare what each policy costs:
# MAGIC acknowledged messages lost, write availability, ack latency (SPEC §4).
# MAGIC
# MAGIC Parameters (widgets on Databricks, `REPLAB_NB_<NAME>` environment variables when run as a script):
# MAGIC
# MAGIC | name | default | meaning |
# MAGIC |---|---|---|
# MAGIC | `scenario` | `demo` | library scenario (`replab scenarios`) or a YAML file |
# MAGIC | `seed`, `scale` | `0`, `0.05` | generator seed and scale (rate and duration both scale) |
# MAGIC | `trace` | empty | an existing trace directory: skips generation |
# MAGIC | `policies` | `all` | `;`-separated policy strings; `all` = every preset |
# MAGIC | `mlflow` | `true` on Databricks, else `false` | log one MLflow run per policy (`tracking_uri`: default store) |
# MAGIC | `window_ms` | `1000` | metric window (SPEC §4.3) |
# MAGIC | `workdir` | `/Volumes/main/default/replab` / `./notebook-runs` | traces, lakehouse, outputs |
# MAGIC
# MAGIC On Databricks, clone the repository as a Git folder (Repos) so that `pipelines`, `replay`, … import, and
# MAGIC attach a cluster with Delta (any Databricks runtime) and the packages of `requirements.txt`.

# COMMAND ----------

import os
import sys

try:
    import pipelines  # noqa: F401  (Databricks Git folders put the repository root on sys.path)
except ImportError:  # a plain `python notebooks/01_overview.py` from a checkout that is not pip-installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pandas as pd

from pipelines.notebook_env import notebook_env, split_list

env = notebook_env(globals(), "01_overview")
spark = env.spark

# COMMAND ----------

scenario = env.param("scenario", "demo")
seed = int(env.param("seed", "0"))
scale = float(env.param("scale", "0.05"))
trace_param = env.param("trace", "")
policy_texts = split_list(env.param("policies", "all"))
use_mlflow = env.flag("mlflow", env.on_databricks)
window_ms = int(env.param("window_ms", "1000"))
workdir = env.workdir
lakehouse_dir = workdir / "lakehouse"
print(f"workdir {workdir}; policies: {policy_texts}; MLflow: {use_mlflow}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## The trace
# MAGIC A trace is independent of any policy (SPEC §2): produce requests, follower progress, faults.

# COMMAND ----------

from generators.generate import generate_trace
from generators.library import resolve_scenario
from storage.trace_loader import locate

if trace_param:
    trace_dir = trace_param
else:
    chosen = resolve_scenario(scenario)
    generated = generate_trace(spark, chosen, seed=seed, scale=scale,
                               out=workdir / "traces" / f"{chosen.name}-s{seed}-x{scale:g}")
    trace_dir = str(generated.trace_dir)
manifest = locate(trace_dir).manifest
print(f"trace {manifest.trace_id}: {len(manifest.brokers)} brokers, {manifest.duration_us / 1e6:g} s")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Replay under every policy (one pass)
# MAGIC The trace gate checks the trace first (SPEC §2.3); the policies share one read and one shuffle; the output
# MAGIC gate checks every run before its Delta tables are written (SPEC §7).

# COMMAND ----------

from pipelines.demo_job import fitting_presets
from engine.plan import ReplayRequest
from engine.replay import run_replay
from report.figures import run_figures
from replay.policies import parse_policy

policies = []
for text in policy_texts:
    if text == "all":
        # Every preset that fits the trace's cluster (dledger-5 needs 5 brokers): the others are named, not run.
        chosen_policies, skipped = fitting_presets(manifest)
        for name, reason in skipped:
            print(f"skipping preset {name}: {reason}")
    else:
        chosen_policies = [parse_policy(text)]
    policies += [p for p in chosen_policies if p.canonical() not in {q.canonical() for q in policies}]

tracking_uri = env.param("tracking_uri", "") or None
report = run_replay(spark, ReplayRequest(trace=trace_dir, policies=policies, lakehouse=str(lakehouse_dir),
                                         window_ms=window_ms, mlflow=use_mlflow, tracking_uri=tracking_uri,
                                         experiment=manifest.trace_id, figures=run_figures),
                    progress=lambda text: print(f"[replay] {text}"))
print(f"{len(report.runs)} runs in {report.lakehouse}; {report.quarantined} trace rows quarantined")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Comparison
# MAGIC One row per policy: the run summary of SPEC §4.4. *acked_lost* is the headline durability figure;
# MAGIC *availability* is acked / produced; *unavailable_partition_seconds* sums the time each partition (queue)
# MAGIC could not acknowledge a write.

# COMMAND ----------

COLUMNS = ["policy", "produced", "acked", "failed", "acked_lost", "failed_committed", "stranded", "availability",
           "unavailable_partition_seconds", "ack_latency_p50_ms", "ack_latency_p99_ms", "brokers_used",
           "replicas_per_message", "run_id"]
comparison = pd.DataFrame(report.summary_json())[COLUMNS]
comparison.to_csv(env.out / "comparison.csv", index=False)
env.show(comparison, "comparison")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Plots
# MAGIC Durability against latency (the Pareto chart: lower left is better; colour = availability, marker area =
# MAGIC unavailable partition-seconds), the ack latency CDF, and acked-and-lost / unavailability per window.

# COMMAND ----------

from report import plots
from storage import report_data
from storage.lakehouse import Lakehouse

lakehouse = Lakehouse(report.lakehouse, spark, create=False)
run_ids = [r.run_id for r in report.runs]
labels = {r.run_id: r.canonical for r in report.runs}

env.show_figure(plots.pareto(comparison, title=f"{manifest.trace_id}: durability against latency"), "pareto")

quantiles = report_data.latency_quantiles(lakehouse, run_ids)
quantiles["policy"] = quantiles["run_id"].map(labels)
env.show_figure(plots.latency_cdf(quantiles, list(comparison["policy"]), title=f"{manifest.trace_id}: ack latency"),
                "latency_cdf")

series = report_data.window_series(lakehouse, run_ids)
series = series.assign(policy=series["run_id"].map(labels), t_s=series["window_start_us"] / 1e6,
                       unavailable_s=series["unavailable_us"] / 1e6)
lossy = [p for p in comparison["policy"] if p in set(series.loc[series["acked_lost"] > 0, "policy"])]
env.show_figure(plots.loss_timeline(series, lossy or list(comparison["policy"][:4]), window_s=window_ms / 1000,
                                    title=f"{manifest.trace_id}: policies that lost acknowledged messages"),
                "loss_timeline")

# COMMAND ----------

# MAGIC %md
# MAGIC Next: `02_run_drilldown` opens one of these runs (its partition timeline, unavailability windows and lost
# MAGIC messages) from the same lakehouse; `04_sweep` turns one trace into probabilities over many seeds.
