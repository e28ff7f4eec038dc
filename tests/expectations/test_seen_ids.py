"""`SeenIds` (expectations/trace_rules.py), the msg_ids a trace's produce rows have shown so far: after any
sequence of chunks it answers membership exactly as a set does, its runs stay sorted, and their number stays
logarithmic (what keeps the duplicate rule linear over a 10 M-event trace)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from expectations.trace_rules import SeenIds

chunks = st.lists(st.lists(st.integers(-50, 400), min_size=1, max_size=40), max_size=30)


@settings(max_examples=300, deadline=None)
@given(chunks, st.lists(st.integers(-60, 420), min_size=1, max_size=50))
def test_seen_ids_answers_as_a_set(batches, probes):
    seen, reference = SeenIds(), set()
    for batch in batches:
        ids = np.array(batch, dtype=np.int64)
        assert seen.contains(ids).tolist() == [i in reference for i in batch]
        seen.add(ids)
        reference.update(batch)
        assert all(np.all(np.diff(run) > 0) for run in seen.runs)  # sorted, no id twice within a run
    assert seen.contains(np.array(probes, dtype=np.int64)).tolist() == [p in reference for p in probes]


def test_runs_stay_logarithmic_with_increasing_ids():
    seen = SeenIds()
    for start in range(0, 1_000_000, 1_000):
        seen.add(np.arange(start, start + 1_000, dtype=np.int64))
        assert len(seen.runs) <= math.log2((start + 1_000) / 1_000) + 1
    assert sum(len(r) for r in seen.runs) == 1_000_000
    assert seen.contains(np.array([0, 999_999, 1_000_000])).tolist() == [True, True, False]
