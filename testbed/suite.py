"""`make testbed`: every testbed scenario of SPEC §12 on a real cluster, then the README's agreement table.

    python -m testbed.suite [--out testbed-runs] [--only NAME ...] [--no-readme]

One Spark session for the whole set; each scenario is one `replab testbed run` (its policies share a cluster).
The README section "Testbed: predicted versus observed" gets its table rewritten between two markers from the
`testbed_comparisons` table (the latest run of each scenario and policy); the text around it is written by
hand (what explains each disagreement).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from schemas.errors import ReplabError

ACKS1 = "kafka-acks1"
DURABLE = "kafka:acks=all,min_insync_replicas=2"
SUITE: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("testbed-leader-crash", (ACKS1, DURABLE)),
    ("testbed-follower-crash", (ACKS1, DURABLE)),
    ("testbed-two-failures", ("kafka:acks=all,unclean_leader_election=true",
                              "kafka:acks=all,unclean_leader_election=false")),
    ("testbed-controlled-shutdown", (ACKS1, DURABLE)),
    ("testbed-zombie-leader", (ACKS1, DURABLE)),
    ("testbed-session-timeout", (ACKS1, DURABLE)),
)
BEGIN, END = "<!-- testbed-table:begin -->", "<!-- testbed-table:end -->"
README = Path(__file__).resolve().parent.parent / "README.md"


def rewrite_readme(rows, wall: dict[str, float], readme: Path = README) -> None:
    from testbed.publish import markdown_table

    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise ReplabError(f"{readme}: the testbed section's markers {BEGIN} … {END} are missing")
    when = time.strftime("%Y-%m-%d", time.gmtime())
    timing = ", ".join(f"{k} {v:.0f} s" for k, v in wall.items())
    table = (f"{BEGIN}\n*From `make testbed` on {when} (wall time per scenario: {timing}). Each cell is "
             f"predicted / observed.*\n\n{markdown_table(rows)}{END}")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(head + table + tail)


def main(argv: list[str] | None = None) -> int:
    from pipelines.session import get_spark
    from pipelines.terminal import console as terminal
    from replay.policies import parse_policy
    from testbed.job import print_cases, run_testbed
    from testbed.publish import agreement_rows

    ap = argparse.ArgumentParser(prog="python -m testbed.suite")
    ap.add_argument("--out", default="testbed-runs", help="run folders, lakehouse and MLflow store")
    ap.add_argument("--only", action="append", default=None, metavar="SCENARIO")
    ap.add_argument("--no-readme", action="store_true")
    args = ap.parse_args(argv)
    console = terminal()
    out = Path(args.out).resolve()
    lakehouse, tracking = out / "lakehouse", f"sqlite:///{out / 'mlflow.db'}"
    spark = None

    def spark_factory():
        nonlocal spark
        spark = spark or get_spark("replab-testbed")
        return spark

    wall = {}
    for scenario, policies in SUITE:
        if args.only and scenario not in args.only:
            continue
        console.rule(scenario)
        result = run_testbed(spark_factory, scenario, [parse_policy(p) for p in policies], list(policies),
                             out / scenario, lakehouse=lakehouse, tracking_uri=tracking,
                             progress=lambda t: console.log(t))
        print_cases(result.cases, console)
        wall[scenario] = result.wall_s["total_s"]
    rows = agreement_rows(lakehouse)
    if not args.no_readme:
        rewrite_readme(rows, wall)
        console.print(f"README: {len(rows)} rows rewritten")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ReplabError as exc:
        print(f"testbed: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
