"""The vectorized Kafka kernel against the reference interpreter (SPEC §9), and chunked against one pass.

A failing case prints the trace and policy; `@reproduce_failure` lines from Hypothesis replay it.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay.local import replay_local
from replay.results import coalesce_states

from .strategies import kafka_policies, traces

WINDOW_US = 1_000_000
FAST = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
SLOW = settings(max_examples=20000, deadline=None, suppress_health_check=list(HealthCheck))


def outcome_rows(result) -> list[tuple]:
    j = result.messages
    r = j.records
    return sorted(zip(r.msg_id.tolist(), r.produce_us.tolist(), r.status.tolist(), r.error.tolist(),
                      r.ack_us.tolist(), r.visible_us.tolist(), j.fate.tolist(), j.readable_at_end.tolist(),
                      j.offset.tolist()))


def assert_same(ref_results, kernel_results, context) -> None:
    assert len(ref_results) == len(kernel_results)
    for ref, ker in zip(ref_results, kernel_results):
        assert outcome_rows(ker) == outcome_rows(ref), context
        assert ker.states == coalesce_states(ref.states, WINDOW_US), context
        assert ker.unavailable == ref.unavailable, context
        assert ker.replication_bytes == ref.replication_bytes, context


@st.composite
def cases(draw):
    manifest, table = draw(traces())
    policy = draw(kafka_policies(len(manifest.brokers)))
    return manifest, table, policy


def _check(case) -> None:
    manifest, table, policy = case
    context = f"{policy.canonical()}\n{table.to_pandas().to_string()}\nduration={manifest.duration_us}"
    ref = replay_local(policy, manifest, table, engine="reference")
    ker = replay_local(policy, manifest, table, engine="kernel")
    assert_same(ref, ker, context)


@FAST
@given(cases())
def test_kernel_matches_reference(case):
    _check(case)


@SLOW
@given(cases())
def test_kernel_matches_reference_many(case):
    _check(case)


test_kernel_matches_reference_many = __import__("pytest").mark.slow(test_kernel_matches_reference_many)


@FAST
@given(cases(), st.lists(st.integers(0, 60_000_000), max_size=6))
def test_chunked_equals_one_pass(case, cuts):
    manifest, table, policy = case
    one = replay_local(policy, manifest, table, engine="kernel")
    cuts = sorted({c for c in cuts if 0 < c <= manifest.duration_us})
    chunked = replay_local(policy, manifest, table, engine="kernel", chunks=cuts)
    for a, b in zip(one, chunked):
        assert outcome_rows(a) == outcome_rows(b), (policy.canonical(), cuts)
        assert a.states == b.states and a.unavailable == b.unavailable
        assert a.replication_bytes == b.replication_bytes


def test_strategy_produces_faults_and_traffic():
    """The generator is not degenerate: it yields faults, reports and produces together."""
    seen = set()

    @settings(max_examples=60, deadline=None)
    @given(traces())
    def collect(trace):
        kinds = set(trace[1].column("kind").to_pylist())
        seen.update(kinds)

    collect()
    assert {"produce", "replicate", "crash", "restart", "isolate", "heal"} <= seen
    assert np.int64  # keep numpy import used for readers extending this file
