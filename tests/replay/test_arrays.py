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
