"""Scenario files (`conf/scenarios/*.yaml`, SPEC §8) read into typed, validated, frozen dataclasses.

A scenario describes the life of a cluster, independent of any replication policy (SPEC §1):

```yaml
name: demo                          # optional; the file name without .yaml by default
description: one line that `replab scenarios` prints
cluster:
  brokers: 6                        # ids 0..5; or a list of {id, rack}
  racks: [a, b, c]                  # broker i sits in racks[i % len(racks)]
workload:
  duration_s: 150
  rate_per_s: 4000                  # messages per second (the base rate of the shape)
  shape: {kind: constant}           # or {kind: diurnal, period_s, amplitude, phase}
                                    # or {kind: bursty, factor, every_s, length_s}
  producers: 8
  keys: {count: 10000, zipf_s: 1.1, unkeyed_share: 0.2}
  size_bytes: {dist: lognormal, median: 1024, sigma: 0.6, min: 64, max: 65536}
replication:                        # per-broker follower behaviour; `brokers:` overrides it by broker id
  fetch_interval_ms: 10             # one `replicate` report per fetch ...
  fetch_jitter_ms: 3                # ... at interval ± jitter
  delay_ms: {dist: lognormal, median: 2, sigma: 0.5, max: 200}   # upto_us = ts_us - delay (bounded)
  catchup_speed: 10                 # after a restart/heal/stall: data time fetched per unit of time (> 1)
  slow_follower: {every_s: 600, length_s: {dist: uniform, min: 20, max: 60}}   # random stalls
  gc_pause: {every_s: 300, length_ms: {dist: lognormal, median: 200, sigma: 0.5, max: 3000}}
  brokers: {2: {fetch_interval_ms: 50}}
  stalls: [{broker: 2, from_ms: 10000, to_ms: 60000}]            # scheduled stalls (slow disk)
faults:
  scheduled:                        # exact events; `broker: N`, `brokers: [..]|all` or `rack: NAME`
    - {at_ms: 30000, kind: crash, broker: 0}
    - {at_ms: 90000, kind: restart, broker: 0}
    - {at_ms: 100000, kind: rolling_restart, downtime_ms: 20000, gap_ms: 30000}
  random:                           # per broker (per rack for rack_power_loss, per cluster for rolling)
    crash: {mtbf_s: 3600, mttr_s: {dist: uniform, min: 30, max: 300}}
    power_loss: {...}, disk_loss: {...}, isolate: {...}, rack_power_loss: {...}
    rolling_restart: {mtbf_s: 7200, downtime_s: 20, gap_s: 30}
```

A distribution is a number (fixed) or `{dist: fixed, value}`, `{dist: uniform, min, max}`,
`{dist: exponential, mean[, min, max]}`, `{dist: lognormal, median, sigma[, min, max]}`; its unit is the
key's (`delay_ms` in ms, `mttr_s` in s). Every problem raises `BadInput` naming the file and the key path
(`conf/scenarios/x.yaml: key 'workload.rate_per_s': must be > 0`), which the CLI turns into exit code 2.

Group events (`brokers: all`, `brokers: [..]`, `rack:`) apply to the brokers that are in a state where the
event makes sense at that instant (a power loss skips brokers already down, a restart skips brokers that are
up); an event naming one `broker:` must be valid, or the file is rejected with the entry's key path.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from generators.model import (
    MAX_DURATION_S,
    MAX_INT32,
    MAX_KEYS,
    MAX_RATE_PER_S,
    NAME_RE,
    RANDOM_FAULT_KINDS,
    Dist,
    DistKind,
    EpisodeProcess,
    FaultKind,
    Faults,
    KeySpace,
    RandomFault,
    RateShape,
    Replication,
    ReplicationBehaviour,
    Scenario,
    ScheduledFault,
    ShapeKind,
    Stall,
    Workload,
)
from generators.timeline import check_scheduled
from schemas.errors import BadInput
from schemas.trace import Broker

# ---------------------------------------------------------------------------------------------------------
# Parsing


class Reader:
    """Reads one decoded YAML document; every error names the file and the key path."""

    def __init__(self, file: str) -> None:
        self.file = file

    def bad(self, path: str, why: str) -> BadInput:
        return BadInput(f"key '{path}': {why}", file=self.file, rule="scenario")

    def mapping(self, raw: Any, path: str, known: tuple[str, ...], required: tuple[str, ...] = ()) -> dict:
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            raise self.bad(path, f"must be a mapping with keys {', '.join(known)}")
        for key in raw:
            if key not in known:
                raise self.bad(_join(path, key), f"unknown key (known here: {', '.join(known)})")
        for key in required:
            if key not in raw:
                raise self.bad(_join(path, key), "missing")
        return dict(raw)

    def number(self, raw: Any, path: str, *, gt: float | None = None, ge: float | None = None,
               lt: float | None = None, le: float | None = None, integer: bool = False) -> float:
        if isinstance(raw, bool) or not isinstance(raw, int | float) or (isinstance(raw, float) and not
                                                                          math.isfinite(raw)):
            raise self.bad(path, f"must be a{'n integer' if integer else ' number'}, got {raw!r}")
        if integer and not (isinstance(raw, int) or float(raw).is_integer()):
            raise self.bad(path, f"must be an integer, got {raw!r}")
        for bound, ok, text in ((gt, lambda v, b: v > b, ">"), (ge, lambda v, b: v >= b, ">="),
                                (lt, lambda v, b: v < b, "<"), (le, lambda v, b: v <= b, "<=")):
            if bound is not None and not ok(raw, bound):
                raise self.bad(path, f"must be {text} {_fmt(bound)}, got {raw!r}")
        return int(raw) if integer else float(raw)

    def text(self, raw: Any, path: str) -> str:
        if not isinstance(raw, str) or not raw.strip():
            raise self.bad(path, "must be a non-empty string")
        return raw.strip()

    def choice(self, raw: Any, path: str, enum_cls: type[enum.StrEnum]) -> Any:
        allowed = [e.value for e in enum_cls]
        if raw not in allowed:
            raise self.bad(path, f"must be one of {', '.join(allowed)}, got {raw!r}")
        return enum_cls(raw)

    def dist(self, raw: Any, path: str, *, ge: float = 0.0, bounded: bool = False) -> Dist:
        if not isinstance(raw, Mapping):
            value = self.number(raw, path, ge=ge)
            return Dist(DistKind.FIXED, value=value)
        kind_raw = raw.get("dist")
        if kind_raw is None:
            raise self.bad(_join(path, "dist"), f"missing (one of {', '.join(k.value for k in DistKind)})")
        kind = self.choice(kind_raw, _join(path, "dist"), DistKind)
        fields = {
            DistKind.FIXED: (("value",), ()),
            DistKind.UNIFORM: (("min", "max"), ()),
            DistKind.EXPONENTIAL: (("mean",), ("min", "max")),
            DistKind.LOGNORMAL: (("median", "sigma"), ("min", "max")),
        }[kind]
        got = self.mapping(raw, path, ("dist", *fields[0], *fields[1]), ("dist", *fields[0]))
        vals: dict[str, float] = {}
        for key in (*fields[0], *fields[1]):
            if key in got:
                positive = key in ("mean", "median")
                vals[key] = self.number(got[key], _join(path, key), gt=0 if positive else None,
                                        ge=None if positive or key == "sigma" else ge)
        if "sigma" in vals and vals["sigma"] < 0:
            raise self.bad(_join(path, "sigma"), f"must be >= 0, got {vals['sigma']!r}")
        if "min" in vals and "max" in vals and vals["min"] > vals["max"]:
            raise self.bad(_join(path, "max"), f"must be >= min ({_fmt(vals['min'])}), got {_fmt(vals['max'])}")
        dist = Dist(kind, **vals)
        if bounded and dist.upper_bound is None:
            raise self.bad(_join(path, "max"), f"missing: a {kind.value} distribution here needs a max (the value "
                                               "must be bounded)")
        return dist


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _fmt(x: float) -> str:
    return f"{x:g}"


def parse_scenario(raw: Any, *, file: str, default_name: str | None = None) -> Scenario:
    """Validate a decoded scenario document into a `Scenario` (errors name `file` and the key path)."""
    r = Reader(file)
    top = r.mapping(raw, "", ("name", "description", "cluster", "workload", "replication", "faults"),
                    ("description", "cluster", "workload"))
    name = top.get("name", default_name)
    if name is None:
        raise r.bad("name", "missing (and the scenario has no file name to default to)")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise r.bad("name", f"must be lowercase letters, digits, '-', '_' or '.', got {name!r}")
    description = r.text(top["description"], "description")
    if "\n" in description:
        raise r.bad("description", "must be one line")
    brokers = _parse_cluster(r, top["cluster"])
    ids = tuple(b.id for b in brokers)
    workload = _parse_workload(r, top["workload"])
    duration_ms = workload.duration_s * 1000.0
    replication = _parse_replication(r, top.get("replication"), ids, duration_ms)
    faults = _parse_faults(r, top.get("faults"), brokers, duration_ms)
    return Scenario(name, description, brokers, workload, replication, faults, source=file)


def _parse_cluster(r: Reader, raw: Any) -> tuple[Broker, ...]:
    got = r.mapping(raw, "cluster", ("brokers", "racks"), ("brokers",))
    spec = got["brokers"]
    if isinstance(spec, list):
        if "racks" in got:
            raise r.bad("cluster.racks", "not allowed when cluster.brokers lists {id, rack} (the racks are there)")
        if not spec:
            raise r.bad("cluster.brokers", "must not be empty")
        brokers = []
        for i, item in enumerate(spec):
            path = f"cluster.brokers[{i}]"
            b = r.mapping(item, path, ("id", "rack"), ("id", "rack"))
            bid = r.number(b["id"], f"{path}.id", ge=0, le=MAX_INT32, integer=True)
            brokers.append(Broker(int(bid), r.text(b["rack"], f"{path}.rack")))
        ids = [b.id for b in brokers]
        if len(set(ids)) != len(ids):
            raise r.bad("cluster.brokers", "broker ids must be unique")
        return tuple(sorted(brokers, key=lambda b: b.id))
    count = int(r.number(spec, "cluster.brokers", ge=1, le=1000, integer=True))
    racks_raw = got.get("racks", ["r0"])
    if not isinstance(racks_raw, list) or not racks_raw:
        raise r.bad("cluster.racks", "must be a non-empty list of rack names")
    racks = [r.text(x if isinstance(x, str) else str(x), f"cluster.racks[{i}]") for i, x in enumerate(racks_raw)]
    if len(set(racks)) != len(racks):
        raise r.bad("cluster.racks", "rack names must be unique")
    return tuple(Broker(i, racks[i % len(racks)]) for i in range(count))


def _parse_workload(r: Reader, raw: Any) -> Workload:
    got = r.mapping(raw, "workload", ("duration_s", "rate_per_s", "shape", "producers", "keys", "size_bytes"),
                    ("duration_s", "rate_per_s"))
    duration_s = r.number(got["duration_s"], "workload.duration_s", gt=0, le=MAX_DURATION_S)
    rate = r.number(got["rate_per_s"], "workload.rate_per_s", gt=0, le=MAX_RATE_PER_S)
    shape = _parse_shape(r, got.get("shape"))
    producers = int(r.number(got.get("producers", 4), "workload.producers", ge=1, le=MAX_INT32, integer=True))
    k = r.mapping(got.get("keys"), "workload.keys", ("count", "zipf_s", "unkeyed_share"))
    keys = KeySpace(
        count=int(r.number(k.get("count", 1000), "workload.keys.count", ge=1, le=MAX_KEYS, integer=True)),
        zipf_s=r.number(k.get("zipf_s", 1.0), "workload.keys.zipf_s", ge=0, le=10),
        unkeyed_share=r.number(k.get("unkeyed_share", 0.0), "workload.keys.unkeyed_share", ge=0, le=1),
    )
    size = Workload.__dataclass_fields__["size_bytes"].default_factory()
    if "size_bytes" in got:
        size = r.dist(got["size_bytes"], "workload.size_bytes", ge=1)
        if size.upper_bound is not None and size.upper_bound > MAX_INT32:
            raise r.bad("workload.size_bytes", f"must stay <= {MAX_INT32} (int32)")
    return Workload(duration_s, rate, shape, producers, keys, size)


def _parse_shape(r: Reader, raw: Any) -> RateShape:
    if raw is None:
        return RateShape()
    if not isinstance(raw, Mapping) or "kind" not in raw:
        raise r.bad("workload.shape.kind", f"missing (one of {', '.join(k.value for k in ShapeKind)})")
    kind = r.choice(raw["kind"], "workload.shape.kind", ShapeKind)
    p = "workload.shape"
    if kind is ShapeKind.CONSTANT:
        r.mapping(raw, p, ("kind",))
        return RateShape()
    if kind is ShapeKind.DIURNAL:
        got = r.mapping(raw, p, ("kind", "period_s", "amplitude", "phase"), ("period_s", "amplitude"))
        return RateShape(kind, period_s=r.number(got["period_s"], f"{p}.period_s", gt=0),
                         amplitude=r.number(got["amplitude"], f"{p}.amplitude", ge=0, lt=1),
                         phase=r.number(got.get("phase", 0.0), f"{p}.phase", ge=0, le=1))
    got = r.mapping(raw, p, ("kind", "factor", "every_s", "length_s"), ("factor", "every_s", "length_s"))
    return RateShape(kind, factor=r.number(got["factor"], f"{p}.factor", ge=1, le=1000),
                     every_s=r.number(got["every_s"], f"{p}.every_s", gt=0),
                     length_s=r.number(got["length_s"], f"{p}.length_s", gt=0))


_BEHAVIOUR_KEYS = ("fetch_interval_ms", "fetch_jitter_ms", "delay_ms", "catchup_speed", "slow_follower", "gc_pause")


def _parse_behaviour(r: Reader, got: dict, path: str, base: ReplicationBehaviour) -> ReplicationBehaviour:
    interval = base.fetch_interval_ms
    if "fetch_interval_ms" in got:
        interval = r.number(got["fetch_interval_ms"], _join(path, "fetch_interval_ms"), ge=0.01, le=3_600_000)
    jitter = base.fetch_jitter_ms
    if "fetch_jitter_ms" in got:
        jitter = r.number(got["fetch_jitter_ms"], _join(path, "fetch_jitter_ms"), ge=0)
    if not jitter < interval / 2:
        # Reports of one broker stay strictly ordered only while the jitter is under half the interval.
        raise r.bad(_join(path, "fetch_jitter_ms"),
                    f"must be < fetch_interval_ms / 2 ({_fmt(interval / 2)}), got {_fmt(jitter)}")
    delay = base.delay_ms
    if "delay_ms" in got:
        delay = r.dist(got["delay_ms"], _join(path, "delay_ms"), ge=0, bounded=True)
    speed = base.catchup_speed
    if "catchup_speed" in got:
        speed = r.number(got["catchup_speed"], _join(path, "catchup_speed"), gt=1, le=1e6)
    episodes = {}
    for key, unit_key in (("slow_follower", "length_s"), ("gc_pause", "length_ms")):
        episodes[key] = getattr(base, key)
        if key in got:
            if got[key] is None:
                episodes[key] = None
                continue
            e = r.mapping(got[key], _join(path, key), ("every_s", unit_key), ("every_s", unit_key))
            episodes[key] = EpisodeProcess(r.number(e["every_s"], _join(path, f"{key}.every_s"), gt=0),
                                           r.dist(e[unit_key], _join(path, f"{key}.{unit_key}"), ge=0))
    return ReplicationBehaviour(interval, jitter, delay, speed, episodes["slow_follower"], episodes["gc_pause"])


def _parse_replication(r: Reader, raw: Any, ids: tuple[int, ...], duration_ms: float) -> Replication:
    got = r.mapping(raw, "replication", (*_BEHAVIOUR_KEYS, "brokers", "stalls"))
    default = _parse_behaviour(r, got, "replication", ReplicationBehaviour())
    per_broker = []
    overrides = got.get("brokers") or {}
    if not isinstance(overrides, Mapping):
        raise r.bad("replication.brokers", "must map broker ids to behaviour overrides")
    for key, value in overrides.items():
        path = f"replication.brokers.{key}"
        if isinstance(key, bool) or not isinstance(key, int) or key not in ids:
            raise r.bad(path, f"not a broker id of the cluster ({', '.join(map(str, ids))})")
        sub = r.mapping(value, path, _BEHAVIOUR_KEYS)
        per_broker.append((key, _parse_behaviour(r, sub, path, default)))
    stalls = []
    stall_list = got.get("stalls") or []
    if not isinstance(stall_list, list):
        raise r.bad("replication.stalls", "must be a list of {broker, from_ms, to_ms}")
    for i, item in enumerate(stall_list):
        path = f"replication.stalls[{i}]"
        s = r.mapping(item, path, ("broker", "from_ms", "to_ms"), ("broker", "from_ms", "to_ms"))
        broker = r.number(s["broker"], f"{path}.broker", integer=True)
        if broker not in ids:
            raise r.bad(f"{path}.broker", f"not a broker id of the cluster ({', '.join(map(str, ids))})")
        start = r.number(s["from_ms"], f"{path}.from_ms", ge=0, le=duration_ms)
        end = r.number(s["to_ms"], f"{path}.to_ms", gt=start)
        stalls.append(Stall(int(broker), start, end))
    return Replication(default, tuple(sorted(per_broker)), tuple(stalls))


def _parse_faults(r: Reader, raw: Any, brokers: tuple[Broker, ...], duration_ms: float) -> Faults:
    got = r.mapping(raw, "faults", ("scheduled", "random"))
    scheduled = _parse_scheduled(r, got.get("scheduled") or [], brokers, duration_ms)
    rnd = r.mapping(got.get("random"), "faults.random", RANDOM_FAULT_KINDS)
    random_faults = []
    for name in RANDOM_FAULT_KINDS:
        if name not in rnd or rnd[name] is None:
            continue
        path = f"faults.random.{name}"
        if name == "rolling_restart":
            f = r.mapping(rnd[name], path, ("mtbf_s", "downtime_s", "gap_s"), ("mtbf_s", "downtime_s"))
            fault = RandomFault(r.number(f["mtbf_s"], f"{path}.mtbf_s", gt=0),
                                r.dist(f["downtime_s"], f"{path}.downtime_s", ge=0),
                                r.dist(f.get("gap_s", 0.0), f"{path}.gap_s", ge=0))
        else:
            f = r.mapping(rnd[name], path, ("mtbf_s", "mttr_s"), ("mtbf_s", "mttr_s"))
            fault = RandomFault(r.number(f["mtbf_s"], f"{path}.mtbf_s", gt=0),
                                r.dist(f["mttr_s"], f"{path}.mttr_s", ge=0))
        random_faults.append((name, fault))
    return Faults(scheduled, tuple(random_faults))


def _parse_scheduled(r: Reader, items: Any, brokers: tuple[Broker, ...], duration_ms: float
                     ) -> tuple[ScheduledFault, ...]:
    if not isinstance(items, list):
        raise r.bad("faults.scheduled", "must be a list of {at_ms, kind, broker|brokers|rack}")
    ids = tuple(b.id for b in brokers)
    racks = sorted({b.rack for b in brokers})
    out: list[tuple[ScheduledFault, str]] = []
    for i, item in enumerate(items):
        path = f"faults.scheduled[{i}]"
        if not isinstance(item, Mapping) or "kind" not in item:
            raise r.bad(f"{path}.kind", f"missing (one of {', '.join(k.value for k in FaultKind)})")
        kind = r.choice(item["kind"], f"{path}.kind", FaultKind)
        extra = ("downtime_ms", "gap_ms") if kind is FaultKind.ROLLING_RESTART else ()
        f = r.mapping(item, path, ("at_ms", "kind", "broker", "brokers", "rack", *extra),
                      ("at_ms", "kind", *extra[:1]))
        at_ms = r.number(f["at_ms"], f"{path}.at_ms", ge=0, le=duration_ms)
        selectors = [k for k in ("broker", "brokers", "rack") if k in f]
        if kind is FaultKind.ROLLING_RESTART and not selectors:
            selectors, f = ["brokers"], {**f, "brokers": "all"}
        if len(selectors) != 1:
            raise r.bad(path, "needs exactly one of broker, brokers, rack")
        sel = selectors[0]
        if sel == "broker":
            b = r.number(f["broker"], f"{path}.broker", integer=True)
            if b not in ids:
                raise r.bad(f"{path}.broker", f"not a broker id of the cluster ({', '.join(map(str, ids))})")
            targets, group = (int(b),), False
        elif sel == "rack":
            if f["rack"] not in racks:
                raise r.bad(f"{path}.rack", f"unknown rack {f['rack']!r} (racks: {', '.join(racks)})")
            targets, group = tuple(b.id for b in brokers if b.rack == f["rack"]), True
        elif f["brokers"] == "all":
            targets, group = ids, True
        else:
            lst = f["brokers"]
            if not isinstance(lst, list) or not lst:
                raise r.bad(f"{path}.brokers", "must be 'all' or a non-empty list of broker ids")
            for j, b in enumerate(lst):
                if isinstance(b, bool) or b not in ids:
                    raise r.bad(f"{path}.brokers[{j}]", f"not a broker id of the cluster ({', '.join(map(str, ids))})")
            targets, group = tuple(dict.fromkeys(int(b) for b in lst)), True
        downtime = gap = None
        if kind is FaultKind.ROLLING_RESTART:
            downtime = r.number(f["downtime_ms"], f"{path}.downtime_ms", ge=0)
            gap = r.number(f.get("gap_ms", 0.0), f"{path}.gap_ms", ge=0)
        out.append((ScheduledFault(at_ms, kind, targets, group, downtime, gap), path))
    # Check the single-broker entries now, at scale 1, so that a bad file fails before any Spark work.
    check_scheduled([s for s, _ in out], [p for _, p in out], ids, duration_ms, bad=r.bad)
    return tuple(s for s, _ in out)


# ---------------------------------------------------------------------------------------------------------
# Loading


def read_yaml_file(p: Path, *, what: str) -> tuple[Any, str]:
    """A YAML input file's content and its path as shown in errors; BadInput (rule `what`) naming the file, and
    the line where the YAML breaks, when it is missing or not YAML."""
    shown = display_path(p)
    if not p.is_file():
        raise BadInput(f"{what} file does not exist", file=shown, rule=what)
    try:
        return yaml.safe_load(p.read_text()), shown
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise BadInput(f"not valid YAML{where}: {getattr(exc, 'problem', exc)}", file=shown, rule=what) from exc


def load_scenario_file(path: str | Path) -> Scenario:
    p = Path(path)
    raw, shown = read_yaml_file(p, what="scenario")
    return parse_scenario(raw, file=shown, default_name=p.stem.lower())


def display_path(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        pass
    # Library files read well as conf/scenarios/<name>.yaml wherever replab is installed.
    if p.parent.name == "scenarios" and p.parent.parent.name == "conf":
        return f"conf/scenarios/{p.name}"
    return str(p)

