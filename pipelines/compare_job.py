"""`replab compare --experiment NAME [--out DIR] [--tracking-uri URI]`: compare an experiment's policies (SPEC §6.1).

Thin: `report.compare.build_report` writes the folder, logs the comparison run and prints the table.
"""

from __future__ import annotations

import argparse


def cli(args: argparse.Namespace) -> int:
    from report.compare import build_report
    from report.terminal import console as terminal

    console = terminal()
    path = build_report(args.experiment, args.out, args.tracking_uri, console=console)
    console.print(f"report: {path}")
    return 0
