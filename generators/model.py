"""The scenario model (SPEC §8): typed, validated, frozen dataclasses and their enums.

`generators/scenario.py` reads YAML into them; `generators/timeline.py` and `generators/generate.py` use them.
A module of its own so that the parser can check scheduled faults with the timeline (which reads the model)
without an import cycle.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from schemas.trace import Broker, Kind

MAX_INT32 = 2**31 - 1
#: Upper bounds that keep a typo from asking for an absurd trace (a 10^12-message scenario, 10^9 keys).
MAX_DURATION_S = 30 * 24 * 3600
MAX_RATE_PER_S = 100_000_000
MAX_KEYS = 10_000_000
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


class DistKind(enum.StrEnum):
    FIXED = "fixed"
    UNIFORM = "uniform"
    EXPONENTIAL = "exponential"
    LOGNORMAL = "lognormal"


class ShapeKind(enum.StrEnum):
    """How the message rate varies over the trace."""

    CONSTANT = "constant"
    DIURNAL = "diurnal"  # rate · (1 + amplitude · sin(2π (t / period + phase)))
    BURSTY = "bursty"  # rate · factor during bursts of length_s starting on average every every_s


class FaultKind(enum.StrEnum):
    """A scheduled fault: a trace event kind (SPEC §2.2), or a rolling restart that expands into shutdowns."""

    CRASH = "crash"
    POWER_LOSS = "power_loss"
    DISK_LOSS = "disk_loss"
    SHUTDOWN = "shutdown"
    ISOLATE = "isolate"
    RESTART = "restart"
    HEAL = "heal"
    ROLLING_RESTART = "rolling_restart"

    @property
    def trace_kind(self) -> Kind:
        return Kind.from_label(self.value)


#: Random processes: per broker, except rack_power_loss (per rack) and rolling_restart (per cluster).
RANDOM_FAULT_KINDS = ("crash", "power_loss", "disk_loss", "isolate", "rack_power_loss", "rolling_restart")


# ---------------------------------------------------------------------------------------------------------
# Typed scenario


@dataclass(frozen=True)
class Dist:
    """A bounded or unbounded distribution of a non-negative quantity (the unit is the owning key's)."""

    kind: DistKind
    value: float | None = None  # fixed
    mean: float | None = None  # exponential
    median: float | None = None  # lognormal
    sigma: float | None = None  # lognormal
    min: float | None = None
    max: float | None = None

    @property
    def upper_bound(self) -> float | None:
        if self.kind is DistKind.FIXED:
            return self.value
        return self.max

    @property
    def mean_value(self) -> float:
        """Approximate mean (ignores clipping); used to size chunks and estimate event counts."""
        if self.kind is DistKind.FIXED:
            return float(self.value)
        if self.kind is DistKind.UNIFORM:
            return (self.min + self.max) / 2
        if self.kind is DistKind.EXPONENTIAL:
            return float(self.mean)
        return float(self.median * math.exp(self.sigma**2 / 2))

    def transform(self, u: np.ndarray, z: np.ndarray | None = None) -> np.ndarray:
        """Map uniforms u in [0, 1) (and standard normals z, for lognormal) to samples."""
        if self.kind is DistKind.FIXED:
            out = np.full(np.shape(u), float(self.value))
        elif self.kind is DistKind.UNIFORM:
            out = self.min + u * (self.max - self.min)
        elif self.kind is DistKind.EXPONENTIAL:
            out = -self.mean * np.log1p(-u)
        else:
            out = self.median * np.exp(self.sigma * z)
        if self.kind in (DistKind.EXPONENTIAL, DistKind.LOGNORMAL) and (self.min is not None or self.max is not None):
            out = np.clip(out, self.min if self.min is not None else -np.inf,
                          self.max if self.max is not None else np.inf)
        return out

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind is DistKind.LOGNORMAL:
            out = rng.lognormal(math.log(self.median), self.sigma, n)
            lo = self.min if self.min is not None else -np.inf
            hi = self.max if self.max is not None else np.inf
            return np.clip(out, lo, hi) if self.min is not None or self.max is not None else out
        return self.transform(rng.random(n))


@dataclass(frozen=True)
class RateShape:
    kind: ShapeKind = ShapeKind.CONSTANT
    period_s: float | None = None  # diurnal
    amplitude: float | None = None  # diurnal, in [0, 1)
    phase: float = 0.0  # diurnal, fraction of a period
    factor: float | None = None  # bursty: rate multiplier during a burst
    every_s: float | None = None  # bursty: mean time between burst starts
    length_s: float | None = None  # bursty: burst length


@dataclass(frozen=True)
class KeySpace:
    count: int = 1000
    zipf_s: float = 1.0  # P(key i) ∝ 1 / (i + 1)^zipf_s; 0 = uniform
    unkeyed_share: float = 0.0  # share of messages without a key (null key)


@dataclass(frozen=True)
class Workload:
    duration_s: float
    rate_per_s: float
    shape: RateShape = field(default_factory=RateShape)
    producers: int = 4
    keys: KeySpace = field(default_factory=KeySpace)
    size_bytes: Dist = field(default_factory=lambda: Dist(DistKind.LOGNORMAL, median=1024, sigma=0.5, min=64,
                                                          max=1_048_576))


@dataclass(frozen=True)
class EpisodeProcess:
    """Random episodes (Poisson starts, mean gap every_s) of a random length; the length's unit is the key's."""

    every_s: float
    length: Dist


@dataclass(frozen=True)
class ReplicationBehaviour:
    """How one broker's follower reports (`replicate` events, SPEC §2.2) look."""

    fetch_interval_ms: float = 10.0
    fetch_jitter_ms: float = 3.0
    delay_ms: Dist = field(default_factory=lambda: Dist(DistKind.LOGNORMAL, median=2.0, sigma=0.5, max=200.0))
    catchup_speed: float = 10.0
    slow_follower: EpisodeProcess | None = None  # length in s; part of the fault profile (scales)
    gc_pause: EpisodeProcess | None = None  # length in ms; a property of the JVM (does not scale)


@dataclass(frozen=True)
class Stall:
    """A scheduled stretch without `replicate` reports (slow disk, saturated link): [from_ms, to_ms)."""

    broker: int
    from_ms: float
    to_ms: float


@dataclass(frozen=True)
class Replication:
    default: ReplicationBehaviour = field(default_factory=ReplicationBehaviour)
    per_broker: tuple[tuple[int, ReplicationBehaviour], ...] = ()
    stalls: tuple[Stall, ...] = ()

    def for_broker(self, broker_id: int) -> ReplicationBehaviour:
        return dict(self.per_broker).get(broker_id, self.default)


@dataclass(frozen=True)
class ScheduledFault:
    """One scheduled entry; `brokers` is resolved (ids), `group` says whether it was a group selector."""

    at_ms: float
    kind: FaultKind
    brokers: tuple[int, ...]
    group: bool
    downtime_ms: float | None = None  # rolling_restart
    gap_ms: float | None = None  # rolling_restart


@dataclass(frozen=True)
class RandomFault:
    """A random fault process: starts every mtbf_s on average (exponential gaps), recovers after mttr_s."""

    mtbf_s: float
    mttr_s: Dist
    gap_s: Dist | None = None  # rolling_restart: wait after a broker is back before stopping the next


@dataclass(frozen=True)
class Faults:
    scheduled: tuple[ScheduledFault, ...] = ()
    random: tuple[tuple[str, RandomFault], ...] = ()  # (process name from RANDOM_FAULT_KINDS, parameters)


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    brokers: tuple[Broker, ...]
    workload: Workload
    replication: Replication = field(default_factory=Replication)
    faults: Faults = field(default_factory=Faults)
    source: str = ""

    @property
    def broker_ids(self) -> tuple[int, ...]:
        return tuple(b.id for b in self.brokers)

    @property
    def racks(self) -> tuple[str, ...]:
        return tuple(sorted({b.rack for b in self.brokers}))

    def to_json(self) -> dict[str, Any]:
        """The resolved scenario (defaults filled in) as plain JSON, for the manifest's `generator`."""
        raw = asdict(self)
        raw.pop("source")
        return _plain(raw)


def _plain(obj: Any) -> Any:
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    return obj
