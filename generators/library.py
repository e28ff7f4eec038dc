"""The scenario library (`conf/scenarios/*.yaml`, SPEC §8): listed by `replab scenarios`, resolved for --scenario."""

from __future__ import annotations

from pathlib import Path

import conf
from generators.model import Scenario
from generators.scenario import load_scenario_file
from schemas.errors import BadInput


def scenario_files() -> dict[str, str]:
    """Library name (the file name without .yaml) → path, in name order."""
    folder = conf.path("scenarios")
    return {p.stem: str(p) for p in sorted(folder.glob("*.yaml"))}


def list_scenarios() -> list[tuple[str, str]]:
    """(name, one-line description) of every library scenario, each parsed and validated (a broken library
    file is a BadInput naming it, not a silently empty line)."""
    return [(name, load_scenario_file(file).description) for name, file in scenario_files().items()]


def resolve_scenario(spec: str) -> Scenario:
    """`--scenario NAME|FILE.yaml`: a library name, or a path to a YAML file."""
    if spec.endswith((".yaml", ".yml")) or "/" in spec or Path(spec).is_file():
        return load_scenario_file(spec)
    files = scenario_files()
    if spec not in files:
        raise BadInput(f"unknown scenario {spec!r}; library scenarios: {', '.join(files)} (or give a .yaml file)",
                       rule="scenario")
    return load_scenario_file(files[spec])
