"""`replab sweep` and `spark-submit pipelines/sweep_job.py`: many seeds × many policies (SPEC §1 "Sweep", §6.1).

One replay outcome says what a policy did on one trace; a sweep asks how likely it is. For seeds
first_seed … first_seed+N−1 of one scenario:

1. generate the trace (`generators.generate.generate_trace`), or reuse it when `<out>/traces/<trace_id>` already
   holds the same scenario at the same seed and scale (generation is deterministic, SPEC §8);
2. replay it under every policy in one pass (`engine.replay.run_replay`; trace gate, output gate and
   Delta tables as for any replay, so every seed's runs are in the lakehouse);
3. per policy, over the N seeds:
   - P(loss): the share of seeds with at least one acknowledged message lost (acked_lost ≥ 1), with a 95 %
     **Wilson score** interval (sound at 0 or N successes and small N, unlike the normal approximation);
   - mean acked_lost and mean availability (acked / produced), each with a 95 % **Student t** interval
     (mean ± t(0.975, N−1) · s / √N), clipped to the quantity's range (acked_lost ≥ 0, availability in
     [0, 1]); N = 1 gives no interval. A t interval assumes the mean is roughly normal: with few seeds and a
     loss count that is zero on most of them, read it as indicative and add seeds.

Outputs: a table on the terminal, `<out>/sweep.json` and `<out>/sweep.csv`, and one MLflow experiment for the
sweep (SPEC §6.4 "one experiment per trace (or sweep)") with one run per policy holding the estimates,
their intervals, the per-seed series (step = seed) and the JSON/CSV. The per-seed replays are not MLflow runs
of their own: their figures are in that run's series and their rows in the lakehouse.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __name__ == "__main__" and __package__ in (None, ""):
    # spark-submit pipelines/sweep_job.py without the package installed: the repo root holds the packages.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CONFIDENCE = 0.95
TAG_KIND_SWEEP = "sweep"
TAG_SWEEP_POLICY = "replab.sweep_policy"


# ------------------------------------------------------------------------------------------------ statistics
@dataclass(frozen=True)
class Interval:
    """An estimate and its two-sided confidence interval (None where it is undefined)."""

    estimate: float | None
    low: float | None
    high: float | None
    method: str

    def text(self, fmt: str = "{:.3f}") -> str:
        if self.estimate is None:
            return "–"
        if self.low is None or self.high is None:
            return fmt.format(self.estimate)
        return f"{fmt.format(self.estimate)} [{fmt.format(self.low)}, {fmt.format(self.high)}]"


def _z(confidence: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(0.5 + confidence / 2))


def wilson_interval(successes: int, n: int, confidence: float = CONFIDENCE) -> Interval:
    """Wilson score interval of a binomial proportion (Wilson 1927)."""
    if n <= 0:
        return Interval(None, None, None, "wilson")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, {n}], got {successes}")
    z = _z(confidence)
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z / denominator * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # Exact bounds at the edges (the formula gives them up to rounding).
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return Interval(p, low, high, "wilson")


def t_interval(values: Sequence[float], confidence: float = CONFIDENCE, *, lower: float | None = None,
               upper: float | None = None) -> Interval:
    """Student t interval of a mean, clipped to [lower, upper]; no interval from fewer than 2 values."""
    from scipy.stats import t

    xs = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    n = len(xs)
    if n == 0:
        return Interval(None, None, None, "t")
    mean = math.fsum(xs) / n
    if n == 1:
        return Interval(mean, None, None, "t")
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1))
    half = float(t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    low, high = mean - half, mean + half
    if lower is not None:
        low = max(lower, low)
    if upper is not None:
        high = min(upper, high)
    return Interval(mean, low, high, "t")


# ------------------------------------------------------------------------------------------------ results
@dataclass(frozen=True)
class SeedOutcome:
    """One policy's run on one seed's trace (its run_summary figures that the sweep aggregates)."""

    seed: int
    trace_id: str
    run_id: str
    produced: int
    acked: int
    acked_lost: int
    availability: float | None

    @property
    def lost_any(self) -> bool:
        return self.acked_lost >= 1


@dataclass
class PolicySweep:
    policy: str  # canonical
    outcomes: list[SeedOutcome]
    mlflow_run_id: str | None = None

    @property
    def seeds(self) -> int:
        return len(self.outcomes)

    @property
    def seeds_with_loss(self) -> int:
        return sum(o.lost_any for o in self.outcomes)

    @property
    def p_loss(self) -> Interval:
        return wilson_interval(self.seeds_with_loss, self.seeds)

    @property
    def mean_acked_lost(self) -> Interval:
        return t_interval([o.acked_lost for o in self.outcomes], lower=0.0)

    @property
    def mean_availability(self) -> Interval:
        return t_interval([o.availability for o in self.outcomes], lower=0.0, upper=1.0)

    def row(self) -> dict[str, Any]:
        """One CSV row (and the JSON's per-policy figures)."""
        p, lost, avail = self.p_loss, self.mean_acked_lost, self.mean_availability
        return {"policy": self.policy, "seeds": self.seeds, "seeds_with_loss": self.seeds_with_loss,
                "p_loss": p.estimate, "p_loss_low": p.low, "p_loss_high": p.high,
                "mean_acked_lost": lost.estimate, "acked_lost_low": lost.low, "acked_lost_high": lost.high,
                "mean_availability": avail.estimate, "availability_low": avail.low,
                "availability_high": avail.high}


CSV_COLUMNS = ("policy", "seeds", "seeds_with_loss", "p_loss", "p_loss_low", "p_loss_high", "mean_acked_lost",
               "acked_lost_low", "acked_lost_high", "mean_availability", "availability_low", "availability_high")
METHODS = {
    "p_loss": "share of seeds with acked_lost >= 1; 95% Wilson score interval",
    "mean_acked_lost": "mean over seeds; 95% Student t interval, clipped at 0",
    "mean_availability": "mean of acked/produced over seeds; 95% Student t interval, clipped to [0, 1]",
}


@dataclass
class SweepReport:
    scenario: str
    scale: float
    seeds: list[int]
    trace_ids: list[str]
    policies: list[PolicySweep]
    lakehouse: str
    out_dir: Path
    experiment: str | None = None
    tracking_uri: str | None = None
    json_path: Path | None = None
    csv_path: Path | None = None
    quarantined: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario, "scale": self.scale, "seeds": self.seeds, "trace_ids": self.trace_ids,
            "confidence": CONFIDENCE, "methods": METHODS, "lakehouse": self.lakehouse,
            "experiment": self.experiment,
            "policies": [{**p.row(), "mlflow_run_id": p.mlflow_run_id,
                          "per_seed": [asdict(o) for o in p.outcomes]} for p in self.policies],
        }

    def write(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.json_path = self.out_dir / "sweep.json"
        self.csv_path = self.out_dir / "sweep.csv"
        self.json_path.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        with self.csv_path.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
            writer.writeheader()
            for p in self.policies:
                writer.writerow(p.row())


# ------------------------------------------------------------------------------------------------ the job
@dataclass
class SweepRequest:
    scenario: str  # library name or YAML file
    seeds: int
    policies: list[Any]  # replay.policies.Policy
    scale: float = 1.0
    first_seed: int = 0
    out: str | None = None
    lakehouse: str = "lakehouse"
    window_ms: int = 1000
    tracking_uri: str | None = None
    experiment: str | None = None
    mlflow: bool = True


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "sweep"


def sweep_name(scenario: str, scale: float, seeds: Sequence[int]) -> str:
    """`sweep-<scenario>[-x<scale>]-seeds<first>-<last>`: the default experiment and output folder name."""
    return (f"sweep-{scenario}" + ("" if scale == 1 else f"-x{scale:g}")
            + f"-seeds{seeds[0]}-{seeds[-1]}")


def _reusable(trace_dir: Path, trace_id: str, scenario) -> bool:
    """A complete trace of the same scenario, seed and scale (the manifest is written last, SPEC §8)."""
    from schemas.trace import Manifest

    if not (trace_dir / "manifest.json").is_file():
        return False
    try:
        manifest = Manifest.read(trace_dir)
    except Exception:
        return False
    generator = manifest.generator or {}
    return manifest.trace_id == trace_id and generator.get("parameters") == scenario.to_json()


def check_request(request: SweepRequest):
    """Bad input (exit 2) before any Spark work: seeds, policies, the scenario and its scale; the scenario."""
    from generators.generate import build_plan
    from generators.library import resolve_scenario
    from schemas.errors import BadInput

    if request.seeds < 1:
        raise BadInput(f"--seeds must be at least 1, got {request.seeds}", rule="arguments")
    if request.first_seed < 0:
        raise BadInput(f"--first-seed must be >= 0, got {request.first_seed}", rule="arguments")
    if not request.policies:
        raise BadInput("a sweep needs at least one --policy", rule="arguments")
    scenario = resolve_scenario(request.scenario)
    build_plan(scenario, request.first_seed, request.scale)  # a bad --scale is refused here
    return scenario


def run_sweep(spark, request: SweepRequest, *, console=None) -> SweepReport:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from engine.plan import ReplayRequest
    from engine.replay import run_replay
    from generators.generate import generate_trace, trace_id_for

    scenario = check_request(request)
    seeds = list(range(request.first_seed, request.first_seed + request.seeds))
    name = sweep_name(scenario.name, request.scale, seeds)
    out_dir = Path(request.out) if request.out else Path("sweeps") / _slug(name)
    console = console or Console(stderr=True)

    canonical = [p.canonical() for p in request.policies]
    outcomes: dict[str, list[SeedOutcome]] = {c: [] for c in canonical}
    trace_ids: list[str] = []
    quarantined: dict[str, int] = {}
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(f"{name}: {len(seeds)} seeds × {len(canonical)} policies", total=len(seeds))
        for seed in seeds:
            trace_id = trace_id_for(scenario, seed, request.scale)
            trace_dir = out_dir / "traces" / _slug(trace_id)
            if _reusable(trace_dir, trace_id, scenario):
                progress.console.log(f"seed {seed}: reusing {trace_dir}")
            else:
                result = generate_trace(spark, scenario, seed=seed, scale=request.scale, out=trace_dir)
                progress.console.log(f"seed {seed}: generated {trace_id} ({result.events:,} events)")
            report = run_replay(spark, ReplayRequest(
                trace=str(trace_dir), policies=list(request.policies), lakehouse=request.lakehouse,
                window_ms=request.window_ms, mlflow=False),
                progress=lambda text, seed=seed: progress.console.log(f"seed {seed}: {text}"))
            trace_ids.append(report.trace_id)
            if report.quarantined:
                quarantined[report.trace_id] = report.quarantined
            for run, summary in zip(report.runs, report.summaries, strict=True):
                outcomes[run.canonical].append(SeedOutcome(
                    seed, report.trace_id, run.run_id, int(summary["produced"]), int(summary["acked"]),
                    int(summary["acked_lost"]),
                    None if summary.get("availability") is None else float(summary["availability"])))
            progress.advance(task)

    sweep = SweepReport(scenario.name, request.scale, seeds, trace_ids,
                        [PolicySweep(c, outcomes[c]) for c in canonical], str(Path(request.lakehouse).resolve()),
                        out_dir, quarantined=quarantined)
    sweep.write()
    if request.mlflow:
        log_sweep(sweep, request, experiment=request.experiment or name)
        sweep.write()  # again, now with the MLflow run ids
    return sweep


def log_sweep(sweep: SweepReport, request: SweepRequest, *, experiment: str) -> None:
    """One experiment for the sweep, one run per policy (an earlier run of the same policy is replaced)."""
    from mlflow.entities import Metric

    from engine import tracking
    from schemas.version import __version__

    client = tracking.client_for(request.tracking_uri)
    experiment_id = tracking.ensure_experiment(client, experiment)
    policies = {p.canonical(): p for p in request.policies}
    now = int(time.time() * 1000)
    for p in sweep.policies:
        quoted = p.policy.replace("'", "\\'")
        for earlier in tracking.search_all_runs(client, [experiment_id],
                                                f"tags.`{TAG_SWEEP_POLICY}` = '{quoted}'"):
            client.delete_run(earlier.info.run_id)
        tags = {tracking.TAG_KIND: TAG_KIND_SWEEP, TAG_SWEEP_POLICY: p.policy, tracking.TAG_POLICY: p.policy,
                "replab.family": policies[p.policy].family, "replab.mode": "batch", "replab.version": __version__,
                "replab.git_sha": tracking.git_sha(), tracking.TAG_LAKEHOUSE: sweep.lakehouse}
        run = client.create_run(experiment_id, start_time=now, tags=tags, run_name=p.policy)
        run_id = run.info.run_id
        params = {k: v if isinstance(v, str) else json.dumps(v, default=str)
                  for k, v in policies[p.policy].params().items()}
        params.update({"scenario.name": sweep.scenario, "scenario.scale": f"{sweep.scale:g}",
                       "sweep.seeds": str(len(sweep.seeds)), "sweep.first_seed": str(sweep.seeds[0]),
                       "sweep.confidence": str(CONFIDENCE)})
        metrics = [Metric(k, float(v), now, 0) for k, v in p.row().items()
                   if k != "policy" and v is not None]
        for o in p.outcomes:
            metrics.append(Metric("seed/acked_lost", float(o.acked_lost), now, o.seed))
            if o.availability is not None:
                metrics.append(Metric("seed/availability", o.availability, now, o.seed))
        try:
            tracking.log_in_chunks(client, run_id, metrics=metrics, params=params)
            for path in (sweep.json_path, sweep.csv_path):
                if path is not None:
                    client.log_artifact(run_id, str(path))
        except BaseException:
            client.set_terminated(run_id, status="FAILED")
            raise
        client.set_terminated(run_id, status="FINISHED")
        p.mlflow_run_id = run_id
    sweep.experiment = experiment
    sweep.tracking_uri = client.tracking_uri


# ------------------------------------------------------------------------------------------------ output
def print_sweep(sweep: SweepReport, console=None) -> None:
    from rich.table import Table

    from report.terminal import console as terminal

    console = console or terminal()
    table = Table(title=f"{sweep.scenario} (scale {sweep.scale:g}), seeds {sweep.seeds[0]}…{sweep.seeds[-1]}: "
                        f"estimates with 95% intervals", title_justify="left")
    table.add_column("policy", overflow="fold")
    table.add_column("seeds", justify="right")
    table.add_column("P(acked loss ≥ 1) [Wilson]", justify="right")
    table.add_column("mean acked lost [t]", justify="right")
    table.add_column("mean availability [t]", justify="right")
    for p in sweep.policies:
        table.add_row(p.policy, f"{p.seeds_with_loss}/{p.seeds}", p.p_loss.text("{:.2f}"),
                      p.mean_acked_lost.text("{:,.1f}"), p.mean_availability.text("{:.4f}"))
    console.print(table)


def cli(args: argparse.Namespace) -> int:
    from rich.console import Console

    from storage.session import get_spark

    # Piped output (CI logs, spark-submit) gets a wide console, so that the table's columns stay readable.
    console = Console() if sys.stdout.isatty() else Console(width=160)
    request = SweepRequest(
        scenario=args.scenario, seeds=args.seeds, policies=args.policies, scale=args.scale,
        first_seed=args.first_seed, out=args.out, lakehouse=args.lakehouse, window_ms=args.window_ms,
        tracking_uri=args.tracking_uri, experiment=args.experiment, mlflow=not args.no_mlflow)
    check_request(request)
    spark = get_spark("replab-sweep")
    sweep = run_sweep(spark, request, console=console)
    print_sweep(sweep, console)
    console.print(f"results: {sweep.json_path}, {sweep.csv_path}")
    console.print(f"lakehouse: {sweep.lakehouse}")
    if sweep.experiment:
        console.print(f"MLflow experiment: {sweep.experiment} ({len(sweep.policies)} runs, {sweep.tracking_uri})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """spark-submit entry point: the same arguments as `replab sweep`."""
    from pipelines.cli import main as cli_main

    return cli_main(["sweep", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
