"""`replab sweep` and `spark-submit pipelines/sweep_job.py`: many seeds × many policies (SPEC §1 "Sweep", §6.1).

Thin: the arguments become a `engine.sweep.run.SweepRequest`; `run_sweep` runs the ONE Spark job over the
seeds (`engine.sweep.job`), the output gate, the `sweeps`/`sweep_results` Delta tables, the estimates
(`engine.sweep.estimates`) and MLflow; this module prints the estimates.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

if __name__ == "__main__" and __package__ in (None, ""):
    # spark-submit pipelines/sweep_job.py without the package installed: the repo root holds the packages.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.sweep.run import SweepReport, SweepRequest, run_sweep

COLUMNS: tuple[tuple[str, str, str], ...] = (
    # (estimate, header, format)
    ("p_loss", "P(acked loss ≥ 1) [Wilson]", "{:.3f}"),
    ("p_loss_day", "P(loss) per day", "{:.3f}"),
    ("mean_acked_lost", "mean acked lost [t]", "{:,.1f}"),
    ("availability", "availability [t]", "{:.4f}"),
    ("ack_p99_ms", "ack p99 ms [bootstrap]", "{:,.1f}"),
    ("unavailable_s", "unavailable partition-s [t]", "{:,.1f}"),
)


def request_from(args: argparse.Namespace, **overrides) -> SweepRequest:
    """The request of `replab sweep` (and the options `replab recommend` shares with it)."""
    fields = dict(
        scenario=args.scenario, seeds=args.seeds, policies=list(getattr(args, "policies", None) or []),
        labels=list(getattr(args, "policy", None) or []) or None, scale=args.scale,
        first_seed=args.first_seed, out=args.out, lakehouse=args.lakehouse, window_ms=args.window_ms,
        tracking_uri=args.tracking_uri, experiment=args.experiment, mlflow=not args.no_mlflow,
        keep_traces=args.keep_traces, series=args.series, reuse=getattr(args, "reuse", False))
    fields.update(overrides)
    return SweepRequest(**fields)


def print_sweep(sweep: SweepReport, console=None, *, highlight: str | None = None) -> None:
    from rich.table import Table

    from report.terminal import console as terminal

    console = console or terminal()
    table = Table(title=f"{sweep.scenario} (scale {sweep.scale:g}, {sweep.duration_s:g} s per trace), seeds "
                        f"{sweep.seeds[0]}…{sweep.seeds[-1]}: estimates with 95% intervals", title_justify="left")
    table.add_column("policy", overflow="fold")
    table.add_column("seeds with loss", justify="right")
    for _, header, _ in COLUMNS:
        table.add_column(header, justify="right")
    table.add_column("brokers", justify="right")
    table.add_column("copies", justify="right")
    for e in sweep.estimates:
        name = e.label if e.label == e.policy else f"{e.label} ({e.policy})"
        style = "bold green" if highlight == e.policy else None
        table.add_row(name, f"{e.seeds_with_loss}/{e.seeds}", *[e.estimates[k].text(fmt) for k, _, fmt in COLUMNS],
                      "–" if e.brokers_used is None else str(e.brokers_used),
                      "–" if e.replicas_per_message is None else f"{e.replicas_per_message:g}", style=style)
    console.print(table)
    if sweep.fatal_seeds:
        console.print(f"[yellow]{len(sweep.fatal_seeds)} seed(s) broke a fatal trace rule and have no figures: "
                      f"{sweep.fatal_seeds[:20]} (table sweep_results, status 'fatal')[/yellow]")


def print_where(sweep: SweepReport, console) -> None:
    console.print(f"sweep {sweep.sweep_id}" + (" (reused from the lakehouse)" if sweep.reused else
                                               f" in {sweep.seconds:.1f} s"))
    console.print(f"results: {sweep.json_path}, {sweep.csv_path}")
    console.print(f"lakehouse: {sweep.lakehouse} (tables sweeps, sweep_results)")
    if sweep.experiment:
        console.print(f"MLflow experiment: {sweep.experiment} (parent run {sweep.parent_run_id}, "
                      f"{len(sweep.child_run_ids)} policy runs, {sweep.tracking_uri})")


def cli(args: argparse.Namespace) -> int:
    from engine.sweep.run import check_request
    from report.terminal import console as terminal
    from storage.session import get_spark

    console = terminal()
    request = request_from(args)
    check_request(request)
    spark = get_spark("replab-sweep")
    sweep = run_sweep(spark, request, log=console.log)
    print_sweep(sweep, console)
    print_where(sweep, console)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """spark-submit entry point: the same arguments as `replab sweep`."""
    from pipelines.cli import main as cli_main

    return cli_main(["sweep", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
