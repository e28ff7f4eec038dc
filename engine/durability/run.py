"""The estimator's driver without Spark: episodes in rounds, allocation, yearly figures, sensitivity.

`episode_rows` is what one Spark task runs for a batch of episode numbers (`engine.durability.job`); here the
same function runs in-process, so the estimator is testable without a cluster. Episode (stratum k, number i)
draws from its own random stream (seed, k, i), so a result does not depend on how episodes were batched.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.durability.episodes import (
    Biasing,
    Episode,
    EpisodeSampler,
    initial_rates_per_year,
    mixture_weight,
    recovery_log_ratio,
)
from engine.durability.estimate import Stratum, policy_figures, stratum_moments, weight_diagnostics
from engine.durability.judge import TraceShape, Verdict, base_scenario, judge_episode
from generators.model import Dist, DistKind, Scenario
from generators.rates import Rates
from replay.policies import Policy

#: Episodes every stratum gets before the estimate may stop on its relative error.
MIN_PER_STRATUM = 8
#: The mixture shares δ a stratum may adapt to: at least 10 % forced episodes (a rare loss mechanism stays in
#: sight) and 10 % drawn from the model (every weight at most 10).
DEFENSIVE_GRID = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
#: The share every stratum starts with, until it has MIN_PER_STRATUM episodes.
DEFENSIVE_START = 0.3
#: Share of all episodes the allocation spreads evenly over the strata whatever their spread (`Estimate.allocation`).
FLOOR_SHARE = 0.1


@dataclass(frozen=True)
class DurabilitySpec:
    """Everything a task needs (small; shipped in the function's closure)."""

    scenario: Scenario
    rates: Rates
    policies: tuple[Policy, ...]
    biasing: Biasing = Biasing(defensive=DEFENSIVE_START)
    shape: TraceShape = TraceShape()
    seed: int = 0

    def sampler(self) -> EpisodeSampler:
        return EpisodeSampler(self.rates, {b.id: b.rack for b in self.scenario.brokers}, self.biasing)

    def per_year(self) -> np.ndarray:
        return initial_rates_per_year(self.rates, len(self.scenario.brokers), len(self.scenario.racks))


Judge = Callable[[Episode, int, int], list[Verdict]]


def kernel_judge(spec: DurabilitySpec) -> Judge:
    base = base_scenario(spec.scenario)

    def judge(episode: Episode, stratum: int, index: int) -> list[Verdict]:
        seed = (spec.seed * 1_000_003 + stratum * 10_000_019 + index) % (2**63)
        return judge_episode(base, episode, spec.policies, spec.shape, stratum * 10_000_000 + index, seed,
                             spec.scenario.workload.rate_per_s)

    return judge


def episode_rows(spec: DurabilitySpec, work: Iterable[tuple[int, int] | tuple[int, int, float]],
                 judge: Judge | None = None) -> list[dict[str, Any]]:
    """Sample and judge episodes (stratum, index[, mixture share δ]): one row per episode, every policy's
    verdict in lists."""
    sampler = spec.sampler()
    judge = judge or kernel_judge(spec)
    rows = []
    for k, i, *delta in work:
        started = time.process_time()
        ep = sampler.sample(k, np.random.default_rng([spec.seed, k, i]), delta[0] if delta else None)
        verdicts = judge(ep, k, i)
        rows.append({
            "stratum": k, "episode": i, "log_q": ep.log_q, "log_forcing_ratio": ep.log_forcing_ratio,
            "defensive": ep.defensive, "counts": ep.counts.tolist(),
            "exposure_s": ep.exposure_s.tolist(), "length_s": ep.length_s, "faults": len(ep.events),
            "max_down": ep.max_down, "truncated": ep.truncated, "recovery_n": ep.recovery_n.tolist(),
            "recovery_sum": ep.recovery_sum.tolist(), "recovery_log_sum": ep.recovery_log_sum.tolist(),
            "lost": [v.lost for v in verdicts], "acked_lost": [v.acked_lost for v in verdicts],
            "unavailable_s": [v.unavailable_s for v in verdicts],
            "failed_committed": [v.failed_committed for v in verdicts],
            "cpu_seconds": time.process_time() - started,
        })
    return rows


def strata_of(rows: Sequence[dict[str, Any]], n_strata: int, per_year: np.ndarray, per_second: np.ndarray,
              n_policies: int, recovery: Callable[[dict[str, Any]], float] | None = None) -> list[Stratum]:
    """Group episode rows by stratum, weighting each to the rates `per_second` (the model's or another's) and,
    with `recovery`, to other recovery times (the row's log density ratio of its recovery draws)."""
    out = []
    for k in range(n_strata):
        rs = [r for r in rows if r["stratum"] == k]
        log_w = _log_p(rs, per_second) - np.array([r["log_q"] for r in rs], dtype=np.float64)
        if recovery:
            log_w += np.array([recovery(r) for r in rs], dtype=np.float64)
        w = np.exp(log_w)

        def col(name: str, rs: list = rs) -> np.ndarray:
            return np.array([r[name] for r in rs], dtype=np.float64).reshape(len(rs), n_policies)

        out.append(Stratum(float(per_year[k]), w, np.array([r["length_s"] for r in rs], dtype=np.float64),
                           col("lost") > 0, col("acked_lost"), col("unavailable_s"), col("failed_committed")))
    return out


def _log_p(rows: Sequence[dict[str, Any]], per_second: np.ndarray) -> np.ndarray:
    """Each row's log density of its inside-episode faults under the rates `per_second` (−inf where a process
    with rate 0 struck)."""
    if not rows:
        return np.zeros(0)
    counts = np.array([r["counts"] for r in rows], dtype=np.float64)
    exposure = np.array([r["exposure_s"] for r in rows], dtype=np.float64)
    with np.errstate(divide="ignore"):
        logs = np.where(counts > 0, np.log(np.where(per_second > 0, per_second, 1.0)), 0.0)
    out = np.sum(counts * logs - per_second * exposure, axis=1)
    return np.where(np.any((counts > 0) & (per_second <= 0), axis=1), -np.inf, out)


@dataclass
class Estimate:
    spec: DurabilitySpec
    rows: list[dict[str, Any]] = field(default_factory=list)

    def strata(self, rates: Rates | None = None, recovery: dict[str, float] | None = None) -> list[Stratum]:
        """The episodes weighted to `rates` (default the model's) with some processes' recovery times × a
        factor (`recovery`: name → factor; clip bounds kept, `episodes.recovery_log_ratio`)."""
        rates = rates or self.spec.rates
        brokers, racks = len(self.spec.scenario.brokers), len(self.spec.scenario.racks)
        per_second = np.array([p.per_second for p in rates.processes])
        ratio = None
        if recovery and any(f != 1.0 for f in recovery.values()):
            index = {p.name: i for i, p in enumerate(rates.processes)}
            dists = {index[name]: (rates.processes[index[name]].recovery_s, f) for name, f in recovery.items()}

            def ratio(row: dict[str, Any]) -> float:
                return sum(recovery_log_ratio(d, f, row["recovery_n"][i], row["recovery_sum"][i],
                                              row["recovery_log_sum"][i]) for i, (d, f) in dists.items())
        return strata_of(self.rows, len(rates.processes), initial_rates_per_year(rates, brokers, racks), per_second,
                         len(self.spec.policies), ratio)

    def figures(self, rates: Rates | None = None, recovery: dict[str, float] | None = None) -> list[dict[str, Any]]:
        strata = self.strata(rates, recovery)
        return [policy_figures(strata, j, self.max_weight()) for j in range(len(self.spec.policies))]

    def max_weight(self) -> float:
        """The largest likelihood ratio any episode's sampling law allows (the mixture shares used so far)."""
        shares = {r.get("defensive", self.spec.biasing.defensive) for r in self.rows} or {self.spec.biasing.defensive}
        return max(dataclasses.replace(self.spec.biasing, defensive=d).max_weight for d in shares)

    def defensive_shares(self) -> list[float]:
        """The mixture share δ_k of each stratum's next episodes (He & Owen, "Optimal mixture weights in multiple
        importance sampling", 2014): the share in DEFENSIVE_GRID that minimises the policies' relative
        variances Σ_j ρ_j·Var_δ(w·L)/R_j² (ρ_j and R_j as in `allocation`). The second moment a share δ' would
        give is estimated from the episodes already drawn, whatever their own share δ_i:
        E_δ'[w_δ'²·L] = E_δi[w_δ'·w_δi·L], with w_δ' = 1 / (δ' + (1 − δ')·f/m) from each episode's log(f/m).
        Each round's share depends only on earlier rounds, so every episode stays unbiased given it."""
        strata = self.strata()
        default = self.spec.biasing.defensive
        if self.spec.biasing.q <= 0 or any(s.per_year > 0 and s.n < MIN_PER_STRATUM for s in strata):
            return [default] * len(strata)
        rate, rho, _ = self._relative_weights(strata)
        live = np.flatnonzero(rate > 0)
        if not len(live):
            return [default] * len(strata)
        out = []
        for k, s in enumerate(strata):
            rs = [r for r in self.rows if r["stratum"] == k]
            if s.per_year <= 0 or not rs:
                out.append(default)
                continue
            ratio = np.array([r.get("log_forcing_ratio", 0.0) for r in rs])
            if not ratio.any():  # nothing was ever biased here (a whole-cluster power loss): keep the default
                out.append(default)
                continue
            z = s.weights[:, None] * s.lost[:, live]  # (n, live policies)
            best, best_cost = default, math.inf
            for d in DEFENSIVE_GRID:
                w_d = mixture_weight(d, ratio)
                second = (w_d[:, None] * s.weights[:, None] * s.lost[:, live]).mean(axis=0)
                cost = float((rho[live] * (second - z.mean(axis=0) ** 2) / rate[live] ** 2).sum())
                if cost < best_cost:
                    best, best_cost = d, cost
            out.append(best)
        return out

    def allocation(self, batch: int) -> list[int]:
        """Episodes per stratum for the next round (strata with Λ_k = 0 get none).

        Until every stratum has MIN_PER_STRATUM episodes, the short ones share the round. Then the round goes where
        it lowers the **worst** policy's relative variance most. Policy j's estimate of its yearly loss rate R_j has
        relative variance V_j = Σ_k A_kj / n_k with A_kj = Λ_k²·s_kj² / R_j² (s_kj: the spread of w·L among stratum
        k's episodes, `stratum_moments`). The run stops when max_j V_j reaches the target, so the episodes after
        this round, n_k + m_k (Σ m_k = batch, m_k ≥ 0), minimise max_j V_j: the allocation for several variables at
        once (Cochran, Sampling Techniques, §5A.3; Chromy's algorithm, "Design optimization with multiple
        objectives", 1987), solved as Neyman allocation (n_k ∝ Λ_k·(Σ_j u_j·s_kj²/R_j²)^½, Cochran §5.5) on policy
        weights u_j that are raised where V_j is largest until the binding policies' variances are level
        (`minimax_allocation`). A weighted sum instead (u_j fixed, for instance the current V_j) still spends much
        of each round on policies that are not the worst, and a fixed share of the round per stratum even more.
        Every live stratum keeps at least MIN_PER_STRATUM episodes plus FLOOR_SHARE of all episodes spread evenly:
        a stratum where no policy has lost yet shows no spread and would otherwise never get another episode, so
        a loss mechanism it holds but has not shown could stay unseen. The allocation depends on the episodes alone,
        not on their CPU time, so a seed gives the same episodes on any machine.
        """
        strata = self.strata()
        if any(s.per_year > 0 and s.n < MIN_PER_STRATUM for s in strata):
            short = [s.per_year > 0 and s.n < MIN_PER_STRATUM for s in strata]
            return [math.ceil(batch / sum(short)) if x else 0 for x in short]
        per_year = np.array([s.per_year for s in strata])
        live = per_year > 0
        n = np.array([s.n for s in strata], dtype=np.float64)
        rate, _, spread2 = self._relative_weights(strata)
        lost = rate > 0
        coeff = per_year[:, None] ** 2 * spread2[:, lost] / rate[lost] ** 2  # A_kj, (K, live policies)
        floor = np.where(live, MIN_PER_STRATUM + FLOOR_SHARE * (n[live].sum() + batch) / live.sum(), 0.0)
        target = minimax_allocation(coeff, n, batch, floor, live)
        return _whole(np.maximum(target - n, 0.0), batch)

    def _relative_weights(self, strata: list[Stratum]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per policy: the yearly loss rate R_j and its current relative variance ρ_j (0 where R_j = 0); per stratum
        and policy, the spread² s_kj² of w·L (`stratum_moments`)."""
        n_pol = len(self.spec.policies)
        moments = [[stratum_moments(s, "lost", j) if s.per_year > 0 else (0.0, 0.0) for j in range(n_pol)]
                   for s in strata]
        rate = np.array([sum(s.per_year * moments[k][j][0] for k, s in enumerate(strata)) for j in range(n_pol)])
        spread2 = np.array([[s.n * v for _, v in row] for s, row in zip(strata, moments, strict=True)])  # (K, J)
        per_year = np.array([s.per_year for s in strata])
        n = np.array([max(s.n, 1) for s in strata])
        safe = np.where(rate > 0, rate, 1.0)
        rho = np.where(rate > 0, (per_year[:, None] ** 2 * spread2 / n[:, None]).sum(axis=0) / safe**2, 0.0)
        return rate, rho, spread2

    def relative_error(self) -> float:
        """The worst relative half-width of P(loss) over policies that lost something (inf if none did, or while a
        stratum has fewer than MIN_PER_STRATUM episodes)."""
        if any(s.per_year > 0 and s.n < MIN_PER_STRATUM for s in self.strata()):
            return math.inf
        rel = [f["relative_half_width"] for f in self.figures() if not f["bounded"]]
        return max(rel) if rel else math.inf

    def summary(self) -> dict[str, Any]:
        strata = self.strata()
        cpu = sum(r["cpu_seconds"] for r in self.rows)
        return {**weight_diagnostics(strata), "episodes_per_stratum": {p.name: s.n for p, s in
                                                                     zip(self.spec.rates.processes, strata,
                                                                         strict=True)},
                "mixture_share_per_stratum": {p.name: d for p, d in zip(self.spec.rates.processes,
                                                                         self.defensive_shares(), strict=True)},
                "cpu_seconds": cpu, "episodes_per_cpu_second": len(self.rows) / cpu if cpu else None,
                "truncated": int(sum(r["truncated"] for r in self.rows))}


def minimax_allocation(coeff: np.ndarray, n: np.ndarray, batch: int, floor: np.ndarray, live: np.ndarray,
                       iterations: int = 200) -> np.ndarray:
    """Episodes per stratum after a round of `batch` more, n'_k ≥ max(n_k, floor_k), Σ n' = Σ n + batch, that
    minimise max_j Σ_k coeff_kj / n'_k (`Estimate.allocation`), over the `live` strata.

    For policy weights u on the simplex, the minimiser of Σ_j u_j·Σ_k coeff_kj / n'_k is Neyman's
    n'_k = max(lower_k, t·(Σ_j u_j·coeff_kj)^½) with t set by the total (water filling); the minimax allocation is
    that of the weights where every policy with u_j > 0 has the largest variance (Lagrange duality). The weights are
    found by multiplicative updates, u_j ∝ u_j·V_j (as Chromy's algorithm updates its constraints' multipliers),
    keeping the best allocation seen: deterministic,
    and a few hundred steps on a strata × policies matrix take milliseconds."""
    lower = np.where(live, np.maximum(n, floor), 0.0)
    total = float(n[live].sum()) + batch
    if lower.sum() >= total:  # the floors take the round: fill the strata furthest below theirs
        need = np.maximum(lower - n, 0.0)
        return n + need * (batch / need.sum()) if need.sum() > 0 else n
    if live.sum() == 1 or coeff.size == 0 or not np.any(coeff[live] > 0):
        return lower + (total - lower.sum()) * live / live.sum()
    u = np.full(coeff.shape[1], 1.0 / coeff.shape[1])
    best, best_worst = lower, math.inf
    for _ in range(iterations):
        need = np.where(live, np.sqrt(coeff @ u), 0.0)
        alloc = _water_fill(need, lower, total)
        with np.errstate(divide="ignore", invalid="ignore"):
            v = np.where(alloc[:, None] > 0, coeff / np.where(alloc > 0, alloc, 1.0)[:, None], 0.0).sum(axis=0)
        worst = float(v.max())
        if worst < best_worst * (1 - 1e-12):
            best, best_worst = alloc, worst
        u = u * v / worst
        u = u / u.sum()
    return best


def _water_fill(need: np.ndarray, lower: np.ndarray, total: float) -> np.ndarray:
    """max(lower_k, t·need_k) summing to `total` (≥ Σ lower): t from the strata above their lower bound, which
    shrink until none of them would fall below it."""
    active = need > 0
    if not active.any():
        return lower
    while True:
        t = (total - float(lower[~active].sum())) / float(need[active].sum())
        below = active & (t * need < lower)
        if not below.any():
            return np.where(active, t * need, lower)
        active &= ~below


def _whole(extra: np.ndarray, batch: int) -> list[int]:
    """Whole episodes per stratum summing to `batch`, in proportion to `extra` (largest remainders)."""
    if extra.sum() <= 0:
        return [0] * len(extra)
    x = extra * (batch / extra.sum())
    out = np.floor(x).astype(int)
    for k in np.argsort(-(x - out), kind="stable")[: batch - int(out.sum())]:
        out[k] += 1
    return out.tolist()


def next_work(est: Estimate, batch: int) -> list[tuple[int, int, float]]:
    """The (stratum, index, mixture share δ) of the next round's episodes."""
    done = {k: 0 for k in range(len(est.spec.rates.processes))}
    for r in est.rows:
        done[r["stratum"]] = max(done[r["stratum"]], r["episode"] + 1)
    shares = est.defensive_shares()
    return [(k, done[k] + i, shares[k]) for k, n in enumerate(est.allocation(batch)) for i in range(n)]


#: Rate multipliers the sensitivity tables re-weight to (per process; disk AFR spans 0.5 %-13 % as drive stats do).
SENSITIVITY = {
    "disk_loss": (0.3, 1.0, 3.0, 8.3),
    "crash": (0.25, 1.0, 4.0),
    "power_loss": (0.25, 1.0, 4.0),
    "rack_power_loss": (0.25, 1.0, 4.0),
    "cluster_power_loss": (0.1, 1.0, 4.0),
    "isolate": (0.25, 1.0, 4.0),
}


#: Broker restart times (after a process crash and after a host power loss) × these, together.
RESTART_SENSITIVITY = (0.5, 1.0, 2.0, 4.0)
RESTART_PROCESSES = ("crash", "power_loss")
#: The `process` of the restart-time rows of the sensitivity table.
RESTART_TIME = "restart_time"


def sensitivity(est: Estimate) -> list[dict[str, Any]]:
    """P(loss per year) and nines per policy with one process's rate, or the brokers' restart times, multiplied,
    by re-weighting (no new episodes; the effective sample size says how far the re-weighting can be trusted).
    `x` is what the row's curve is drawn against: the process's rate per unit-year, or the mean restart time
    after a crash in seconds (clip bounds kept, so not exactly factor × the model's mean)."""
    out = []

    def rows(process: str, f: float, x: float, x_label: str, figures: list[dict[str, Any]]) -> None:
        for policy, fig in zip(est.spec.policies, figures, strict=True):
            out.append({"process": process, "factor": f, "x": x, "x_label": x_label,
                        **({"per_year": x} if process != RESTART_TIME else {}), "policy": policy.canonical(),
                        "p_loss_per_year": fig["p_loss_per_year"], "nines": fig["nines"],
                        "loss_ess": fig["loss_ess"], "bounded": fig["bounded"]})

    for name, factors in SENSITIVITY.items():
        base = est.spec.rates[name].per_year
        for f in factors:
            rows(name, f, base * f, f"{name} per unit per year", est.figures(est.spec.rates.scaled(rate={name: f})))
    names = [n for n in RESTART_PROCESSES if n in est.spec.rates.names]
    if names:
        crash = est.spec.rates[names[0]].recovery_s
        for f in RESTART_SENSITIVITY:
            rows(RESTART_TIME, f, _clipped_mean(crash, f), f"mean broker restart time after a {names[0]}, s",
                 est.figures(recovery={n: f for n in names}))
    return out


def _clipped_mean(d: Dist, factor: float, n: int = 20_000) -> float:
    """Mean of d's law with its scale × factor and the same clip bounds (midpoint quadrature over quantiles)."""
    from scipy import stats

    u = (np.arange(n) + 0.5) / n
    if d.kind is DistKind.LOGNORMAL:
        x = d.median * factor * np.exp(d.sigma * stats.norm.ppf(u))
    elif d.kind is DistKind.EXPONENTIAL:
        x = -d.mean * factor * np.log1p(-u)
    else:
        return d.mean_value * factor
    return float(np.clip(x, d.min if d.min is not None else -np.inf, d.max if d.max is not None else np.inf).mean())


def estimate_local(spec: DurabilitySpec, *, episodes: int, batch: int = 32, target_rel_error: float | None = None,
                   judge: Judge | None = None) -> Estimate:
    """Rounds of `batch` episodes in-process until `episodes` or the target relative error."""
    est = Estimate(spec)
    while len(est.rows) < episodes:
        work = next_work(est, min(batch, episodes - len(est.rows)))
        est.rows.extend(episode_rows(spec, work, judge))
        if target_rel_error is not None and est.relative_error() <= target_rel_error:
            break
    return est
