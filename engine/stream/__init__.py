"""Stream mode: the trace-events source, the stateful group replay and the query (`replab replay --mode stream`)."""

from schemas.exports import lazy_exports

#: public name -> the module that defines it
_EXPORTS = {
    "TraceEventsSource": "engine.stream.source",
    "ReplayProcessor": "engine.stream.groups",
    "StreamPlan": "engine.stream.plan",
    "StreamCheckpoint": "engine.stream.checkpoint",
    "run_stream_replay": "engine.stream.query",
    "stream_plan": "engine.stream.query",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports("engine.stream", _EXPORTS)
