"""The HTML reports' interactive charts (plotly): small pandas frames in, an HTML fragment out.

plotly.js goes into each HTML file once, inline (`script_tag`), never from a CDN: a report opens offline and as
an MLflow artifact. Every chart is a `<div>` plus a call to that one copy (`fragment`).

Conventions shared by the charts:
- one legend group per policy family, so a click on a family in the legend hides or shows all its policies;
- hover, not static labels, names the policies: the name as typed (a preset) beside its canonical string, and
  the point's figures; policies that land on the same point (common: several presets the trace cannot tell
  apart) are one marker whose hover lists them all, so nothing is drawn on top of anything else;
- latencies are on log axes with 0 ms drawn at 1 µs, the trace's resolution (as the PNG plots, `report.plots`).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from report.plots import LOG_FLOOR_MS, colour_of

#: Marks each chart's div, so that a test (or a reader of the DOM) can count the report's charts.
CHART_CLASS = "replab-chart"
_CONFIG = {"displaylogo": False, "responsive": True}


def script_tag() -> str:
    """plotly.js, inline: once per HTML file, before the first chart."""
    from plotly.offline import get_plotlyjs

    return f'<script type="text/javascript">{get_plotlyjs()}</script>'


def fragment(fig: go.Figure, div_id: str) -> str:
    """The chart as a div of class CHART_CLASS and the script that draws it with the page's plotly.js."""
    body = fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=_CONFIG)
    return f'<div class="{CHART_CLASS}" data-chart="{html.escape(div_id)}">{body}</div>'


def policy_text(name: str, canonical: str) -> str:
    """`kafka-durable (kafka:acks=all,…)` for a preset; the canonical string alone when that is what was typed."""
    return canonical if not name or name == canonical else f"{name} ({canonical})"


@dataclass(frozen=True)
class PolicyInfo:
    """How a report names one policy: the report's label, the name as typed, the canonical form, its family."""

    label: str
    name: str
    canonical: str
    family: str
    index: int  # colour, the same as the PNG plots'

    @property
    def text(self) -> str:
        return policy_text(self.name, self.canonical)


def _layout(fig: go.Figure, title: str, height: int) -> None:
    fig.update_layout(title={"text": title, "x": 0.01}, height=height, template="plotly_white",
                      hovermode="closest", legend={"groupclick": "togglegroup", "title": {"text": "family"}},
                      margin={"l": 70, "r": 20, "t": 70, "b": 60})


def _merge_points(frame: pd.DataFrame, keys: Sequence[str]) -> list[pd.DataFrame]:
    """Rows grouped by identical coordinates (one marker each), in first-appearance order."""
    if frame.empty:
        return []
    return [g for _, g in frame.groupby(list(keys), sort=False, dropna=False)]


def pareto(points: pd.DataFrame, info: Sequence[PolicyInfo], *, title: str) -> go.Figure:
    """Acked-and-lost messages against p99 ack latency, one marker per point, one trace per family.

    `points`: columns policy (the label), acked_lost, ack_latency_p99_ms, availability,
    unavailable_partition_seconds. Marker area is unavailable partition-seconds, as in the PNG.
    """
    by_label = {p.label: p for p in info}
    pts = points.reset_index(drop=True).copy()
    pts["family"] = [by_label[p].family for p in pts["policy"]]
    pts["x"] = np.maximum(pts["ack_latency_p99_ms"].astype(float).fillna(LOG_FLOOR_MS), LOG_FLOOR_MS)
    pts["unavailable"] = pts["unavailable_partition_seconds"].astype(float).fillna(0.0)
    u_max = float(pts["unavailable"].max()) if len(pts) and pts["unavailable"].max() > 0 else 1.0
    fig = go.Figure()
    drawn = pts[pts["ack_latency_p99_ms"].notna()]
    for family, rows in drawn.groupby("family", sort=False):
        xs, ys, sizes, hovers, colours = [], [], [], [], []
        for group in _merge_points(rows, ["x", "acked_lost"]):
            first = group.iloc[0]
            xs.append(first["x"])
            ys.append(first["acked_lost"])
            sizes.append(10 + 26 * float(group["unavailable"].max()) / u_max)
            colours.append(colour_of(by_label[first["policy"]].index))
            names = "<br>".join(html.escape(by_label[p].text) for p in group["policy"])
            hovers.append(
                f"<b>{names}</b><br>acked lost: {first['acked_lost']:,.0f}<br>"
                f"ack p99: {first['ack_latency_p99_ms']:,.1f} ms<br>"
                f"availability: {_pct(first['availability'])}<br>"
                f"unavailable: {first['unavailable']:,.3f} partition-s")
        fig.add_trace(go.Scatter(
            x=xs, y=ys, mode="markers", name=str(family), legendgroup=str(family),
            marker={"size": sizes, "color": colours, "line": {"color": "black", "width": 1}, "opacity": 0.85},
            hovertext=hovers, hovertemplate="%{hovertext}<extra></extra>"))
    missing = [by_label[p].text for p in pts.loc[pts["ack_latency_p99_ms"].isna(), "policy"]]
    subtitle = f"<br><sup>not drawn, nothing acknowledged: {html.escape(', '.join(missing))}</sup>" if missing else ""
    _layout(fig, title + subtitle, 520)
    fig.update_layout(showlegend=True)  # the family legend even for one family (plotly hides a lone trace's)
    fig.update_xaxes(type="log", title="ack latency p99 (ms, log; 0 ms drawn at 0.001 ms)")
    top = float(drawn["acked_lost"].max()) if len(drawn) else 1.0
    # Padding on both sides, so markers on 0 or on the largest loss are not cut by the plot's edge.
    fig.update_yaxes(title="acknowledged messages lost", range=[-0.08 * max(top, 1.0), 1.12 * max(top, 1.0)])
    return fig


def _pct(value: float | None) -> str:
    return "–" if value is None or pd.isna(value) else f"{value:.4%}"


def latency_cdf(quantiles: pd.DataFrame, info: Sequence[PolicyInfo], *, title: str) -> go.Figure:
    """Ack latency CDF, one line per policy. `quantiles`: columns policy (label), quantile, latency_ms."""
    fig = go.Figure()
    for p in info:
        q = quantiles[quantiles["policy"] == p.label].sort_values("quantile")
        if q.empty:
            continue
        fig.add_trace(go.Scatter(
            x=np.maximum(q["latency_ms"].to_numpy(dtype=float), LOG_FLOOR_MS), y=q["quantile"].to_numpy(dtype=float),
            mode="lines", line={"shape": "hv", "color": colour_of(p.index)}, name=p.name or p.label,
            legendgroup=p.family, legendgrouptitle={"text": p.family},
            customdata=q["latency_ms"].to_numpy(dtype=float),
            hovertemplate=f"<b>{html.escape(p.text)}</b><br>%{{customdata:,.3f}} ms: %{{y:.1%}} of acked"
                          "<extra></extra>"))
    _layout(fig, title, 480)
    fig.update_xaxes(type="log", title="ack latency (ms, log; 0 ms drawn at 0.001 ms)")
    fig.update_yaxes(title="fraction of acknowledged messages", range=[0, 1.02])
    return fig


def loss_timeline(series: pd.DataFrame, info: Sequence[PolicyInfo], *, window_s: float, title: str) -> go.Figure:
    """Acked-and-lost messages and unavailable partition-seconds per window over trace time.

    `series`: columns policy (label), t_s, acked_lost, unavailable_s.
    """
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08)
    for p in info:
        s = series[series["policy"] == p.label].sort_values("t_s")
        if s.empty:
            continue
        for row, column, unit in ((1, "acked_lost", "messages lost"), (2, "unavailable_s", "partition-s unavailable")):
            fig.add_trace(go.Scatter(
                x=s["t_s"].to_numpy(dtype=float), y=s[column].to_numpy(dtype=float), mode="lines",
                line={"shape": "hv", "color": colour_of(p.index)}, name=p.name or p.label, legendgroup=p.family,
                legendgrouptitle={"text": p.family}, showlegend=row == 1,
                hovertemplate=f"<b>{html.escape(p.text)}</b><br>t = %{{x:,.3f}} s: %{{y:,.4g}} {unit}"
                              "<extra></extra>"), row=row, col=1)
    _layout(fig, title, 600)
    fig.update_yaxes(title=f"acked & lost per {window_s:g} s", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title=f"unavailable partition-s per {window_s:g} s", rangemode="tozero", row=2, col=1)
    fig.update_xaxes(title="trace time (s)", row=2, col=1)
    return fig


def recommendation(rows: pd.DataFrame, slo: Sequence[tuple[str, str, float]], *, title: str) -> go.Figure:
    """Cost against the SLO's metrics, one panel per metric, the SLO's bound drawn on each panel.

    `rows`: one row per policy: label (as typed), policy (canonical), family, index, meets, chosen,
    replication_mb, brokers_used, replicas_per_message and, per metric M shown, M, M_low, M_high (the 95 %
    interval). `slo`: (metric, op, value) terms. Panels: p_loss and ack_p99_ms when the rows have them (a sweep's),
    then every other SLO metric. The cost axis is MB replicated per trace, or copies per message where the rows
    carry no bytes (a durability run's). A figure without an estimate (nines where no sampled episode lost
    anything) is drawn at its interval's lower end. Marker: a circle when the policy meets every term, an x when
    not, a star for the recommendation.
    """
    metrics = list(dict.fromkeys([*[m for m in ("p_loss", "ack_p99_ms") if m in rows.columns],
                                  *[m for m, _, _ in slo]]))
    x_col, x_title = (("replication_mb", "MB replicated per trace (cost)") if rows["replication_mb"].any()
                      else ("replicas_per_message", "copies per message (cost)"))
    cols = 2
    nrows = (len(metrics) + cols - 1) // cols
    fig = make_subplots(rows=nrows, cols=cols, subplot_titles=metrics, horizontal_spacing=0.1,
                        vertical_spacing=0.16 if nrows > 1 else 0.1)
    families_shown: set[str] = set()
    for i, metric in enumerate(metrics):
        r, c = i // cols + 1, i % cols + 1
        for family, group in rows.groupby("family", sort=False):
            xs, ys, lo, hi, symbols, colours, hovers = [], [], [], [], [], [], []
            for same in _merge_points(group, [x_col, metric]):
                first = same.iloc[0]
                y = first[metric] if pd.notna(first[metric]) else first[f"{metric}_low"]
                xs.append(first[x_col])
                ys.append(y)
                lo.append(max(0.0, y - first[f"{metric}_low"]) if pd.notna(first[f"{metric}_low"]) else 0)
                hi.append(max(0.0, first[f"{metric}_high"] - y) if pd.notna(first[f"{metric}_high"])
                          and math.isfinite(first[f"{metric}_high"]) else 0)
                symbols.append("star" if same["chosen"].any() else "circle" if first["meets"] else "x")
                colours.append(colour_of(int(first["index"])))
                names = "<br>".join(
                    html.escape(policy_text(n, p)) + (" <b>recommended</b>" if ch else "")
                    + ("" if m else " (misses the SLO)")
                    for n, p, ch, m in zip(same["label"], same["policy"], same["chosen"], same["meets"], strict=True))
                figures = "<br>".join(
                    f"{m}: {_num(first[m])} [{_num(first[f'{m}_low'])}, {_num(first[f'{m}_high'])}]" for m in metrics)
                hovers.append(f"<b>{names}</b><br>{figures}<br>cost: {first['brokers_used']:g} brokers, "
                              f"{first['replicas_per_message']:g} copies, {first['replication_mb']:,.2f} MB replicated")
            fig.add_trace(go.Scatter(
                x=xs, y=ys, mode="markers", name=str(family), legendgroup=str(family),
                showlegend=family not in families_shown,
                error_y={"type": "data", "symmetric": False, "array": hi, "arrayminus": lo, "thickness": 1},
                marker={"symbol": symbols, "color": colours, "size": 13, "line": {"color": "black", "width": 1}},
                hovertext=hovers, hovertemplate="%{hovertext}<extra></extra>"), row=r, col=c)
            families_shown.add(str(family))
        for m, op, value in slo:
            if m == metric:
                fig.add_hline(y=value, line_dash="dash", line_color="#b00020", row=r, col=c,
                              annotation_text=f"SLO {m}{op}{value:g}", annotation_position="top left")
        fig.update_xaxes(title=x_title, row=r, col=c)
        if metric == "ack_p99_ms":
            fig.update_yaxes(title="ms", row=r, col=c)
    _layout(fig, title, 430 * nrows + 40)
    fig.update_layout(showlegend=True)
    return fig


def _num(value) -> str:
    return "–" if value is None or pd.isna(value) else f"{float(value):.4g}"


def chart_count(page: str) -> int:
    """Charts a report embeds (its CHART_CLASS divs)."""
    return page.count(f'class="{CHART_CLASS}"')
