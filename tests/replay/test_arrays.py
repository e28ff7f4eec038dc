"""The kernels' shared containers."""

import numpy as np

from replay.kernels._arrays import Table


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


def test_compiled_helpers_agree_with_their_numpy_definitions():
    """The numba helpers the kernels use in place of numpy expressions compute exactly those expressions."""
    from replay.kernels._arrays import forward_fill, kth_largest_columns, merge_order

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
