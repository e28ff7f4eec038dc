"""The durability judge replays one episode trace under every preset with shared work (`replay.local.SplitTrace`:
routing per routing key and layout, broker events per replica set, order checks instead of sorts). Its results
must be exactly those of a plain replay that splits, routes, selects and sorts the trace anew for every policy and
unit, on episodes of every kind of fault."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from engine.durability.episodes import EpisodeSampler
from engine.durability.judge import TraceShape, base_scenario, episode_trace, judge_episode, verdict
from generators.library import resolve_scenario
from generators.rates import load_rates
from replay.events import PartitionEvents
from replay.families import engine_context, family_of
from replay.family import RouteInput
from replay.local import SplitTrace, msg_rank, replay_local
from replay.policies import all_presets
from schemas.trace import CONTROL_KINDS, UNKNOWN_KIND, Kind, kind_codes

SHAPE = TraceShape(trace_rate_per_s=20.0, max_gap_s=40.0, tail_s=10.0)  # short traces: the claim holds for any
PRESETS = [p for _, p in all_presets()]


def plain_unit_events(policy, manifest, table) -> dict[int, PartitionEvents]:
    """Every unit's events built from the raw table for this policy alone: a mask per unit, the unit's replicas'
    broker events by `np.isin`, both sorted by `np.lexsort` (SPEC §2.2 order)."""
    kind = kind_codes(table.column("kind"))
    assert not (kind == UNKNOWN_KIND).any()
    col = {n: table.column(n).to_numpy(zero_copy_only=False) for n in ("ts_us", "msg_id", "size_bytes", "broker")}
    prod = kind == Kind.PRODUCE
    ts, msg, size = (col[n][prod].astype(np.int64) for n in ("ts_us", "msg_id", "size_bytes"))
    keys = np.array(table.column("key").to_pylist(), dtype=object)[prod]
    upto = table.column("upto_us").to_numpy(zero_copy_only=False).astype(float)
    b_ts, b_kind = col["ts_us"][~prod].astype(np.int64), kind[~prod]
    b_id, b_upto = col["broker"][~prod].astype(np.int64), np.where(np.isnan(upto), 0, upto)[~prod].astype(np.int64)
    is_control = np.isin(b_kind, [int(k) for k in CONTROL_KINDS])
    c = np.lexsort((b_id[is_control], b_kind[is_control], b_ts[is_control]))
    control = PartitionEvents(ts[:0], msg[:0], size[:0], b_ts[is_control][c], b_kind[is_control][c],
                              b_id[is_control][c], b_upto[is_control][c])
    fam = family_of(policy)
    layout = fam.layout(policy, manifest)
    routed = fam.route(policy, manifest, layout, control, RouteInput(ts, msg_rank(msg), list(keys)))
    delay = routed.delay_us if routed.delay_us is not None else np.zeros(len(ts), dtype=np.int64)
    out = {}
    for u in layout.units:
        sel = routed.unit == u
        p = np.lexsort((msg[sel], ts[sel]))
        hosted = np.isin(b_id, layout.replicas[u])
        b = np.lexsort((b_id[hosted], b_kind[hosted], b_ts[hosted]))
        payload = {"part": routed.partition[sel].astype(np.int64)[p], "delay": delay[sel].astype(np.int64)[p]}
        out[u] = PartitionEvents(ts[sel][p], msg[sel][p], size[sel][p], b_ts[hosted][b], b_kind[hosted][b],
                                 b_id[hosted][b], b_upto[hosted][b], payload)
    return out


def plain_replay(policy, manifest, table) -> list:
    fam = family_of(policy)
    layout = fam.layout(policy, manifest)
    events = plain_unit_events(policy, manifest, table)
    context = engine_context(policy, manifest, SplitTrace(table).control)
    results = []
    for u in layout.units:
        replay = fam.kernel(policy, u, layout.replicas[u], manifest.duration_us, **context)
        replay.advance(events[u], manifest.duration_us + 1)
        results.append(replay.finish())
    return results


def assert_identical(a, b, where: str) -> None:
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b), where
    elif dataclasses.is_dataclass(a) and not isinstance(a, type):
        assert type(a) is type(b), where
        for f in dataclasses.fields(a):
            assert_identical(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_identical(a[k], b[k], f"{where}[{k}]")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_identical(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


@pytest.fixture(scope="module")
def episodes():
    """One seeded episode of each of three fault processes on `demo`: a crash, a rack power loss, a rolling
    restart (the last two touch several brokers, so units differ in what they see)."""
    scenario = resolve_scenario("demo")
    rates = load_rates()
    sampler = EpisodeSampler(rates, {b.id: b.rack for b in scenario.brokers})
    base = base_scenario(scenario)
    out = []
    for name in ("crash", "rack_power_loss", "rolling_restart"):
        k = rates.names.index(name)
        ep = sampler.sample(k, np.random.default_rng([7, k, 0]))
        out.append((base, ep, k, *episode_trace(base, ep, SHAPE, k, 11 + k)))
    return out


def test_shared_replay_and_judged_verdicts_equal_a_plain_replay_per_policy(episodes):
    lost = 0
    for base, ep, k, manifest, table, gaps in episodes:
        split = SplitTrace(table)
        plain_verdicts = []
        for policy in PRESETS:
            shared = replay_local(policy, manifest, table, split=split)
            plain = plain_replay(policy, manifest, table)
            assert_identical(shared, plain, f"episode {k} {policy.canonical()}")
            plain_verdicts.append(verdict(policy, family_of(policy).layout(policy, manifest), plain, gaps, 2.0))
        assert judge_episode(base, ep, PRESETS, SHAPE, k, 11 + k, 40.0) == plain_verdicts
        lost += sum(v.lost for v in plain_verdicts)
    assert lost > 0  # the episodes exercise losses, not only clean replays
