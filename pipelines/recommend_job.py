"""`replab recommend`: the cheapest policy whose 95 % intervals meet an SLO, from a sweep (run or reused).

Thin: the SLO and the space are parsed first (bad input exits 2 before any Spark work), the sweep runs or is read
back from the lakehouse (`engine.sweep.run.run_sweep`, `reuse=True`), `engine.recommend` decides, and the
MLflow parent run of the sweep carries the recommendation (tags `replab.slo`, `replab.recommended`; the
decision as `recommendation.json`, the section as `recommendation.html`, `report.recommend`), with one child run
per policy.
"""

from __future__ import annotations

import argparse
import json

from engine.recommend import Recommendation, expand_space, parse_slo, recommend


def space_of(args: argparse.Namespace):
    """--policy (each one policy string) or --space (families, presets, grids); default: the Kafka presets."""
    if getattr(args, "policy", None) and args.space:
        from schemas.errors import BadInput

        raise BadInput("give --policy or --space, not both", rule="arguments")
    if getattr(args, "policy", None):
        return expand_space(args.policy, split=False)
    return expand_space(args.space or ["kafka"])


def print_recommendation(rec: Recommendation, console) -> None:
    from rich.table import Table

    table = Table(title="SLO check (a term is met when the whole 95% interval is on its side)",
                  title_justify="left")
    table.add_column("policy", overflow="fold")
    for t in rec.slo:
        table.add_column(str(t), justify="right")
    table.add_column("meets", justify="center")
    table.add_column("cost (brokers, copies, repl. MB/trace)", justify="right")
    for v in rec.verdicts:
        e = v.estimate
        cells = []
        for t, met, _ in v.terms:
            iv = e.estimates[t.metric]
            mark = "[green]✓[/green]" if met else "[red]✗[/red]"
            cells.append(f"{mark} {iv.text('{:.4g}')}")
        b, c, r = e.cost
        table.add_row(e.label, *cells, "yes" if v.meets else "no", f"{b:g}, {c:g}, {r / 1e6:,.2f}")
    console.print(table)
    chosen = rec.chosen
    if chosen is None:
        console.print("[bold red]no policy of the space meets every SLO term with 95% confidence[/bold red] "
                      "(more seeds narrow the intervals; a wider space may hold one)")
        return
    e = chosen.estimate
    console.print(f"[bold green]recommended: {e.label}[/bold green]" + ("" if e.label == e.policy else
                                                                       f" ({e.policy})"))
    console.print(f"  cheapest of {len(rec.ranked)} polic{'y' if len(rec.ranked) == 1 else 'ies'} meeting the SLO: "
                  f"{e.brokers_used} brokers, {e.replicas_per_message:g} copies per message, "
                  f"{(e.replication_bytes or 0) / 1e6:,.2f} MB replicated per trace")
    for t, _, bound in chosen.terms:
        iv = e.estimates[t.metric]
        console.print(f"  {t}: estimate {iv.estimate:.4g}, 95% interval [{iv.low:.4g}, {iv.high:.4g}] "
                      f"({'upper' if t.op == '<=' else 'lower'} bound {bound:.4g})")
    console.print(f"  evidence: {e.seeds} seeds, {e.seeds_with_loss} with an acknowledged loss"
                  + (f", {e.fatal_seeds} refused by the trace gate" if e.fatal_seeds else ""))


def cli(args: argparse.Namespace) -> int:
    from engine.sweep.run import check_request, log_sweep, run_sweep
    from pipelines.sweep_job import print_sweep, print_where, request_from
    from report.recommend import FILE as PAGE
    from report.recommend import write_page
    from report.terminal import console as terminal
    from storage.session import get_spark

    console = terminal()
    slo = parse_slo(args.slo)
    space = space_of(args)
    request = request_from(args, policies=space.policies, labels=space.labels, reuse=not args.no_reuse,
                           mlflow=False)
    check_request(request)
    if space.refused:
        console.log(f"space: {len(space.policies)} policies ({space.refused} grid combinations refused by the "
                    f"policy rules)")
    spark = get_spark("replab-recommend")
    sweep = run_sweep(spark, request, log=console.log)
    rec = recommend(sweep.estimates, slo)
    path = sweep.out_dir / "recommendation.json"
    path.write_text(json.dumps({"sweep_id": sweep.sweep_id, **rec.to_json()}, indent=1) + "\n")
    page = write_page(rec, sweep.out_dir / PAGE, title=f"{sweep.name}: cost against the SLO")
    if not args.no_mlflow:
        chosen = rec.chosen.estimate if rec.chosen else None
        request.mlflow = True
        log_sweep(sweep, request, experiment=request.experiment or sweep.name,
                  parent_tags={"replab.slo": args.slo, "replab.recommended": chosen.label if chosen else "none",
                               "replab.recommended_policy": chosen.policy if chosen else "none"},
                  parent_metrics={"policies_meeting_slo": len(rec.ranked)})
        sweep.write()
        from engine import tracking

        client = tracking.client_for(request.tracking_uri)
        client.log_artifact(sweep.parent_run_id, str(path))
        client.log_artifact(sweep.parent_run_id, str(page))
    print_sweep(sweep, console, highlight=rec.chosen.estimate.policy if rec.chosen else None)
    print_recommendation(rec, console)
    print_where(sweep, console)
    console.print(f"recommendation: {path}, {page}")
    return 0
