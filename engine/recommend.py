"""`replab recommend`'s logic: SLO terms, the policy space, and the cheapest policy whose intervals meet the SLO.

- SLO: `METRIC<=NUMBER` or `METRIC>=NUMBER` terms joined by commas, metrics of `sweep_estimates.METRICS` (per
  trace, from a sweep) or of `DURABILITY_METRICS` (per year, from a `replab durability` run's durability.json);
  one SLO draws on one of the two. A term is met when the whole 95 % interval is on its side: the upper bound
  for `<=`, the lower bound for `>=` (so a policy is kept only if the estimate is confident it meets the term;
  an estimate without an interval, from one seed, meets nothing; a durability figure where no sampled episode
  lost anything is checked by its proven bound).
- Space: family names (every preset of the family), preset names, policy strings, or a grid: a policy string
  whose values list alternatives with `|` (`kafka:replication_factor=2|3,min_insync_replicas=1|2,acks=1|all`)
  expands to every combination the policy rules accept (combinations they refuse, e.g. min ISR above the
  replication factor, are left out and counted).
- Cost, cheapest first: brokers used, then copies per message, then mean replication bytes per trace (a
  durability run has no bytes: they tie); ties keep the space's order.
"""

from __future__ import annotations

import enum
import itertools
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.sweep.estimates import METRICS, Interval, PolicyEstimate
from schemas.errors import BadInput

#: The per-year SLO metrics (name -> the durability.json figure it reads, and what it is).
DURABILITY_METRICS: dict[str, tuple[str, str]] = {
    "nines_per_year": ("nines", "-log10 P(>= 1 acked message lost per year)"),
    "p_loss_per_year": ("p_loss_per_year", "P(>= 1 acked message lost per year)"),
    "acked_lost_per_year": ("acked_lost_per_year", "acknowledged messages lost per year"),
    "unavailable_min_per_year": ("unavailable_min_per_year", "unavailable minutes per year (average partition)"),
    "failed_committed_per_year": ("failed_committed_per_year", "failed-but-committed messages per year"),
}

_TERM = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=)\s*(\S+)\s*$")


class Op(enum.StrEnum):
    AT_MOST = "<="
    AT_LEAST = ">="


@dataclass(frozen=True)
class SloTerm:
    metric: str
    op: Op
    value: float

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"

    def check(self, e: PolicyEstimate) -> tuple[bool, float | None]:
        """Whether the estimate's 95 % interval meets the term, and the bound that decided it."""
        iv = e.estimates[self.metric]
        bound = iv.high if self.op is Op.AT_MOST else iv.low
        if bound is None:
            return False, None
        return (bound <= self.value if self.op is Op.AT_MOST else bound >= self.value), bound


def is_durability(term: SloTerm) -> bool:
    return term.metric in DURABILITY_METRICS


def parse_slo(text: str) -> list[SloTerm]:
    valid = ", ".join([*METRICS, *DURABILITY_METRICS])
    terms = []
    for raw in text.split(","):
        if not raw.strip():
            raise BadInput(f"--slo {text!r}: empty term (expected METRIC<=NUMBER or METRIC>=NUMBER; valid metrics: "
                           f"{valid})", rule="slo")
        m = _TERM.match(raw)
        if not m:
            raise BadInput(f"--slo term {raw.strip()!r}: expected METRIC<=NUMBER or METRIC>=NUMBER (valid metrics: "
                           f"{valid})", rule="slo")
        metric, op, number = m.groups()
        if metric not in METRICS and metric not in DURABILITY_METRICS:
            raise BadInput(f"--slo term {raw.strip()!r}: unknown metric {metric!r} (valid metrics: {valid})",
                           rule="slo")
        try:
            value = float(number)
        except ValueError:
            raise BadInput(f"--slo term {raw.strip()!r}: {number!r} is not a number (valid metrics: {valid})",
                           rule="slo") from None
        if not math.isfinite(value):
            raise BadInput(f"--slo term {raw.strip()!r}: {number!r} is not a finite number (valid metrics: {valid})",
                           rule="slo")
        terms.append(SloTerm(metric, Op(op), value))
    kinds = {is_durability(t) for t in terms}
    if len(kinds) > 1:
        first = next(t for t in terms if not is_durability(t))
        raise BadInput(f"--slo term {str(first)!r}: a per-trace metric cannot share an SLO with per-year ones "
                       f"({', '.join(DURABILITY_METRICS)}); check them in two recommends", rule="slo")
    return terms


@dataclass
class Space:
    policies: list[Any]  # replay.policies.Policy
    labels: list[str]
    refused: int = 0  # grid combinations the policy rules refuse


def expand_space(items: Sequence[str], *, split: bool = True) -> Space:
    """`--space` values (see the module docstring) → distinct policies in order, labelled as typed. With
    `split=False` every item is one policy string (`--policy`), commas included."""
    from replay.policies import FAMILIES, all_presets, parse_policy

    families = set(FAMILIES)
    space = Space([], [])
    seen: set[str] = set()

    def add(policy, label: str) -> None:
        c = policy.canonical()
        if c not in seen:
            seen.add(c)
            space.policies.append(policy)
            space.labels.append(label)

    for item in items:
        if "|" in item:
            family, _, params = item.partition(":")
            choices = []
            for part in params.split(","):
                key, eq, values = part.partition("=")
                if not eq or not key.strip():
                    raise BadInput(f"--space {item!r}: {part!r} is not PARAM=V1|V2|...", rule="space")
                choices.append([f"{key.strip()}={v.strip()}" for v in values.split("|")])
            for combo in itertools.product(*choices):
                text = f"{family}:{','.join(combo)}"
                try:
                    policy = parse_policy(text)
                except BadInput:
                    space.refused += 1
                    continue
                add(policy, policy.canonical())
            continue
        for name in (s.strip() for s in (item.split(",") if split else [item])):
            if not name:
                continue
            if name in families:
                for preset, policy in all_presets():
                    if policy.family == name:
                        add(policy, preset.name)
            else:
                add(parse_policy(name), name)
    if not space.policies:
        raise BadInput(f"--space {' '.join(items)!r} holds no policy", rule="space")
    return space


@dataclass
class DurabilityEstimate:
    """One policy's per-year figures from a durability run, shaped like a sweep's `PolicyEstimate` for the
    SLO check and the recommendation page (episodes stand where seeds do)."""

    policy: str
    label: str
    seeds: int  # episodes judged
    seeds_with_loss: int  # sampled episodes that lost an acknowledged message
    estimates: dict[str, Interval]
    brokers_used: int | None
    replicas_per_message: float | None
    bounded: bool
    fatal_seeds: int = 0
    replication_bytes: float | None = None

    @property
    def cost(self) -> tuple[float, float, float]:
        def v(x: float | None) -> float:
            return math.inf if x is None else float(x)

        return v(self.brokers_used), v(self.replicas_per_message), 0.0


def _interval(figure: dict[str, Any], method: str) -> Interval:
    def v(x: Any) -> float | None:
        return None if x is None else float(x)

    high = figure.get("high")
    if high is None and figure.get("low") is not None:
        high = math.inf  # infinite nines (P = 0) are stored as null
    return Interval(v(figure.get("estimate")), v(figure.get("low")), v(high), method)


def durability_estimates(path: str | Path) -> tuple[dict[str, Any], list[DurabilityEstimate]]:
    """A durability run's output (DIR or DIR/durability.json) → its document and one estimate per policy."""
    p = Path(path)
    if p.is_dir():
        p = p / "durability.json"
    if not p.is_file():
        raise BadInput(f"--durability {str(path)!r}: no durability.json there (write one with `replab durability "
                       f"--out DIR`)", rule="durability")
    try:
        doc = json.loads(p.read_text())
        out = []
        for f in doc["policies"]:
            method = f.get("method", "importance sampling")
            out.append(DurabilityEstimate(
                f["policy"], f.get("label", f["policy"]), int(doc["episodes"]), int(f["losing_episodes_sampled"]),
                {m: _interval(f[key], method) for m, (key, _) in DURABILITY_METRICS.items()},
                f.get("brokers_used"), f.get("replicas_per_message"), bool(f["bounded"])))
    except (ValueError, KeyError, TypeError) as exc:
        raise BadInput(f"--durability {str(p)!r} is not a replab durability.json ({exc!r})",
                       rule="durability") from None
    return doc, out


@dataclass
class Verdict:
    estimate: PolicyEstimate
    terms: list[tuple[SloTerm, bool, float | None]]  # (term, met, deciding bound)

    @property
    def meets(self) -> bool:
        return all(met for _, met, _ in self.terms)


@dataclass
class Recommendation:
    slo: list[SloTerm]
    verdicts: list[Verdict]  # in the sweep's order
    ranked: list[Verdict] = field(default_factory=list)  # those meeting every term, cheapest first

    @property
    def chosen(self) -> Verdict | None:
        return self.ranked[0] if self.ranked else None

    def to_json(self) -> dict[str, Any]:
        return {
            "slo": [str(t) for t in self.slo],
            "chosen": None if self.chosen is None else self.chosen.estimate.policy,
            "chosen_label": None if self.chosen is None else self.chosen.estimate.label,
            "ranked": [v.estimate.policy for v in self.ranked],
            "policies": [{"policy": v.estimate.policy, "label": v.estimate.label, "meets": v.meets,
                          "cost": list(v.estimate.cost),
                          "terms": [{"term": str(t), "met": met, "bound": b} for t, met, b in v.terms]}
                         for v in self.verdicts],
        }


def recommend(estimates: Sequence[PolicyEstimate], slo: Sequence[SloTerm]) -> Recommendation:
    verdicts = [Verdict(e, [(t, *t.check(e)) for t in slo]) for e in estimates]
    ranked = sorted((v for v in verdicts if v.meets), key=lambda v: v.estimate.cost)  # stable: space order
    return Recommendation(list(slo), verdicts, ranked)
