"""The comparison table of a replay's policies, as `replab replay` and `replab demo` print it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.plan import ReplayReport

COMPARISON_COLUMNS: tuple[tuple[str, str, str], ...] = (
    # (summary field, header, format)
    ("produced", "produced", "{:,}"),
    ("acked", "acked", "{:,}"),
    ("acked_lost", "acked lost", "{:,}"),
    ("failed_committed", "failed but committed", "{:,}"),
    ("stranded", "stranded", "{:,}"),
    ("availability", "availability", "{:.4%}"),
    ("unavailable_partition_seconds", "unavailable partition-s", "{:,.1f}"),
    ("ack_latency_p50_ms", "ack p50 ms", "{:,.1f}"),
    ("ack_latency_p99_ms", "ack p99 ms", "{:,.1f}"),
    ("visibility_lag_p99_ms", "visible p99 ms", "{:,.1f}"),
    ("brokers_used", "brokers", "{}"),
)


def comparison_rows(report: ReplayReport) -> list[dict[str, str]]:
    rows = []
    labels = report.labels or [r.canonical for r in report.runs]
    for label, s in zip(labels, report.summaries, strict=False):
        row = {"policy": label}
        for name, header, fmt in COMPARISON_COLUMNS:
            value = s.get(name)
            row[header] = "–" if value is None else fmt.format(value)
        rows.append(row)
    return rows


def print_comparison(report: ReplayReport, console=None) -> None:
    from rich.table import Table

    from report.terminal import console as terminal

    console = console or terminal()
    table = Table(title=f"trace {report.trace_id}: {len(report.runs)} policies", title_justify="left")
    table.add_column("policy", overflow="fold")
    for _, header, _ in COMPARISON_COLUMNS:
        table.add_column(header, justify="right")
    for row in comparison_rows(report):
        table.add_row(*row.values())
    console.print(table)
