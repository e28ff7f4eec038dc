"""The scenario library: `conf/scenarios/*.yaml` (SPEC §8), listed by `replab scenarios`."""

from __future__ import annotations

import conf


def scenario_files() -> dict[str, str]:
    """Library name (the file name without .yaml) → path, in name order."""
    folder = conf.path("scenarios")
    return {p.stem: str(p) for p in sorted(folder.glob("*.yaml"))}


def list_scenarios() -> list[tuple[str, str]]:
    """(name, one-line description) of every library scenario, each parsed and validated (a broken library
    file is a BadInput naming it, not a silently empty line)."""
    from generators.scenario import load_scenario_file

    return [(name, load_scenario_file(file).description) for name, file in scenario_files().items()]
