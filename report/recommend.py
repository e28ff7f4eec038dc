"""`replab recommend`'s HTML section: the SLO check per policy and a chart of cost against the SLO's metrics.

`section_html` is the section (a table and an interactive chart, `report.interactive`); `write_page` makes it a
self-contained page, `recommendation.html` beside `recommendation.json`, with plotly.js inline once, so the file
opens offline and as an MLflow artifact of the sweep's parent run.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from conf import page_css

if TYPE_CHECKING:
    from engine.recommend import Recommendation

FILE = "recommendation.html"


def frame(rec: Recommendation) -> pd.DataFrame:
    """One row per policy of the sweep: names, family, verdict, cost and every estimate with its interval."""
    chosen = rec.chosen.estimate.policy if rec.chosen else None
    rows = []
    for i, v in enumerate(rec.verdicts):
        e = v.estimate
        row = {"label": e.label, "policy": e.policy, "family": e.policy.partition(":")[0], "index": i,
               "meets": v.meets, "chosen": e.policy == chosen, "brokers_used": e.brokers_used,
               "replicas_per_message": e.replicas_per_message,
               "replication_mb": (e.replication_bytes or 0.0) / 1e6}
        for name, iv in e.estimates.items():
            row[name], row[f"{name}_low"], row[f"{name}_high"] = iv.estimate, iv.low, iv.high
        rows.append(row)
    return pd.DataFrame(rows)


def section_html(rec: Recommendation, *, title: str) -> str:
    from report import interactive

    esc = html.escape
    head = "".join(f"<th>{esc(str(t))}</th>" for t in rec.slo)
    body = []
    chosen = rec.chosen.estimate.policy if rec.chosen else None
    for v in rec.verdicts:
        e = v.estimate
        cells = "".join(
            f'<td class="n">{"✓" if met else "✗"} {esc(e.estimates[t.metric].text("{:.4g}"))}</td>'
            for t, met, _ in v.terms)
        b, c, r = e.cost
        cls = ' class="chosen"' if e.policy == chosen else ""
        body.append(f"<tr{cls}><td><code>{esc(interactive.policy_text(e.label, e.policy))}</code></td>"
                    f'<td class="n">{e.seeds_with_loss}/{e.seeds}</td>{cells}<td>{"yes" if v.meets else "no"}</td>'
                    f'<td class="n">{b:g}, {c:g}, {r / 1e6:,.2f}</td></tr>')
    if rec.chosen is None:
        verdict = ("<p><b>No policy of the space meets every SLO term with 95 % confidence</b> (more seeds narrow "
                   "the intervals; a wider space may hold one).</p>")
    else:
        e = rec.chosen.estimate
        verdict = (f'<p class="verdict">Recommended: <code>{esc(interactive.policy_text(e.label, e.policy))}'
                   f"</code>, the cheapest of {len(rec.ranked)} policies meeting the SLO ({e.seeds} seeds, "
                   f"{e.seeds_with_loss} with an acknowledged loss).</p>")
    slo = [(t.metric, str(t.op), t.value) for t in rec.slo]
    chart = interactive.fragment(interactive.recommendation(frame(rec), slo, title=title), "chart-recommendation")
    return f"""<h2>Recommendation: SLO {esc(', '.join(str(t) for t in rec.slo))}</h2>
{verdict}
<table><thead><tr><th>policy</th><th>seeds with loss</th>{head}<th>meets</th>
<th>cost (brokers, copies, MB replicated per trace)</th></tr></thead><tbody>{''.join(body)}</tbody></table>
<p class="meta">A term is met when the whole 95 % interval is on its side (upper bound for &lt;=, lower bound for
&gt;=). Cost ranks brokers used, then copies per message, then bytes replicated per trace.</p>
<figure>{chart}<figcaption>Cost against each SLO metric, one marker per policy with its 95 % interval (policies on
the same point share one marker), the SLO's bound dashed. Circle: meets every term; x: misses one; star: the
recommendation. Hover a marker for the policies and their figures; click a family in the legend to hide or show
it.</figcaption></figure>
"""




def write_page(rec: Recommendation, path: str | Path, *, title: str) -> Path:
    from report.interactive import script_tag

    path = Path(path)
    path.write_text(f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>replab recommend: {html.escape(title)}</title>
<style>{page_css()}</style>{script_tag()}</head><body>
{section_html(rec, title=title)}
</body></html>
""", encoding="utf-8")
    return path
