"""Failure-rate files (`conf/rates/*.yaml`): the failure model of `replab durability`, typed and checked.

A file names every process of `PROCESSES` under `processes:`, each with `per_year` (Poisson starts per unit
per year; the unit is a broker, a rack or the whole cluster), a recovery time in seconds (a scenario
distribution, `generators.scenario`), and a `source` that says where the figure comes from. A missing or bad
key is a `BadInput` naming the file and the key path (exit code 2), as for scenario files.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import conf
from generators.model import Dist, DistKind
from generators.scenario import Reader, read_yaml_file
from schemas.errors import BadInput

SECONDS_PER_YEAR = 365.25 * 24 * 3600


class Unit(enum.StrEnum):
    """What one Poisson process belongs to (its rate is per unit)."""

    BROKER = "broker"
    RACK = "rack"
    CLUSTER = "cluster"


@dataclass(frozen=True)
class ProcessSpec:
    """How a process is written in the file: its unit and the key of its recovery time."""

    unit: Unit
    recovery_key: str
    extra_keys: tuple[str, ...] = ()


#: The processes of the failure model, in the order the estimator numbers them.
PROCESSES: dict[str, ProcessSpec] = {
    "crash": ProcessSpec(Unit.BROKER, "restart_s"),
    "power_loss": ProcessSpec(Unit.BROKER, "restart_s"),
    "disk_loss": ProcessSpec(Unit.BROKER, "replace_s", ("data_gb", "rebuild_mb_per_s")),
    "isolate": ProcessSpec(Unit.BROKER, "duration_s"),
    "rack_power_loss": ProcessSpec(Unit.RACK, "restart_s"),
    "cluster_power_loss": ProcessSpec(Unit.CLUSTER, "restart_s"),
    "rolling_restart": ProcessSpec(Unit.CLUSTER, "downtime_s", ("gap_s",)),
}
#: Processes that start an episode but do not strike inside one: planned maintenance waits for a healthy cluster.
PLANNED = frozenset({"rolling_restart"})


@dataclass(frozen=True)
class Process:
    name: str
    unit: Unit
    per_year: float
    recovery_s: Dist  # restart, isolation, disk replacement or per-broker downtime
    fixed_extra_s: float = 0.0  # disk loss: the rebuild, data / bandwidth
    gap_s: Dist | None = None  # rolling restart: wait between brokers
    source: str = ""

    @property
    def per_second(self) -> float:
        return self.per_year / SECONDS_PER_YEAR


@dataclass(frozen=True)
class Rates:
    name: str
    description: str
    processes: tuple[Process, ...]
    source: str = ""

    def __getitem__(self, name: str) -> Process:
        for p in self.processes:
            if p.name == name:
                return p
        raise KeyError(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.processes)

    def scaled(self, rate: dict[str, float] | None = None, recovery: dict[str, float] | None = None,
               label: str | None = None) -> Rates:
        """These rates with some processes' per_year and recovery times multiplied (sensitivity)."""
        rate, recovery = rate or {}, recovery or {}
        out = []
        for p in self.processes:
            q = dataclasses.replace(p, per_year=p.per_year * rate.get(p.name, 1.0))
            if p.name in recovery:
                q = dataclasses.replace(q, recovery_s=scale_dist(p.recovery_s, recovery[p.name]),
                                        fixed_extra_s=p.fixed_extra_s * recovery[p.name])
            out.append(q)
        return dataclasses.replace(self, processes=tuple(out), name=label or self.name)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "processes": {p.name: {"per_year": p.per_year, "unit": p.unit.value,
                                                           "recovery_mean_s": p.recovery_s.mean_value
                                                           + p.fixed_extra_s, "source": p.source}
                                                  for p in self.processes}}


def scale_dist(d: Dist, k: float) -> Dist:
    """The distribution of k·X for X ~ d."""
    def m(x: float | None) -> float | None:
        return None if x is None else x * k
    return dataclasses.replace(d, value=m(d.value), mean=m(d.mean), median=m(d.median), min=m(d.min), max=m(d.max))


def parse_rates(raw: Any, *, file: str, default_name: str = "rates") -> Rates:
    r = Reader(file)
    r.bad = lambda path, why: BadInput(f"key '{path}': {why}", file=file, rule="rates")  # type: ignore[method-assign]
    top = r.mapping(raw, "", ("name", "description", "processes"), ("processes",))
    procs = r.mapping(top["processes"], "processes", tuple(PROCESSES), tuple(PROCESSES))
    out = []
    for name, spec in PROCESSES.items():
        path = f"processes.{name}"
        rk = spec.recovery_key
        # `<anything>_source` keys cite where a recovery figure comes from (free text, checked non-empty)
        raw_proc = procs[name] if isinstance(procs[name], dict) else {}
        source_keys = tuple(k for k in raw_proc if isinstance(k, str) and k.endswith("_source"))
        got = r.mapping(procs[name], path, ("per_year", "source", rk, *spec.extra_keys, *source_keys),
                        ("per_year", "source", rk, *spec.extra_keys))
        per_year = r.number(got["per_year"], f"{path}.per_year", ge=0, le=1e6)
        source = r.text(got["source"], f"{path}.source")
        for k in source_keys:
            r.text(got[k], f"{path}.{k}")
        recovery = r.dist(got[rk], f"{path}.{rk}", ge=0)
        extra, gap = 0.0, None
        if name == "disk_loss":
            gb = r.number(got["data_gb"], f"{path}.data_gb", ge=0)
            bw = r.number(got["rebuild_mb_per_s"], f"{path}.rebuild_mb_per_s", gt=0)
            extra = gb * 1000.0 / bw
        if name == "rolling_restart":
            gap = r.dist(got["gap_s"], f"{path}.gap_s", ge=0, bounded=True)
        out.append(Process(name, spec.unit, per_year, recovery, extra, gap, source))
    name = top.get("name", default_name)
    return Rates(str(name), str(top.get("description", "")), tuple(out), source=file)


def load_rates(spec: str | Path | None = None) -> Rates:
    """`--rates NAME|FILE.yaml` (None: the default set, conf/rates/default.yaml)."""
    if spec is None:
        spec = "default"
    p = Path(spec)
    if not str(spec).endswith((".yaml", ".yml")):
        p = conf.path("rates", f"{spec}.yaml")
        if not p.is_file():
            names = sorted(x.stem for x in conf.path("rates").glob("*.yaml"))
            raise BadInput(f"unknown rates {spec!r}; shipped: {', '.join(names)} (or give a .yaml file)",
                           rule="rates")
    raw, shown = read_yaml_file(p, what="rates")
    return parse_rates(raw, file=shown, default_name=p.stem)


def log_density(d: Dist, x: float) -> float:
    """log of d's density at x (−inf outside its support; 0 for a fixed value, whose ratio is then 1)."""
    if d.kind is DistKind.FIXED:
        return 0.0 if x == d.value else -math.inf
    if d.kind is DistKind.UNIFORM:
        return -math.log(d.max - d.min) if d.min <= x <= d.max and d.max > d.min else -math.inf
    if d.kind is DistKind.EXPONENTIAL:
        return -math.log(d.mean) - x / d.mean if x > 0 else -math.inf
    if x <= 0:
        return -math.inf
    z = (math.log(x) - math.log(d.median)) / d.sigma
    return -math.log(x * d.sigma * math.sqrt(2 * math.pi)) - z * z / 2
