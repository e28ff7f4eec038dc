"""The Delta tables of SPEC §4-5, declared once. Tables are created with these schemas, never inferred.

`TABLES[name]` gives the schema (Spark DDL, so that it reads like the spec), how the table is partitioned, and
its table properties. Column order is the spec's order.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TableSpec:
    name: str
    ddl: str
    partition_by: tuple[str, ...] = ()
    #: Column whose value identifies "this run's rows" (replaced as one unit, SPEC §5).
    run_key: str = "run_id"
    properties: dict[str, str] = field(default_factory=dict)
    description: str = ""

    @property
    def fields(self) -> list[tuple[str, str, bool]]:
        """(name, type, nullable) parsed from the DDL, which is kept in the spec's own words."""
        out = []
        for part in _split_top_level(self.ddl):
            name, _, rest = part.strip().partition(" ")
            rest = rest.strip()
            nullable = not rest.upper().endswith("NOT NULL")
            typ = rest[: -len("NOT NULL")].strip() if not nullable else rest
            out.append((name.strip("`"), typ.upper().replace(" ", ""), nullable))
        return out

    @property
    def columns(self) -> list[str]:
        return [name for name, _, _ in self.fields]

    def spark_schema(self):
        from pyspark.sql import types as T

        return T.StructType([T.StructField(n, _spark_type(t), nullable) for n, t, nullable in self.fields])

    def arrow_schema(self):
        import pyarrow as pa

        return pa.schema([pa.field(n, _arrow_type(t), nullable) for n, t, nullable in self.fields])


def _split_top_level(ddl: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(ddl):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(ddl[start:i])
            start = i + 1
    parts.append(ddl[start:])
    return parts


def _spark_type(t: str):
    from pyspark.sql import types as T

    simple = {"STRING": T.StringType(), "BIGINT": T.LongType(), "INT": T.IntegerType(), "DOUBLE": T.DoubleType(),
              "BOOLEAN": T.BooleanType(), "TIMESTAMP": T.TimestampType()}
    if t in simple:
        return simple[t]
    if t.startswith("ARRAY<"):
        return T.ArrayType(_spark_type(t[6:-1]), True)
    if t.startswith("MAP<"):
        k, v = _split_top_level(t[4:-1])
        return T.MapType(_spark_type(k), _spark_type(v), True)
    raise ValueError(f"unsupported column type {t}")


def _arrow_type(t: str):
    import pyarrow as pa

    simple = {"STRING": pa.string(), "BIGINT": pa.int64(), "INT": pa.int32(), "DOUBLE": pa.float64(),
              "BOOLEAN": pa.bool_(), "TIMESTAMP": pa.timestamp("us", tz="UTC")}
    if t in simple:
        return simple[t]
    if t.startswith("ARRAY<"):
        return pa.list_(_arrow_type(t[6:-1]))
    if t.startswith("MAP<"):
        k, v = _split_top_level(t[4:-1])
        return pa.map_(_arrow_type(k), _arrow_type(v))
    raise ValueError(f"unsupported column type {t}")


#: The run_summary fields (SPEC §4.4), also every row of sweep_results.
_SUMMARY_DDL = (
    "produced BIGINT, acked BIGINT, failed BIGINT, pending BIGINT, acked_lost BIGINT, "
    "acked_lost_rate DOUBLE, failed_committed BIGINT, stranded BIGINT, availability DOUBLE, "
    "unavailable_partition_seconds DOUBLE, ack_latency_p50_ms DOUBLE, ack_latency_p99_ms DOUBLE, "
    "ack_latency_p999_ms DOUBLE, ack_latency_max_ms DOUBLE, visibility_lag_p99_ms DOUBLE, brokers_used INT, "
    "replicas_per_message DOUBLE, replication_bytes BIGINT"
)
#: The big run-partitioned tables: a run's partition is only ever replaced whole, in one commit, so its files never
#: accumulate and auto compaction only rewrote what the write had just written (3.7 M outcome rows of 16 runs
#: written by 4 tasks: 7.1 s, 14.0 s with the compaction). Optimized writes stay for sessions that allow them.
_BIG = {"delta.autoOptimize.optimizeWrite": "true", "delta.autoOptimize.autoCompact": "false"}


def _big(*stats_columns: str) -> dict[str, str]:
    """A big table's properties, with file statistics on these numeric columns only. Delta's default, min/max and
    null counts of the first 32 columns, cost 17-20 % of writing every outcome row (6 M rows of message_outcomes'
    shape: 8.8 s against 7.2 s with two columns), mostly for strings (status, error, fate, key) whose ranges
    skip nothing: a task's file holds rows of every window and status of its partitions."""
    return {**_BIG, "delta.dataSkippingStatsColumns": ",".join(stats_columns)}


_SMALL = {"delta.autoOptimize.autoCompact": "true"}

TABLES: dict[str, TableSpec] = {t.name: t for t in (
    TableSpec(
        "runs",
        "run_id STRING NOT NULL, trace_id STRING NOT NULL, policy STRING NOT NULL, family STRING NOT NULL, "
        "params MAP<STRING, STRING>, mode STRING NOT NULL, started_at TIMESTAMP, finished_at TIMESTAMP, "
        "status STRING NOT NULL, mlflow_run_id STRING, replab_version STRING NOT NULL",
        properties=_SMALL, description="one row per replay (SPEC §4.4)",
    ),
    TableSpec(
        "run_summary",
        "run_id STRING NOT NULL, " + _SUMMARY_DDL,
        properties=_SMALL, description="the run's headline figures (SPEC §4.4)",
    ),
    TableSpec(
        "message_outcomes",
        "run_id STRING NOT NULL, msg_id BIGINT NOT NULL, key STRING, producer_id INT, `partition` INT, "
        "produce_us BIGINT NOT NULL, status STRING NOT NULL, error STRING, ack_us BIGINT, latency_us BIGINT, "
        "fate STRING NOT NULL, readable_at_end BOOLEAN NOT NULL, `offset` BIGINT, visible_us BIGINT",
        partition_by=("run_id",), properties=_big("partition", "msg_id", "produce_us"),
        description="one row per produced message (SPEC §4.1)",
    ),
    TableSpec(
        "partition_states",
        "run_id STRING NOT NULL, `partition` INT NOT NULL, ts_us BIGINT NOT NULL, leader INT, leader_epoch INT, "
        "isr ARRAY<INT>, log_end_offset BIGINT, high_watermark BIGINT",
        partition_by=("run_id",), properties=_big("partition", "ts_us"),
        description="per-partition timeline: a row at every leader/epoch/ISR change and the last log-end/high-"
                    "watermark change of every window (SPEC §4.2)",
    ),
    TableSpec(
        "committed_offsets",
        "window_start_us BIGINT NOT NULL, window_end_us BIGINT NOT NULL, run_id STRING NOT NULL, "
        "`partition` INT NOT NULL, high_watermark BIGINT, log_end_offset BIGINT, leader INT, isr_size INT, "
        "under_min_isr BOOLEAN, visibility_lag_p99_us BIGINT",
        partition_by=("run_id",), properties=_big("partition", "window_start_us"),
        description="windowed offsets (SPEC §4.3)",
    ),
    TableSpec(
        "loss_metrics",
        "window_start_us BIGINT NOT NULL, window_end_us BIGINT NOT NULL, run_id STRING NOT NULL, "
        "`partition` INT NOT NULL, produced BIGINT, acked BIGINT, failed BIGINT, acked_lost BIGINT, "
        "failed_committed BIGINT, stranded BIGINT, unavailable_us BIGINT, ack_latency_p50_us BIGINT, "
        "ack_latency_p99_us BIGINT, ack_latency_max_us BIGINT",
        partition_by=("run_id",), properties=_big("partition", "window_start_us"),
        description="windowed loss and availability (SPEC §4.3)",
    ),
    TableSpec(
        "unavailability",
        "run_id STRING NOT NULL, `partition` INT NOT NULL, start_us BIGINT NOT NULL, end_us BIGINT NOT NULL",
        partition_by=("run_id",), properties=_SMALL,
        description="intervals during which a produce to the partition could not be acknowledged (feeds "
                    "loss_metrics.unavailable_us; an addition to SPEC §4.3 for drill-downs)",
    ),
    TableSpec(
        "watermarks",
        "run_id STRING NOT NULL, batch BIGINT NOT NULL, watermark_us BIGINT, max_event_us BIGINT, rows_in BIGINT, "
        "rows_late BIGINT",
        properties=_SMALL, description="the replay's own event-time progress (SPEC §4.3)",
    ),
    TableSpec(
        "testbed_outcomes",
        "run_id STRING NOT NULL, scenario STRING NOT NULL, policy STRING NOT NULL, msg_id BIGINT NOT NULL, "
        "`partition` INT, produce_us BIGINT NOT NULL, observed_status STRING NOT NULL, observed_error STRING, "
        "observed_ack_us BIGINT, observed_fate STRING NOT NULL, observed_offset BIGINT, predicted_status STRING, "
        "predicted_error STRING, predicted_ack_us BIGINT, predicted_fate STRING",
        partition_by=("run_id",), properties=_SMALL,
        description="testbed (SPEC §12): per message, what a real Kafka cluster did beside replab's prediction; "
                    "run_id is the prediction's run",
    ),
    TableSpec(
        "testbed_comparisons",
        "run_id STRING NOT NULL, scenario STRING NOT NULL, policy STRING NOT NULL, trace_id STRING NOT NULL, "
        "predicted_produced BIGINT, observed_produced BIGINT, predicted_acked BIGINT, observed_acked BIGINT, "
        "predicted_failed BIGINT, observed_failed BIGINT, predicted_pending BIGINT, observed_pending BIGINT, "
        "predicted_acked_lost BIGINT, observed_acked_lost BIGINT, predicted_failed_committed BIGINT, "
        "observed_failed_committed BIGINT, predicted_unavailable_partition_seconds DOUBLE, "
        "observed_unavailable_partition_seconds DOUBLE, predicted_ack_latency_p50_ms DOUBLE, "
        "observed_ack_latency_p50_ms DOUBLE, predicted_ack_latency_p99_ms DOUBLE, observed_ack_latency_p99_ms DOUBLE, "
        "predicted_failover_ms DOUBLE, observed_failover_ms DOUBLE, status_agreement DOUBLE, "
        "fate_agreement DOUBLE, loss_agrees BOOLEAN, mlflow_run_id STRING, recorded_at TIMESTAMP",
        properties=_SMALL,
        description="testbed (SPEC §12): per (scenario, policy), predicted and observed figures and agreement",
    ),
    TableSpec(
        "quarantine",
        "run_id STRING, trace_id STRING NOT NULL, file STRING, `row` BIGINT, raw STRING, rule STRING NOT NULL, "
        "severity STRING NOT NULL",
        run_key="trace_id", properties=_SMALL, description="rows dropped by a gate, with the rule (SPEC §5)",
    ),
    TableSpec(
        "sweeps",
        "sweep_id STRING NOT NULL, scenario STRING NOT NULL, scale DOUBLE NOT NULL, first_seed BIGINT NOT NULL, "
        "seeds INT NOT NULL, policies ARRAY<STRING>, labels ARRAY<STRING>, window_ms INT, duration_us BIGINT, "
        "status STRING NOT NULL, fatal_seeds INT, started_at TIMESTAMP, finished_at TIMESTAMP, "
        "replab_version STRING NOT NULL",
        run_key="sweep_id", properties=_SMALL,
        description="one row per sweep (many seeds of a scenario × policies); written after its results",
    ),
    TableSpec(
        "sweep_results",
        "sweep_id STRING NOT NULL, seed BIGINT NOT NULL, trace_id STRING NOT NULL, policy STRING NOT NULL, "
        "label STRING, status STRING NOT NULL, events BIGINT, gate_fatal_rows BIGINT, gate_quarantined_rows BIGINT, "
        "gate_rules STRING, " + ", ".join(
            f.strip() for f in _SUMMARY_DDL.split(",")) + ", loss_series ARRAY<BIGINT>, "
        "unavailable_series ARRAY<BIGINT>",
        run_key="sweep_id", properties=_SMALL,
        description="one row per seed and policy of a sweep: every run_summary field (null for a seed whose trace "
                    "broke a fatal rule), the trace gate's counts, optional per-window series",
    ),
    TableSpec(
        "durability_runs",
        "durability_id STRING NOT NULL, scenario STRING NOT NULL, rates STRING NOT NULL, rates_json STRING, "
        "policies ARRAY<STRING>, method STRING NOT NULL, episodes BIGINT NOT NULL, episodes_per_stratum STRING, "
        "cpu_seconds DOUBLE, wall_seconds DOUBLE, weight_ess DOUBLE, status STRING NOT NULL, "
        "started_at TIMESTAMP, finished_at TIMESTAMP, replab_version STRING NOT NULL",
        run_key="durability_id", properties=_SMALL,
        description="one row per `replab durability` run: failure rates, method, episodes, time",
    ),
    TableSpec(
        "durability_estimates",
        "durability_id STRING NOT NULL, policy STRING NOT NULL, label STRING, metric STRING NOT NULL, "
        "estimate DOUBLE, low DOUBLE, high DOUBLE, bounded BOOLEAN NOT NULL, loss_ess DOUBLE, "
        "largest_weight_share DOUBLE, losing_episodes INT, method STRING",
        run_key="durability_id", properties=_SMALL,
        description="per durability run, policy and yearly metric: estimate and 95 % interval (an upper bound "
                    "only when bounded), effective sample size",
    ),
    TableSpec(
        "validations",
        "validation_id STRING NOT NULL, run_id STRING, trace_id STRING NOT NULL, suite STRING NOT NULL, "
        "target STRING NOT NULL, success BOOLEAN NOT NULL, evaluated INT, successful INT, unexpected_rows BIGINT, "
        "report_path STRING, validated_at TIMESTAMP",
        run_key="trace_id", properties=_SMALL, description="every gate run (SPEC §5, §7)",
    ),
)}

#: The fields of run_summary and of the summary JSON, in order (SPEC §4.4, §6.1).
SUMMARY_FIELDS: tuple[str, ...] = tuple(c for c in TABLES["run_summary"].columns if c != "run_id")
