"""Scenario files (SPEC §8): the library parses, bad files are BadInput naming file and key (exit code 2)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from generators.library import list_scenarios, resolve_scenario, scenario_files
from generators.model import DistKind, FaultKind, ShapeKind
from generators.scenario import load_scenario_file, parse_scenario
from generators.timeline import fault_events, stall_episodes
from schemas.errors import BadInput
from schemas.trace import Kind

#: Reference §E scenarios the trace format can express (K12 needs client retries; it is left out, SPEC §3.1).
REFERENCE_SCENARIOS = ("k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8", "k9", "k10", "k11", "k13",
                       "r1", "r2", "r3", "r4", "r5", "r6", "p1")
MIXES = ("steady-state", "rolling-restart", "rack-power-loss", "flaky-network", "slow-disk",
         "full-cluster-power-loss", "chaos", "demo", "dledger5-single-failure", "dledger5-double-failure")

MINIMAL = {
    "description": "minimal",
    "cluster": {"brokers": 3, "racks": ["a", "b"]},
    "workload": {"duration_s": 10, "rate_per_s": 100},
}


def write(tmp_path: Path, doc: dict | str, name: str = "bad.yaml") -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return path


def with_(base: dict, **changes) -> dict:
    """A deep copy of base with dotted keys set (value None deletes)."""
    doc = copy.deepcopy(base)
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = doc
        for p in parents:
            node = node.setdefault(p, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return doc


def test_library_covers_the_reference_and_the_mixes():
    names = set(scenario_files())
    prefixes = {n.split("-")[0] for n in names}
    assert set(REFERENCE_SCENARIOS) <= prefixes
    assert set(MIXES) <= names


@pytest.mark.parametrize("name", sorted(scenario_files()))
def test_every_library_file_parses(name):
    sc = load_scenario_file(scenario_files()[name])
    assert sc.name == name
    assert sc.description and "\n" not in sc.description
    assert sc.source == f"conf/scenarios/{name}.yaml" or sc.source.endswith(f"{name}.yaml")
    # Realistic scale, not a handful of messages (reference §E timelines are 3-message sketches).
    assert sc.workload.rate_per_s * sc.workload.duration_s >= 2000
    # Every scheduled fault lands inside the trace and the timeline is valid (fault_events asserts it).
    events = fault_events(sc, seed=0, scale=1.0)
    assert all(0 <= e.ts_us <= sc.workload.duration_s * 1e6 for e in events)


def test_library_descriptions_are_what_replab_scenarios_prints():
    rows = dict(list_scenarios())
    out = subprocess.run([sys.executable, "-m", "pipelines", "scenarios", "--format", "json"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    printed = {r["name"]: r["description"] for r in json.loads(out.stdout)}
    assert printed == rows
    assert printed["demo"].startswith("demo: 6 brokers")
    table = subprocess.run([sys.executable, "-m", "pipelines", "scenarios"], capture_output=True, text=True,
                           timeout=120)
    assert table.returncode == 0 and "k2-acks1-leader-crash" in table.stdout and "chaos" in table.stdout


def test_demo_meets_its_brief():
    sc = resolve_scenario("demo")
    assert len(sc.brokers) == 6 and len(sc.racks) == 3
    assert 120 <= sc.workload.duration_s <= 180 and 2000 <= sc.workload.rate_per_s <= 5000
    kinds = {e.kind for e in fault_events(sc, 0, 1.0)}
    assert {Kind.CRASH, Kind.ISOLATE, Kind.POWER_LOSS} <= kinds
    assert sc.replication.stalls and sc.replication.stalls[0].to_ms - sc.replication.stalls[0].from_ms > 30000


def test_minimal_file_gets_documented_defaults(tmp_path):
    sc = load_scenario_file(write(tmp_path, MINIMAL, "tiny.yaml"))
    assert sc.name == "tiny"
    assert [(b.id, b.rack) for b in sc.brokers] == [(0, "a"), (1, "b"), (2, "a")]
    assert sc.workload.shape.kind is ShapeKind.CONSTANT
    assert sc.workload.size_bytes.kind is DistKind.LOGNORMAL
    assert sc.replication.default.fetch_interval_ms == 10.0 and sc.replication.default.delay_ms.max == 200.0
    assert sc.faults.scheduled == () and sc.faults.random == ()
    assert sc.to_json()["workload"]["rate_per_s"] == 100


def test_full_file_parses_every_section(tmp_path):
    doc = yaml.safe_load(textwrap.dedent("""
        name: full
        description: every section
        cluster: {brokers: [{id: 3, rack: x}, {id: 7, rack: y}, {id: 9, rack: y}]}
        workload:
          duration_s: 60
          rate_per_s: 500
          shape: {kind: diurnal, period_s: 30, amplitude: 0.5, phase: 0.25}
          producers: 3
          keys: {count: 50, zipf_s: 0, unkeyed_share: 0.5}
          size_bytes: {dist: uniform, min: 10, max: 20}
        replication:
          fetch_interval_ms: 20
          fetch_jitter_ms: 5
          delay_ms: {dist: exponential, mean: 3, max: 50}
          catchup_speed: 2.5
          gc_pause: {every_s: 10, length_ms: 100}
          brokers: {7: {fetch_interval_ms: 100, slow_follower: {every_s: 20, length_s: {dist: fixed, value: 2}}}}
          stalls: [{broker: 9, from_ms: 1000, to_ms: 2000}]
        faults:
          scheduled:
            - {at_ms: 5000, kind: power_loss, rack: y}
            - {at_ms: 9000, kind: restart, brokers: all}
            - {at_ms: 20000, kind: rolling_restart, downtime_ms: 1000, gap_ms: 500}
          random:
            crash: {mtbf_s: 30, mttr_s: {dist: lognormal, median: 2, sigma: 0.5}}
            rack_power_loss: {mtbf_s: 100, mttr_s: 5}
            rolling_restart: {mtbf_s: 200, downtime_s: 1}
    """))
    sc = parse_scenario(doc, file="full.yaml")
    assert sc.broker_ids == (3, 7, 9) and sc.racks == ("x", "y")
    assert sc.workload.shape.period_s == 30 and sc.workload.keys.unkeyed_share == 0.5
    assert sc.replication.for_broker(7).fetch_interval_ms == 100
    assert sc.replication.for_broker(7).delay_ms.kind is DistKind.EXPONENTIAL  # inherited from the default
    assert sc.replication.for_broker(3).slow_follower is None
    assert [s.kind for s in sc.faults.scheduled] == [FaultKind.POWER_LOSS, FaultKind.RESTART,
                                                     FaultKind.ROLLING_RESTART]
    assert sc.faults.scheduled[0].brokers == (7, 9) and sc.faults.scheduled[2].brokers == (3, 7, 9)
    assert [name for name, _ in sc.faults.random] == ["crash", "rack_power_loss", "rolling_restart"]
    events = fault_events(sc, 4, 1.0)
    assert [(e.kind, e.broker) for e in events if e.ts_us == 5_000_000] == [(Kind.POWER_LOSS, 7), (Kind.POWER_LOSS, 9)]
    assert [(e.kind, e.broker) for e in events if e.ts_us == 9_000_000] == [(Kind.RESTART, 7), (Kind.RESTART, 9)]
    rolling = [(e.ts_us, e.kind, e.broker) for e in events if e.ts_us >= 20_000_000 and e.kind in
               (Kind.SHUTDOWN, Kind.RESTART)][:6]
    assert rolling == [(20_000_000, Kind.SHUTDOWN, 3), (21_000_000, Kind.RESTART, 3),
                       (21_500_000, Kind.SHUTDOWN, 7), (22_500_000, Kind.RESTART, 7),
                       (23_000_000, Kind.SHUTDOWN, 9), (24_000_000, Kind.RESTART, 9)]


@pytest.mark.parametrize(("change", "key", "why"), [
    ({"speed": 1}, "speed", "unknown key"),
    ({"workload__rate": 5}, "workload.rate", "unknown key"),
    ({"workload__rate_per_s": 0}, "workload.rate_per_s", "must be > 0"),
    ({"workload__rate_per_s": "fast"}, "workload.rate_per_s", "must be a number"),
    ({"workload__duration_s": None}, "workload.duration_s", "missing"),
    ({"description": None}, "description", "missing"),
    ({"description": "two\nlines"}, "description", "one line"),
    ({"name": "Bad Name"}, "name", "lowercase"),
    ({"cluster__brokers": 0}, "cluster.brokers", "must be >= 1"),
    ({"cluster__brokers": 2.5}, "cluster.brokers", "integer"),
    ({"workload__producers": True}, "workload.producers", "integer"),
    ({"workload__keys": {"count": 10, "zipf": 1}}, "workload.keys.zipf", "unknown key"),
    ({"workload__keys": {"unkeyed_share": 1.5}}, "workload.keys.unkeyed_share", "must be <= 1"),
    ({"workload__shape": {"kind": "sawtooth"}}, "workload.shape.kind", "must be one of"),
    ({"workload__shape": {"kind": "diurnal", "period_s": 10, "amplitude": 1.0}}, "workload.shape.amplitude",
     "must be < 1"),
    ({"workload__size_bytes": {"dist": "lognormal", "median": 100}}, "workload.size_bytes.sigma", "missing"),
    ({"workload__size_bytes": {"dist": "gamma"}}, "workload.size_bytes.dist", "must be one of"),
    ({"workload__size_bytes": {"dist": "uniform", "min": 10, "max": 5}}, "workload.size_bytes.max", "must be >= min"),
    ({"workload__size_bytes": 0}, "workload.size_bytes", "must be >= 1"),
    ({"replication__fetch_jitter_ms": 6}, "replication.fetch_jitter_ms", "must be < fetch_interval_ms / 2"),
    ({"replication__delay_ms": {"dist": "lognormal", "median": 2, "sigma": 1}}, "replication.delay_ms.max",
     "must be bounded"),
    ({"replication__catchup_speed": 1}, "replication.catchup_speed", "must be > 1"),
    ({"replication__brokers": {5: {"fetch_interval_ms": 5}}}, "replication.brokers.5", "not a broker id"),
    ({"replication__brokers": {1: {"fetch_every_ms": 5}}}, "replication.brokers.1.fetch_every_ms", "unknown key"),
    ({"replication__stalls": [{"broker": 1, "from_ms": 500, "to_ms": 100}]}, "replication.stalls[0].to_ms",
     "must be > 500"),
    ({"replication__gc_pause": {"every_s": 0, "length_ms": 10}}, "replication.gc_pause.every_s", "must be > 0"),
    ({"faults__scheduled": [{"at_ms": 100, "kind": "explode", "broker": 0}]}, "faults.scheduled[0].kind",
     "must be one of"),
    ({"faults__scheduled": [{"at_ms": 100, "kind": "crash", "broker": 4}]}, "faults.scheduled[0].broker",
     "not a broker id"),
    ({"faults__scheduled": [{"at_ms": 100, "kind": "crash", "rack": "z"}]}, "faults.scheduled[0].rack",
     "unknown rack"),
    ({"faults__scheduled": [{"at_ms": 100, "kind": "crash"}]}, "faults.scheduled[0]", "exactly one of"),
    ({"faults__scheduled": [{"at_ms": 20000, "kind": "crash", "broker": 0}]}, "faults.scheduled[0].at_ms",
     "must be <= 10000"),
    ({"faults__scheduled": [{"at_ms": 100, "kind": "crash", "broker": 0, "until_ms": 5}]},
     "faults.scheduled[0].until_ms", "unknown key"),
    ({"faults__scheduled": [{"at_ms": 100, "kind": "restart", "broker": 0}]}, "faults.scheduled[0]",
     "broker 0 is up"),
    ({"faults__scheduled": [{"at_ms": 100, "kind": "crash", "broker": 0},
                            {"at_ms": 200, "kind": "shutdown", "broker": 0}]}, "faults.scheduled[1]",
     "already down"),
    ({"faults__scheduled": [{"at_ms": 100, "kind": "heal", "broker": 1}]}, "faults.scheduled[0]",
     "not isolated"),
    ({"faults__scheduled": [{"at_ms": 9000, "kind": "rolling_restart", "downtime_ms": 1000, "gap_ms": 0}]},
     "faults.scheduled[0]", "ends after the trace"),
    ({"faults__random": {"crash": {"mtbf_s": 10}}}, "faults.random.crash.mttr_s", "missing"),
    ({"faults__random": {"meteor": {"mtbf_s": 10, "mttr_s": 1}}}, "faults.random.meteor", "unknown key"),
    ({"faults__random": {"isolate": {"mtbf_s": -1, "mttr_s": 1}}}, "faults.random.isolate.mtbf_s", "must be > 0"),
])
def test_bad_values_name_file_and_key(tmp_path, change, key, why):
    path = write(tmp_path, with_(MINIMAL, **change))
    with pytest.raises(BadInput) as err:
        load_scenario_file(path)
    message = str(err.value)
    assert message.startswith(f"{path}: key '{key}': ") or message.startswith(f"{err.value.file}: key '{key}': ")
    assert str(path.name) in message and why in message, message
    assert err.value.exit_code == 2


def test_group_events_skip_brokers_in_the_wrong_state(tmp_path):
    doc = with_(MINIMAL, faults__scheduled=[
        {"at_ms": 1000, "kind": "crash", "broker": 1},
        {"at_ms": 2000, "kind": "power_loss", "brokers": "all"},  # broker 1 is already down: skipped
        {"at_ms": 3000, "kind": "restart", "brokers": [0, 1]},
        {"at_ms": 4000, "kind": "heal", "rack": "a"},  # nobody is isolated: a no-op
    ])
    events = fault_events(load_scenario_file(write(tmp_path, doc)), 0, 1.0)
    assert [(e.ts_us // 1000, e.kind.label, e.broker) for e in events] == [
        (1000, "crash", 1), (2000, "power_loss", 0), (2000, "power_loss", 2), (3000, "restart", 0),
        (3000, "restart", 1)]


def test_not_yaml_and_missing_file(tmp_path):
    with pytest.raises(BadInput, match="not valid YAML at line 3"):
        load_scenario_file(write(tmp_path, "description: x\ncluster: [1, 2\nworkload: {}\n"))
    with pytest.raises(BadInput, match="does not exist"):
        load_scenario_file(tmp_path / "nope.yaml")
    with pytest.raises(BadInput, match=r"unknown scenario 'no-such-scenario'.*demo"):
        resolve_scenario("no-such-scenario")
    with pytest.raises(BadInput, match="key 'cluster': must be a mapping"):
        load_scenario_file(write(tmp_path, with_(MINIMAL, cluster=[1, 2])))


def test_scale_stretches_the_fault_profile_keeping_its_shape():
    """Same seed, any scale: the same faults in the same order at the same fractions of the trace."""
    chaos = resolve_scenario("chaos")
    base = fault_events(chaos, 7, 1.0)
    assert len({e.kind for e in base}) >= 5  # chaos has faults of every kind
    for scale in (0.05, 0.5, 3.0):
        scaled = fault_events(chaos, 7, scale)
        assert [(e.kind, e.broker) for e in scaled] == [(e.kind, e.broker) for e in base]
        assert all(abs(s.ts_us - b.ts_us * scale) <= 1 + scale for s, b in zip(scaled, base, strict=True))
    k2 = resolve_scenario("k2-acks1-leader-crash")
    assert [e.ts_us for e in fault_events(k2, 0, 0.5)] == [13_513_500, 30_000_000]
    # GC pauses are a JVM property: same real-time rate, so a longer trace has more of them, same lengths.
    steady = resolve_scenario("steady-state")
    short, long = stall_episodes(steady, 1, 1.0)[0], stall_episodes(steady, 1, 4.0)[0]
    assert len(long) > 2 * len(short) and long[: len(short)] == short


def test_cli_exit_code_2_names_file_and_key(tmp_path):
    bad = write(tmp_path, with_(MINIMAL, workload__rate_per_s=-3), "broken.yaml")
    out = subprocess.run([sys.executable, "-m", "pipelines", "generate", "--scenario", str(bad), "--out",
                          str(tmp_path / "t")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "broken.yaml: key 'workload.rate_per_s': must be > 0" in lines[0], out.stderr
    assert not (tmp_path / "t").exists()
    for args, text in ((["--scenario", "nope"], "unknown scenario 'nope'"),
                       (["--scenario", "demo", "--scale", "0"], "--scale must be a number > 0"),
                       (["--scenario", "demo", "--seed", "-1"], "--seed must be an integer")):
        out = subprocess.run([sys.executable, "-m", "pipelines", "generate", *args, "--out", str(tmp_path / "t")],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and text in out.stderr, out.stderr
