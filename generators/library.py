"""The scenario library: `conf/scenarios/*.yaml`."""

from __future__ import annotations

import yaml

import conf


def scenario_files() -> dict[str, str]:
    folder = conf.path("scenarios")
    return {p.stem: str(p) for p in sorted(folder.glob("*.yaml"))}


def list_scenarios() -> list[tuple[str, str]]:
    """(name, one-line description) of every library scenario."""
    out = []
    for name, file in scenario_files().items():
        with open(file) as fh:
            raw = yaml.safe_load(fh) or {}
        out.append((name, str(raw.get("description", "")).strip()))
    return out
