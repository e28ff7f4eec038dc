"""The stream benchmark reads its per-micro-batch profile from the sink's progress line: the two must agree (no
Spark: the sink's line is formatted from a micro-batch's figures as the sink does it)."""

from __future__ import annotations

from bench.stream_bench import BATCH_LINE
from engine.stream.sink import StreamSink


def test_the_bench_parses_the_sinks_micro_batch_line():
    lines: list[str] = []
    sink = StreamSink(spark=None, lakehouse=None, tf=None, runs=[], request=None, ck=None, live=False,
                      progress=lines.append, max_event_us=7_119_000)
    stats = {"watermark_us": 3_192_000, "rows_in": 1_234_567, "rows_late": 89}
    sink._report(12, stats, replay_s=10.587, write_s=2.6449)
    assert len(lines) == 1 and lines[0].startswith("micro-batch 12: watermark 3.192 s")
    m = BATCH_LINE.match(lines[0])
    assert m is not None, lines[0]
    assert (int(m[1]), int(m[2].replace(",", "")), float(m[3]), float(m[4])) == (12, 1_234_567, 10.59, 2.64)
