"""What a sweep's per-seed results say about each policy: estimates with 95 % intervals (scipy.stats).

Per policy, over the seeds whose trace passed the gate (a seed with a fatal rule has no figures):

- `p_loss`: the share of seeds with at least one acknowledged message lost (acked_lost ≥ 1), with the
  **Wilson score** interval (`binomtest(k, n).proportion_ci(method="wilson")`: sound at 0 or n and small n);
- `p_loss_day`: the probability of any acknowledged loss in a day of cluster life. A seed is one trace of the
  scenario's duration d; taking losses as independent across consecutive d-long periods, a day is
  m = 86 400 s / d periods and P(day) = 1 − (1 − p)^m. The map is increasing, so the Wilson bounds map to
  its bounds;
- `mean_acked_lost`, `availability` (acked / produced) and `unavailable_s` (unavailable partition-seconds):
  means over seeds with the **Student t** interval (`t.interval`), clipped to the quantity's range; with no
  spread (every seed equal) the interval is that value;
- `ack_p99_ms`: the median over seeds of each seed's p99 ack latency, with a **bootstrap** interval
  (`scipy.stats.bootstrap`, BCa, 2 000 resamples, fixed random state so a re-run prints the same figures);
- cost: brokers used and copies per message (from the layout), mean replication bytes per seed.

One seed gives no interval (None): such an estimate never meets an SLO term.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

CONFIDENCE = 0.95
DAY_S = 86_400.0
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20261123


@dataclass(frozen=True)
class Interval:
    """An estimate and its two-sided confidence interval (None where it is undefined)."""

    estimate: float | None
    low: float | None
    high: float | None
    method: str

    def text(self, fmt: str = "{:.3f}") -> str:
        if self.estimate is None:
            return "–"
        if self.low is None or self.high is None:
            return fmt.format(self.estimate)
        return f"{fmt.format(self.estimate)} [{fmt.format(self.low)}, {fmt.format(self.high)}]"


def wilson_interval(successes: int, n: int, confidence: float = CONFIDENCE) -> Interval:
    """Wilson score interval of a binomial proportion."""
    from scipy.stats import binomtest

    if n <= 0:
        return Interval(None, None, None, "wilson")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, {n}], got {successes}")
    ci = binomtest(successes, n).proportion_ci(confidence_level=confidence, method="wilson")
    return Interval(successes / n, float(ci.low), float(ci.high), "wilson")


def _values(values: Sequence[float | None]) -> np.ndarray:
    return np.array([float(v) for v in values if v is not None and not math.isnan(float(v))], dtype=float)


def t_interval(values: Sequence[float | None], confidence: float = CONFIDENCE, *, lower: float | None = None,
               upper: float | None = None) -> Interval:
    """Student t interval of a mean, clipped to [lower, upper]; no interval from fewer than 2 values."""
    from scipy.stats import sem, t

    xs = _values(values)
    if not len(xs):
        return Interval(None, None, None, "t")
    mean = float(xs.mean())
    if len(xs) == 1:
        return Interval(mean, None, None, "t")
    spread = float(sem(xs))
    low, high = (mean, mean) if spread == 0 else (float(v) for v in t.interval(confidence, len(xs) - 1, loc=mean,
                                                                                scale=spread))
    if lower is not None:
        low = max(lower, low)
    if upper is not None:
        high = min(upper, high)
    return Interval(mean, low, high, "t")


def bootstrap_median(values: Sequence[float | None], confidence: float = CONFIDENCE) -> Interval:
    """The median over seeds with a BCa bootstrap interval (percentile bootstrap if BCa is degenerate)."""
    from scipy.stats import bootstrap

    xs = _values(values)
    if not len(xs):
        return Interval(None, None, None, "bootstrap")
    median = float(np.median(xs))
    if len(xs) == 1:
        return Interval(median, None, None, "bootstrap")
    if np.all(xs == xs[0]):
        return Interval(median, median, median, "bootstrap")
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = bootstrap((xs,), np.median, confidence_level=confidence, n_resamples=BOOTSTRAP_RESAMPLES,
                            method=method, random_state=np.random.default_rng(BOOTSTRAP_SEED))
        low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if math.isfinite(low) and math.isfinite(high):
            return Interval(median, low, high, "bootstrap")
    return Interval(median, None, None, "bootstrap")


def per_day(p: Interval, duration_s: float) -> Interval:
    """P(any loss in a day) from P(any loss in one trace of `duration_s`), bounds mapped the same way."""
    periods = DAY_S / duration_s

    def f(x: float | None) -> float | None:
        return None if x is None else 1.0 - (1.0 - x) ** periods

    return Interval(f(p.estimate), f(p.low), f(p.high), "wilson, per day")


# ------------------------------------------------------------------------------------------------ per policy
#: The SLO metrics (name -> what it is), in the order tables show them.
METRICS: dict[str, str] = {
    "p_loss": "P(acked loss >= 1) per trace; 95% Wilson interval",
    "p_loss_day": "P(acked loss >= 1) per day of cluster life (independent trace-long periods)",
    "mean_acked_lost": "mean acked_lost per trace; 95% t interval, clipped at 0",
    "availability": "mean acked/produced per trace; 95% t interval, clipped to [0, 1]",
    "ack_p99_ms": "median over seeds of the p99 ack latency (ms); 95% bootstrap (BCa) interval",
    "unavailable_s": "mean unavailable partition-seconds per trace; 95% t interval, clipped at 0",
}


@dataclass
class PolicyEstimate:
    """One policy's estimates over a sweep's seeds, and its cost."""

    policy: str  # canonical
    label: str  # as typed (a preset name reads better)
    seeds: int  # seeds with figures (passed the gate)
    fatal_seeds: int
    seeds_with_loss: int
    duration_s: float
    estimates: dict[str, Interval]
    brokers_used: int | None
    replicas_per_message: float | None
    replication_bytes: float | None  # mean per seed

    @property
    def cost(self) -> tuple[float, float, float]:
        """Cheapest first: fewer brokers, then fewer copies per message, then fewer replication bytes."""
        def v(x: float | None) -> float:
            return math.inf if x is None else float(x)

        return v(self.brokers_used), v(self.replicas_per_message), v(self.replication_bytes)

    def row(self) -> dict[str, Any]:
        row: dict[str, Any] = {"policy": self.policy, "label": self.label, "seeds": self.seeds,
                               "fatal_seeds": self.fatal_seeds, "seeds_with_loss": self.seeds_with_loss}
        for name, iv in self.estimates.items():
            row[name], row[f"{name}_low"], row[f"{name}_high"] = iv.estimate, iv.low, iv.high
        row.update(brokers_used=self.brokers_used, replicas_per_message=self.replicas_per_message,
                   replication_bytes=self.replication_bytes)
        return row


def estimate(policy: str, label: str, rows: Sequence[dict[str, Any]], duration_s: float) -> PolicyEstimate:
    """`rows`: the policy's sweep_results rows (one per seed)."""
    ok = [r for r in rows if r["status"] == "ok"]
    lost = sum(1 for r in ok if (r["acked_lost"] or 0) >= 1)
    p = wilson_interval(lost, len(ok))
    estimates = {
        "p_loss": p,
        "p_loss_day": per_day(p, duration_s),
        "mean_acked_lost": t_interval([r["acked_lost"] for r in ok], lower=0.0),
        "availability": t_interval([r["availability"] for r in ok], lower=0.0, upper=1.0),
        "ack_p99_ms": bootstrap_median([r["ack_latency_p99_ms"] for r in ok]),
        "unavailable_s": t_interval([r["unavailable_partition_seconds"] for r in ok], lower=0.0),
    }
    first = ok[0] if ok else {}
    repl = _values([r["replication_bytes"] for r in ok])
    return PolicyEstimate(policy, label, len(ok), len(rows) - len(ok), lost, duration_s, estimates,
                          first.get("brokers_used"), first.get("replicas_per_message"),
                          float(repl.mean()) if len(repl) else None)
