"""A whole sweep (SPEC §1 "Sweep", §6.1): the distributed job, its output gate, its two Delta tables, its estimates
and its MLflow runs. `replab sweep`, `replab recommend`, spark-submit and notebook 04 call `run_sweep`.

1. `engine.sweep.job.run_sweep_job`: ONE Spark job; per (seed, policy) every run_summary field;
2. `expectations.sweep_gate`: the output gate, once, on those rows (before anything is written);
3. lakehouse: `sweep_results` (one row per seed and policy) then `sweeps` (one row, the commit marker), each
   ONE Delta commit replacing the rows of this `sweep_id` (replaceWhere), so a re-run, or a run after a
   killed one, ends with the same rows. The sweep id hashes what determines the results (scenario
   parameters, scale, seeds, canonical policies, window, series, replab version); `reuse=True` reads a
   succeeded sweep of that id back instead of running it again;
4. estimates per policy (`engine.sweep.estimates`), `<out>/sweep.json` and `<out>/sweep.csv`;
5. MLflow: one experiment, a parent run for the sweep and a child run per policy, named as typed.
"""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.sweep.estimates import CONFIDENCE, METRICS, PolicyEstimate, estimate

TAG_KIND_SWEEP = "sweep"
TAG_KIND_SWEEP_POLICY = "sweep_policy"
TAG_SWEEP_ID = "replab.sweep_id"
TAG_SWEEP_POLICY = "replab.sweep_policy"
SUCCEEDED = "succeeded"


@dataclass
class SweepRequest:
    scenario: str  # library name or YAML file
    seeds: int
    policies: list[Any]  # replay.policies.Policy
    #: How the user typed each policy (preset names); default: canonical strings.
    labels: list[str] | None = None
    scale: float = 1.0
    first_seed: int = 0
    out: str | None = None
    lakehouse: str = "lakehouse"
    window_ms: int = 1000
    tracking_uri: str | None = None
    experiment: str | None = None
    mlflow: bool = True
    keep_traces: bool = False
    series: bool = False
    #: Read a succeeded sweep with the same id from the lakehouse instead of running it.
    reuse: bool = False


@dataclass
class SweepReport:
    sweep_id: str
    name: str
    scenario: str
    scale: float
    seeds: list[int]
    policies: list[str]  # canonical, in request order
    labels: list[str]
    rows: list[dict[str, Any]]  # sweep_results rows
    estimates: list[PolicyEstimate]
    duration_s: float
    lakehouse: str
    out_dir: Path
    reused: bool = False
    seconds: float = 0.0
    experiment: str | None = None
    tracking_uri: str | None = None
    parent_run_id: str | None = None
    child_run_ids: dict[str, str] = field(default_factory=dict)  # canonical -> MLflow run id
    json_path: Path | None = None
    csv_path: Path | None = None

    @property
    def fatal_seeds(self) -> list[int]:
        return sorted({r["seed"] for r in self.rows if r["status"] != "ok"})

    def to_json(self) -> dict[str, Any]:
        return {"sweep_id": self.sweep_id, "scenario": self.scenario, "scale": self.scale,
                "seeds": [self.seeds[0], self.seeds[-1]], "duration_s": self.duration_s,
                "confidence": CONFIDENCE, "metrics": METRICS, "lakehouse": self.lakehouse,
                "fatal_seeds": self.fatal_seeds, "experiment": self.experiment,
                "policies": [{**e.row(), "mlflow_run_id": self.child_run_ids.get(e.policy)} for e in self.estimates]}

    def write(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.json_path, self.csv_path = self.out_dir / "sweep.json", self.out_dir / "sweep.csv"
        self.json_path.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        rows = [e.row() for e in self.estimates]
        with self.csv_path.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


def sweep_name(scenario: str, scale: float, seeds: Sequence[int]) -> str:
    """`sweep-<scenario>[-x<scale>]-seeds<first>-<last>`: the default experiment and output folder name."""
    return f"sweep-{scenario}" + ("" if scale == 1 else f"-x{scale:g}") + f"-seeds{seeds[0]}-{seeds[-1]}"


def sweep_id_for(scenario, scale: float, seeds: Sequence[int], policies: Sequence[str], window_ms: int,
                 series: bool) -> str:
    from schemas.version import __version__

    key = json.dumps({"scenario": scenario.to_json(), "scale": scale, "seeds": [seeds[0], seeds[-1]],
                      "policies": list(policies), "window_ms": window_ms, "series": series,
                      "version": __version__}, sort_keys=True, default=str)
    return f"{sweep_name(scenario.name, scale, seeds)}-{hashlib.sha1(key.encode()).hexdigest()[:10]}"


def check_request(request: SweepRequest):
    """Bad input (exit 2) before any Spark work: seeds, policies, the scenario and its scale."""
    from generators.generate import build_plan
    from generators.library import resolve_scenario
    from schemas.errors import BadInput

    if request.seeds < 1:
        raise BadInput(f"--seeds must be at least 1, got {request.seeds}", rule="arguments")
    if request.first_seed < 0:
        raise BadInput(f"--first-seed must be >= 0, got {request.first_seed}", rule="arguments")
    if request.window_ms <= 0:
        raise BadInput(f"--window-ms must be > 0, got {request.window_ms}", rule="arguments")
    if not request.policies:
        raise BadInput("a sweep needs at least one --policy", rule="arguments")
    if request.labels is not None and len(request.labels) != len(request.policies):
        raise BadInput(f"{len(request.labels)} labels for {len(request.policies)} policies", rule="arguments")
    seen: dict[str, int] = {}
    for i, p in enumerate(request.policies):
        c = p.canonical()
        if c in seen:
            raise BadInput(f"--policy #{i + 1} ({c}) is the same policy as --policy #{seen[c] + 1}",
                           rule="policy-duplicate")
        seen[c] = i
    scenario = resolve_scenario(request.scenario)
    build_plan(scenario, request.first_seed, request.scale)  # a bad --scale is refused here
    return scenario


# ------------------------------------------------------------------------------------------------ lakehouse
def stored_rows(lakehouse, sweep_id: str) -> list[dict[str, Any]] | None:
    """The results of a succeeded sweep of this id, or None."""
    from pyspark.sql import functions as F

    from storage.lakehouse import sql_string

    root = Path(lakehouse.root)
    if not (root / "sweeps" / "_delta_log").is_dir() or not (root / "sweep_results" / "_delta_log").is_dir():
        return None
    marker = lakehouse.read("sweeps").where(F.expr(f"sweep_id = {sql_string(sweep_id)}")).collect()
    if not marker or marker[0]["status"] != SUCCEEDED:
        return None
    rows = (lakehouse.read("sweep_results").where(F.expr(f"sweep_id = {sql_string(sweep_id)}")).toArrow()
            .to_pylist())
    return [{**r, "duration_us": marker[0]["duration_us"]} for r in rows]  # the trace length is the sweep's


def publish(lakehouse, sweep_id: str, rows: list[dict[str, Any]], sweep_row: dict[str, Any]) -> None:
    """sweep_results, then sweeps (the marker): one commit each, replacing this sweep's rows."""
    import pyarrow as pa

    from schemas.tables import TABLES

    spark = lakehouse.spark
    schema = TABLES["sweep_results"].arrow_schema()
    results = pa.Table.from_pylist([{k: r.get(k) for k in schema.names} for r in rows], schema=schema)
    lakehouse.replace_rows("sweep_results", "sweep_id", [sweep_id],
                           spark.createDataFrame(results, TABLES["sweep_results"].spark_schema()))
    marker = pa.Table.from_pylist([sweep_row], schema=TABLES["sweeps"].arrow_schema())
    lakehouse.replace_rows("sweeps", "sweep_id", [sweep_id],
                           spark.createDataFrame(marker, TABLES["sweeps"].spark_schema()))


# ------------------------------------------------------------------------------------------------ the sweep
def run_sweep(spark, request: SweepRequest, *, log: Callable[[str], None] | None = None) -> SweepReport:
    from engine.sweep.job import SweepSpec, run_sweep_job, slug
    from schemas.version import __version__
    from storage.lakehouse import Lakehouse

    say = log or (lambda text: None)
    started_wall = time.monotonic()
    scenario = check_request(request)
    seeds = list(range(request.first_seed, request.first_seed + request.seeds))
    canonical = [p.canonical() for p in request.policies]
    labels = list(request.labels or canonical)
    label_of = dict(zip(canonical, labels, strict=True))
    sweep_id = sweep_id_for(scenario, request.scale, seeds, canonical, request.window_ms, request.series)
    name = sweep_name(scenario.name, request.scale, seeds)
    out_dir = Path(request.out) if request.out else Path("sweeps") / slug(name)
    lakehouse = Lakehouse(request.lakehouse, spark, create=False)

    rows = stored_rows(lakehouse, sweep_id) if request.reuse else None
    reused = rows is not None
    if reused:
        say(f"{sweep_id}: reusing {len(rows)} results from {lakehouse.root}")
    else:
        started = dt.datetime.now(dt.UTC)
        spec = SweepSpec(scenario, request.scale, tuple(request.policies), request.window_ms * 1000,
                         request.series, str((out_dir / "traces").resolve()) if request.keep_traces else None)
        say(f"{sweep_id}: {len(seeds)} seeds × {len(canonical)} policies, one Spark job")
        table = run_sweep_job(spark, spec, seeds, job_group=sweep_id)
        rows = [{**r, "sweep_id": sweep_id, "label": label_of[r["policy"]]} for r in table.to_pylist()]
        say("output gate on the sweep's results")
        from expectations.sweep_gate import run_sweep_gate

        try:
            run_sweep_gate(rows, sweep_id=sweep_id, seeds=len(seeds), policies=len(canonical), lakehouse=lakehouse)
        finally:
            lakehouse.flush_validations()
        say("Delta tables sweep_results, sweeps")
        fatal = len({r["seed"] for r in rows if r["status"] != "ok"})
        publish(lakehouse, sweep_id, rows, {
            "sweep_id": sweep_id, "scenario": scenario.name, "scale": float(request.scale),
            "first_seed": seeds[0], "seeds": len(seeds), "policies": canonical, "labels": labels,
            "window_ms": request.window_ms, "duration_us": int(rows[0]["duration_us"]), "status": SUCCEEDED,
            "fatal_seeds": fatal, "started_at": started, "finished_at": dt.datetime.now(dt.UTC),
            "replab_version": __version__})

    # Seed order whatever the source (a Delta read has none): the bootstrap's fixed random state then gives the
    # same interval for a reused sweep as for the run that wrote it.
    order = {c: i for i, c in enumerate(canonical)}
    rows.sort(key=lambda r: (r["seed"], order[r["policy"]]))
    duration_s = float(rows[0]["duration_us"]) / 1e6
    by_policy: dict[str, list[dict[str, Any]]] = {c: [] for c in canonical}
    for r in rows:
        by_policy[r["policy"]].append(r)
    estimates = [estimate(c, label_of[c], by_policy[c], duration_s) for c in canonical]
    report = SweepReport(sweep_id, name, scenario.name, request.scale, seeds, canonical, labels, rows, estimates,
                         duration_s, str(lakehouse.root), out_dir, reused=reused)
    report.write()
    if request.mlflow:
        log_sweep(report, request, experiment=request.experiment or name)
        report.write()  # again, with the MLflow run ids
    report.seconds = time.monotonic() - started_wall
    return report


# ------------------------------------------------------------------------------------------------ MLflow
def log_sweep(sweep: SweepReport, request: SweepRequest, *, experiment: str,
              parent_tags: dict[str, str] | None = None, parent_metrics: dict[str, float] | None = None) -> None:
    """A parent run for the sweep and a child run per policy (named as typed); an earlier logging of the same
    sweep id in this experiment is replaced."""
    from mlflow.entities import Metric

    from engine import tracking
    from schemas.version import __version__

    client = tracking.client_for(request.tracking_uri)
    experiment_id = tracking.ensure_experiment(client, experiment)
    for earlier in tracking.search_all_runs(client, [experiment_id],
                                            f"tags.`{TAG_SWEEP_ID}` = '{sweep.sweep_id}'"):
        client.delete_run(earlier.info.run_id)
    now = int(time.time() * 1000)
    common = {TAG_SWEEP_ID: sweep.sweep_id, "replab.version": __version__, "replab.git_sha": tracking.git_sha(),
              tracking.TAG_LAKEHOUSE: sweep.lakehouse, "replab.mode": "sweep"}
    parent = client.create_run(experiment_id, start_time=now, run_name=sweep.name,
                               tags={**common, tracking.TAG_KIND: TAG_KIND_SWEEP, **(parent_tags or {})})
    parent_id = parent.info.run_id
    try:
        tracking.log_in_chunks(client, parent_id, params={
            "scenario.name": sweep.scenario, "scenario.scale": f"{sweep.scale:g}",
            "sweep.seeds": str(len(sweep.seeds)), "sweep.first_seed": str(sweep.seeds[0]),
            "sweep.policies": str(len(sweep.policies)), "sweep.confidence": str(CONFIDENCE)},
            metrics=[Metric(k, float(v), now, 0) for k, v in {
                "fatal_seeds": len(sweep.fatal_seeds), **(parent_metrics or {})}.items()])
        policies = {p.canonical(): p for p in request.policies}
        for e in sweep.estimates:
            tags = {**common, tracking.TAG_KIND: TAG_KIND_SWEEP_POLICY, TAG_SWEEP_POLICY: e.policy,
                    tracking.TAG_POLICY: e.policy, "replab.label": e.label, "replab.family": policies[e.policy].family,
                    "mlflow.parentRunId": parent_id}
            run = client.create_run(experiment_id, start_time=now, tags=tags, run_name=e.label)
            run_id = run.info.run_id
            params = {k: v if isinstance(v, str) else json.dumps(v, default=str)
                      for k, v in policies[e.policy].params().items()}
            params.update({"policy": e.policy, "scenario.name": sweep.scenario, "scenario.scale": f"{sweep.scale:g}",
                           "sweep.seeds": str(len(sweep.seeds))})
            metrics = [Metric(k, float(v), now, 0) for k, v in e.row().items()
                       if k not in ("policy", "label") and v is not None]
            for r in sweep.rows:
                if r["policy"] == e.policy and r["status"] == "ok":
                    metrics.append(Metric("seed/acked_lost", float(r["acked_lost"]), now, int(r["seed"])))
                    if r["availability"] is not None:
                        metrics.append(Metric("seed/availability", float(r["availability"]), now, int(r["seed"])))
            try:
                tracking.log_in_chunks(client, run_id, metrics=metrics, params=params)
            except BaseException:
                client.set_terminated(run_id, status="FAILED")
                raise
            client.set_terminated(run_id, status="FINISHED")
            sweep.child_run_ids[e.policy] = run_id
        for path in (sweep.json_path, sweep.csv_path):
            if path is not None:
                client.log_artifact(parent_id, str(path))
    except BaseException:
        client.set_terminated(parent_id, status="FAILED")
        raise
    client.set_terminated(parent_id, status="FINISHED")
    sweep.parent_run_id, sweep.experiment, sweep.tracking_uri = parent_id, experiment, client.tracking_uri
