"""From weighted episode verdicts to yearly figures with 95 % intervals (pure numpy).

Episodes are sampled **stratified by their initial process** k: the rate Λ_k at which process k starts an
episode is known exactly from the model, so only the inside of an episode is estimated, and rare but
dangerous initial faults (a whole-cluster power loss) get their own share of episodes instead of the share
their rate would give them. Within stratum k, with weights w_i (the likelihood ratios) and a verdict y_i,
the estimate of E[y | k] is the mean of w_i·y_i, its variance the sample variance over n_k.

By renewal reward (healthy stretches are exponential with total rate Λ, episodes last E[len]), a quantity y
accrues per year at Σ_k Λ_k E[y | k] / (1 + Λ·E[len]). P(≥ 1 acknowledged message lost in a year) is
1 − exp(−R) for the yearly rate R of losing episodes (their count in a year is nearly Poisson: an episode is
minutes to days long). Intervals: R ± 1.96·SE widened on the side the skewness points to (`interval`; the yearly
denominator's own error is much smaller and left out), mapped through 1 − exp(−·).

When no sampled episode of a policy lost anything, the estimate would be 0; the page shows a proven upper
bound instead, the **weighted zero-failure bound**: within stratum k, E_p[L] = E_q[W·L] ≤ w_max·Q(L), where
w_max bounds every likelihood ratio (`run.Estimate.max_weight`: 1/δ for the smallest mixture share used) and
Q(L), the chance that a sampled episode loses, is at most 1 − (α/K)^(1/n_k) with confidence 1 − α/K after n_k
loss-free episodes (Clopper-Pearson); a union bound over the K strata keeps the whole at 1 − α.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

Z95 = 1.959963984540054
SECONDS_PER_MINUTE = 60.0


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float

    def to_json(self) -> dict[str, float]:
        return {"estimate": self.estimate, "low": self.low, "high": self.high}


@dataclass
class Stratum:
    """The episodes of one initial process: weights, lengths and each policy's verdicts."""

    per_year: float  # Λ_k
    weights: np.ndarray  # (n,)
    length_s: np.ndarray  # (n,)
    lost: np.ndarray  # (n, policies) bool: ≥ 1 acknowledged message lost
    acked_lost: np.ndarray  # (n, policies) messages, at the real rate
    unavailable_s: np.ndarray  # (n, policies) unavailable seconds of the average partition
    failed_committed: np.ndarray  # (n, policies) messages, at the real rate

    @property
    def n(self) -> int:
        return len(self.weights)


def _mean_var(w: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    n = len(w)
    if n == 0:
        return 0.0, 0.0
    z = w * y
    return float(z.mean()), float(z.var(ddof=1) / n) if n > 1 else 0.0


def renewal_denominator(strata: list[Stratum]) -> float:
    """1 + Λ·E[episode length], Λ and lengths in the same time unit (year)."""
    out = 1.0
    for s in strata:
        m, _ = _mean_var(s.weights, s.length_s)
        out += s.per_year * m / (365.25 * 24 * 3600)
    return out


def stratum_moments(s: Stratum, column: str, policy: int) -> tuple[float, float]:
    """(mean of w·y, variance of that mean) of a verdict column for one policy in one stratum.

    For the loss indicator, a stratum whose episodes all lost with the same weight (every whole-cluster power
    loss loses a policy without fsync, and nothing can strike inside it, so every weight is 1) has a sample
    variance of 0 and would claim no error; it gets w̄²·p̃(1 − p̃)/n instead, p̃ = (x + 2)/(n + 4)
    (Agresti-Coull's, x = n losing episodes, w̄ the mean weight). A stratum where the policy lost nothing adds
    nothing to its estimate nor to its variance, as in any importance-sampling estimate: a floor there would
    assume an unseen loss carries the mean weight w̄, where the losses the sampler makes rare carry weights
    orders of magnitude smaller, and it would bury every rarely-losing policy's interval under the most
    frequent strata's Λ_k/n_k. When a policy lost nothing anywhere, the weighted zero-failure bound applies.
    """
    y = getattr(s, column)[:, policy].astype(np.float64)
    m, v = _mean_var(s.weights, y)
    if column == "lost" and v == 0 and s.n and m > 0:
        x = float(y.sum())
        pt = (x + 2) / (s.n + 4)
        v = float(s.weights.mean()) ** 2 * pt * (1 - pt) / s.n
    return m, v


def yearly(strata: list[Stratum], column: str, policy: int) -> tuple[float, float]:
    """(rate per year, its standard error) of a verdict column for one policy (`stratum_moments` per stratum)."""
    a, var = 0.0, 0.0
    for s in strata:
        if s.n == 0 or s.per_year == 0:
            continue
        m, v = stratum_moments(s, column, policy)
        a += s.per_year * m
        var += s.per_year**2 * v
    return a, math.sqrt(var)


def skewness(strata: list[Stratum], column: str, policy: int) -> float:
    """Skewness of the stratified estimator Σ Λ_k·mean_k(w·y): its third cumulant Σ Λ_k³·μ3_k / n_k² over the
    cube of its standard error."""
    k3, var = 0.0, 0.0
    for s in strata:
        if s.n < 3 or s.per_year == 0:
            continue
        z = s.weights * getattr(s, column)[:, policy].astype(np.float64)
        d = z - z.mean()
        k3 += s.per_year**3 * float((d**3).mean()) / s.n**2
        var += s.per_year**2 * float(z.var(ddof=1)) / s.n
    return k3 / var**1.5 if var > 0 else 0.0


def interval(a: float, se: float, skew: float = 0.0, denominator: float = 1.0) -> Interval:
    """95 % interval for a mean of importance-sampling terms: the normal interval a ± z·se, widened on the side
    the skewness points to by Johnson's correction of the t interval (J. Amer. Statist. Assoc. 73, 1978; Hall,
    Ann. Statist. 20, 1992, gives its Edgeworth basis), g = skew·(2z² + 1)/6: [a − se·(z + max(−g, 0)),
    a + se·(z + max(g, 0))], the union of the two intervals.

    Johnson's interval itself shifts both ends by g·se: it widens the upper end, which protects the many samples
    that drew none of the few heavy episodes (their mean and spread both fall short), but it also raises the lower
    end, and the sample skewness is largest exactly in the samples where a heavy episode was drawn and pushed the
    mean above the true value: there the lower end rose to the estimate and the true value fell below it (in the
    Markov check at 1e-3, 1.7 misses below for each one above). The union keeps the widening and drops the
    narrowing; it covers whenever either interval does."""
    g = skew * (2 * Z95**2 + 1) / 6
    low = a - se * (Z95 + max(-g, 0.0))
    high = a + se * (Z95 + max(g, 0.0))
    return Interval(a / denominator, max(0.0, low) / denominator, high / denominator)


def _interval(a: float, se: float, denominator: float) -> Interval:
    return interval(a, se, 0.0, denominator)


def zero_failure_bound(strata: list[Stratum], max_weight: float, alpha: float = 0.05) -> float:
    """Upper bound (confidence 1 − alpha) on the yearly rate of losing episodes when none was sampled."""
    live = [s for s in strata if s.per_year > 0]
    if any(s.n == 0 for s in live):
        return math.inf
    k = len(live)
    return sum(s.per_year * min(1.0, max_weight * (1 - (alpha / k) ** (1 / s.n))) for s in live)


def _p_of_rate(r: float) -> float:
    return -math.expm1(-r)


def _nines(p: float) -> float:
    return math.inf if p <= 0 else -math.log10(p)


def policy_figures(strata: list[Stratum], policy: int, max_weight: float) -> dict:
    """Every yearly figure of one policy (the keys of durability_estimates' metrics)."""
    den = renewal_denominator(strata)
    a, se = yearly(strata, "lost", policy)
    contributions = np.concatenate([s.per_year * s.weights * s.lost[:, policy] / s.n for s in strata if s.n])
    total = float(contributions.sum())
    out: dict = {}
    if total > 0:
        rate = interval(a, se, skewness(strata, "lost", policy), den)
        method = "importance sampling, 95 % interval widened on the side of its skewness"
        ess = total**2 / float((contributions**2).sum())
        share = float(contributions.max()) / total
    else:
        bound = zero_failure_bound(strata, max_weight) / den
        rate = Interval(0.0, 0.0, bound)
        method = "no sampled episode lost a message: weighted zero-failure bound (upper end only)"
        ess, share = 0.0, 0.0
    p = Interval(_p_of_rate(rate.estimate), _p_of_rate(rate.low), _p_of_rate(rate.high))
    out["p_loss_per_year"] = p.to_json()
    out["nines"] = {"estimate": _nines(p.estimate) if total > 0 else None, "low": _nines(p.high),
                    "high": _nines(p.low)}
    out["losing_episodes_per_year"] = rate.to_json()
    out["bounded"] = total == 0
    out["method"] = method
    out["loss_ess"] = ess
    out["loss_largest_weight_share"] = share
    out["losing_episodes_sampled"] = int(sum(int(s.lost[:, policy].sum()) for s in strata))
    for column, key, scale in (("acked_lost", "acked_lost_per_year", 1.0),
                               ("unavailable_s", "unavailable_min_per_year", 1 / SECONDS_PER_MINUTE),
                               ("failed_committed", "failed_committed_per_year", 1.0)):
        a_c, se_c = yearly(strata, column, policy)
        iv = _interval(a_c * scale, se_c * scale, den)
        out[key] = iv.to_json()
    rel = (rate.high - rate.low) / 2 / rate.estimate if rate.estimate > 0 else math.inf
    out["relative_half_width"] = rel
    return out


def weight_diagnostics(strata: list[Stratum]) -> dict:
    w = np.concatenate([s.weights for s in strata if s.n]) if strata else np.zeros(0)
    if not len(w):
        return {"episodes": 0, "weight_ess": 0.0, "mean_weight": None}
    return {"episodes": len(w), "weight_ess": float(w.sum() ** 2 / (w**2).sum()),
            "mean_weight": float(w.mean()), "max_weight": float(w.max())}
