"""The testbed section of `replab compare`'s HTML report (SPEC §12): predicted beside observed, per case.

It reads the MLflow runs tagged `source=testbed` of the same tracking store (experiment `testbed`, the latest
run of each scenario and policy), so the comparison report shows them whatever experiment it is about.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import numpy as np
import pandas as pd

from engine.tracking import SOURCE_TESTBED, TAG_SOURCE, TESTBED_EXPERIMENT

FIGURE = "testbed.png"


@dataclass(frozen=True)
class ReportSection:
    html: str
    figure: object | None  # matplotlib Figure


def load_cases(client) -> pd.DataFrame:
    """One row per (scenario, policy): the latest testbed run's predicted/observed metrics."""
    from engine.tracking import find_experiment, search_all_runs

    exp = find_experiment(client, TESTBED_EXPERIMENT)
    if exp is None:
        return pd.DataFrame()
    rows = {}
    for r in sorted(search_all_runs(client, [exp.experiment_id], f"tags.{TAG_SOURCE} = '{SOURCE_TESTBED}'"),
                    key=lambda r: r.info.start_time or 0):
        name = r.info.run_name or ""
        scenario, _, policy = name.partition(" · ")
        m = r.data.metrics
        rows[(scenario, policy)] = {
            "scenario": scenario, "policy": policy,
            **{f"{side}_{k}": m.get(f"{side}.{k}") for side in ("predicted", "observed")
               for k in ("acked_lost", "unavailable_partition_seconds", "failover_ms")},
            "status": m.get("agreement.status"), "fate": m.get("agreement.fate"),
        }
    return pd.DataFrame([rows[k] for k in sorted(rows)])


def chart(cases: pd.DataFrame):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 5.5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    labels = [f"{s}\n{p}" for s, p in zip(cases["scenario"], cases["policy"], strict=True)]
    x = np.arange(len(cases))
    for i, (key, title) in enumerate((("acked_lost", "acknowledged messages lost"),
                                      ("unavailable_partition_seconds", "unavailable partition-seconds"))):
        ax = fig.add_subplot(1, 2, i + 1)
        pred = cases[f"predicted_{key}"].astype(float).fillna(0).to_numpy()
        obs = cases[f"observed_{key}"].astype(float).fillna(0).to_numpy()
        ax.barh(x - 0.2, pred, 0.4, label="predicted (replab)", color="#1f77b4")
        ax.barh(x + 0.2, obs, 0.4, label="observed (Kafka 4.1)", color="#ff7f0e")
        ax.set_yticks(x, labels if i == 0 else [""] * len(x), fontsize=7)
        ax.invert_yaxis()
        ax.set_title(title)
        ax.legend(fontsize=8)
    return fig


def section(client) -> ReportSection | None:
    cases = load_cases(client)
    if cases.empty:
        return None
    esc = html.escape

    def f(v, fmt="{:,.0f}"):
        return "–" if v is None or v != v else fmt.format(v)

    body = "".join(
        f"<tr><td>{esc(r.scenario)}</td><td><code>{esc(r.policy)}</code></td>"
        f'<td class="n">{f(r.predicted_acked_lost)} / {f(r.observed_acked_lost)}</td>'
        f'<td class="n">{f(r.predicted_unavailable_partition_seconds, "{:,.1f}")} / '
        f'{f(r.observed_unavailable_partition_seconds, "{:,.1f}")}</td>'
        f'<td class="n">{f(r.predicted_failover_ms)} / {f(r.observed_failover_ms)}</td>'
        f'<td class="n">{f(r.status, "{:.1%}")}</td><td class="n">{f(r.fate, "{:.1%}")}</td></tr>'
        for r in cases.itertuples(index=False))
    text = ("<h2>Testbed: predicted versus observed</h2>"
            "<p class=\"meta\">The same scenarios on a real Apache Kafka cluster (<code>replab testbed run</code>, "
            "SPEC §12); each cell is predicted / observed.</p>"
            "<table><thead><tr><th>scenario</th><th>policy</th><th>acked lost</th><th>unavailable partition-s</th>"
            f"<th>failover ms</th><th>same status</th><th>same fate</th></tr></thead><tbody>{body}</tbody></table>")
    return ReportSection(text, chart(cases))
