"""`replab recommend`: the cheapest policy whose 95 % intervals meet an SLO, from a sweep (run or reused), or
for per-year terms from a durability run's `durability.json` (`--durability DIR`; no Spark).

Thin: the SLO and the space are parsed first (bad input exits 2 before any Spark work), the sweep runs or is read
back from the lakehouse (`engine.sweep.run.run_sweep`, `reuse=True`), `engine.recommend` decides, and the
MLflow parent run of the sweep carries the recommendation (tags `replab.slo`, `replab.recommended`; the
decision as `recommendation.json`, the section as `recommendation.html`, `report.recommend`), with one child run
per policy.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from engine.recommend import Recommendation, durability_estimates, expand_space, is_durability, parse_slo, recommend
from schemas.errors import BadInput


def space_of(args: argparse.Namespace):
    """--policy (each one policy string) or --space (families, presets, grids); default: the Kafka presets."""
    if getattr(args, "policy", None) and args.space:
        raise BadInput("give --policy or --space, not both", rule="arguments")
    if getattr(args, "policy", None):
        return expand_space(args.policy, split=False)
    return expand_space(args.space or ["kafka"])


def print_verdicts(rec: Recommendation, console, *, title: str, cost_header: str, cost, cell) -> None:
    """The SLO check as a table: one row per policy, one column per term (`cell(estimate, term, mark)`), whether
    it meets them all and its cost (`cost(estimate)`)."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    table.add_column("policy", overflow="fold")
    for t in rec.slo:
        table.add_column(str(t), justify="right")
    table.add_column("meets", justify="center")
    table.add_column(cost_header, justify="right")
    for v in rec.verdicts:
        e = v.estimate
        cells = [cell(e, t, "[green]✓[/green]" if met else "[red]✗[/red]") for t, met, _ in v.terms]
        table.add_row(e.label, *cells, "yes" if v.meets else "no", cost(e))
    console.print(table)


def print_recommendation(rec: Recommendation, console) -> None:
    def cost(e) -> str:
        b, c, r = e.cost
        return f"{b:g}, {c:g}, {r / 1e6:,.2f}"

    print_verdicts(rec, console, title="SLO check (a term is met when the whole 95% interval is on its side)",
                   cost_header="cost (brokers, copies, repl. MB/trace)", cost=cost,
                   cell=lambda e, t, mark: f"{mark} {e.estimates[t.metric].text('{:.4g}')}")
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


def print_durability_recommendation(rec: Recommendation, doc: dict, console) -> None:
    def cell(e, t, mark: str) -> str:
        iv = e.estimates[t.metric]
        bound = iv.low if t.op == ">=" else iv.high
        if e.bounded and bound is not None and t.metric in ("nines_per_year", "p_loss_per_year"):
            return f"{mark} {'≥' if t.op == '>=' else '≤'} {bound:.4g}"
        return f"{mark} {iv.text('{:.4g}')}"

    def cost(e) -> str:
        b, c, _ = e.cost
        return f"{b:g}, {c:g}"

    print_verdicts(rec, console, title=f"SLO check per year: {doc['scenario']}, rates {doc['rates']['name']}, "
                   f"{doc['episodes']} episodes (a term is met when the whole 95% interval is on its side)",
                   cost_header="cost (brokers, copies)", cost=cost, cell=cell)
    if rec.chosen is None:
        console.print("[bold red]no policy of the run meets every SLO term with 95% confidence[/bold red] "
                      "(a longer durability run narrows the intervals)")
        return
    e = rec.chosen.estimate
    console.print(f"[bold green]recommended: {e.label}[/bold green]" + ("" if e.label == e.policy else
                                                                       f" ({e.policy})"))
    console.print(f"  cheapest of {len(rec.ranked)} polic{'y' if len(rec.ranked) == 1 else 'ies'} meeting the SLO: "
                  f"{e.brokers_used} brokers, {e.replicas_per_message:g} copies per message")
    for t, _, bound in rec.chosen.terms:
        console.print(f"  {t}: {'lower' if t.op == '>=' else 'upper'} end of the 95% interval {bound:.4g}")


def cli_durability(args: argparse.Namespace, slo, console) -> int:
    """Per-year terms: the policies of a durability run (restricted to --policy/--space if given)."""
    from report.recommend import FILE as PAGE
    from report.recommend import write_page

    if not args.durability:
        raise BadInput(f"--slo term {str(slo[0])!r} is per year: give --durability DIR (the --out of a `replab "
                       f"durability` run)", rule="arguments")
    doc, estimates = durability_estimates(args.durability)
    if getattr(args, "policy", None) or args.space:
        space = space_of(args)
        run = {e.policy for e in estimates}
        missing = [lab for p, lab in zip(space.policies, space.labels, strict=True) if p.canonical() not in run]
        if missing:
            raise BadInput(f"--durability {args.durability!r} holds no estimate for {', '.join(missing)} (run "
                           f"`replab durability` with those policies)", rule="arguments")
        wanted = {p.canonical() for p in space.policies}
        estimates = [e for e in estimates if e.policy in wanted]
    rec = recommend(estimates, slo)
    out = Path(args.out) if args.out else Path(args.durability)
    if out.suffix == ".json":
        out = out.parent
    out.mkdir(parents=True, exist_ok=True)
    path = out / "recommendation.json"
    path.write_text(json.dumps({"durability_id": doc.get("durability_id"), **rec.to_json()}, indent=1) + "\n")
    page = write_page(rec, out / PAGE, title=f"durability {doc['scenario']}: cost against the SLO")
    print_durability_recommendation(rec, doc, console)
    console.print(f"recommendation: {path}, {page}")
    return 0


def cli(args: argparse.Namespace) -> int:
    from engine.sweep.run import check_request, log_sweep, run_sweep
    from pipelines.sweep_job import print_sweep, print_where, request_from
    from report.recommend import FILE as PAGE
    from report.recommend import write_page
    from report.terminal import console as terminal
    from storage.session import get_spark

    console = terminal()
    slo = parse_slo(args.slo)
    if is_durability(slo[0]):
        return cli_durability(args, slo, console)
    if args.durability:
        raise BadInput(f"--durability gives per-year figures, and --slo {args.slo!r} has per-trace terms only",
                       rule="arguments")
    for name, value in (("--scenario", args.scenario), ("--seeds", args.seeds)):
        if value is None:
            raise BadInput(f"{name} is required for per-trace SLO terms (a sweep)", rule="arguments")
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
