"""The plots logged with each policy's MLflow run (`engine.tracking.ReplayTracker`'s `figures` hook)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from report import plots
from storage import report_data

if TYPE_CHECKING:
    import pandas as pd

    from engine.plan import PolicyRun
    from storage.lakehouse import Lakehouse


def run_figures(run: PolicyRun, lakehouse: Lakehouse, series: pd.DataFrame, quantiles: pd.DataFrame,
                window_us: int, duration_us: int) -> dict[str, Any]:
    """Latency CDF, loss timeline and the busiest partitions' timeline of one run, by artifact name."""
    label = run.canonical
    q = quantiles[quantiles["run_id"] == run.run_id].assign(policy=label)
    s = series[series["run_id"] == run.run_id]
    timeline = s.assign(policy=label, t_s=s["window_start_us"] / 1e6, unavailable_s=s["unavailable_us"] / 1e6)
    partitions = report_data.busiest_partitions(lakehouse, run.run_id)
    history = report_data.partition_history(lakehouse, run.run_id, partitions, duration_us)
    return {
        "plots/latency_cdf.png": plots.latency_cdf(q, [label], title=f"Ack latency CDF: {label}"),
        "plots/loss_timeline.png": plots.loss_timeline(
            timeline, [label], window_s=window_us / 1e6,
            title=f"Acked-and-lost messages and unavailability per window: {label}"),
        "plots/partition_timeline.png": plots.partition_timeline(
            history, duration_s=duration_us / 1e6,
            title=f"Leader, ISR and high watermark of the busiest partitions: {label}"),
    }
