"""`replab policies` and `replab scenarios`: render the single definitions (replay/policies.py, conf/)."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table

from replay.policies import FAMILIES, all_presets


def policies_markdown() -> str:
    """The policy reference as Markdown (the README's table is this text)."""
    lines = []
    for name, cls in FAMILIES.items():
        lines += [f"#### `{name}`: {cls.description}", "", "| param | default | unit | allowed | meaning | source |",
                  "|---|---|---|---|---|---|"]
        for s in cls.param_specs():
            allowed = ", ".join(s.allowed) if s.allowed else (
                f"{s.minimum if s.minimum is not None else ''}…{s.maximum if s.maximum is not None else ''}"
                if s.minimum is not None or s.maximum is not None else "")
            lines.append(f"| {s.name} | {s.default_text} | {s.unit or ''} | {allowed} | {s.meaning} | {s.source} |")
        lines.append("")
    lines += ["#### Presets (`conf/policies.yaml`)", "", "| preset | canonical policy | description |", "|---|---|---|"]
    for preset, policy in all_presets():
        lines.append(f"| {preset.name} | `{policy.canonical()}` | {preset.description} |")
    return "\n".join(lines) + "\n"


def policies_json() -> dict:
    return {
        "families": {
            name: {"description": cls.description, "params": [
                {"name": s.name, "type": s.type_name, "default": s.default_text, "unit": s.unit,
                 "allowed": list(s.allowed) if s.allowed else None, "minimum": s.minimum, "maximum": s.maximum,
                 "meaning": s.meaning, "source": s.source} for s in cls.param_specs()]}
            for name, cls in FAMILIES.items()
        },
        "presets": {p.name: {"policy": pol.canonical(), "description": p.description} for p, pol in all_presets()},
    }


def policies_cli(args: argparse.Namespace) -> int:
    if args.format == "markdown":
        print(policies_markdown(), end="")
        return 0
    if args.format == "json":
        print(json.dumps(policies_json(), indent=1))
        return 0
    console = Console(width=160)
    for name, cls in FAMILIES.items():
        table = Table(title=f"{name}: {cls.description}", title_justify="left", show_lines=False)
        for col in ("param", "default", "unit", "allowed", "meaning"):
            table.add_column(col, overflow="fold")
        for s in cls.param_specs():
            table.add_row(s.name, s.default_text, s.unit or "", ", ".join(s.allowed) if s.allowed else "", s.meaning)
        console.print(table)
    table = Table(title="presets (conf/policies.yaml)", title_justify="left")
    for col in ("preset", "canonical policy", "description"):
        table.add_column(col, overflow="fold")
    for preset, policy in all_presets():
        table.add_row(preset.name, policy.canonical(), preset.description)
    console.print(table)
    return 0


def scenarios_markdown(rows: list[tuple[str, str]] | None = None) -> str:
    """The scenario library as a Markdown table (`replab scenarios --format markdown`; docs/reference/scenarios.md)."""
    from generators.library import list_scenarios

    rows = list_scenarios() if rows is None else rows
    cells = [f"| `{name}` | {desc.replace('|', '/')} |" for name, desc in rows]
    return "\n".join(["| scenario | description |", "|---|---|", *cells]) + "\n"


def scenarios_cli(args: argparse.Namespace) -> int:
    from generators.library import list_scenarios

    rows = list_scenarios()
    if args.format == "json":
        print(json.dumps([{"name": n, "description": d} for n, d in rows], indent=1))
    elif args.format == "markdown":
        print(scenarios_markdown(rows), end="")
    else:
        table = Table(title="scenario library (conf/scenarios)", title_justify="left")
        table.add_column("scenario")
        table.add_column("description", overflow="fold")
        for name, desc in rows:
            table.add_row(name, desc)
        Console(width=160).print(table)
    return 0
