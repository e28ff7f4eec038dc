"""The replay engine: the plan batch and stream share, the group replay on the executors, publish, metrics, MLflow."""

from schemas.exports import lazy_exports

#: public name -> the module that defines it
_EXPORTS = {
    "PolicyRun": "engine.plan",
    "ReplayReport": "engine.plan",
    "ReplayRequest": "engine.plan",
    "RunFigures": "engine.plan",
    "OutcomeFrames": "engine.plan",
    "policy_runs": "engine.plan",
    "ReplayFrames": "engine.replay",
    "replay_frames": "engine.replay",
    "run_replay": "engine.replay",
    "ReplayResults": "engine.publish",
    "publish": "engine.publish",
    "RunInfo": "engine.metrics",
    "ReplayTracker": "engine.tracking",
    "run_stream_replay": "engine.stream.query",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports("engine", _EXPORTS)
