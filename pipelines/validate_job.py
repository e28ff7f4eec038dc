"""`replab validate --trace DIR [--lakehouse DIR]`: the trace quality gate alone (SPEC §2.3, §7).

Exit 0 when no fatal rule is broken (quarantined rows go to the `quarantine` table, the gate run to
`validations`); exit 2 with `file, row N: what [rule: name]` on stderr when one is, writing no table.
"""

from __future__ import annotations

import argparse


def cli(args: argparse.Namespace) -> int:
    from expectations.trace_gate import run_trace_gate, short_lived_gate
    from storage.lakehouse import Lakehouse
    from storage.session import get_spark

    spark = get_spark("replab-validate", short_lived=short_lived_gate(args.trace))
    lakehouse = Lakehouse(args.lakehouse, spark, create=False)
    lakehouse.check_writable()
    _, result = run_trace_gate(spark, args.trace, lakehouse)
    report = result.report
    quarantined = ", ".join(f"{o.rule}: {o.count}" for o in report.outcomes if o.count) if report else ""
    print(f"trace {result.trace_id}: passed the trace gate ({result.successful}/{result.evaluated} expectations "
          f"met); quarantined rows: {result.quarantined}{f' ({quarantined})' if quarantined else ''}")
    print(f"report: {result.report_html}")
    if report is not None:
        report.release()
    return 0
