"""replay.events.split_trace_table: produce rows apart, broker events in the kernels' codes; an unknown or null
kind is refused with its row (kind labels become codes in one vectorized place, schemas.trace.kind_codes)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from replay.events import split_trace_table
from schemas.trace import EVENT_ARROW_SCHEMA, Kind


def _table(kinds: list[str | None]) -> pa.Table:
    n = len(kinds)
    columns = {name: [None] * n for name in EVENT_ARROW_SCHEMA.names}
    columns.update(ts_us=list(range(n)), kind=kinds, broker=[0] * n, msg_id=list(range(n)), size_bytes=[1] * n,
                   producer_id=[0] * n, upto_us=[0] * n)
    return pa.table(columns, schema=EVENT_ARROW_SCHEMA)


def test_produce_rows_and_broker_events_are_split_by_kind():
    produce, events = split_trace_table(_table(["produce", "crash", "produce", "restart"]))
    assert produce["msg_id"].tolist() == [0, 2] and produce["ts_us"].tolist() == [0, 2]
    assert events.broker_kind.tolist() == [int(Kind.CRASH), int(Kind.RESTART)] and events.broker_ts.tolist() == [1, 3]


@pytest.mark.parametrize("bad", ["explode", None])
def test_an_unknown_or_null_kind_is_refused_with_its_row(bad):
    with pytest.raises(ValueError, match="unknown or null kind in row 2"):
        split_trace_table(_table(["produce", "crash", bad, "produce"]))
