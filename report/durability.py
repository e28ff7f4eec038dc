"""`DIR/durability.html`: nines and unavailable minutes per year against cost (brokers × copies) per policy,
with their intervals, and the sensitivity curves (nines against each re-weighted rate and against the brokers'
restart times). Inline plotly.js
(`report.interactive.script_tag`), so the page opens offline."""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from report.interactive import fragment, script_tag


def _nines_point(p: dict[str, Any]) -> tuple[float, float, float]:
    """(value, distance down, distance up) of a policy's nines; a bounded policy shows its lower bound."""
    n = p["nines"]
    low = n["low"] if n["low"] is not None else 0.0
    if p["bounded"]:
        return low, 0.0, 0.0
    est = n["estimate"] if n["estimate"] is not None else low
    high = n["high"] if n["high"] is not None and math.isfinite(n["high"]) else est
    return est, est - low, high - est


def nines_chart(doc: dict[str, Any]) -> go.Figure:
    fig = go.Figure()
    for p in doc["policies"]:
        y, down, up = _nines_point(p)
        u = p["unavailable_min_per_year"]
        fig.add_trace(go.Scatter(
            x=[u["estimate"]], y=[y], mode="markers", name=p["label"],
            marker={"symbol": "triangle-up" if p["bounded"] else "circle", "size": 11},
            error_y={"type": "data", "array": [up], "arrayminus": [down]},
            error_x={"type": "data", "array": [u["high"] - u["estimate"]], "arrayminus": [u["estimate"] - u["low"]]},
            hovertemplate=f"{html.escape(p['label'])}<br>nines %{{y:.2f}}" + (" (lower bound)" if p["bounded"] else "")
            + "<br>unavailable %{x:.1f} min/year<extra></extra>"))
    fig.update_layout(title={"text": "nines per year against unavailable minutes per year (95 % intervals; "
                                     "▲ = no sampled loss, lower bound)", "x": 0.01},
                      xaxis_title="unavailable minutes per year (average partition)",
                      yaxis_title="nines: −log10 P(≥ 1 acked message lost per year)",
                      template="plotly_white", height=520)
    return fig


def sensitivity_chart(doc: dict[str, Any], process: str) -> go.Figure:
    fig = go.Figure()
    rows = [r for r in doc["sensitivity"] if r["process"] == process]
    for label in dict.fromkeys(r["policy"] for r in rows):
        mine = sorted((r for r in rows if r["policy"] == label), key=_x)
        ys = [r["nines"]["low"] if r["bounded"] else r["nines"]["estimate"] for r in mine]
        fig.add_trace(go.Scatter(x=[_x(r) for r in mine], y=ys, mode="lines+markers", name=label))
    what = "the brokers' restart times" if process == "restart_time" else f"the {process} rate"
    x_label = rows[0].get("x_label", f"{process} per unit per year") if rows else process
    fig.update_layout(title={"text": f"nines against {what} (same episodes, re-weighted)", "x": 0.01},
                      xaxis={"title": x_label, "type": "log"}, yaxis_title="nines",
                      template="plotly_white", height=420)
    return fig


def _x(row: dict[str, Any]) -> float:
    return row["x"] if "x" in row else row["per_year"]


def write_html(doc: dict[str, Any], path: Path) -> Path:
    parts = [fragment(nines_chart(doc), "nines")]
    for process in dict.fromkeys(r["process"] for r in doc["sensitivity"]):
        parts.append(fragment(sensitivity_chart(doc, process), f"sens-{process}"))
    rows = "".join(
        f"<tr><td>{html.escape(p['label'])}</td><td>{_fmt_nines(p)}</td>"
        f"<td>{_fmt(p['p_loss_per_year'])}</td><td>{_fmt(p['unavailable_min_per_year'])}</td>"
        f"<td>{p['loss_ess']:.1f}</td></tr>" for p in doc["policies"])
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>replab durability</title>{script_tag()}
<style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:2px 10px;text-align:right}}</style></head><body>
<h1>Durability per year: {html.escape(doc['scenario'])}, rates {html.escape(doc['rates']['name'])}</h1>
<p>{doc['episodes']} episodes; {html.escape(doc['method'])}. The input's uncertainty (the sensitivity curves) is
usually larger than the Monte-Carlo error (the intervals).</p>
<table><tr><th>policy</th><th>nines</th><th>P(loss) / year</th><th>unavailable min / year</th><th>loss ESS</th></tr>
{rows}</table>{''.join(parts)}</body></html>"""
    path.write_text(page)
    return path


def _fmt(iv: dict[str, Any]) -> str:
    def f(v: Any) -> str:
        return "–" if v is None else f"{v:.3g}"
    return f"{f(iv['estimate'])} [{f(iv['low'])}, {f(iv['high'])}]"


def _fmt_nines(p: dict[str, Any]) -> str:
    n = p["nines"]
    if p["bounded"]:
        return f"≥ {n['low']:.2f}" if n["low"] is not None else "–"
    return _fmt(n)
