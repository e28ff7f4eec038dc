"""Time units. Every instant and duration in a trace and in the tables is an integer count of microseconds."""

from __future__ import annotations

__all__ = ["MS", "US", "S"]

#: One microsecond, the trace's clock tick.
US: int = 1
#: Microseconds per millisecond: `timeout_ms * MS` is a duration in µs.
MS: int = 1_000
#: Microseconds per second.
S: int = 1_000_000
