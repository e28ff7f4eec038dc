"""The report plots on small hand-made frames: labelled axes, PNG output, the Pareto frontier."""

from __future__ import annotations

import pandas as pd
import pytest

from report import plots

PNG = b"\x89PNG\r\n\x1a\n"


def _labels(fig):
    return [(ax.get_xlabel(), ax.get_ylabel()) for ax in fig.axes]


def test_latency_cdf_log_axis_in_ms():
    q = pd.DataFrame({"policy": ["a"] * 3 + ["b"] * 3, "quantile": [0, 0.5, 1] * 2,
                      "latency_ms": [0.0, 1.0, 3.0, 2.0, 40.0, 900.0]})
    fig = plots.latency_cdf(q, ["a", "b"])
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and "ms" in ax.get_xlabel() and ax.get_ylabel()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["a", "b"]
    assert plots.png_bytes(fig)[:8] == PNG


def test_loss_timeline_two_panels_in_trace_seconds():
    s = pd.DataFrame({"policy": ["a", "a", "a"], "t_s": [0.0, 1.0, 2.0], "acked_lost": [0, 2, 0],
                      "unavailable_s": [0.5, 1.0, 0.0]})
    fig = plots.loss_timeline(s, ["a"], window_s=1.0)
    (_, top_y), (bottom_x, bottom_y) = _labels(fig)[:2]
    assert bottom_x == "trace time (s)" and "per 1 s window" in top_y and "partition-seconds" in bottom_y
    assert "total 2 lost, 1.5 partition-s unavailable" in fig.axes[0].get_legend().get_texts()[0].get_text()


def test_partition_timeline_offline_leader_and_empty_input():
    h = pd.DataFrame({"partition": [0, 0, 0], "ts_us": [0, 27_000, 9_127_000], "leader": [0, None, 1],
                      "isr_size": [3, 3, 2], "high_watermark": [0, 2, 2]})
    fig = plots.partition_timeline(h, duration_s=120.0, title="t")
    assert [lbl.get_text() for lbl in fig.axes[0].get_yticklabels()] == ["offline", "broker 0", "broker 1"]
    assert fig.axes[2].get_xlabel() == "trace time (s)"
    empty = plots.partition_timeline(h.iloc[0:0], duration_s=1.0, title="t")
    assert plots.png_bytes(empty)[:8] == PNG


def test_pareto_frontier_and_chart():
    points = pd.DataFrame({
        "policy": ["fast-lossy", "slow-safe", "dominated", "no-acks"],
        "acked_lost": [5, 0, 6, 0],
        "ack_latency_p99_ms": [1.0, 50.0, 60.0, None],
        "availability": [1.0, 0.97, 0.9, 0.0],
        "unavailable_partition_seconds": [1.0, 10.0, 12.0, 120.0],
    })
    assert plots.pareto_frontier(points) == [0, 1]
    fig = plots.pareto(points)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and "p99" in ax.get_xlabel() and "lost" in ax.get_ylabel()
    assert "no-acks" in ax.get_title()  # said, not silently dropped
    texts = {t.get_text() for t in ax.texts}
    assert {"fast-lossy", "slow-safe", "dominated"} <= texts
    assert fig.axes[1].get_ylabel() == "availability (acked / produced)"
    assert plots.png_bytes(fig)[:8] == PNG


@pytest.mark.parametrize("same", [True, False])
def test_pareto_shares_a_label_for_policies_at_one_point(same):
    points = pd.DataFrame({"policy": ["a", "b"], "acked_lost": [1, 1], "ack_latency_p99_ms": [0.0, 0.0 if same else 5],
                           "availability": [1.0, 1.0], "unavailable_partition_seconds": [9.1, 18.1]})
    texts = {t.get_text() for t in plots.pareto(points).axes[0].texts}
    assert texts == ({"a\nb"} if same else {"a", "b"})
