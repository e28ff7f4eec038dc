"""`replab recommend`'s logic: SLO terms, the policy space, and the cheapest policy whose intervals meet the SLO.

- SLO: `METRIC<=NUMBER` or `METRIC>=NUMBER` terms joined by commas, metrics of `sweep_estimates.METRICS`. A
  term is met when the whole 95 % interval is on its side: the upper bound for `<=`, the lower bound for `>=`
  (so a policy is kept only if the sweep is confident it meets the term; an estimate without an interval, from
  one seed, meets nothing).
- Space: family names (every preset of the family), preset names, policy strings, or a grid: a policy string
  whose values list alternatives with `|` (`kafka:replication_factor=2|3,min_insync_replicas=1|2,acks=1|all`)
  expands to every combination the policy rules accept (combinations they refuse, e.g. min ISR above the
  replication factor, are left out and counted).
- Cost, cheapest first: brokers used, then copies per message, then mean replication bytes per trace; ties keep
  the space's order.
"""

from __future__ import annotations

import enum
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.sweep.estimates import METRICS, PolicyEstimate
from schemas.errors import BadInput

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


def parse_slo(text: str) -> list[SloTerm]:
    valid = ", ".join(METRICS)
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
        if metric not in METRICS:
            raise BadInput(f"--slo term {raw.strip()!r}: unknown metric {metric!r} (valid metrics: {valid})",
                           rule="slo")
        try:
            value = float(number)
        except ValueError:
            raise BadInput(f"--slo term {raw.strip()!r}: {number!r} is not a number (valid metrics: {valid})",
                           rule="slo") from None
        terms.append(SloTerm(metric, Op(op), value))
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
