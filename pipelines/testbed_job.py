"""`replab testbed run` and `replab testbed report` (SPEC §12): thin commands over `testbed.job` and the
`testbed_comparisons` table, and `make testbed` (`python -m pipelines.testbed_job`)."""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Any

from schemas.errors import ReplabError
from testbed.compare import COMPARED, Case
from testbed.job import RECORDING, recompare_testbed, recorded_wall_s, run_testbed
from testbed.publish import agreement_rows, markdown_table


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.2f}"
    return f"{v:,}"


def print_cases(cases: list[Case], console) -> None:
    from rich.table import Table

    table = Table(title="testbed: predicted / observed", title_justify="left")
    for col in ("scenario", "policy", *COMPARED, "failover ms", "status agree", "fate agree"):
        table.add_column(col, justify="left" if col in ("scenario", "policy") else "right", overflow="fold")
    for c in cases:
        cells = [f"{_fmt(c.predicted.get(k))} / {_fmt(c.observed.get(k))}" for k in COMPARED]
        fo = f"{_fmt(c.failover_ms.get('predicted'))} / {_fmt(c.failover_ms.get('observed'))}"
        table.add_row(c.scenario, c.policy, *cells, fo, f"{c.agreement['status']:.1%}",
                      f"{c.agreement['fate']:.1%}")
    console.print(table)


def cli(args: argparse.Namespace) -> int:
    from report.terminal import console as terminal

    console = terminal()
    if args.testbed_command == "report":
        return print_report(args.lakehouse, console)

    def spark_factory():
        from storage.session import get_spark

        return get_spark("replab-testbed")

    common = dict(lakehouse=args.lakehouse, tracking_uri=args.tracking_uri, mlflow=not args.no_mlflow,
                  spark_replay=args.spark_replay, publish=not args.no_tables, progress=lambda t: console.log(t))
    if args.testbed_command == "recompare":
        result = recompare_testbed(spark_factory, args.policies, list(args.policy), args.out, **common)
    else:
        result = run_testbed(spark_factory, args.scenario, args.policies, list(args.policy), args.out,
                             client_debug=args.client_debug, **common)
    print_cases(result.cases, console)
    console.print(f"trace: {result.trace}   comparison: {result.out / 'comparison.json'}   "
                  f"wall: {result.wall_s['total_s']:.0f} s")
    return 0


def print_report(lakehouse, console) -> int:
    from rich.table import Table

    from schemas.errors import BadInput

    rows = agreement_rows(lakehouse)
    if not rows:
        raise BadInput(f"{lakehouse}: no testbed_comparisons rows yet (run `replab testbed run` first)",
                       rule="testbed-report")
    table = Table(title="testbed: predicted / observed", title_justify="left")
    cols = ("scenario", "policy", "acked", "acked lost", "failed", "unavail. part-s", "ack p99 ms", "failover ms",
            "status", "fate", "0 vs >0 loss")
    for col in cols:
        table.add_column(col, justify="left" if col in ("scenario", "policy") else "right", overflow="fold")
    for r in rows:
        def pair(k: str, fmt: str = "{:,.0f}", r: dict[str, Any] = r) -> str:
            p, o = r[f"predicted_{k}"], r[f"observed_{k}"]
            return f"{'–' if p is None else fmt.format(p)} / {'–' if o is None else fmt.format(o)}"

        table.add_row(r["scenario"], r["policy"], pair("acked"), pair("acked_lost"), pair("failed"),
                      pair("unavailable_partition_seconds", "{:,.1f}"), pair("ack_latency_p99_ms"),
                      pair("failover_ms"), f"{r['status_agreement']:.1%}", f"{r['fate_agreement']:.1%}",
                      "agrees" if r["loss_agrees"] else "differs")
    console.print(table)
    return 0


# ------------------------------------------------------------------------------------------------ make testbed
ACKS1 = "kafka-acks1"
# The testbed's producer is librdkafka, which puts one partition's batch in each produce request (SPEC §3.7 K-6);
# the default, null, is the Java producer's one request per broker.
LIBRDKAFKA = "partitions_per_request=1"
DURABLE = f"kafka:acks=all,min_insync_replicas=2,{LIBRDKAFKA}"
SEED_DLEDGER = "dledger:group_size=5,queues_per_group=50"
SUITE: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("testbed-leader-crash", (ACKS1, DURABLE)),
    ("testbed-follower-crash", (ACKS1, DURABLE)),
    ("testbed-two-failures", (f"kafka:acks=all,unclean_leader_election=true,{LIBRDKAFKA}",
                              f"kafka:acks=all,unclean_leader_election=false,{LIBRDKAFKA}")),
    ("testbed-controlled-shutdown", (ACKS1, DURABLE)),
    ("testbed-zombie-leader", (ACKS1, DURABLE)),
    ("testbed-session-timeout", (ACKS1, DURABLE)),
    # RocketMQ on a real 5.3.3 cluster (testbed/rocketmq/)
    ("testbed-rmq-dledger-leader-crash", ("dledger",)),
    ("testbed-rmq-dledger-crash-after-poll", ("dledger",)),
    ("testbed-rmq-dledger-leader-isolation", ("dledger",)),
    ("testbed-rmq-dledger-two-lost", ("dledger",)),
    ("testbed-rmq-sync-slave-down", ("rocketmq-sync",)),
    # a send timeout above slaveTimeout lets the master's FLUSH_SLAVE_TIMEOUT reach the client, and the cluster is
    # 5.x (SPEC §3.7 R-6); a shared client would have the other policy's timed-out sends close its connections
    ("testbed-rmq-sync-slave-down",
     ("rocketmq:broker_role=SYNC_MASTER,delivery_timeout_ms=10000,slave_not_available=false",)),
    ("testbed-rmq-async-master-crash", ("rocketmq-async",)),
    # all_ack_in_sync_state_set on and off change the brokers' settings: one cluster each
    ("testbed-rmq-controller-master-crash", ("rocketmq-controller",)),
    ("testbed-rmq-controller-master-crash", ("rocketmq-controller-allack",)),
    # the seed articles' layout: one 5-node DLedger group holding 50 queues, one and two brokers lost
    ("testbed-rmq-seed-single-failure", (SEED_DLEDGER,)),
    ("testbed-rmq-seed-double-failure", (SEED_DLEDGER,)),
)
BEGIN, END = "<!-- testbed-table:begin -->", "<!-- testbed-table:end -->"
#: The docs page whose agreement table `make testbed` rewrites (between BEGIN and END).
AGREEMENT_PAGE = Path(__file__).resolve().parent.parent / "docs" / "guides" / "testbed.md"


def run_folder(scenario: str, policies: tuple[str, ...], *, again: bool) -> str:
    """A run's folder under --out: the scenario, and for its second cluster the policies too, in the characters
    a path may hold anywhere (a RocketMQ broker reads a comma in its store path as a second path)."""
    name = scenario if not again else f"{scenario}-{'-'.join(policies)}"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def rewrite_agreement_table(rows, wall: dict[str, float], page: Path = AGREEMENT_PAGE, *,
                            recompared: bool = False) -> None:
    text = page.read_text()
    if BEGIN not in text or END not in text:
        raise ReplabError(f"{page}: the testbed section's markers {BEGIN} … {END} are missing")
    when = time.strftime("%Y-%m-%d", time.gmtime())
    timing = ", ".join(f"{k} {v:.0f} s" for k, v in wall.items())
    how = (f"`make testbed TESTBED_ARGS=--recompare` on {when}: recorded runs judged again by the current model"
           if recompared else f"`make testbed` on {when}")
    table = (f"{BEGIN}\n*From {how} (wall time per scenario's recording: {timing}). Each cell is "
             f"predicted / observed.*\n\n{markdown_table(rows)}{END}")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    page.write_text(head + table + tail)


def suite_main(argv: list[str] | None = None) -> int:
    """`make testbed`: every testbed scenario of SPEC §12 on a real cluster (one Spark session for the set),
    then the agreement table of docs/guides/testbed.md between its markers (the text around it is written by hand)."""
    from replay.policies import parse_policy
    from report.terminal import console as terminal
    from storage.session import get_spark

    ap = argparse.ArgumentParser(prog="python -m pipelines.testbed_job")
    ap.add_argument("--out", default="testbed-runs", help="run folders, lakehouse and MLflow store")
    ap.add_argument("--only", action="append", default=None, metavar="SCENARIO")
    ap.add_argument("--no-page", action="store_true", help="leave docs/guides/testbed.md as it is")
    ap.add_argument("--recompare", action="store_true",
                    help="judge the runs already recorded under --out again with the current model (no cluster); "
                    "scenarios without a recording are run")
    args = ap.parse_args(argv)
    console = terminal()
    out = Path(args.out).resolve()
    lakehouse, tracking = out / "lakehouse", f"sqlite:///{out / 'mlflow.db'}"
    spark = None

    def spark_factory():
        nonlocal spark
        spark = spark or get_spark("replab-testbed")
        return spark

    wall: dict[str, float] = {}
    recompared = False
    failed: list[str] = []
    seen: set[str] = set()
    for scenario, policies in SUITE:
        if args.only and scenario not in args.only:
            continue
        console.rule(scenario)
        folder = out / run_folder(scenario, policies, again=scenario in seen)
        seen.add(scenario)
        parsed = [parse_policy(p) for p in policies]
        try:
            if args.recompare and (folder / RECORDING).is_file():
                result = recompare_testbed(spark_factory, parsed, list(policies), folder, lakehouse=lakehouse,
                                           tracking_uri=tracking, progress=lambda t: console.log(t))
                recompared = True
            else:
                result = run_testbed(spark_factory, scenario, parsed, list(policies), folder, lakehouse=lakehouse,
                                     tracking_uri=tracking, progress=lambda t: console.log(t))
        except ReplabError as exc:  # one cluster that would not run does not cost the others theirs
            console.print(f"[red]{scenario} ({', '.join(policies)}): {exc}[/red]")
            failed.append(scenario)
            continue
        wall[scenario] = wall.get(scenario, 0.0) + recorded_wall_s(folder)
        print_cases(result.cases, console)
    if failed:
        console.print(f"[red]{len(failed)} run(s) failed: {', '.join(failed)}; the page is left as it was "
                      "(rerun with --recompare to run only what is missing)[/red]")
        return 1
    rows = agreement_rows(lakehouse)
    if not args.no_page:
        rewrite_agreement_table(rows, wall, recompared=recompared)
        console.print(f"{AGREEMENT_PAGE}: {len(rows)} rows rewritten")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(suite_main(sys.argv[1:]))
    except ReplabError as exc:
        print(f"testbed: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
