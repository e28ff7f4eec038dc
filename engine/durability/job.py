"""`replab durability` as a Spark job: rounds of episodes, each round ONE `mapInArrow` over (stratum, episode)
numbers. Each task samples its episodes, generates each episode's short trace in-process and replays it under
every policy (`engine.durability.run.episode_rows`); only one small row per episode (its likelihood statistics
and every policy's verdict) reaches the driver, never a trace. Between rounds the driver re-allocates episodes
to the strata (`Estimate.allocation`) and stops at the target relative error or the time budget.

Then: the output gate (`expectations.durability_gate`), Delta tables `durability_estimates` and
`durability_runs` (one commit each, replacing this run's rows), `DIR/durability.json`, and MLflow (a parent
run and a child per policy).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from engine import worker_imports
from engine.durability.judge import layout_cost
from engine.durability.run import DurabilitySpec, Estimate, episode_rows, next_work, sensitivity

worker_imports.install()

ROW_SCHEMA = pa.schema([
    ("stratum", pa.int32()), ("episode", pa.int64()), ("log_q", pa.float64()), ("log_forcing_ratio", pa.float64()),
    ("defensive", pa.float64()), ("counts", pa.list_(pa.float64())),
    ("exposure_s", pa.list_(pa.float64())), ("length_s", pa.float64()), ("faults", pa.int32()),
    ("max_down", pa.int32()), ("truncated", pa.bool_()), ("recovery_n", pa.list_(pa.float64())),
    ("recovery_sum", pa.list_(pa.float64())), ("recovery_log_sum", pa.list_(pa.float64())),
    ("lost", pa.list_(pa.bool_())),
    ("acked_lost", pa.list_(pa.float64())), ("unavailable_s", pa.list_(pa.float64())),
    ("failed_committed", pa.list_(pa.float64())), ("cpu_seconds", pa.float64()),
])
ROW_DDL = ("stratum INT, episode BIGINT, log_q DOUBLE, log_forcing_ratio DOUBLE, defensive DOUBLE, "
           "counts ARRAY<DOUBLE>, exposure_s ARRAY<DOUBLE>, "
           "length_s DOUBLE, faults INT, max_down INT, truncated BOOLEAN, recovery_n ARRAY<DOUBLE>, "
           "recovery_sum ARRAY<DOUBLE>, recovery_log_sum ARRAY<DOUBLE>, lost ARRAY<BOOLEAN>, "
           "acked_lost ARRAY<DOUBLE>, unavailable_s ARRAY<DOUBLE>, failed_committed ARRAY<DOUBLE>, cpu_seconds DOUBLE")
#: The yearly metrics of `durability_estimates` (keys of `estimate.policy_figures`).
METRICS = ("p_loss_per_year", "nines", "acked_lost_per_year", "unavailable_min_per_year", "failed_committed_per_year")
SUCCEEDED = "succeeded"


def episodes_task(spec: DurabilitySpec):
    """mapInArrow function: rows of (stratum, episode, mixture share) → ROW_DDL rows."""

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            work = list(zip(*(batch.column(c).to_pylist() for c in range(3)), strict=True))
            if work:
                yield pa.RecordBatch.from_pylist(episode_rows(spec, work), schema=ROW_SCHEMA)

    return fn


def run_round(spark, spec: DurabilitySpec, work: Sequence[tuple[int, int, float]]) -> list[dict[str, Any]]:
    sc = spark.sparkContext
    tasks = max(1, min(len(work), 4 * sc.defaultParallelism))
    df = spark.createDataFrame([(int(k), int(i), float(d)) for k, i, d in work],
                               "stratum INT, episode BIGINT, defensive DOUBLE").repartition(tasks)
    return df.mapInArrow(episodes_task(spec), ROW_DDL).toArrow().cast(ROW_SCHEMA).to_pylist()


@dataclass
class DurabilityRequest:
    spec: DurabilitySpec
    labels: list[str]
    target_rel_error: float = 0.2
    budget_minutes: float = 10.0
    max_episodes: int = 100_000
    batch: int | None = None  # episodes per round (default 4 per core)
    out: str = "durability"
    lakehouse: str = "lakehouse"
    tracking_uri: str | None = None
    experiment: str | None = None
    mlflow: bool = True


@dataclass
class DurabilityReport:
    durability_id: str
    estimate: Estimate
    labels: list[str]
    figures: list[dict[str, Any]]
    sensitivity: list[dict[str, Any]]
    wall_seconds: float
    stop_reason: str
    json_path: Path | None = None
    parent_run_id: str | None = None
    child_run_ids: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        spec = self.estimate.spec
        return {"durability_id": self.durability_id, "scenario": spec.scenario.name,
                "rates": spec.rates.to_json(), "method": method_text(spec), "stop_reason": self.stop_reason,
                "wall_seconds": self.wall_seconds, **self.estimate.summary(),
                "policies": [{"policy": p.canonical(), "label": lab, **fig,
                              **dict(zip(("brokers_used", "replicas_per_message"), layout_cost(spec.scenario, p),
                                         strict=True)),
                              "mlflow_run_id": self.child_run_ids.get(p.canonical())}
                             for p, lab, fig in zip(spec.policies, self.labels, self.figures, strict=True)],
                "sensitivity": self.sensitivity, "mlflow_parent_run_id": self.parent_run_id}


def method_text(spec: DurabilitySpec) -> str:
    b = spec.biasing
    return (f"regenerative episodes stratified by initial fault; failure biasing with forcing q={b.q:g}, "
            f"cap {b.cap:g}, {b.max_biased_faults} biased faults in {b.max_biased_steps} steps, in a defensive "
            f"mixture with the model (share {b.defensive:g}); "
            f"traces compressed to gaps <= {spec.shape.max_gap_s:g} s at {spec.shape.trace_rate_per_s:g} msg/s")


def durability_id_for(spec: DurabilitySpec) -> str:
    from schemas.version import __version__

    key = json.dumps({"scenario": spec.scenario.to_json(), "rates": spec.rates.to_json(), "seed": spec.seed,
                      "policies": [p.canonical() for p in spec.policies], "method": method_text(spec),
                      "version": __version__}, sort_keys=True, default=str)
    return "dur-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def estimate_rows(report: DurabilityReport) -> list[dict[str, Any]]:
    rows = []
    for p, lab, fig in zip(report.estimate.spec.policies, report.labels, report.figures, strict=True):
        for m in METRICS:
            iv = fig[m]

            def num(v: Any) -> float | None:
                return None if v is None else float(v)

            rows.append({"durability_id": report.durability_id, "policy": p.canonical(), "label": lab, "metric": m,
                         "estimate": num(iv["estimate"]) if iv["estimate"] is not None else
                         (num(iv["low"]) if m == "nines" else None),
                         "low": num(iv["low"]), "high": num(iv["high"]), "bounded": bool(fig["bounded"]),
                         "loss_ess": float(fig["loss_ess"]), "largest_weight_share":
                         float(fig["loss_largest_weight_share"]),
                         "losing_episodes": int(fig["losing_episodes_sampled"]),
                         "method": fig["method"]})
    return rows


def _finite(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Infinite figures (infinite nines when the bound is 0) are stored as null."""
    return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()} for r in rows]


def run_durability(spark, request: DurabilityRequest, *, log: Callable[[str], None] | None = None,
                   publish: bool = True) -> DurabilityReport:
    say = log or (lambda text: None)
    spec = request.spec
    started_wall, started = time.monotonic(), dt.datetime.now(dt.UTC)
    did = durability_id_for(spec)
    est = Estimate(spec)
    batch = request.batch or 4 * spark.sparkContext.defaultParallelism
    deadline = started_wall + request.budget_minutes * 60
    stop = "max episodes"
    rounds = 0
    while len(est.rows) < request.max_episodes:
        work = next_work(est, min(batch, request.max_episodes - len(est.rows)))
        est.rows.extend(run_round(spark, spec, work))
        rounds += 1
        rel = est.relative_error()
        say(f"round {rounds}: {len(est.rows)} episodes, worst relative half-width {rel:.3g}")
        if rel <= request.target_rel_error:
            stop = f"target relative error {request.target_rel_error:g} reached"
            break
        if time.monotonic() > deadline:
            stop = f"budget of {request.budget_minutes:g} minutes spent"
            break
    report = DurabilityReport(did, est, request.labels, est.figures(), sensitivity(est),
                              time.monotonic() - started_wall, stop)
    out = Path(request.out)
    out.mkdir(parents=True, exist_ok=True)
    report.json_path = out / "durability.json"
    write_json(report)
    if publish:
        _publish(spark, request, report, started)
    if request.mlflow:
        _log_mlflow(request, report)
        write_json(report)
    return report


def write_json(report: DurabilityReport) -> None:
    report.json_path.write_text(json.dumps(_plain(report.to_json()), indent=2, allow_nan=False, default=str) + "\n")


def _plain(v: Any) -> Any:
    """Strict JSON: infinite figures (infinite nines when P is 0) become null."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v


def _publish(spark, request: DurabilityRequest, report: DurabilityReport, started: dt.datetime) -> None:
    from expectations.durability_gate import run_durability_gate
    from schemas.tables import TABLES
    from schemas.version import __version__
    from storage.lakehouse import Lakehouse

    lakehouse = Lakehouse(request.lakehouse, spark, create=False)
    rows = _finite(estimate_rows(report))
    try:
        run_durability_gate(rows, durability_id=report.durability_id, policies=len(report.labels),
                            metrics=len(METRICS), lakehouse=lakehouse)
    finally:
        lakehouse.flush_validations()
    spec, summary = report.estimate.spec, report.estimate.summary()
    schema = TABLES["durability_estimates"].arrow_schema()
    table = pa.Table.from_pylist([{k: r.get(k) for k in schema.names} for r in rows], schema=schema)
    lakehouse.replace_rows("durability_estimates", "durability_id", [report.durability_id],
                           spark.createDataFrame(table, TABLES["durability_estimates"].spark_schema()))
    run = {"durability_id": report.durability_id, "scenario": spec.scenario.name, "rates": spec.rates.name,
           "rates_json": json.dumps(spec.rates.to_json()), "policies": [p.canonical() for p in spec.policies],
           "method": method_text(spec), "episodes": len(report.estimate.rows),
           "episodes_per_stratum": json.dumps(summary["episodes_per_stratum"]), "cpu_seconds": summary["cpu_seconds"],
           "wall_seconds": report.wall_seconds, "weight_ess": summary["weight_ess"], "status": SUCCEEDED,
           "started_at": started, "finished_at": dt.datetime.now(dt.UTC), "replab_version": __version__}
    marker = pa.Table.from_pylist([run], schema=TABLES["durability_runs"].arrow_schema())
    lakehouse.replace_rows("durability_runs", "durability_id", [report.durability_id],
                           spark.createDataFrame(marker, TABLES["durability_runs"].spark_schema()))


def _log_mlflow(request: DurabilityRequest, report: DurabilityReport) -> None:
    from mlflow.entities import Metric

    from engine import tracking
    from schemas.version import __version__

    spec = report.estimate.spec
    client = tracking.client_for(request.tracking_uri)
    experiment_id = tracking.ensure_experiment(client, request.experiment or f"durability-{spec.scenario.name}")
    now = int(time.time() * 1000)
    common = {"replab.durability_id": report.durability_id, "replab.version": __version__,
              "replab.mode": "durability", tracking.TAG_LAKEHOUSE: str(Path(request.lakehouse).resolve())}
    parent = client.create_run(experiment_id, start_time=now, run_name=f"durability {spec.scenario.name}",
                               tags={**common, tracking.TAG_KIND: "durability"})
    pid = parent.info.run_id
    summary = report.estimate.summary()
    tracking.log_in_chunks(client, pid, params={"scenario.name": spec.scenario.name, "rates": spec.rates.name,
                                                "method": method_text(spec)[:500],
                                                "policies": str(len(spec.policies))},
                           metrics=[Metric(k, float(summary[k]), now, 0) for k in
                                    ("episodes", "weight_ess", "cpu_seconds") if summary.get(k) is not None])
    for p, lab, fig in zip(spec.policies, report.labels, report.figures, strict=True):
        run = client.create_run(experiment_id, start_time=now, run_name=lab,
                                tags={**common, tracking.TAG_KIND: "durability_policy", tracking.TAG_POLICY:
                                      p.canonical(), "mlflow.parentRunId": pid})
        values = {"p_loss_per_year": fig["p_loss_per_year"]["estimate"],
                  "p_loss_per_year_high": fig["p_loss_per_year"]["high"],
                  "nines": fig["nines"]["estimate"], "nines_low": fig["nines"]["low"],
                  "acked_lost_per_year": fig["acked_lost_per_year"]["estimate"],
                  "unavailable_min_per_year": fig["unavailable_min_per_year"]["estimate"],
                  "failed_committed_per_year": fig["failed_committed_per_year"]["estimate"],
                  "loss_ess": fig["loss_ess"], "loss_largest_weight_share": fig["loss_largest_weight_share"]}
        tracking.log_in_chunks(client, run.info.run_id, params={"policy": p.canonical()},
                               metrics=[Metric(k, float(v), now, 0) for k, v in values.items()
                                        if v is not None and math.isfinite(float(v))])
        client.set_terminated(run.info.run_id, status="FINISHED")
        report.child_run_ids[p.canonical()] = run.info.run_id
    if report.json_path is not None:
        write_json(report)
        client.log_artifact(pid, str(report.json_path))
    client.set_terminated(pid, status="FINISHED")
    report.parent_run_id = pid
