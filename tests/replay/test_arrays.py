"""The kernels' shared containers."""

import numpy as np
import pytest

from replay.shared.kernels.arrays import Table


def test_tables_built_from_one_column_spec_do_not_share_added_columns():
    """A kernel adds payload columns to its own table (RocketMQ: `keyid` from the Spark layer); a later kernel
    built from the same module-level spec must not expect them (it did, and failed with KeyError: 'keyid')."""
    spec = {"msg": np.int64}
    first = Table(spec)
    first.dtypes["keyid"] = np.int64
    first.cols["keyid"] = np.zeros(0, dtype=np.int64)
    second = Table(spec)
    assert spec == {"msg": np.int64}
    assert second.append(msg=np.array([7, 8])).tolist() == [0, 1]
    assert second.cols["msg"][:2].tolist() == [7, 8]


def test_a_pickled_table_keeps_its_rows_not_its_capacity():
    """Stream mode pickles its groups' kernels, whose tables reserve room ahead (unset slots)."""
    import pickle

    from replay.shared.kernels.arrays import reserve_rows

    table = Table({"msg": np.int64, "state": np.int8})
    table.append(msg=np.arange(5), state=np.arange(5, dtype=np.int8))
    reserve_rows(table, 100_000)
    blob = pickle.dumps(table)
    assert len(blob) < 2_000
    again = pickle.loads(blob)
    assert again.n == 5 and again["msg"].tolist() == [0, 1, 2, 3, 4] and again["state"].tolist() == [0, 1, 2, 3, 4]
    assert again.append(msg=np.array([9]), state=np.array([9], dtype=np.int8)).tolist() == [5]
    assert again["msg"].tolist() == [0, 1, 2, 3, 4, 9]


def test_compiled_helpers_agree_with_their_numpy_definitions():
    """The numba helpers the kernels use in place of numpy expressions compute exactly those expressions."""
    from replay.shared.kernels.arrays import forward_fill, kth_largest_columns, member_index, merge_order

    rng = np.random.default_rng(0)
    for m in range(1, 7):
        stack = rng.integers(0, 5, (m, 40))
        for k in range(1, m + 2):
            expected = np.sort(stack, axis=0)[::-1][k - 1] if k <= m else np.zeros(40, dtype=np.int64)
            assert kth_largest_columns(stack, k).tolist() == expected.tolist()
    for _ in range(20):
        a, b = np.sort(rng.integers(0, 20, 30)), np.sort(rng.integers(0, 20, rng.integers(0, 25)))
        expected = np.argsort(np.concatenate([a, b]), kind="stable")
        assert merge_order(a, b).tolist() == expected.tolist()
    idx, values = np.array([2, 5, 5, 9]), np.array([10, 20, 30, 40])
    assert forward_fill(idx, values, 11, -1).tolist() == [-1, -1, 10, 10, 10, 30, 30, 30, 30, 40, 40]
    ids, members = rng.integers(-1, 8, 200), np.array([5, 2, 7])
    expected = np.full(200, -1)
    for i, b in enumerate(members):
        expected[ids == b] = i
    assert member_index(ids, members).tolist() == expected.tolist()


def test_hand_over_moves_settled_rows_keeps_the_rest_in_order_and_the_columns_capacity():
    from replay.shared.kernels.arrays import reserve_rows
    from replay.shared.kernels.records import all_records, hand_over_settled, record_table

    pend = Table({"msg_id": np.int64, "produce_us": np.int64, "state": np.int8, "error": np.int8, "ack_us": np.int64,
                  "visible_us": np.int64, "epoch": np.int64, "offset": np.int64, "key": np.int64})
    msg = np.arange(10, 20)
    pend.append(msg_id=msg, produce_us=msg * 10, state=np.array([0, 3, 4, 0, 3, 0, 4, 0, 3, 5], dtype=np.int8),
                error=np.array([0, 0, 2, 0, 0, 0, 1, 0, 0, 0], dtype=np.int8), ack_us=msg * 100, visible_us=msg * 1000,
                epoch=msg % 3, offset=msg, key=-msg)
    reserve_rows(pend, 100)
    capacity = len(pend.cols["msg_id"])
    recs = record_table(("key",))
    remap = hand_over_settled(pend, recs, np.arange(10) % 2 == 1, ("key",), 3, 4)
    assert pend["msg_id"].tolist() == [10, 12, 14, 16, 18] and pend["state"].tolist() == [0, 4, 3, 4, 3]
    assert pend["error"].tolist() == [0, 2, 0, 1, 0] and pend["key"].tolist() == [-10, -12, -14, -16, -18]
    assert remap.tolist() == [0, -1, 1, -1, 2, -1, 3, -1, 4, -1]
    assert len(pend.cols["msg_id"]) == capacity  # the next stretch's rows fit without a reallocation
    assert recs["msg_id"].tolist() == [11, 13, 15, 17, 19] and recs["key"].tolist() == [-11, -13, -15, -17, -19]
    assert recs["status"].tolist() == [0, 2, 2, 2, 2]  # state 3 (acked) -> ACKED; 0 and 5 -> PENDING
    pend.append(msg_id=np.array([99]), produce_us=np.array([990]), state=np.array([4], dtype=np.int8),
                error=np.array([3], dtype=np.int8), ack_us=np.array([0]), visible_us=np.array([0]), epoch=np.array([0]),
                offset=np.array([0]), key=np.array([-99]))
    rec = all_records(pend, recs, ("key",), 3, 4)
    assert rec.msg_id.tolist() == [11, 13, 15, 17, 19, 10, 12, 14, 16, 18, 99] and pend.n == 0
    assert rec.status.tolist() == [0, 2, 2, 2, 2, 2, 1, 0, 1, 0, 1]  # state 4 (failed) -> FAILED
    assert rec.error.tolist() == [0, 0, 0, 0, 0, 0, 2, 0, 1, 0, 3]
    assert rec.ack_us.tolist()[-1] == 0 and rec.payload["key"].tolist()[5:] == [-10, -12, -14, -16, -18, -99]


def test_records_sorted_by_msg_id_whether_or_not_they_arrive_sorted():
    from replay.results import MessageRecords

    def records(ids):
        ids = np.array(ids, dtype=np.int64)
        r = MessageRecords(ids, ids * 10, np.zeros(len(ids), np.int8), np.zeros(len(ids), np.int8), ids, ids, ids,
                           ids)
        r.payload = {"pid": ids + 1}
        return r

    for ids in ([1, 2, 2, 5], [5, 1, 2, 2], []):
        out = records(ids).sorted_by_msg_id()
        assert out.msg_id.tolist() == sorted(ids)
        assert out.produce_us.tolist() == [10 * i for i in sorted(ids)]
        assert out.payload["pid"].tolist() == [i + 1 for i in sorted(ids)]


def test_compiled_judge_agrees_with_the_results_judge():
    """The kernels judge fates in one compiled pass (`replay.shared.kernels.judge`); `replay.results.judge` (which the
    reference interpreter uses) is the definition."""
    from replay.results import FinalView, MessageRecords
    from replay.results import judge as judge_numpy
    from replay.shared.kernels.judge import judge

    rng = np.random.default_rng(1)

    def runs(k):
        ends = np.cumsum(rng.integers(1, 6, k))
        return np.stack([rng.integers(0, 4, k), ends - rng.integers(1, 3, k).clip(max=ends - np.r_[0, ends[:-1]]),
                         ends], axis=1).astype(np.int64).reshape(-1, 3)

    for _ in range(200):
        n = int(rng.integers(0, 40))
        pe, po = rng.integers(-1, 4, n), rng.integers(-1, 25, n)
        rec = MessageRecords(np.arange(n), np.zeros(n, np.int64), np.zeros(n, np.int8), np.zeros(n, np.int8),
                             np.zeros(n, np.int64), np.zeros(n, np.int64), pe, po)
        final = None if rng.random() < 0.2 else runs(int(rng.integers(0, 5)))
        view = FinalView(final, runs(int(rng.integers(0, 5))), int(rng.integers(0, 25)), bool(rng.random() < 0.8))
        got, want = judge(rec, view), judge_numpy(rec, view)
        for name in ("fate", "readable_at_end", "offset"):
            assert getattr(got, name).tolist() == getattr(want, name).tolist(), name
            assert getattr(got, name).dtype == getattr(want, name).dtype, name


def _replay_with_growth(monkeypatch, fill: int, trace: str, scale: float, policy: str) -> tuple[list, int]:
    """The kernels' results on a library trace when the slots a buffer grows by (unset in production) are filled
    with byte `fill`, and how many compactions ran."""
    from replay.local import replay_local
    from replay.policies import parse_policy
    from replay.shared.kernels import arrays
    from studies.dledger_vs_kafka import load_trace

    def grown(buf, n, capacity):
        new = np.empty(capacity, dtype=buf.dtype)
        new.view(np.uint8).fill(fill)
        new[:n] = buf[:n]
        return new

    monkeypatch.setattr(arrays, "_grown", grown)
    keeps = _count_compactions(monkeypatch)
    manifest, table = load_trace(trace, 1, scale)
    results = replay_local(parse_policy(policy), manifest, table)
    monkeypatch.undo()
    return results, len(keeps)


def _count_compactions(monkeypatch) -> list[int]:
    """The rows each compaction of a kernel's pending table keeps (`_compact`, which hands the settled messages
    over to the records, `records.hand_over`), as the kernels run."""
    from replay.kafka.kernels.outputs import KafkaOutputs
    from replay.rocketmq.kernels.messages import GroupMessages

    kept: list[int] = []
    for family in (KafkaOutputs, GroupMessages):
        def counted(self, compact=family._compact):
            before = self.pend.n
            compact(self)
            if self.pend.n < before:
                kept.append(self.pend.n)

        monkeypatch.setattr(family, "_compact", counted)
    return kept


def _everything(results) -> list:
    out = []
    for r in results:
        rec, j = r.messages.records, r.messages
        payload = {k: v.tolist() for k, v in sorted((rec.payload or {}).items())}
        out.append((rec.msg_id.tolist(), rec.produce_us.tolist(), rec.status.tolist(), rec.error.tolist(),
                    rec.ack_us.tolist(), rec.visible_us.tolist(), rec.pos_epoch.tolist(), rec.pos_offset.tolist(),
                    rec.extra_positions.tolist(), payload,
                    j.fate.tolist(), j.readable_at_end.tolist(), j.offset.tolist(), r.states, r.unavailable,
                    r.replication_bytes))
    return out


@pytest.mark.parametrize(("trace", "scale", "policy"), [
    ("k5-min-isr-refusal", 1.0, "kafka-durable"),  # compactions with failed rows among thousands pending
    ("steady-state", 0.5, "rocketmq-sync"),
    ("rack-power-loss", 0.3, "dledger-3"),
    ("rack-power-loss", 0.3, "rocketmq-controller"),
])
def test_no_kernel_reads_a_slot_its_buffers_grew_by_before_writing_it(monkeypatch, trace, scale, policy):
    """The growable buffers leave new slots unset (`arrays._grown`: np.empty, no zero-fill). That is only
    correct if every row a kernel appends is written in every column and nothing reads past a buffer's count:
    the same replay with those slots filled with zero bytes and with 0x5A bytes must give the same results.
    (Before ca7ea71 the Kafka loop left a new row's `err` unwritten; this test fails on that.)"""
    zero, keeps = _replay_with_growth(monkeypatch, 0x00, trace, scale, policy)
    poison, _ = _replay_with_growth(monkeypatch, 0x5A, trace, scale, policy)
    assert sum(len(r.messages.records.msg_id) for r in zero) > 100_000
    assert keeps > 0  # compacted tables' stale rows are exercised too
    assert _everything(poison) == _everything(zero)


def test_joined_intervals_are_what_merge_intervals_makes_of_them():
    """The kernels join touching unavailability intervals as they close instants: the compiled loops one interval
    at a time (`arrays.add_interval`), RocketMQ's vectorized segments per segment (`arrays.joined_intervals`);
    `replay.results.merge_intervals` is the definition."""
    from replay.results import merge_intervals
    from replay.shared.kernels.arrays import add_interval, joined_intervals

    rng = np.random.default_rng(3)
    for _ in range(200):
        n = int(rng.integers(0, 30))
        gaps, lengths = rng.integers(0, 3, n), rng.integers(1, 4, n)  # a gap of 0: touching the previous one
        lo = np.cumsum(gaps + np.append(0, lengths[:-1]))
        hi = lo + lengths
        expected = merge_intervals(list(zip(lo.tolist(), hi.tolist(), strict=True)))
        assert joined_intervals(lo, hi) == expected
        out, count = np.empty((n, 2), dtype=np.int64), 0
        for a, b in zip(lo.tolist(), hi.tolist(), strict=True):
            count = add_interval(out, count, a, a)  # empty: dropped
            count = add_interval(out, count, a, b)
        assert list(map(tuple, out[:count].tolist())) == expected


@pytest.mark.parametrize(("trace", "scale", "policy"), [
    ("k5-min-isr-refusal", 1.0, "kafka-durable"),  # compactions by deadlines, failed rows among thousands pending
    ("steady-state", 0.5, "kafka-durable"),  # compactions between stretches, acks=all rows kept pending
    ("steady-state", 0.5, "rocketmq-sync"),
    ("steady-state", 0.5, "rocketmq-controller-allack"),
])
def test_compaction_changes_no_result(monkeypatch, trace, scale, policy):
    """The kernels hand settled messages over to their records and compact the rest in place as they go
    (`records.hand_over`); replaying with every message kept pending to the end must give the same results, and
    some compactions must have kept rows (so moved rows are compared, not only handed-over ones)."""
    from replay.kafka.kernels import stretch
    from replay.kafka.kernels.outputs import KafkaOutputs
    from replay.local import replay_local
    from replay.policies import parse_policy
    from replay.rocketmq.kernels.messages import GroupMessages
    from studies.dledger_vs_kafka import load_trace

    manifest, table = load_trace(trace, 1, scale)
    kept = _count_compactions(monkeypatch)
    compacted = replay_local(parse_policy(policy), manifest, table)
    assert sum(k > 0 for k in kept) >= 2
    for family in (KafkaOutputs, GroupMessages):
        monkeypatch.setattr(family, "_compact", lambda self: None)
    monkeypatch.setattr(stretch, "COMPACT_AT", 2**62)
    whole = replay_local(parse_policy(policy), manifest, table)
    assert _everything(compacted) == _everything(whole)


def test_the_compiled_cache_changes_with_any_source_a_compiled_function_holds(tmp_path):
    """numba keeps a cached function while its own file is unchanged: a change to an inlined helper (here
    `arrays.timeline_row`) or to a constant read from another module must move the cache elsewhere."""
    import shutil
    from pathlib import Path

    from replay.shared.kernels.arrays import COMPILED_SOURCES, sources_digest

    repo = Path(__file__).resolve().parents[2]
    for pattern in COMPILED_SOURCES:
        for f in repo.glob(pattern):
            (tmp_path / f.relative_to(repo)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(f, tmp_path / f.relative_to(repo))
    before = sources_digest(tmp_path)
    assert before == sources_digest(repo)
    for changed in ("replay/shared/kernels/arrays.py", "schemas/outcomes.py"):
        path = tmp_path / changed
        text = path.read_text()
        path.write_text(text + "\n# changed\n")
        assert sources_digest(tmp_path) not in (None, before), changed
        path.write_text(text)
    assert sources_digest(tmp_path) == before
    assert sources_digest(tmp_path / "nowhere") is None


@pytest.mark.parametrize("policy", ["kafka-acks-all", "rocketmq-sync", "rocketmq-controller-allack"])
def test_a_kernel_pickled_mid_trace_leaves_its_scratch_and_finishes_as_one_pass(policy):
    """Stream mode pickles each group's kernel between micro-batches. The compiled loops' scratch (output buffers,
    the offset -> row map) is not state: it stays out of the pickle, and a kernel restored from it mid-trace
    ends with the results of one uninterrupted pass."""
    import pickle

    from replay.families import family_of
    from replay.local import unit_events
    from replay.policies import parse_policy
    from studies.dledger_vs_kafka import load_trace

    manifest, table = load_trace("rack-power-loss", 1, 0.2)
    p = parse_policy(policy)
    fam = family_of(p)
    events, info = unit_events(p, manifest, table)
    layout, end, cut = info["layout"], manifest.duration_us + 1, manifest.duration_us // 2
    whole, restored = [], []
    for u in layout.units:
        one = fam.kernel(p, u, layout.replicas[u], manifest.duration_us)
        one.advance(events[u], end)
        whole.append(one.finish())
        first = fam.kernel(p, u, layout.replicas[u], manifest.duration_us)
        first.advance(events[u].slice_time(0, cut), cut)
        state = first.__getstate__()
        assert not {"scratch", "orow", "_bufs", "_orow"} & set(state)
        again = pickle.loads(pickle.dumps(first))
        again.advance(events[u].slice_time(cut, end), end)
        restored.append(again.finish())
    assert _everything(restored) == _everything(whole)
