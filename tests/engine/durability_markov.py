"""An exact CTMC for the durability estimator's checks (SPEC-style validation, docs/guides/durability.md).

RF 3 on 3 brokers, independent disk losses at λ per broker-year, each replaced and rebuilt after an
exponential time of mean 1/μ: the number of lost replicas is a birth-death chain 0..3 (failures (3−k)λ,
repairs kμ); an acknowledged message is lost exactly when it reaches 3 (all replicas gone at once).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy.linalg import expm

from generators.model import Dist, DistKind
from generators.rates import SECONDS_PER_YEAR, load_rates

BROKERS = {0: "r0", 1: "r1", 2: "r2"}


def disk_only_rates(afr: float, repair_mean_s: float):
    base = load_rates()
    procs = []
    for p in base.processes:
        if p.name == "disk_loss":
            procs.append(dataclasses.replace(p, per_year=afr, recovery_s=Dist(DistKind.EXPONENTIAL,
                                                                              mean=repair_mean_s),
                                             fixed_extra_s=0.0))
        else:
            procs.append(dataclasses.replace(p, per_year=0.0))
    return dataclasses.replace(base, processes=tuple(procs), name="disk-only")


def generator(lam: float, mu: float) -> np.ndarray:
    q = np.zeros((4, 4))
    for k in range(4):
        if k < 3:
            q[k, k + 1] = (3 - k) * lam
        if 0 < k < 3:
            q[k, k - 1] = k * mu
        q[k, k] = -q[k].sum()
    return q


def absorption_from_one(lam: float, mu: float) -> float:
    """P(all three replicas lost before all are back | one was just lost): the episode's loss probability."""
    q = generator(lam, mu)
    # h_k = P(hit 3 before 0 from k), k = 1, 2: Q_TT h = −Q_T,3
    a = q[1:3, 1:3]
    b = -q[1:3, 3]
    return float(np.linalg.solve(a, b)[0])


def p_loss_per_year(lam: float, mu: float, years: float = 1.0) -> float:
    """P(all three lost at some point within `years` from a healthy start), exactly (expm, 3 absorbing)."""
    q = generator(lam, mu)
    q[3] = 0.0
    return float(expm(q * years)[0, 3])


REPAIR_MEAN_S = 24 * 3600.0


def afr_for(target_rate_per_year: float, repair_mean_s: float = REPAIR_MEAN_S) -> float:
    """Disk AFR at which losing episodes happen `target_rate_per_year` times a year (bisection)."""
    mu = SECONDS_PER_YEAR / repair_mean_s
    lo, hi = 1e-6, 1e3
    for _ in range(200):
        mid = (lo * hi) ** 0.5
        rate = 3 * mid * absorption_from_one(mid, mu)
        lo, hi = (mid, hi) if rate < target_rate_per_year else (lo, mid)
    return (lo * hi) ** 0.5


def chain_judge(episode, stratum: int, index: int):
    """The chain's verdict on an episode: an acknowledged message is lost exactly when all three replicas are down
    at once (what the kernels say of the same episodes: `test_replayed_verdict_equals_the_chain_absorption`)."""
    from engine.durability.judge import Verdict

    return [Verdict(episode.max_down == 3, 0.0, 0.0, 0.0)]


def chain_spec(afr: float, seed: int, repair_mean_s: float = REPAIR_MEAN_S):
    """The estimator's spec for the chain: the `demo` workload on three brokers in three racks, disk losses only,
    one policy (judged by `chain_judge`)."""
    from engine.durability.run import DurabilitySpec
    from generators.library import resolve_scenario
    from replay.policies import parse_policy
    from schemas.trace import Broker

    demo = resolve_scenario("demo")
    scenario = dataclasses.replace(demo, brokers=tuple(Broker(b, r) for b, r in BROKERS.items()))
    return DurabilitySpec(scenario, disk_only_rates(afr, repair_mean_s), (parse_policy("kafka-durable"),), seed=seed)


@dataclasses.dataclass(frozen=True)
class ChainRun:
    """One run of the estimator on the chain: its yearly rate of losing episodes (before the renewal denominator,
    which the chain's exact value does not include), its interval, and what the interval was made of."""

    exact: float
    estimate: float
    low: float
    high: float
    se: float
    skew: float
    shares: tuple[float, ...]  # the mixture shares δ the rounds used

    @property
    def covers(self) -> bool:
        return self.low <= self.exact <= self.high


def estimator_run(target: float, episodes: int, seed: int, batch: int = 250) -> ChainRun:
    """`replab durability`'s estimator (`engine.durability.run.estimate_local`: rounds, the mixture share adapted per
    stratum, `estimate.policy_figures`' interval) on the chain whose yearly loss rate is `target`."""
    from engine.durability.estimate import renewal_denominator, skewness, yearly
    from engine.durability.run import estimate_local

    afr = afr_for(target)
    est = estimate_local(chain_spec(afr, seed), episodes=episodes, batch=batch, judge=chain_judge)
    strata = est.strata()
    den = renewal_denominator(strata)
    (fig,) = est.figures()
    rate = fig["losing_episodes_per_year"]
    _, se = yearly(strata, "lost", 0)
    shares = tuple(sorted({r["defensive"] for r in est.rows}))
    return ChainRun(3 * afr * absorption_from_one(afr, SECONDS_PER_YEAR / REPAIR_MEAN_S), rate["estimate"] * den,
                    rate["low"] * den, rate["high"] * den, se, skewness(strata, "lost", 0), shares)
