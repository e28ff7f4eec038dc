"""Regenerative episodes of the failure model (`generators.rates`) and their importance sampling.

A year of a cluster alternates healthy stretches (every broker up, every replica in sync) and **episodes**:
an episode starts with a fault (its *initial* process) and ends when every fault has been repaired. The
healthy stretches are exponential (the fault processes are Poisson), so episodes are independent and
identically distributed given their initial process (regeneration), and a yearly figure is a renewal reward
(`engine.durability.estimate`).

Inside an episode further faults arrive as Poisson processes on the units still healthy (a broker that is up
and reachable, a rack or the cluster not already dark), while repairs run on their own clocks (recovery times
are drawn from the model as they are). The dangerous episodes are those where faults pile up before repairs,
which are rare. The sampler uses **failure biasing with forcing** in its form for general repair times
(Shahabuddin 1994, "Importance sampling for the simulation of highly reliable Markovian systems", Management
Science 40(3); Nicola, Shahabuddin & Nakayama 2001, "Techniques for fast simulation of models of highly
dependable systems", IEEE Trans. Reliability 50(3)): at each of the episode's first `max_biased_steps` decision
points (after every event, while fewer than `max_biased_faults` faults struck), with r the time to the next
repair event and p = 1 − exp(−Λr) the model's chance of a fault before it, a fault is forced before r with
chance q_s = min(cap, a·p) (never below p), at the model's time law conditioned on [0, r); its unit is drawn
half uniformly over the m units that can fail ("balanced": a rare but dangerous disk loss is as likely as a
crash) and half in proportion to the model's rates. The scale a = q / (1 − exp(−Λ τ)), τ the model's mean
recovery time of the initial fault, is fixed per episode, so that every forced fault below the cap has the
same likelihood ratio p / q_s = 1 / a. That is what L'Ecuyer & Tuffin's zero-variance approximation for
highly reliable systems ("Approximating zero-variance importance sampling in a reliability setting", Annals of
Operations Research 189, 2011) asks of paths to a loss made of the same number of rare faults: their weights
are nearly equal, so the estimate's variance is that of counting them. Forcing with a fixed chance instead
(the textbook form for exponential repairs) makes a fault's ratio proportional to r, and a losing episode's
weight a product of repair times: in the Markov check below the losing weights then spread over five orders
of magnitude and the intervals covered the exact value in only 89-91 % of repetitions. Biasing stops after
the first faults (beyond them a loss is already decided or needs more faults than the model makes likely),
so faults after a loss do not multiply the weight. Each biased step's ratio is at most 1 / (1 − cap) (no fault)
or 1 / (1 − balance) (a fault: p / q_s ≤ 1), every other step's is 1 (`Biasing.forcing_max_weight`).

Forcing suits the policies that lose only when faults pile up (acks=all with min ISR 2, SYNC_FLUSH, Raft), but
every policy is judged on the same episodes, and many lose on the initial fault alone (acks=1, asynchronous
replication, page cache under a power loss). Their probability then rests on the few episodes forcing left
unforced, each weighted up to 1 / (1 − cap) per step: a relative variance per episode of 3-4 where plain
sampling has none. So an episode is drawn from a **defensive mixture** (Hesterberg, "Weighted average importance
sampling and defensive mixture distributions", Technometrics 37(2), 1995; Owen & Zhou, "Safe and effective
importance sampling", JASA 95, 2000): with chance δ = `defensive` from the model itself, else with forcing, and
its likelihood ratio is p / (δ·p + (1 − δ)·f), both densities followed along the path whichever component drew
it (Veach's balance heuristic). Every weight is then at most 1/δ (`Biasing.max_weight`), a loss the initial fault
alone causes has a relative variance per episode of at most 1/δ − 1, and the paths forcing is for keep their
nearly constant ratio, divided by 1 − δ (their variance grows by at most 1 / (1 − δ); 15 % at δ = 0.3 in the
Markov check). Each episode keeps log(f / m) over its biased steps (`Episode.log_forcing_ratio`), so its weight
under any other share follows (`mixture_weight`), which is how the estimator adapts δ per stratum
(`engine.durability.run.Estimate.defensive_shares`). The sampler's own default is δ = 0, forcing alone: the
Markov checks validate it as such, and the estimator sets δ for every episode it draws.

The biased choices depend only on the past, so an episode's likelihood ratio is its density under the model,
Π λ_i^{n_i} · exp(−Σ λ_i·exposure_i), over its density under the sampler (`log_q`, the product of the chances
and conditional densities drawn). The model's part is kept as sufficient statistics (per process: faults
inside the episode and unit-seconds exposed), so the same episodes re-weight exactly to any other per-year
rates (`log_p`), the sensitivity.
Recovery times re-weight too (`recovery_log_ratio`): each lognormal or exponential recovery time is drawn
unclipped and then clipped to the process's [min, max], and the episode keeps, per process, the count, the sum
and the sum of logs of the unclipped draws; "recovery times × f" is then the same law with its scale (median or
mean) × f and the **same clip bounds** (a restart is no faster than a JVM start, however slow the typical one),
whose density ratio on the unclipped draw depends only on those sums. The path is the same function of the
unclipped draws under both laws, so the re-weighting is exact. A uniform or fixed recovery time cannot be
re-weighted to another scale (its support moves), nor an exponential one to × 2 or more (the ratio's variance is
infinite there); a lognormal one can (the ratio's second moment per draw is exp((ln f)²/σ²), 6.8 at f = 4 and
σ = 1, and the effective sample size shows what is left).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from generators.model import Dist, DistKind
from generators.rates import PLANNED, Rates, Unit

#: Trace event labels an episode emits (SPEC §2.2 kinds).
CRASH, POWER, DISK, ISOLATE, SHUTDOWN, RESTART, HEAL = ("crash", "power_loss", "disk_loss", "isolate", "shutdown",
                                                        "restart", "heal")
_DOWN_LABEL = {"crash": CRASH, "power_loss": POWER, "disk_loss": DISK}


@dataclass(frozen=True)
class Biasing:
    """Balanced failure biasing with forcing, in a defensive mixture with the model itself (see the module
    docstring). q = 0 turns biasing off (plain MC)."""

    q: float = 2.0  # a = q / p̄: biased chance of a fault before the next repair = a × the model's, at most `cap`
    cap: float = 0.8
    balance: float = 0.5  # share of a forced fault's unit chosen uniformly (the rest in proportion to its rate)
    max_biased_steps: int = 4  # biased decision points per episode; then the model's law alone
    max_biased_faults: int = 2
    max_faults: int = 32  # a safety stop; an episode reaching it is counted as truncated
    defensive: float = 0.0  # share δ of episodes drawn from the model itself (0: forcing alone; see run.py)

    @property
    def forcing_max_weight(self) -> float:
        """Largest likelihood ratio forcing alone gives an episode: each biased step multiplies it by at most
        1 / (1 − cap) (no fault) or 1 / (1 − balance) (a forced fault), every other step by 1."""
        return max(1.0 / (1.0 - self.cap), 1.0 / (1.0 - self.balance)) ** self.max_biased_steps

    @property
    def max_weight(self) -> float:
        """Largest likelihood ratio an episode can carry: p / (δ·p + (1 − δ)·q_f) is at most 1/δ and at most the
        forcing's own bound over 1 − δ."""
        if self.q <= 0:
            return 1.0
        bounds = [self.forcing_max_weight / (1.0 - self.defensive)] if self.defensive < 1 else []
        return min(bounds + ([1.0 / self.defensive] if self.defensive > 0 else []))


@dataclass
class Episode:
    """One sampled episode: its events in real seconds from its start, and its likelihood statistics."""

    initial: int  # index of the initial process in rates.processes
    events: list[tuple[float, str, int]]  # (t_s, trace kind label, broker), time-ordered
    counts: np.ndarray  # faults inside the episode (the initial one excluded), per process
    exposure_s: np.ndarray  # unit-seconds during which each process could strike, per process
    log_q: float  # log density of the inside-episode fault process under the sampling rates
    length_s: float
    max_down: int  # most brokers down at once
    truncated: bool = False
    #: per process: recovery times drawn (the initial fault's included), their unclipped sum and sum of logs
    recovery_n: np.ndarray = field(default_factory=lambda: np.zeros(0))
    recovery_sum: np.ndarray = field(default_factory=lambda: np.zeros(0))
    recovery_log_sum: np.ndarray = field(default_factory=lambda: np.zeros(0))
    #: log(f / m) over the biased steps: forcing's density over the model's (`mixture_weight`)
    log_forcing_ratio: float = 0.0
    defensive: float = 0.0  # the mixture share δ the episode was drawn with

    def log_p(self, per_second: np.ndarray) -> float:
        """log density of the inside-episode fault process under the model's rates `per_second`."""
        with np.errstate(divide="ignore"):
            logs = np.where(self.counts > 0, np.log(per_second), 0.0)
        return float(np.sum(self.counts * logs - per_second * self.exposure_s))

    def weight(self, per_second: np.ndarray) -> float:
        return math.exp(self.log_p(per_second) - self.log_q)


@dataclass
class _Cluster:
    brokers: tuple[int, ...]
    rack_of: dict[int, str]
    racks: tuple[str, ...]
    causes: dict[int, set[int]] = field(default_factory=dict)  # broker -> open fault ids keeping it down
    isolated: dict[int, bool] = field(default_factory=dict)
    dark_racks: set[str] = field(default_factory=set)
    cluster_dark: bool = False
    n_proc: int = 0
    recovery: np.ndarray = field(default_factory=lambda: np.zeros((3, 0)))  # rows: count, sum, sum of logs

    def __post_init__(self) -> None:
        self.causes = {b: set() for b in self.brokers}
        self.isolated = {b: False for b in self.brokers}
        self.recovery = np.zeros((3, self.n_proc))

    def healthy(self, b: int) -> bool:
        return not self.causes[b] and not self.isolated[b]

    def down(self) -> int:
        return sum(1 for b in self.brokers if self.causes[b])


def mixture_weight(delta: float, log_forcing_ratio: float | np.ndarray) -> float | np.ndarray:
    """An episode's likelihood ratio under the sampling rates, m / (δ·m + (1 − δ)·f), from log(f / m) over its
    biased steps (elsewhere the model's and forcing's densities are equal); of many episodes at once when given
    an array (the estimator's choice of δ)."""
    if np.ndim(log_forcing_ratio):
        if delta >= 1.0:
            return np.ones(np.shape(log_forcing_ratio))
        x = math.log1p(-delta) + np.asarray(log_forcing_ratio, dtype=np.float64)
        with np.errstate(over="ignore"):
            return np.where(x > 700, np.exp(-x), 1.0 / (delta + np.exp(np.minimum(x, 700.0))))
    if delta >= 1.0:
        return 1.0
    x = math.log1p(-delta) + log_forcing_ratio
    if x > 700:
        return math.exp(-x)
    return 1.0 / (delta + math.exp(x))


def _draw_unclipped(d: Dist, rng: np.random.Generator) -> float:
    """One draw of d before its clip (the same random numbers `Dist.sample` uses)."""
    if d.kind is DistKind.LOGNORMAL:
        return float(rng.lognormal(math.log(d.median), d.sigma, 1)[0])
    if d.kind is DistKind.EXPONENTIAL:
        return float(-d.mean * math.log1p(-rng.random(1)[0]))
    return float(d.sample(rng, 1)[0])


def _clip(d: Dist, x: float) -> float:
    if d.kind in (DistKind.LOGNORMAL, DistKind.EXPONENTIAL):
        x = max(x, d.min) if d.min is not None else x
        x = min(x, d.max) if d.max is not None else x
    return x


def recovery_log_ratio(d: Dist, factor: float, n: float, total: float, log_total: float) -> float:
    """log of Π g_f(x_j) / g(x_j) over n unclipped draws x_j of d (sum `total`, sum of logs `log_total`), g_f the
    law of d with its scale × `factor` (clip bounds kept)."""
    if factor == 1.0 or n == 0:
        return 0.0
    lf = math.log(factor)
    if d.kind is DistKind.LOGNORMAL:  # (ln x − ln m)² − (ln x − ln m − ln f)², summed, over 2σ²
        return (2 * lf * (log_total - n * math.log(d.median)) - n * lf * lf) / (2 * d.sigma**2)
    if d.kind is DistKind.EXPONENTIAL:
        if factor >= 2.0:  # E_q[(g_f/g)²] = 1/(f(2 − f)) per draw: infinite from f = 2 on
            raise ValueError(f"an exponential recovery time re-weights only to factors below 2 (got {factor:g}): "
                             "beyond, the likelihood ratio has infinite variance")
        return -n * lf + total * (1 - 1 / factor) / d.mean
    raise ValueError(f"a {d.kind.value} recovery time cannot be re-weighted to another scale (its support moves)")


def unit_counts(rates: Rates, brokers: int, racks: int) -> np.ndarray:
    return np.array([{Unit.BROKER: brokers, Unit.RACK: racks, Unit.CLUSTER: 1}[p.unit] for p in rates.processes],
                    dtype=np.float64)


def initial_rates_per_year(rates: Rates, brokers: int, racks: int) -> np.ndarray:
    """Λ_k: episodes per year started by each process (per-unit rate × units)."""
    return np.array([p.per_year for p in rates.processes]) * unit_counts(rates, brokers, racks)


class EpisodeSampler:
    """Samples episodes of `rates` on a cluster of brokers in racks (`rack_of`: broker -> rack)."""

    def __init__(self, rates: Rates, rack_of: dict[int, str], biasing: Biasing = Biasing()) -> None:
        self.rates = rates
        self.rack_of = dict(rack_of)
        self.brokers = tuple(sorted(rack_of))
        self.racks = tuple(sorted(set(rack_of.values())))
        self.biasing = biasing
        self.per_second = np.array([p.per_second for p in rates.processes])
        self.index = {p.name: i for i, p in enumerate(rates.processes)}

    # -------------------------------------------------------------------------------------------- faults
    def _recovery(self, c: _Cluster, proc: int, rng: np.random.Generator) -> float:
        d = self.rates.processes[proc].recovery_s
        x = _draw_unclipped(d, rng)
        c.recovery[:, proc] += (1.0, x, math.log(x) if x > 0 else 0.0)
        return _clip(d, x)

    def _slots(self, c: _Cluster) -> list[tuple[int, object]]:
        """(process index, unit) of every fault that can strike now."""
        out: list[tuple[int, object]] = []
        for i, p in enumerate(self.rates.processes):
            if p.name in PLANNED or p.per_year <= 0:
                continue
            if p.unit is Unit.BROKER:
                out.extend((i, b) for b in self.brokers if c.healthy(b))
            elif p.unit is Unit.RACK:
                out.extend((i, r) for r in self.racks if r not in c.dark_racks and not c.cluster_dark)
            elif not c.cluster_dark:
                out.append((i, None))
        return out

    def _apply(self, c: _Cluster, proc: int, unit: object, t: float, rng: np.random.Generator,
               queue: list, events: list, seq: list[int]) -> None:
        p = self.rates.processes[proc]

        def push(at: float, action: tuple) -> None:
            seq[0] += 1
            heapq.heappush(queue, (at, seq[0], action))

        def down(b: int, fault_id: int, label: str) -> None:
            if not c.causes[b]:
                events.append((t, label, b))
            c.causes[b].add(fault_id)

        fid = seq[0] + 1_000_000
        seq[0] += 1
        if p.name in _DOWN_LABEL:
            b = int(unit)  # type: ignore[arg-type]
            down(b, fid, _DOWN_LABEL[p.name])
            push(t + self._recovery(c, proc, rng) + p.fixed_extra_s, ("up", (b,), fid, None))
        elif p.name == "isolate":
            b = int(unit)  # type: ignore[arg-type]
            c.isolated[b] = True
            events.append((t, ISOLATE, b))
            push(t + self._recovery(c, proc, rng), ("heal", (b,), fid, None))
        elif p.name in ("rack_power_loss", "cluster_power_loss"):
            rack = unit if p.name == "rack_power_loss" else None
            hit = tuple(b for b in self.brokers if (rack is None or self.rack_of[b] == rack) and c.healthy(b))
            for b in hit:
                down(b, fid, POWER)
            if rack is None:
                c.cluster_dark = True
            else:
                c.dark_racks.add(rack)
            push(t + self._recovery(c, proc, rng), ("up", hit, fid, rack if rack is not None else "*"))
        elif p.name == "rolling_restart":
            push(t, ("roll", 0, fid, None))
        else:
            raise ValueError(p.name)

    def _repair(self, c: _Cluster, action: tuple, t: float, rng: np.random.Generator, queue: list,
                events: list, seq: list[int]) -> None:
        what, arg, fid, area = action
        if what == "up":
            for b in arg:
                c.causes[b].discard(fid)
                if not c.causes[b]:
                    events.append((t, RESTART, b))
            if area == "*":
                c.cluster_dark = False
            elif area is not None:
                c.dark_racks.discard(area)
        elif what == "heal":
            (b,) = arg
            c.isolated[b] = False
            events.append((t, HEAL, b))
        elif what == "roll":
            p = self.rates["rolling_restart"]
            i = arg
            if i >= len(self.brokers):
                return
            b = self.brokers[i]
            downtime = self._recovery(c, self.index["rolling_restart"], rng)
            if c.healthy(b):  # a broker already down or cut off is skipped: there is nothing to restart
                c.causes[b].add(fid)
                events.append((t, SHUTDOWN, b))
                seq[0] += 1
                heapq.heappush(queue, (t + downtime, seq[0], ("up", (b,), fid, None)))
            gap = float(p.gap_s.sample(rng, 1)[0]) if p.gap_s is not None else 0.0
            seq[0] += 1
            heapq.heappush(queue, (t + downtime + gap, seq[0], ("roll", i + 1, fid, None)))

    def mean_recovery_s(self, proc: int) -> float:
        """The model's mean time to undo a fault of `proc` (a rolling restart: its whole length)."""
        p = self.rates.processes[proc]
        mean = p.recovery_s.mean_value + p.fixed_extra_s
        if p.name == "rolling_restart":
            mean = len(self.brokers) * (mean + (p.gap_s.mean_value if p.gap_s is not None else 0.0))
        return max(mean, 1e-3)

    # ------------------------------------------------------------------------------------------ sampling
    def sample(self, initial: int, rng: np.random.Generator, defensive: float | None = None) -> Episode:
        """One episode started by process `initial` on a uniformly chosen unit; `defensive` overrides the
        biasing's mixture share δ (the estimator adapts it per stratum)."""
        n_proc = len(self.rates.processes)
        c = _Cluster(self.brokers, self.rack_of, self.racks, n_proc=n_proc)
        counts = np.zeros(n_proc)
        exposure = np.zeros(n_proc)
        log_q = 0.0
        queue: list = []
        events: list[tuple[float, str, int]] = []
        seq = [0]
        p0 = self.rates.processes[initial]
        unit: object = {Unit.BROKER: lambda: self.brokers[rng.integers(len(self.brokers))],
                        Unit.RACK: lambda: self.racks[rng.integers(len(self.racks))],
                        Unit.CLUSTER: lambda: None}[p0.unit]()
        self._apply(c, initial, unit, 0.0, rng, queue, events, seq)
        t, faults, max_down, truncated = 0.0, 0, c.down(), False
        bias = self.biasing
        biased_steps = 0
        tau = self.mean_recovery_s(initial)
        scale = 0.0  # a: biased chance of a fault = a × the model's (set at the first step)
        # The episode is drawn from the model with chance δ (`defensive`), else with forcing; both densities are
        # followed along the path (log_m: the model's, log_f: forcing's; equal outside the biased steps), and the
        # sampling density is their mixture δ·m + (1 − δ)·f (balance heuristic).
        delta = bias.defensive if defensive is None else defensive
        mixing = bias.q > 0 and delta > 0
        forcing = bias.q > 0 and not (mixing and rng.random() < delta)
        log_m = log_f = 0.0
        while queue:
            while queue and queue[0][0] <= t:
                _, _, action = heapq.heappop(queue)
                self._repair(c, action, t, rng, queue, events, seq)
            if not queue:
                break
            r = queue[0][0] - t
            slots = self._slots(c)
            lam = np.array([self.per_second[i] for i, _ in slots])
            total = float(lam.sum())
            p_fault = -math.expm1(-total * r)  # the model's chance of a fault before the next repair event
            if scale == 0.0 and total > 0:
                scale = max(1.0, bias.q / -math.expm1(-total * tau))
            k = -1
            if (bias.q > 0 and p_fault > 0 and biased_steps < bias.max_biased_steps
                    and faults < bias.max_biased_faults):
                # forcing: a fault before r with chance q_s, at the model's time law conditioned on [0, r)
                biased_steps += 1
                q_s = max(p_fault, min(bias.cap, scale * p_fault))
                choice = (1.0 - bias.balance) * lam / total + bias.balance / len(slots)
                if forcing:
                    if rng.random() < q_s:
                        dt = -math.log1p(-rng.random() * p_fault) / total
                        k = int(rng.choice(len(slots), p=choice))
                    else:
                        dt = math.inf
                else:
                    dt = rng.exponential(1.0 / total)
                    if dt < r:
                        k = int(rng.choice(len(slots), p=lam / total))
                    else:
                        dt = math.inf
                if k >= 0:
                    log_m += math.log(lam[k]) - total * dt
                    log_f += (math.log(q_s) + math.log(total) - total * dt - math.log(p_fault)
                              + math.log(choice[k]))
                else:
                    log_m -= total * r
                    log_f += math.log1p(-q_s)
            else:
                dt = rng.exponential(1.0 / total) if total > 0 else math.inf
                step = min(dt, r)
                log_q -= total * step
                if dt < r and faults < bias.max_faults:
                    k = int(rng.choice(len(slots), p=lam / total))
                    log_q += math.log(lam[k])
            step = min(dt, r)
            for i, _ in slots:
                exposure[i] += step
            if dt < r and faults < bias.max_faults:
                t += dt
                proc, unit = slots[k]
                counts[proc] += 1
                faults += 1
                self._apply(c, proc, unit, t, rng, queue, events, seq)
            else:
                truncated = truncated or (dt < r)
                t += r
            max_down = max(max_down, c.down())
        if bias.q > 0:
            log_q += log_m - math.log(mixture_weight(delta if mixing else 0.0, log_f - log_m))
        events.sort(key=lambda e: e[0])
        return Episode(initial, events, counts, exposure, log_q, t, max_down, truncated, *c.recovery,
                       log_forcing_ratio=log_f - log_m, defensive=delta if mixing else 0.0)
