"""The report's plots (SPEC §6.4): one function per plot, small pandas frames in, a matplotlib Figure out.

Figures are built on the Agg canvas directly (no pyplot): no global figure registry to leak memory in long
jobs, and no interference with the backend of a notebook that imports replab. Inputs are the plot-sized
frames of `storage.report_data` (or MLflow's metric histories); nothing here touches Spark.

Conventions: time on x axes is trace time in seconds; latencies are in ms on a log axis, where a latency of 0
(acks=0/1 acknowledge at append, SPEC §3.2 rule 4) is drawn at 1 µs, the trace's resolution, and the axis
label says so.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

#: Where a 0 ms latency is drawn on log axes: 1 µs, the trace's time resolution.
LOG_FLOOR_MS = 0.001
_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
            "#bcbd22", "#17becf", "#393b79", "#ad494a", "#637939", "#8c6d31", "#7b4173", "#3182bd")


def colour_of(index: int) -> str:
    """The colour of the index-th policy, the same in every plot of a report."""
    return _COLOURS[index % len(_COLOURS)]


def _line_width(index: int, count: int) -> float:
    """Earlier policies draw wider lines, so that a series hidden under a later identical one still shows."""
    return 1.4 if count <= 1 else 3.2 - 1.8 * index / (count - 1)


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _no_data(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#666666")


def latency_cdf(quantiles: pd.DataFrame, policies: Sequence[str], *, title: str = "Ack latency CDF") -> Figure:
    """CDF of ack latency per policy. `quantiles`: columns policy, quantile (0-1), latency_ms."""
    fig = _figure(9, 5.5)
    ax = fig.add_subplot()
    drawn = 0
    for i, policy in enumerate(policies):
        q = quantiles[quantiles["policy"] == policy].sort_values("quantile")
        if q.empty:
            continue
        x = np.maximum(q["latency_ms"].to_numpy(dtype=float), LOG_FLOOR_MS)
        ax.step(x, q["quantile"].to_numpy(dtype=float), where="post", color=colour_of(i),
                lw=_line_width(i, len(policies)), alpha=0.9, label=policy)
        drawn += 1
    ax.set_xscale("log")
    ax.set_xlabel("ack latency (ms, log scale; 0 ms drawn at 0.001 ms)")
    ax.set_ylabel("fraction of acknowledged messages")
    ax.set_ylim(0, 1.02)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title)
    if drawn:
        ax.legend(fontsize=8, loc="lower right")
    else:
        _no_data(ax, "no acknowledged messages")
    return fig


def loss_timeline(series: pd.DataFrame, policies: Sequence[str], *, window_s: float,
                  title: str = "Acknowledged-and-lost messages and unavailability per window") -> Figure:
    """Two panels over trace time: acked-and-lost messages per window, unavailable partition-seconds per window.

    `series`: columns policy, t_s (window start, s), acked_lost (count), unavailable_s (partition-seconds).
    """
    fig = _figure(10, 6.5)
    top, bottom = fig.subplots(2, 1, sharex=True)
    for i, policy in enumerate(policies):
        s = series[series["policy"] == policy].sort_values("t_s")
        if s.empty:
            continue
        t = s["t_s"].to_numpy(dtype=float)
        label = (f"{policy} (total {s['acked_lost'].sum():,.0f} lost, "
                 f"{s['unavailable_s'].sum():,.4g} partition-s unavailable)")
        kw = {"where": "post", "color": colour_of(i), "lw": _line_width(i, len(policies)), "alpha": 0.9,
              "label": label}
        top.step(t, s["acked_lost"].to_numpy(dtype=float), **kw)
        bottom.step(t, s["unavailable_s"].to_numpy(dtype=float), **kw)
    top.set_ylabel(f"acked & lost\n(messages per {window_s:g} s window)")
    bottom.set_ylabel(f"unavailable\n(partition-seconds per {window_s:g} s window)")
    bottom.set_xlabel("trace time (s)")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
    top.set_title(title)
    if len(policies):
        top.legend(fontsize=8, loc="upper right")
    return fig


def partition_timeline(history: pd.DataFrame, *, duration_s: float, title: str) -> Figure:
    """Leader, ISR size and high watermark of a few partitions of one run over trace time.

    `history`: columns partition, ts_us, leader (null = offline), isr_size, high_watermark; each row holds
    until the next one of its partition (a step plot), and the last one until `duration_s`.
    """
    fig = _figure(10, 7.5)
    axes = fig.subplots(3, 1, sharex=True)
    partitions = sorted(int(p) for p in history["partition"].unique()) if len(history) else []
    offline = -1
    for i, p in enumerate(partitions):
        h = history[history["partition"] == p].sort_values("ts_us")
        t = np.append(h["ts_us"].to_numpy(dtype=float) / 1e6, duration_s)
        kw = {"where": "post", "color": colour_of(i), "lw": _line_width(i, len(partitions)), "alpha": 0.9,
              "label": f"partition {p}"}
        leader = h["leader"].astype("float").fillna(offline).to_numpy()
        isr = h["isr_size"].astype("float").fillna(0).to_numpy()
        hwm = h["high_watermark"].astype("float").to_numpy()
        axes[0].step(t, np.append(leader, leader[-1]), **kw)
        axes[1].step(t, np.append(isr, isr[-1]), **kw)
        axes[2].step(t, np.append(hwm, hwm[-1]), **kw)
    if partitions:
        leaders = sorted({int(v) for v in history["leader"].dropna()})
        ticks = [offline, *leaders]
        axes[0].set_yticks(ticks, ["offline", *[f"broker {b}" for b in leaders]])
        axes[0].set_ylim(offline - 0.5, (max(leaders) if leaders else 0) + 0.5)
        axes[0].legend(fontsize=8, loc="upper right")
        isr_max = int(np.nanmax(history["isr_size"].astype("float").fillna(0))) if len(history) else 0
        axes[1].set_yticks(range(0, isr_max + 1))
    else:
        _no_data(axes[0], "no partition state rows")
    axes[0].set_ylabel("leader")
    axes[1].set_ylabel("ISR size\n(replicas)")
    axes[2].set_ylabel("high watermark\n(offset)")
    axes[2].set_xlabel("trace time (s)")
    axes[2].set_xlim(0, max(duration_s, 1e-6))
    for ax in axes:
        ax.grid(True, alpha=0.3)
    axes[0].set_title(title)
    return fig


def pareto_frontier(points: pd.DataFrame) -> list[int]:
    """Row positions of the policies no other policy beats on both acked-lost and p99 latency (ties kept)."""
    lost = points["acked_lost"].to_numpy(dtype=float)
    p99 = points["ack_latency_p99_ms"].to_numpy(dtype=float)
    keep = []
    for i in range(len(points)):
        if np.isnan(p99[i]):
            continue
        dominated = any(j != i and not np.isnan(p99[j]) and lost[j] <= lost[i] and p99[j] <= p99[i]
                        and (lost[j] < lost[i] or p99[j] < p99[i]) for j in range(len(points)))
        if not dominated:
            keep.append(i)
    return keep


def pareto(points: pd.DataFrame, *, title: str = "Durability against latency") -> Figure:
    """Acked-and-lost messages against p99 ack latency, one point per policy.

    `points`: columns policy, acked_lost, ack_latency_p99_ms, availability (acked / produced, 0-1) and
    unavailable_partition_seconds. Availability is the colour, unavailable partition-seconds the marker area;
    the frontier (no other policy is better on both axes) is joined by a dashed line. Policies at the same
    point share one label.
    """
    fig = _figure(10.5, 6.5)
    ax = fig.add_subplot()
    pts = points.reset_index(drop=True)
    has_p99 = pts["ack_latency_p99_ms"].notna().to_numpy()
    x = np.maximum(pts["ack_latency_p99_ms"].astype(float).fillna(LOG_FLOOR_MS).to_numpy(), LOG_FLOOR_MS)
    y = pts["acked_lost"].astype(float).to_numpy()
    avail = pts["availability"].astype(float).to_numpy()
    unavailable = pts["unavailable_partition_seconds"].astype(float).fillna(0).to_numpy()
    u_max = float(unavailable.max()) if len(unavailable) and unavailable.max() > 0 else 1.0
    sizes = 50 + 450 * unavailable / u_max
    finite = avail[np.isfinite(avail)]
    vmin = min(0.9, float(finite.min())) if len(finite) else 0.9
    sc = ax.scatter(x[has_p99], y[has_p99], c=avail[has_p99], s=sizes[has_p99], cmap="viridis_r", vmin=vmin,
                    vmax=1.0, edgecolors="black", alpha=0.85, zorder=3)
    fig.colorbar(sc, ax=ax, label="availability (acked / produced)")
    labels: dict[tuple[float, float], list[str]] = {}
    for i in np.flatnonzero(has_p99):
        labels.setdefault((x[i], y[i]), []).append(str(pts.loc[i, "policy"]))
    for (px, py), names in labels.items():
        ax.annotate("\n".join(names), (px, py), xytext=(9, 4), textcoords="offset points", fontsize=8,
                    va="bottom")
    handles = []
    front = pareto_frontier(pts)
    if len(front) > 1:
        order = sorted(front, key=lambda i: (x[i], -y[i]))
        (line,) = ax.plot(x[order], y[order], ls="--", color="#555555", lw=1, zorder=2, label="Pareto frontier")
        handles.append(line)
    for value in sorted({0.0, u_max} if u_max > 0 else {0.0}):
        handles.append(ax.scatter([], [], s=50 + 450 * value / u_max, facecolors="none", edgecolors="black",
                                  label=f"unavailable {value:,.4g} partition-s"))
    ax.legend(handles=handles, fontsize=8, loc="upper right", labelspacing=1.3, borderpad=1)
    ax.set_xscale("log")
    ax.set_yscale("symlog", linthresh=1)
    ax.set_ylim(-0.5, max(2.0, float(y.max()) * 4 + 2) if len(y) else 2.0)
    lo, hi = float(x[has_p99].min()) if has_p99.any() else LOG_FLOOR_MS, float(x.max()) if len(x) else 1.0
    ax.set_xlim(lo / 3, hi * 30)
    ax.set_xlabel("ack latency p99 (ms, log scale; 0 ms drawn at 0.001 ms)")
    ax.set_ylabel("acknowledged messages lost (count, symlog)")
    missing = [str(p) for p, ok in zip(pts["policy"], has_p99, strict=True) if not ok]
    ax.set_title(title + (f"\n(not drawn, nothing acknowledged: {', '.join(missing)})" if missing else ""))
    ax.grid(True, which="both", alpha=0.3)
    return fig


def png_bytes(fig: Figure) -> bytes:
    """The figure as PNG bytes (for embedding in the HTML report)."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
