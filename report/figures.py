"""The plots logged with each policy's MLflow run (`engine.tracking.ReplayTracker`'s `figures` hook)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from report import plots
from report.render import FigureJob, Renderer
from storage import report_data

if TYPE_CHECKING:
    import pandas as pd

    from engine.plan import PolicyRun
    from storage.lakehouse import HeldTables, Lakehouse

#: The plots of each run, by artifact name.
RUN_PLOTS = ("plots/latency_cdf.png", "plots/loss_timeline.png", "plots/partition_timeline.png")


def run_figures(runs: Sequence[PolicyRun], lakehouse: Lakehouse | HeldTables, series: pd.DataFrame,
                quantiles: pd.DataFrame, window_us: int, duration_us: int) -> Iterator[tuple[str, dict[str, bytes]]]:
    """(run_id, {artifact name: PNG bytes}) of each run: latency CDF, loss timeline and the busiest partitions'
    timeline. The timelines of every run come from two Spark queries (two per run took ~6 Spark jobs each:
    most of the demo's MLflow logging); the plots are drawn on every core (`report.render`), whose workers start
    while those queries run."""
    with Renderer(len(runs) * len(RUN_PLOTS)) as renderer:
        busiest = report_data.busiest_partitions_of(lakehouse, [r.run_id for r in runs])
        histories = report_data.partition_histories(lakehouse, busiest, duration_us)
        jobs: list[FigureJob] = []
        for run in runs:
            label = run.canonical
            q = quantiles[quantiles["run_id"] == run.run_id].assign(policy=label)
            s = series[series["run_id"] == run.run_id]
            timeline = s.assign(policy=label, t_s=s["window_start_us"] / 1e6, unavailable_s=s["unavailable_us"] / 1e6)
            history = histories[histories["run_id"] == run.run_id][report_data.HISTORY_COLUMNS].reset_index(drop=True)
            jobs += [
                FigureJob(plots.latency_cdf, {"quantiles": q, "policies": [label],
                                              "title": f"Ack latency CDF: {label}"}),
                FigureJob(plots.loss_timeline, {
                    "series": timeline, "policies": [label], "window_s": window_us / 1e6,
                    "title": f"Acked-and-lost messages and unavailability per window: {label}"}),
                FigureJob(plots.partition_timeline, {
                    "history": history, "duration_s": duration_us / 1e6,
                    "title": f"Leader, ISR and high watermark of the busiest partitions: {label}"}),
            ]
        pngs = renderer.render(jobs)
    for i, run in enumerate(runs):
        yield run.run_id, dict(zip(RUN_PLOTS, pngs[i * len(RUN_PLOTS):(i + 1) * len(RUN_PLOTS)], strict=True))
