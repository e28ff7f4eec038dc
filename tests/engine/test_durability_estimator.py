"""The durability estimator against exact answers: a CTMC, plain Monte Carlo, and its own sampling measure."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.durability.episodes import Biasing, EpisodeSampler
from engine.durability.estimate import Z95, Stratum, policy_figures, yearly
from generators.rates import SECONDS_PER_YEAR
from tests.engine.durability_markov import (
    BROKERS,
    REPAIR_MEAN_S,
    absorption_from_one,
    afr_for,
    disk_only_rates,
    estimator_run,
    p_loss_per_year,
)

AFR = 0.02  # the chain at 1e-3 .. 1e-9 uses afr_for(target) instead


def _stratum(sampler: EpisodeSampler, n: int, rng: np.random.Generator, per_second=None) -> Stratum:
    disk = sampler.index["disk_loss"]
    eps = [sampler.sample(disk, rng) for _ in range(n)]
    rates = sampler.per_second if per_second is None else per_second
    w = np.array([e.weight(rates) for e in eps])
    lost = np.array([[e.max_down == 3] for e in eps])
    zeros = np.zeros((n, 1))
    return Stratum(3 * sampler.rates["disk_loss"].per_year, w, np.array([e.length_s for e in eps]), lost, zeros,
                   zeros, zeros)


def _coverage(target: float, reps: int, n: int, seed: int) -> tuple[float, float]:
    """Share of `reps` runs of the estimator `replab durability` runs (`estimator_run`: rounds, the mixture share
    adapted per stratum, its interval) whose 95 % interval covers the chain's exact value, and the mean estimate's
    relative bias."""
    runs = [estimator_run(target, n, seed * 100_000 + rep) for rep in range(reps)]
    exact = runs[0].exact
    return sum(r.covers for r in runs) / reps, float(np.mean([r.estimate for r in runs])) / exact - 1


def test_markov_chain_solution_is_consistent():
    """The absorption probability and the yearly expm agree (P ≈ 3λ·h₁ for rare losses)."""
    for target in (1e-3, 1e-9):
        afr = afr_for(target)
        mu = SECONDS_PER_YEAR / REPAIR_MEAN_S
        rate = 3 * afr * absorption_from_one(afr, mu)
        assert rate == pytest.approx(target, rel=1e-6)
        assert p_loss_per_year(afr, mu) == pytest.approx(-math.expm1(-rate), rel=5e-2)


@pytest.mark.parametrize("target", [1e-3, 1e-5, 1e-7, 1e-9])
def test_interval_covers_the_exact_markov_value(target):
    """Short version: 25 runs of 1000 episodes; coverage ≥ 80 % and the mean within 10 % (the slow test asks ≥ 93 %
    of 200 runs of 4000 episodes)."""
    coverage, bias = _coverage(target, reps=25, n=1000, seed=int(-math.log10(target)))
    assert coverage >= 0.80, coverage
    assert abs(bias) < 0.10, bias


@pytest.mark.slow
@pytest.mark.parametrize("target", [1e-3, 1e-5, 1e-7, 1e-9])
def test_interval_covers_the_exact_markov_value_200(target):
    """200 runs of 4000 episodes: the 95 % interval covers the exact value in ≥ 93 % of them, and the mean of the
    estimates is within 3 % of it."""
    coverage, bias = _coverage(target, reps=200, n=4000, seed=100 + int(-math.log10(target)))
    print(f"true value {target:g}: coverage {coverage:.3f}, mean {bias:+.4f}")  # the guide's figures (pytest -rP)
    assert coverage >= 0.93, coverage
    assert abs(bias) < 0.03, bias


def test_plain_monte_carlo_at_inflated_rates_agrees_with_importance_sampling():
    """At a disk AFR of 500 % (×250 the default) with 30-day repairs, where one episode in eight loses, plain MC
    (q = 0) and IS agree within their intervals, and both cover the exact chain."""
    repair = 30 * 24 * 3600.0
    rates = disk_only_rates(5.0, repair)  # AFR × 250
    exact = 3 * 5.0 * absorption_from_one(5.0, SECONDS_PER_YEAR / repair)
    plain = EpisodeSampler(rates, BROKERS, Biasing(q=0.0))
    biased = EpisodeSampler(rates, BROKERS, Biasing())
    a_p, se_p = yearly([_stratum(plain, 3000, np.random.default_rng(7))], "lost", 0)
    a_i, se_i = yearly([_stratum(biased, 3000, np.random.default_rng(8))], "lost", 0)
    assert abs(a_p - a_i) <= Z95 * math.hypot(se_p, se_i)
    assert abs(a_p - exact) <= Z95 * se_p and abs(a_i - exact) <= Z95 * se_i


def test_plain_sampling_has_unit_weights_and_reweighting_to_the_sampler_is_the_plain_mean():
    """Unbiasedness by construction: with biasing off every likelihood ratio is exactly 1, so the weighted
    estimate is the plain mean; with biasing on, the ratios average to 1 (E_q[W] = 1) within their interval."""
    rates = disk_only_rates(5.0, 30 * 24 * 3600.0)
    plain = EpisodeSampler(rates, BROKERS, Biasing(q=0.0))
    s = _stratum(plain, 500, np.random.default_rng(3))
    assert np.allclose(s.weights, 1.0)
    a, _ = yearly([s], "lost", 0)
    assert a == pytest.approx(s.per_year * s.lost[:, 0].mean())
    biased = EpisodeSampler(rates, BROKERS, Biasing())
    w = _stratum(biased, 2000, np.random.default_rng(4)).weights
    assert abs(w.mean() - 1) <= Z95 * w.std(ddof=1) / math.sqrt(len(w))
    assert w.max() <= Biasing().max_weight


def test_reweighting_to_other_rates_matches_sampling_at_those_rates():
    """Sensitivity is exact re-weighting: episodes sampled at one AFR, re-weighted to 3× that AFR, estimate the
    chain at 3× (the exact value lies in the interval)."""
    afr = afr_for(1e-6)
    rates = disk_only_rates(afr, REPAIR_MEAN_S)
    sampler = EpisodeSampler(rates, BROKERS, Biasing())
    alt = sampler.per_second * 3
    s = _stratum(sampler, 3000, np.random.default_rng(11), per_second=alt)
    s.per_year *= 3
    a, se = yearly([s], "lost", 0)
    exact = 3 * 3 * afr * absorption_from_one(3 * afr, SECONDS_PER_YEAR / REPAIR_MEAN_S)
    assert abs(a - exact) <= Z95 * se, (a, se, exact)


def test_no_loss_gives_a_bound_not_zero():
    rates = disk_only_rates(AFR, 3600.0)
    sampler = EpisodeSampler(rates, BROKERS, Biasing())
    s = _stratum(sampler, 200, np.random.default_rng(5))
    s.lost[:] = False
    fig = policy_figures([s], 0, sampler.biasing.max_weight)
    assert fig["bounded"] and fig["p_loss_per_year"]["estimate"] == 0.0
    assert 0 < fig["p_loss_per_year"]["high"] < 1 and fig["nines"]["low"] > 0


def test_replayed_verdict_equals_the_chain_absorption():
    """The kernels' verdict on each episode's trace (kafka-durable: RF 3, acks=all, min ISR 2, three brokers) is
    "acknowledged messages lost" exactly when the chain reaches 3 (all replicas lost at once): the episode
    dynamics the Markov checks use are the ones the replay judges."""
    import dataclasses

    from engine.durability.judge import TraceShape, base_scenario, judge_episode
    from generators.library import resolve_scenario
    from replay.policies import parse_policy
    from schemas.trace import Broker

    demo = resolve_scenario("demo")
    scenario = base_scenario(dataclasses.replace(demo, brokers=tuple(Broker(b, r) for b, r in BROKERS.items()),
                                                 replication=dataclasses.replace(demo.replication, per_broker=())))
    sampler = EpisodeSampler(disk_only_rates(5.0, 30 * 24 * 3600.0), BROKERS, Biasing(q=0.9))
    rng = np.random.default_rng(21)
    losing = safe = 0
    for i in range(200):
        ep = sampler.sample(sampler.index["disk_loss"], rng)
        chain_loses = ep.max_down == 3
        if (losing >= 3 and chain_loses) or (safe >= 4 and not chain_loses):
            continue
        (verdict,) = judge_episode(scenario, ep, [parse_policy("kafka-durable")], TraceShape(trace_rate_per_s=20.0),
                                   i, i, 20.0)
        assert verdict.lost == chain_loses, (i, ep.events)
        losing, safe = losing + chain_loses, safe + (not chain_loses)
        if losing >= 3 and safe >= 4:
            break
    assert losing >= 3 and safe >= 4


def _recovery_weights(sampler: EpisodeSampler, eps, process: str, factor: float) -> np.ndarray:
    """Each episode's likelihood ratio to the model with `process`'s recovery times × factor (clips kept)."""
    from engine.durability.episodes import recovery_log_ratio

    i = sampler.index[process]
    d = sampler.rates.processes[i].recovery_s
    return np.array([e.weight(sampler.per_second) * math.exp(recovery_log_ratio(
        d, factor, e.recovery_n[i], e.recovery_sum[i], e.recovery_log_sum[i])) for e in eps])


@pytest.mark.parametrize("factor", [0.5, 1.25])
def test_reweighting_repair_times_matches_the_chain_at_those_repair_times(factor):
    """Restart-time sensitivity is exact re-weighting too: episodes sampled with mean repair 1/μ, re-weighted to
    repairs × factor, estimate the chain at μ / factor (the exact value lies in the interval). Exponential repairs
    re-weight only below × 2 (the likelihood ratio's variance is infinite beyond, and the recovery ratio refuses)."""
    afr = afr_for(1e-6)
    sampler = EpisodeSampler(disk_only_rates(afr, REPAIR_MEAN_S), BROKERS, Biasing())
    disk = sampler.index["disk_loss"]
    eps = [sampler.sample(disk, np.random.default_rng([13, i])) for i in range(3000)]
    w = _recovery_weights(sampler, eps, "disk_loss", factor)
    lost = np.array([[e.max_down == 3] for e in eps])
    zeros = np.zeros((len(eps), 1))
    s = Stratum(3 * afr, w, np.array([e.length_s for e in eps]), lost, zeros, zeros, zeros)
    a, se = yearly([s], "lost", 0)
    exact = 3 * afr * absorption_from_one(afr, SECONDS_PER_YEAR / (REPAIR_MEAN_S * factor))
    assert abs(a - exact) <= Z95 * se, (a, se, exact)
    base = 3 * afr * absorption_from_one(afr, SECONDS_PER_YEAR / REPAIR_MEAN_S)
    if factor == 0.5:  # the check has teeth: halving the repairs moves P by 4×, outside the interval
        assert abs(base - a) > Z95 * se


def test_reweighting_restart_times_to_the_sampling_law_is_the_plain_estimate_and_matches_resampling():
    """The default model's crash restarts (lognormal, clipped at 10 s and 1 h): with biasing off, re-weighting to
    the sampling law (factor 1) gives every episode weight 1, so the estimate is the plain mean; re-weighted to
    restarts × 2 (same clips) the mean episode length agrees with episodes sampled at × 2."""
    import dataclasses

    from generators.rates import load_rates

    rates = load_rates()
    rack_of = {b: f"r{b % 3}" for b in range(6)}
    plain = EpisodeSampler(rates, rack_of, Biasing(q=0.0))
    crash = plain.index["crash"]
    eps = [plain.sample(crash, np.random.default_rng([17, i])) for i in range(3000)]
    assert np.allclose(_recovery_weights(plain, eps, "crash", 1.0), 1.0, rtol=1e-9, atol=0)
    assert all(e.recovery_n[crash] >= 1 for e in eps)  # the initial crash's restart is among the draws
    lengths = np.array([e.length_s for e in eps])

    w = _recovery_weights(plain, eps, "crash", 2.0)
    z = w * lengths
    reweighted, se_r = z.mean(), z.std(ddof=1) / math.sqrt(len(z))
    d = rates["crash"].recovery_s
    slow = dataclasses.replace(rates, processes=tuple(
        dataclasses.replace(p, recovery_s=dataclasses.replace(d, median=d.median * 2)) if p.name == "crash" else p
        for p in rates.processes))
    resampled_eps = EpisodeSampler(slow, rack_of, Biasing(q=0.0))
    y = np.array([resampled_eps.sample(crash, np.random.default_rng([19, i])).length_s for i in range(3000)])
    resampled, se_s = y.mean(), y.std(ddof=1) / math.sqrt(len(y))
    assert abs(reweighted - resampled) <= Z95 * math.hypot(se_r, se_s), (reweighted, resampled)
    assert resampled > 1.5 * lengths.mean()  # the check has teeth: the lengths moved


def test_recovery_ratio_from_sums_equals_the_density_ratio_of_the_draws():
    from scipy import stats

    from engine.durability.episodes import recovery_log_ratio
    from generators.model import Dist, DistKind

    rng = np.random.default_rng(2)
    ln = Dist(DistKind.LOGNORMAL, median=60.0, sigma=1.0, min=10.0, max=3600.0)
    x = rng.lognormal(math.log(60.0), 1.0, 7)
    direct = float(np.sum(stats.lognorm.logpdf(x, 1.0, scale=120.0) - stats.lognorm.logpdf(x, 1.0, scale=60.0)))
    assert recovery_log_ratio(ln, 2.0, len(x), x.sum(), np.log(x).sum()) == pytest.approx(direct, rel=1e-12)
    ex = Dist(DistKind.EXPONENTIAL, mean=600.0)
    y = rng.exponential(600.0, 5)
    direct = float(np.sum(stats.expon.logpdf(y, scale=300.0) - stats.expon.logpdf(y, scale=600.0)))
    assert recovery_log_ratio(ex, 0.5, len(y), y.sum(), np.log(y).sum()) == pytest.approx(direct, rel=1e-12)
    with pytest.raises(ValueError, match="infinite variance"):
        recovery_log_ratio(ex, 2.0, len(y), y.sum(), np.log(y).sum())
    with pytest.raises(ValueError, match="uniform"):
        recovery_log_ratio(Dist(DistKind.UNIFORM, min=1.0, max=2.0), 2.0, 1, 1.5, math.log(1.5))


def test_defensive_mixture_bounds_the_weights_of_losses_the_initial_fault_alone_causes():
    """Where the initial fault alone loses (acks=1, asynchronous replication, page cache under a power loss), every
    episode loses and the estimate of E[L | k] = 1 is the mean weight. Forcing alone draws a further fault in most
    episodes, so the probability rests on the few unforced ones, weighted up to 1 / (1 − cap) per step: a relative
    variance per episode of 3-4. Drawing a share δ of episodes from the model itself (Hesterberg's defensive
    mixture, balance heuristic) bounds every weight by 1/δ and that variance by 1/δ − 1."""
    from generators.rates import load_rates

    rates = load_rates()
    rack_of = {b: f"r{b % 3}" for b in range(6)}
    relvar = {}
    from engine.durability.run import DEFENSIVE_START

    for alpha in (0.0, DEFENSIVE_START):
        sampler = EpisodeSampler(rates, rack_of, Biasing(defensive=alpha))
        crash = sampler.index["crash"]
        w = np.array([sampler.sample(crash, np.random.default_rng([23, i])).weight(sampler.per_second)
                      for i in range(1500)])
        assert abs(w.mean() - 1) <= Z95 * w.std(ddof=1) / math.sqrt(len(w))  # E_q[W] = 1: unbiased
        assert w.max() <= sampler.biasing.max_weight
        relvar[alpha] = w.var(ddof=1) / w.mean() ** 2
    mixed = DEFENSIVE_START
    assert Biasing(defensive=mixed).max_weight == pytest.approx(1 / mixed)
    assert relvar[mixed] <= 1 / mixed - 1 + 0.2 and relvar[0.0] > 2 * relvar[mixed], relvar


def test_a_stratum_without_losses_adds_no_variance_and_one_where_all_lost_keeps_a_floor():
    """Agresti-Coull's floor applies where every episode lost with one weight (the spread would claim no error);
    a stratum where the policy lost nothing contributes neither estimate nor variance."""
    from engine.durability.estimate import stratum_moments

    n = 20
    ones, zeros = np.ones((n, 1), dtype=bool), np.zeros((n, 1))
    all_lost = Stratum(0.5, np.ones(n), np.ones(n), ones, zeros, zeros, zeros)
    none_lost = Stratum(12.0, np.ones(n), np.ones(n), ~ones, zeros, zeros, zeros)
    assert stratum_moments(none_lost, "lost", 0) == (0.0, 0.0)
    m, v = stratum_moments(all_lost, "lost", 0)
    assert m == 1.0 and v == pytest.approx((22 / 24) * (2 / 24) / n)
    a, se = yearly([all_lost, none_lost], "lost", 0)
    assert a == 0.5 and se == pytest.approx(0.5 * math.sqrt(v))


def test_allocation_serves_the_policy_farthest_from_its_relative_target():
    """Two policies: one loses in every crash episode (a large rate, settled), the other only now and then in disk
    losses (a rate 10⁴ times smaller, its relative error large). The allocation that lowers the worst relative
    variance sends most of a round to the disk-loss stratum; a pooled absolute spread would send it to crashes."""
    from engine.durability.run import MIN_PER_STRATUM, DurabilitySpec, Estimate
    from generators.library import resolve_scenario
    from generators.rates import load_rates
    from replay.policies import parse_policy

    rates = load_rates()
    spec = DurabilitySpec(resolve_scenario("demo"), rates, (parse_policy("kafka-acks1"), parse_policy("dledger-5")))
    est = Estimate(spec)
    disk = rates.names.index("disk_loss")
    zero = [0.0] * len(rates.processes)
    rng = np.random.default_rng(1)
    for k, p in enumerate(rates.processes):
        for i in range(MIN_PER_STRATUM * 2):
            first = p.name == "crash"
            second = k == disk and i % 5 == 0
            weight = float(rng.uniform(0.5, 1.5)) if first else 1e-4 * float(rng.uniform(0.2, 5.0))
            est.rows.append({"stratum": k, "episode": i, "log_q": -math.log(weight), "counts": zero,
                             "exposure_s": zero, "length_s": 60.0, "recovery_n": zero, "recovery_sum": zero,
                             "recovery_log_sum": zero, "lost": [first, second], "acked_lost": [0.0, 0.0],
                             "unavailable_s": [0.0, 0.0], "failed_committed": [0.0, 0.0], "cpu_seconds": 1.0})
    plan = est.allocation(64)
    assert sum(plan) == 64 and plan[disk] == max(plan) and plan[disk] >= 0.8 * sum(plan), plan


def test_minimax_allocation_levels_the_worst_relative_variances():
    """Policy 0's variance lives in stratum 0, policy 1's in stratum 1 with four times the coefficient: the round
    that minimises the worse of the two gives n₁ = 4·n₀ (both variances equal), exactly; a floor is kept, and a
    stratum with no spread at all still gets episodes once it falls below its floor."""
    from engine.durability.run import minimax_allocation

    coeff = np.array([[1.0, 0.0], [0.0, 4.0], [0.0, 0.0]])
    live = np.array([True, True, True])
    n = np.array([10.0, 10.0, 30.0])
    out = minimax_allocation(coeff, n, 100, np.zeros(3), live)
    assert out[:2] == pytest.approx([24.0, 96.0], rel=1e-3) and out[2] == 30.0
    n[2] = 10.0  # below its floor of 20: raised to it, the rest as before
    floored = minimax_allocation(coeff, n, 100, np.full(3, 20.0), live)
    assert floored == pytest.approx([22.0, 88.0, 20.0], rel=1e-3)


@pytest.mark.parametrize("mechanism", ["faults pile up", "initial fault alone"])
def test_mixture_share_adapts_to_the_loss_mechanism(mechanism):
    """The share δ of episodes drawn from the model adapts per stratum to what the policies' losses need: little
    (0.1, the least allowed) where a loss takes three disk losses before a rebuild (the Markov chain), most (0.9)
    where every episode loses on its initial fault. The estimate stays on the exact value either way."""
    import dataclasses

    from engine.durability.judge import Verdict
    from engine.durability.run import DEFENSIVE_GRID, DurabilitySpec, estimate_local
    from generators.library import resolve_scenario
    from replay.policies import parse_policy
    from schemas.trace import Broker

    demo = resolve_scenario("demo")
    scenario = dataclasses.replace(demo, brokers=tuple(Broker(b, r) for b, r in BROKERS.items()))
    afr = afr_for(1e-6)
    spec = DurabilitySpec(scenario, disk_only_rates(afr, REPAIR_MEAN_S), (parse_policy("kafka-durable"),), seed=4)

    def judge(ep, k, i):
        return [Verdict(ep.max_down == 3 if mechanism == "faults pile up" else True, 0.0, 0.0, 0.0)]

    est = estimate_local(spec, episodes=600, batch=300, judge=judge)
    disk = spec.rates.names.index("disk_loss")
    assert {r["defensive"] for r in est.rows[300:]} == {est.rows[300]["defensive"]}  # one share per round
    share = est.rows[300]["defensive"]
    assert share == (DEFENSIVE_GRID[0] if mechanism == "faults pile up" else DEFENSIVE_GRID[-1]), share
    assert est.summary()["mixture_share_per_stratum"]["disk_loss"] == share  # durability.json shows it
    (fig,) = est.figures()
    exact = 3 * afr * (absorption_from_one(afr, SECONDS_PER_YEAR / REPAIR_MEAN_S) if mechanism == "faults pile up"
                       else 1.0)
    rate = fig["losing_episodes_per_year"]
    den = 1 + 3 * afr * np.mean([r["length_s"] for r in est.rows if r["stratum"] == disk]) / SECONDS_PER_YEAR
    assert rate["low"] * den <= exact <= rate["high"] * den, (rate, exact)
