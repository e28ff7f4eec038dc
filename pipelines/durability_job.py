"""`replab durability` and `spark-submit pipelines/durability_job.py`: nines per year of each policy at the
user's failure rates (docs/guides/durability.md). Thin: the arguments become an
`engine.durability.job.DurabilityRequest`; `run_durability` runs the Spark rounds, the gate, the Delta tables,
`DIR/durability.json` and MLflow; this module prints the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path

if __name__ == "__main__" and __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from schemas.errors import BadInput


def request_from(args: argparse.Namespace):
    from engine.durability.job import DurabilityRequest
    from engine.durability.judge import TraceShape
    from engine.durability.run import DurabilitySpec
    from generators.library import resolve_scenario
    from generators.rates import load_rates
    from replay.policies import all_presets
    from schemas.trace import Broker

    scenario = resolve_scenario(args.scenario)
    if args.cluster:
        m = re.fullmatch(r"(\d+)(?:x(\d+))?", args.cluster)
        if not m or int(m.group(1)) < 1 or (m.group(2) and int(m.group(2)) < 1):
            raise BadInput(f"--cluster must be BROKERS or BROKERSxRACKS (e.g. 6x3), got {args.cluster!r}",
                           rule="arguments")
        n, racks = int(m.group(1)), int(m.group(2) or 1)
        scenario = dataclasses.replace(scenario, brokers=tuple(Broker(i, f"r{i % racks}") for i in range(n)),
                                       replication=dataclasses.replace(scenario.replication, per_broker=(),
                                                                       stalls=()))
    for name, value in (("--target-rel-error", args.target_rel_error), ("--budget-minutes", args.budget_minutes),
                        ("--trace-rate", args.trace_rate), ("--max-gap-s", args.max_gap_s)):
        if not (math.isfinite(value) and value > 0):
            raise BadInput(f"{name} must be > 0, got {value!r}", rule="arguments")
    if args.max_episodes < 1:
        raise BadInput(f"--max-episodes must be >= 1, got {args.max_episodes}", rule="arguments")
    if getattr(args, "policies", None):
        policies, labels = list(args.policies), list(args.policy)
    else:
        pairs = list(all_presets())
        policies, labels = [p for _, p in pairs], [pre.name for pre, _ in pairs]
    spec = DurabilitySpec(scenario, load_rates(args.rates), tuple(policies),
                          shape=TraceShape(trace_rate_per_s=args.trace_rate, max_gap_s=args.max_gap_s),
                          seed=args.seed)
    return DurabilityRequest(spec, labels, target_rel_error=args.target_rel_error,
                             budget_minutes=args.budget_minutes, max_episodes=args.max_episodes, batch=args.batch,
                             out=args.out, lakehouse=args.lakehouse, tracking_uri=args.tracking_uri,
                             experiment=args.experiment, mlflow=not args.no_mlflow)


def print_report(report, console) -> None:
    from rich.table import Table

    spec = report.estimate.spec
    s = report.estimate.summary()
    table = Table(title=f"durability per year: {spec.scenario.name} ({len(spec.scenario.brokers)} brokers, "
                        f"{len(spec.scenario.racks)} racks), rates {spec.rates.name}; {s['episodes']} episodes, "
                        f"95 % intervals", title_justify="left")
    for col in ("policy", "nines", "P(acked loss ≥ 1) / year", "acked lost / year", "unavailable min / year",
                "failed-but-committed / year", "loss ESS", "max weight share"):
        table.add_column(col, justify="left" if col == "policy" else "right")

    def iv(x: dict, fmt: str = "{:.3g}") -> str:
        def f(v):
            return "∞" if v is None or (isinstance(v, float) and math.isinf(v)) else fmt.format(v)
        return f"{f(x['estimate'])} [{f(x['low'])}, {f(x['high'])}]"

    for label, fig in zip(report.labels, report.figures, strict=True):
        p = fig["p_loss_per_year"]
        nines = (f"≥ {fig['nines']['low']:.2f} (bound)" if fig["bounded"] else iv(fig["nines"], "{:.2f}"))
        prob = f"≤ {p['high']:.3g} (bound)" if fig["bounded"] else iv(p)
        table.add_row(label, nines, prob, iv(fig["acked_lost_per_year"]), iv(fig["unavailable_min_per_year"]),
                      iv(fig["failed_committed_per_year"]), f"{fig['loss_ess']:.1f}",
                      f"{fig['loss_largest_weight_share']:.2f}")
    console.print(table)
    console.print(f"{report.stop_reason}; {s['episodes_per_cpu_second']:.2f} episodes per CPU-second; "
                  f"results: {report.json_path}")


def cli(args: argparse.Namespace) -> int:
    from engine.durability.job import run_durability
    from report.terminal import console as terminal
    from storage.session import get_spark

    console = terminal()
    request = request_from(args)
    spark = get_spark("replab-durability")
    report = run_durability(spark, request, log=console.log)
    print_report(report, console)
    import json

    from report.durability import write_html

    page = write_html(json.loads(report.json_path.read_text()), report.json_path.with_suffix(".html"))
    console.print(f"page: {page}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """spark-submit entry point: the same arguments as `replab durability`."""
    from pipelines.cli import main as cli_main

    return cli_main(["durability", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
