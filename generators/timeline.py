"""The fault timeline and the per-broker stall schedule of a trace (small; computed on the driver).

Faults come from the scenario's scheduled entries and random processes. One state machine (up/down and
isolated per broker) replays every proposal in the order the trace applies them (SPEC §2.2: time, then kind
order), so the emitted events are valid by construction (SPEC §2.3): a stop only of a broker that is up, a
restart only of a broker that is down, a heal only of an isolated broker.

- A scheduled entry naming one `broker:` must be valid; otherwise the scenario is rejected (`check_scheduled`,
  run at parse time with the entry's key path).
- A group entry (`brokers:`, `rack:`, `rolling_restart`) applies to the brokers for which it is valid at that
  instant and skips the others.
- A random episode (onset and its recovery) is accepted when the broker is in a state that allows the onset
  and no scheduled event of that broker falls within [onset, recovery]: random faults never break a scheduled
  scenario. A recovery that would fall after the end of the trace is dropped (the broker stays down).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from generators.model import Dist, FaultKind, RandomFault, Scenario, ScheduledFault
from schemas.trace import STOP_KINDS, Kind
from schemas.units import MS, S

#: Independent random streams (numpy SeedSequence spawn keys) so that adding one kind of randomness to a
#: scenario never changes the draws of another.
STREAM_FAULTS = 1
STREAM_STALLS = 2
STREAM_SHAPE = 3


def to_us(value: float, unit_us: int, scale: float = 1.0) -> int:
    """A scenario time in ms or s, scaled, as integer µs (the one rounding rule)."""
    return round(value * unit_us * scale)


def rng_for(seed: int, *spawn_key: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=tuple(spawn_key)))


@dataclass(frozen=True)
class FaultEvent:
    ts_us: int
    kind: Kind
    broker: int


@dataclass
class _State:
    up: dict[int, bool]
    isolated: dict[int, bool]
    since_us: dict[int, int] = field(default_factory=dict)

    def problem(self, kind: Kind, b: int) -> str | None:
        """Why `kind` cannot apply to broker b now (SPEC §2.3), or None."""
        if kind in STOP_KINDS and not self.up[b]:
            return f"broker {b} is already down"
        if kind is Kind.RESTART and self.up[b]:
            return f"broker {b} is up (a restart needs an earlier crash, power_loss, disk_loss or shutdown)"
        if kind is Kind.HEAL and not self.isolated[b]:
            return f"broker {b} is not isolated"
        if kind is Kind.ISOLATE and self.isolated[b]:
            return f"broker {b} is already isolated"
        return None

    def apply(self, ts_us: int, kind: Kind, b: int) -> None:
        if kind in STOP_KINDS:
            self.up[b] = False
        elif kind is Kind.RESTART:
            self.up[b] = True
        elif kind is Kind.ISOLATE:
            self.isolated[b] = True
        elif kind is Kind.HEAL:
            self.isolated[b] = False
        self.since_us[b] = ts_us


# Proposal modes.
_STRICT, _GROUP, _RANDOM, _RECOVERY = 0, 1, 2, 3


@dataclass(order=True)
class _Proposal:
    ts_us: int
    kind_order: int
    broker: int
    seq: int
    mode: int = field(compare=False)
    recovery_us: int | None = field(compare=False, default=None)  # _RANDOM: when it ends (None: after the end)
    recovery_kind: Kind | None = field(compare=False, default=None)
    path: str = field(compare=False, default="")


def _expand_scheduled(scheduled: Sequence[ScheduledFault], paths: Sequence[str], scale: float
                      ) -> list[tuple[int, Kind, int, int, str]]:
    """(ts_us, kind, broker, mode, key path) of every scheduled entry; rolling restarts expand in id order."""
    # Order-preserving scaling: entries that were apart stay apart by at least 1 µs after rounding.
    order = sorted(range(len(scheduled)), key=lambda i: (scheduled[i].at_ms, i))
    at_us: dict[int, int] = {}
    prev_ms, prev_us = None, -1
    for i in order:
        ms = scheduled[i].at_ms
        us = to_us(ms, MS, scale)
        if prev_ms is not None and ms > prev_ms:
            us = max(us, prev_us + 1)
        elif prev_ms is not None:
            us = prev_us
        at_us[i] = us
        prev_ms, prev_us = ms, us
    out = []
    for i, s in enumerate(scheduled):
        t = at_us[i]
        if s.kind is FaultKind.ROLLING_RESTART:
            down, gap = to_us(s.downtime_ms, MS, scale), to_us(s.gap_ms or 0.0, MS, scale)
            for j, b in enumerate(s.brokers):
                start = t + j * (down + gap)
                out.append((start, Kind.SHUTDOWN, b, _GROUP, paths[i]))
                out.append((start + down, Kind.RESTART, b, _GROUP, paths[i]))
        else:
            mode = _GROUP if s.group else _STRICT
            out.extend((t, s.kind.trace_kind, b, mode, paths[i]) for b in s.brokers)
    return out


def check_scheduled(scheduled: Sequence[ScheduledFault], paths: Sequence[str], ids: Sequence[int],
                    duration_ms: float, *, bad: Callable[[str, str], Exception]) -> None:
    """Reject a scenario whose single-broker scheduled entries break SPEC §2.3 (raises bad(path, why))."""
    duration_us = to_us(duration_ms, MS)
    expanded = _expand_scheduled(scheduled, paths, 1.0)
    for ts, _, _, _, path in expanded:
        if ts > duration_us:
            raise bad(path, f"ends after the trace (rolling restart reaches {ts / MS:g} ms, duration "
                            f"{duration_ms:g} ms)")
    _simulate(expanded, [], ids, duration_us, bad=bad)


def _simulate(scheduled: list[tuple[int, Kind, int, int, str]],
              random_episodes: list[tuple[int, Kind, int, int | None, Kind | None]],
              ids: Sequence[int], duration_us: int, *,
              bad: Callable[[str, str], Exception] | None = None) -> list[FaultEvent]:
    state = _State({b: True for b in ids}, {b: False for b in ids})
    sched_times: dict[int, list[int]] = {b: [] for b in ids}
    heap: list[_Proposal] = []
    seq = 0
    for ts, kind, b, mode, path in scheduled:
        heap.append(_Proposal(ts, int(kind), b, seq, mode, path=path))
        sched_times[b].append(ts)
        seq += 1
    for ts, kind, b, rec_us, rec_kind in random_episodes:
        heap.append(_Proposal(ts, int(kind), b, seq, _RANDOM, rec_us, rec_kind))
        seq += 1
    sorted_sched = {b: np.array(sorted(v), dtype=np.int64) for b, v in sched_times.items()}
    heapq.heapify(heap)
    out: list[FaultEvent] = []
    while heap:
        p = heapq.heappop(heap)
        kind = Kind(p.kind_order)
        why = state.problem(kind, p.broker)
        if p.mode == _STRICT and why is not None:
            if bad is None:
                raise AssertionError(f"scheduled entry {p.path} invalid at generation time: {why}")
            raise bad(p.path, f"{kind.label} at {p.ts_us / MS:g} ms: {why}")
        if why is not None:
            continue
        if p.mode == _RANDOM:
            if (kind in STOP_KINDS or kind is Kind.ISOLATE) and not state.up[p.broker]:
                continue
            end = p.recovery_us if p.recovery_us is not None else duration_us + 1
            times = sorted_sched[p.broker]
            lo = np.searchsorted(times, p.ts_us, side="left")
            if lo < len(times) and times[lo] <= end:
                continue  # would overlap a scheduled event of this broker
            if p.recovery_us is not None and p.recovery_us <= duration_us:
                heapq.heappush(heap, _Proposal(p.recovery_us, int(p.recovery_kind), p.broker, seq, _RECOVERY))
                seq += 1
        state.apply(p.ts_us, kind, p.broker)
        out.append(FaultEvent(p.ts_us, kind, p.broker))
    return out


def _poisson_episodes(rng: np.random.Generator, mean_gap: float, horizon: float, length: Dist
                      ) -> list[tuple[float, float]]:
    """(start, length) of episodes starting as a Poisson process; each start's length is drawn right after
    it, so a longer horizon extends the list without changing its beginning."""
    out, t = [], 0.0
    while True:
        t += rng.exponential(mean_gap)
        if t > horizon:
            return out
        out.append((t, float(length.sample(rng, 1)[0])))


_RANDOM_KIND = {"crash": Kind.CRASH, "power_loss": Kind.POWER_LOSS, "disk_loss": Kind.DISK_LOSS,
                "isolate": Kind.ISOLATE, "rack_power_loss": Kind.POWER_LOSS, "rolling_restart": Kind.SHUTDOWN}


def _random_episodes(scenario: Scenario, seed: int, scale: float
                     ) -> list[tuple[int, Kind, int, int | None, Kind | None]]:
    """Onsets and recoveries of every random fault process, drawn in unscaled time then stretched by scale."""
    out = []
    horizon_s = scenario.workload.duration_s
    ids = scenario.broker_ids
    for proc_index, (name, fault) in enumerate(scenario.faults.random):
        kind = _RANDOM_KIND[name]
        recovery = Kind.HEAL if kind is Kind.ISOLATE else Kind.RESTART
        if name == "rack_power_loss":
            for rack_index, rack in enumerate(scenario.racks):
                rng = rng_for(seed, STREAM_FAULTS, proc_index, rack_index)
                members = [b.id for b in scenario.brokers if b.rack == rack]
                for t, down in _poisson_episodes(rng, fault.mtbf_s, horizon_s, fault.mttr_s):
                    stagger = rng.random(len(members)) * 0.1 * down  # machines boot at slightly different times
                    for b, extra in zip(members, stagger, strict=True):
                        out.append((to_us(t, S, scale), kind, b, to_us(t + down + extra, S, scale),
                                    recovery))
        elif name == "rolling_restart":
            rng = rng_for(seed, STREAM_FAULTS, proc_index, 0)
            out.extend(_rolling(rng, fault, ids, horizon_s, scale))
        else:
            for b in ids:
                rng = rng_for(seed, STREAM_FAULTS, proc_index, b)
                for t, down in _poisson_episodes(rng, fault.mtbf_s, horizon_s, fault.mttr_s):
                    out.append((to_us(t, S, scale), kind, b, to_us(t + down, S, scale), recovery))
    return out


def _rolling(rng: np.random.Generator, fault: RandomFault, ids: Sequence[int], horizon_s: float, scale: float):
    out = []
    t = 0.0
    while True:
        t += rng.exponential(fault.mtbf_s)
        if t > horizon_s:
            return out
        at = t
        for b in ids:
            down = float(fault.mttr_s.sample(rng, 1)[0])
            gap = float(fault.gap_s.sample(rng, 1)[0]) if fault.gap_s is not None else 0.0
            out.append((to_us(at, S, scale), Kind.SHUTDOWN, b, to_us(at + down, S, scale),
                        Kind.RESTART))
            at += down + gap


def fault_events(scenario: Scenario, seed: int, scale: float) -> list[FaultEvent]:
    """Every fault event of the trace, in trace order (time, then SPEC §2.2 kind order, then broker)."""
    duration_us = to_us(scenario.workload.duration_s, S, scale)
    paths = [f"faults.scheduled[{i}]" for i in range(len(scenario.faults.scheduled))]
    scheduled = _expand_scheduled(scenario.faults.scheduled, paths, scale)
    scheduled = [s for s in scheduled if s[0] <= duration_us]
    episodes = [e for e in _random_episodes(scenario, seed, scale) if e[0] <= duration_us]
    events = _simulate(scheduled, episodes, scenario.broker_ids, duration_us)
    return sorted(events, key=lambda e: (e.ts_us, int(e.kind), e.broker))


# ---------------------------------------------------------------------------------------------------------
# Per-broker stall schedule: when a broker sends no `replicate` reports, and where it resumes from.


@dataclass(frozen=True)
class BrokerBlocks:
    """Merged [start, end) stretches without reports (down, isolated, stalled), and the catch-up points.

    `disk_lost[i]` says a disk_loss happened inside stretch i, so the broker resumes from nothing.
    """

    starts_us: np.ndarray
    ends_us: np.ndarray
    disk_lost: np.ndarray


def stall_episodes(scenario: Scenario, seed: int, scale: float) -> dict[int, list[tuple[int, int]]]:
    """[start, end) µs of every stall (scheduled, slow-follower and GC-pause episodes) per broker."""
    duration_us = to_us(scenario.workload.duration_s, S, scale)
    out: dict[int, list[tuple[int, int]]] = {b: [] for b in scenario.broker_ids}
    for s in scenario.replication.stalls:
        out[s.broker].append((to_us(s.from_ms, MS, scale), min(to_us(s.to_ms, MS, scale),
                                                                      duration_us + 1)))
    for b in scenario.broker_ids:
        beh = scenario.replication.for_broker(b)
        if beh.slow_follower is not None:
            # Part of the fault profile: drawn in unscaled time, stretched by scale.
            rng = rng_for(seed, STREAM_STALLS, 0, b)
            for t, length in _poisson_episodes(rng, beh.slow_follower.every_s, scenario.workload.duration_s,
                                               beh.slow_follower.length):
                out[b].append((to_us(t, S, scale), to_us(t + length, S, scale)))
        if beh.gc_pause is not None:
            # A JVM property: pauses keep their real-time rate and length whatever the scale.
            rng = rng_for(seed, STREAM_STALLS, 1, b)
            for t, length_ms in _poisson_episodes(rng, beh.gc_pause.every_s, duration_us / S,
                                                  beh.gc_pause.length):
                start = to_us(t, S)
                out[b].append((start, start + max(1, to_us(length_ms, MS))))
    return out


def broker_blocks(scenario: Scenario, faults: Sequence[FaultEvent], stalls: dict[int, list[tuple[int, int]]],
                  duration_us: int) -> dict[int, BrokerBlocks]:
    """Union of down, isolated and stalled stretches per broker (a report at a stop instant is blocked too:
    the stop applies first, SPEC §2.2; a report at the restart or heal instant is allowed)."""
    after_end = duration_us + 1
    spans: dict[int, list[tuple[int, int]]] = {b: list(v) for b, v in stalls.items()}
    disk_losses: dict[int, list[int]] = {b: [] for b in scenario.broker_ids}
    down_since: dict[int, int] = {}
    iso_since: dict[int, int] = {}
    for e in faults:
        if e.kind in STOP_KINDS:
            down_since[e.broker] = e.ts_us
            if e.kind is Kind.DISK_LOSS:
                disk_losses[e.broker].append(e.ts_us)
        elif e.kind is Kind.RESTART:
            spans[e.broker].append((down_since.pop(e.broker), e.ts_us))
        elif e.kind is Kind.ISOLATE:
            iso_since[e.broker] = e.ts_us
        elif e.kind is Kind.HEAL:
            spans[e.broker].append((iso_since.pop(e.broker), e.ts_us))
    for b, t in down_since.items():
        spans[b].append((t, after_end))
    for b, t in iso_since.items():
        spans[b].append((t, after_end))
    out = {}
    for b in scenario.broker_ids:
        merged: list[list[int]] = []
        for s, e in sorted(x for x in spans[b] if x[1] > x[0]):
            if merged and s <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        starts = np.array([m[0] for m in merged], dtype=np.int64)
        ends = np.array([m[1] for m in merged], dtype=np.int64)
        losses = np.array(disk_losses[b], dtype=np.int64)
        lost = np.array([bool(np.any((losses >= s) & (losses < e))) for s, e in merged], dtype=bool)
        out[b] = BrokerBlocks(starts, ends, lost)
    return out
