# Databricks notebook source
# MAGIC %md
# MAGIC # replab 02: one run, in detail
# MAGIC
# MAGIC Everything here is read back from the Delta tables a replay wrote (SPEC §4-5), so it works on any lakehouse:
# MAGIC the one `01_overview` filled, `make demo`'s (`demo/lakehouse`), or a cluster's.
# MAGIC
# MAGIC - the run: its `runs` row and `run_summary` figures;
# MAGIC - the partition timeline (`partition_states`): leader, ISR size and high watermark of the partitions whose
# MAGIC   leadership changed most;
# MAGIC - the unavailability windows (`unavailability`): when a produce to each partition could not be acknowledged;
# MAGIC - the acknowledged messages that were lost (`message_outcomes`, status `acked`, fate `lost`), and where.
# MAGIC
# MAGIC | parameter | default | meaning |
# MAGIC |---|---|---|
# MAGIC | `lakehouse` | `<workdir>/lakehouse` | the lakehouse root |
# MAGIC | `run_id` | empty | the run to open; empty: chosen by `trace_id` / `policy`, else the run that lost most |
# MAGIC | `trace_id`, `policy` | empty | narrow the choice (policy: any spelling, e.g. `kafka-acks1` or `kafka:acks=1`) |
# MAGIC | `max_rows` | `1000` | lost messages listed (the counts cover all of them) |

# COMMAND ----------

import os
import sys

try:
    import pipelines  # noqa: F401  (Databricks Git folders put the repository root on sys.path)
except ImportError:  # a plain `python notebooks/02_run_drilldown.py` from a checkout that is not pip-installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import matplotlib.pyplot as plt
from pyspark.sql import functions as F

from storage.lakehouse import Lakehouse
from pipelines.notebook_env import notebook_env

env = notebook_env(globals(), "02_run_drilldown")
spark = env.spark

# COMMAND ----------

lakehouse_dir = env.param("lakehouse", str(env.workdir / "lakehouse"))
run_id_param = env.param("run_id", "")
trace_id_param = env.param("trace_id", "")
policy_param = env.param("policy", "")
max_rows = int(env.param("max_rows", "1000"))
lakehouse = Lakehouse(lakehouse_dir, spark, create=False)

# COMMAND ----------

# MAGIC %md
# MAGIC ## The run
# MAGIC Only runs marked `succeeded` count (the run protocol of SPEC §5: a run's tables are complete and passed the
# MAGIC output gate).

# COMMAND ----------

from replay.policies import parse_policy

runs = lakehouse.read("runs").where(F.col("status") == "succeeded").join(lakehouse.read("run_summary"), "run_id")
if run_id_param:
    runs = runs.where(F.col("run_id") == run_id_param)
if trace_id_param:
    runs = runs.where(F.col("trace_id") == trace_id_param)
if policy_param:
    runs = runs.where(F.col("policy") == parse_policy(policy_param).canonical())
candidates = runs.orderBy(F.desc("acked_lost"), F.desc("unavailable_partition_seconds"), "policy", "run_id")
chosen = candidates.limit(1).collect()
if not chosen:
    raise ValueError(f"no succeeded run in {lakehouse_dir} matches run_id={run_id_param!r}, "
                     f"trace_id={trace_id_param!r}, policy={policy_param!r}")
run = chosen[0].asDict()
run_id = run["run_id"]
summary = {k: run[k] for k in ("produced", "acked", "failed", "pending", "acked_lost", "failed_committed",
                               "stranded", "availability", "unavailable_partition_seconds", "ack_latency_p50_ms",
                               "ack_latency_p99_ms", "ack_latency_max_ms")}
print(f"run {run_id}: policy {run['policy']} on trace {run['trace_id']} "
      f"(MLflow run {run['mlflow_run_id'] or 'not logged'})")
import pandas as pd

env.show(pd.DataFrame([summary]), "run summary")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Partition timeline
# MAGIC A row of `partition_states` at every leader, epoch or ISR change (SPEC §4.2). "offline" means no leader:
# MAGIC the partition takes no writes until an eligible replica is back.

# COMMAND ----------

from report import plots
from storage import report_data

duration_us = int(lakehouse.read("loss_metrics").where(F.col("run_id") == run_id)
                  .agg(F.max("window_end_us")).first()[0] or 0)
timeline_partitions = report_data.busiest_partitions(lakehouse, run_id)
history = report_data.partition_history(lakehouse, run_id, timeline_partitions, duration_us)
env.show_figure(plots.partition_timeline(history, duration_s=duration_us / 1e6,
                                         title=f"{run['policy']}: leader, ISR, high watermark"),
                "partition_timeline")
leader_changes = (lakehouse.read("partition_states").where(F.col("run_id") == run_id)
                  .groupBy("partition").agg(F.countDistinct("leader_epoch").alias("leader_epochs"),
                                            F.sum(F.col("leader").isNull().cast("int")).alias("offline_rows"))
                  .where((F.col("leader_epochs") > 1) | (F.col("offline_rows") > 0))
                  .orderBy(F.desc("leader_epochs"), "partition").toPandas())
env.show(leader_changes, "partitions whose leader changed or that went offline")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Unavailability windows
# MAGIC Each interval is time during which a produce to the partition could not be acknowledged: no leader, writes
# MAGIC refused (min ISR), or a leader that could not commit within the request timeout (SPEC §4.3).

# COMMAND ----------

unavailable = (lakehouse.read("unavailability").where(F.col("run_id") == run_id)
               .select("partition", (F.col("start_us") / 1e6).alias("start_s"), (F.col("end_us") / 1e6).alias("end_s"),
                       ((F.col("end_us") - F.col("start_us")) / 1e6).alias("seconds"))
               .orderBy("partition", "start_s").toPandas())
env.show(unavailable, f"unavailability windows ({unavailable['seconds'].sum():.3f} partition-seconds)")

fig, ax = plt.subplots(figsize=(10, 1.2 + 0.35 * max(1, unavailable["partition"].nunique())))
for row, (partition, spans) in enumerate(unavailable.groupby("partition")):
    ax.broken_barh(list(zip(spans["start_s"], spans["seconds"])), (row - 0.4, 0.8), color="#d62728")
ax.set_yticks(range(unavailable["partition"].nunique()),
              [f"partition {p}" for p in sorted(unavailable["partition"].unique())])
ax.set_xlim(0, max(duration_us / 1e6, 1e-6))
ax.set_xlabel("trace time (s)")
ax.set_title(f"{run['policy']}: when writes could not be acknowledged")
ax.grid(True, axis="x", alpha=0.3)
env.show_figure(fig, "unavailability")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Lost acknowledged messages
# MAGIC The client was told the write succeeded; no consumer will ever read it (SPEC §4.1: truncated by a new leader,
# MAGIC or destroyed with a disk). Also counted: *failed but committed* (the client got an error, consumers will see
# MAGIC the message) and *stranded* (acknowledged and committed, but unreadable at the end of the trace).

# COMMAND ----------

outcomes = lakehouse.read("message_outcomes").where(F.col("run_id") == run_id)
lost_df = outcomes.where((F.col("status") == "acked") & (F.col("fate") == "lost"))
lost = (lost_df.select("msg_id", "key", "partition", (F.col("produce_us") / 1e6).alias("produce_s"),
                       (F.col("ack_us") / 1e6).alias("ack_s"), (F.col("latency_us") / 1e3).alias("latency_ms"))
        .orderBy("msg_id").limit(max_rows).toPandas())
lost_by_partition = (lost_df.groupBy("partition").agg(F.count(F.lit(1)).alias("acked_lost"),
                                                      F.min("produce_us").alias("first_produce_us"),
                                                      F.max("produce_us").alias("last_produce_us"))
                     .orderBy("partition").toPandas())
outcome_counts = outcomes.groupBy("status", "fate").count().orderBy("status", "fate").toPandas()
env.show(outcome_counts, "messages by status and fate")
env.show(lost_by_partition, "acknowledged and lost, per partition")
env.show(lost, f"acknowledged and lost (first {max_rows})")
