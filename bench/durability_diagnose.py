"""Where each policy's P(loss per year) and its variance come from, from a durability bench's episodes.

    python -m bench.durability_bench --budget-s 240 --rows rows.json
    python -m bench.durability_diagnose rows.json

Per policy: the yearly rate of losing episodes R = Σ_k Λ_k·mean_k(w·L) and its variance Σ_k Λ_k²·var_k(w·L)/n_k,
split by stratum (initial process k); the losing episodes sampled, their loss ESS, the largest one's share of R and
the spread of their weights (largest / smallest); and, for the losing episodes, how many faults struck inside the
episode (0: the initial fault alone loses; 1, 2: faults piled up), which tells the policy's loss mechanism.
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np


def diagnose(path: str) -> str:
    from engine.durability.episodes import initial_rates_per_year
    from engine.durability.estimate import stratum_moments
    from engine.durability.run import strata_of
    from generators.rates import load_rates

    with open(path) as f:
        data = json.load(f)
    rows, policies = data["rows"], data["policies"]
    rates = load_rates()
    names = rates.names
    per_year = initial_rates_per_year(rates, 6, 3)
    per_second = np.array([p.per_second for p in rates.processes])
    strata = strata_of(rows, len(names), per_year, per_second, len(policies))
    faults_inside = {k: np.array([sum(r["counts"]) for r in rows if r["stratum"] == k]) for k in range(len(names))}
    out = [f"{len(rows)} episodes; per stratum: " + ", ".join(f"{n} {s.n}" for n, s in zip(names, strata, strict=True))]
    out.append("")
    out.append("| policy | R /yr | rel. SE | rel. SE with floors | losing | loss ESS | top share | weight spread | "
               "R by stratum (share) | var by stratum (share) | faults inside losing episodes |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for j, name in enumerate(policies):
        parts, vars_, contrib, weights, inside, floored = [], [], [], [], [], 0.0
        for k, s in enumerate(strata):
            if s.n == 0:
                parts.append(0.0)
                vars_.append(0.0)
                continue
            z = s.weights * s.lost[:, j]
            parts.append(s.per_year * z.mean())
            vars_.append(s.per_year**2 * (z.var(ddof=1) if s.n > 1 else 0.0) / s.n)
            floored += s.per_year**2 * stratum_moments(s, "lost", j)[1]
            contrib.extend(s.per_year * z[s.lost[:, j]] / s.n)
            weights.extend(s.weights[s.lost[:, j]])
            inside.extend(faults_inside[k][s.lost[:, j]])
        r, v = sum(parts), sum(vars_)
        c = np.array(contrib)
        ess = c.sum() ** 2 / (c**2).sum() if len(c) else 0.0
        top = c.max() / c.sum() if len(c) else 0.0
        w = np.array(weights)
        spread = w.max() / w.min() if len(w) else math.nan
        by = ", ".join(f"{names[k]} {parts[k] / r:.0%}" for k in np.argsort(parts)[::-1] if parts[k] > 0.005 * r)
        byv = ", ".join(f"{names[k]} {vars_[k] / v:.0%}" for k in np.argsort(vars_)[::-1] if vars_[k] > 0.005 * v)
        hist = np.bincount(np.array(inside, dtype=int)) if inside else np.zeros(0, dtype=int)
        rel_f = math.sqrt(floored) / r if r else math.inf
        out.append(f"| {name} | {r:.3g} | {math.sqrt(v) / r if r else math.inf:.2f} | {rel_f:.3g} | {len(c)} | "
                   f"{ess:.1f} | {top:.2f} | {spread:.3g} | {by} | {byv} | {' / '.join(str(x) for x in hist)} |")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.durability_diagnose", description=__doc__.splitlines()[0])
    parser.add_argument("rows", help="the episodes a `durability_bench --rows FILE` run wrote")
    print(diagnose(parser.parse_args(argv).rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
