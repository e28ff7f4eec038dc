"""Policy semantics and the stateful replay: pure, typed functions over arrays, no Spark (SPEC §3, §9)."""

from schemas.exports import lazy_exports

#: public name -> the module that defines it
_EXPORTS = {
    "Policy": "replay.policies",
    "parse_policy": "replay.policies",
    "all_presets": "replay.policies",
    "family_of": "replay.families",
    "replay_local": "replay.local",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports("replay", _EXPORTS)
