"""Synthetic, seeded traces of a cluster's life in the format of SPEC §2, generated with Spark (SPEC §8)."""

from schemas.exports import lazy_exports

#: public name -> the module that defines it
_EXPORTS = {
    "Scenario": "generators.model",
    "load_scenario_file": "generators.scenario",
    "parse_scenario": "generators.scenario",
    "resolve_scenario": "generators.library",
    "scenario_files": "generators.library",
    "list_scenarios": "generators.library",
    "build_plan": "generators.generate",
    "generate_trace": "generators.generate",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports("generators", _EXPORTS)
