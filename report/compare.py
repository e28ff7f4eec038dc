"""The HTML comparison of an experiment's policies behind `replab compare` (SPEC §6.1).

Reads the experiment's finished policy runs from MLflow (one per policy, SPEC §6.4), then writes to the report
folder (default `reports/<experiment>`):

- `comparison.csv`: one row per policy, every run_summary figure and a one-line verdict;
- `pareto.png` (from MLflow alone), and, when the lakehouse named by the runs' `replab.lakehouse` tag is
  still there, `latency_cdf.png` and the leader/ISR timeline of the policy that fared worst; the loss and
  unavailability timeline comes from the lakehouse, else from the runs' per-window MLflow series;
- `report.html`: self-contained, readable offline or as an MLflow artifact: CSS and plotly.js inline (once),
  the Pareto chart, the latency CDF and the loss timeline as interactive charts (`report.interactive`: hover
  names the policy as typed beside its canonical form, the legend toggles families), the partition timeline
  and the testbed's plot as base64 PNGs;

prints the table in the terminal, and logs the folder as artifacts of a separate `replab.kind=comparison` run
of the experiment, so that policy runs stay one per policy. An unknown experiment is bad input (exit 2).
What the page says (results, verdicts, findings) is computed in `report.findings`; this module renders it.
"""

from __future__ import annotations

import base64
import csv
import html
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from conf import page_css
from engine import tracking
from report.findings import Comparison, PolicyResult, compare, comparison_frame, count_of, seconds_text, worst_of

if TYPE_CHECKING:
    from storage.report_data import RunViews

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------ outputs
def print_table(cmp: Comparison, console=None) -> None:
    from rich.table import Table

    from report.tables import COMPARISON_COLUMNS
    from report.terminal import console as terminal

    console = console or terminal()
    table = Table(title=f"experiment {cmp.experiment}: {len(cmp.results)} policies", title_justify="left")
    table.add_column("policy", overflow="fold")
    for _, header, _ in COMPARISON_COLUMNS:
        table.add_column(header, justify="right")
    for r in cmp.results:
        table.add_row(r.label, *[_fmt(r.metric(name), fmt, name) for name, _, fmt in COMPARISON_COLUMNS])
    console.print(table)
    for r in cmp.results:
        console.print(f"[bold]{r.label}[/bold]: {cmp.verdicts[r.label]}", highlight=False)
    for line in cmp.findings:
        console.print(line, highlight=False)


def _fmt(value: float | None, fmt: str, name: str = "") -> str:
    if value is None:
        return "–"
    if name == "unavailable_partition_seconds":
        return seconds_text(value)
    # MLflow stores every metric as a float; counts print as integers.
    if "{:,}" in fmt or fmt == "{}":
        return fmt.format(round(value))
    return fmt.format(value)


def _lakehouse_plots(cmp: Comparison, data: dict[str, Any], views: Sequence[RunViews] = ()) -> dict[str, Any]:
    """Latency CDF, loss timeline and the worst policy's partition timeline from the lakehouse(s). `views`
    stand in for the window series and latency quantiles of the runs they cover."""
    from report import plots
    from storage import report_data
    from storage.lakehouse import Lakehouse
    from storage.session import get_spark

    by_root: dict[Path, list[PolicyResult]] = {}
    for r in cmp.results:
        if r.lakehouse is not None:
            by_root.setdefault(r.lakehouse, []).append(r)
    if not by_root:
        return {}
    spark = get_spark("replab-compare")
    label_of = {r.run_id: r.label for r in cmp.results}
    quantiles, series, windows = [], [], set()
    houses = {}
    for root, results in by_root.items():
        lakehouse = Lakehouse(root, spark, create=False)
        houses[root] = lakehouse
        ids = [r.run_id for r in results]
        window_ms = results[0].window_ms
        window_us = window_ms * 1000 if window_ms else report_data.window_us_of(lakehouse, ids)
        if window_us:
            windows.add(window_us)
        view = next((v for v in views if v.covers(root, ids, window_us)), None)
        if view is not None:  # computed by the replay of these runs a moment ago, from these tables
            quantiles.append(view.quantiles_of(ids))
            series.append(view.series_of(ids))
            continue
        quantiles.append(report_data.latency_quantiles(lakehouse, ids))
        series.append(report_data.window_series(lakehouse, ids, window_us))
    labels = [r.label for r in cmp.results if r.lakehouse is not None]
    q = pd.concat(quantiles, ignore_index=True)
    q["policy"] = q["run_id"].map(label_of)
    figures: dict[str, Any] = {"latency_cdf.png": plots.latency_cdf(q, labels, title="Ack latency CDF per policy")}
    data["latency_cdf.png"] = q
    s = pd.concat(series, ignore_index=True)
    if len(s) and len(windows) == 1:
        s = s.assign(policy=s["run_id"].map(label_of), t_s=s["window_start_us"] / 1e6,
                     unavailable_s=s["unavailable_us"] / 1e6)
        window_s = windows.pop() / 1e6
        figures["loss_timeline.png"] = plots.loss_timeline(s, labels, window_s=window_s)
        data["loss_timeline.png"] = (s, window_s)

    worst = worst_of(r for r in cmp.results if r.lakehouse is not None)
    if worst is not None:
        lakehouse = houses[worst.lakehouse]
        duration_us = int(s.loc[s["run_id"] == worst.run_id, "window_start_us"].max()) if len(s) else 0
        manifest_duration = _trace_duration_us(worst)
        duration_us = manifest_duration if manifest_duration is not None else duration_us
        parts = report_data.busiest_partitions(lakehouse, worst.run_id)
        history = report_data.partition_history(lakehouse, worst.run_id, parts, duration_us)
        figures["partition_timeline.png"] = plots.partition_timeline(
            history, duration_s=duration_us / 1e6,
            title=f"Leader, ISR and high watermark of the busiest partitions: {worst.label}")
    return figures


def _trace_duration_us(r: PolicyResult) -> int | None:
    from schemas.trace import Manifest

    trace_dir = r.tags.get("replab.trace_dir")
    if trace_dir and (Path(trace_dir) / "manifest.json").is_file():
        try:
            return Manifest.read(trace_dir).duration_us
        except Exception:  # a trace edited since: the windows still bound the plot
            return None
    return None


def _mlflow_timeline(client, cmp: Comparison, data: dict[str, Any]):
    """The loss/unavailability timeline from the runs' per-window MLflow series (no lakehouse needed)."""
    from report import plots

    frames, windows = [], {r.window_ms for r in cmp.results}
    if len(windows) != 1 or None in windows:
        return None
    window_ms = windows.pop()
    for r in cmp.results:
        lost = {m.step: m.value for m in client.get_metric_history(r.mlflow_run_id, tracking.SERIES_ACKED_LOST)}
        unavailable = {m.step: m.value
                       for m in client.get_metric_history(r.mlflow_run_id, tracking.SERIES_UNAVAILABLE)}
        steps = sorted(set(lost) | set(unavailable))
        frames.append(pd.DataFrame({"policy": r.label, "t_s": [s * window_ms / 1000 for s in steps],
                                    "acked_lost": [lost.get(s, 0.0) for s in steps],
                                    "unavailable_s": [unavailable.get(s, 0.0) for s in steps]}))
    if not frames:
        return None
    frame = pd.concat(frames, ignore_index=True)
    data["loss_timeline.png"] = (frame, window_ms / 1000)
    return plots.loss_timeline(frame, [r.label for r in cmp.results], window_s=window_ms / 1000)


def figures_for(client, cmp: Comparison, data: dict[str, Any] | None = None,
                views: Sequence[RunViews] = ()) -> dict[str, Any]:
    """The PNG plots by file name; `data` (if given) receives each plot's frame, for the interactive charts;
    `views`: see `_lakehouse_plots`."""
    from report import plots

    data = {} if data is None else data

    points = pd.DataFrame({
        "policy": [r.label for r in cmp.results],
        "acked_lost": [r.metric("acked_lost") or 0.0 for r in cmp.results],
        "ack_latency_p99_ms": [r.metric("ack_latency_p99_ms") for r in cmp.results],
        "availability": [r.metric("availability") for r in cmp.results],
        "unavailable_partition_seconds": [r.metric("unavailable_partition_seconds") for r in cmp.results],
    })
    figures: dict[str, Any] = {"pareto.png": plots.pareto(points, title=f"Durability against latency: "
                                                                        f"{cmp.experiment}")}
    data["pareto.png"] = points
    figures.update(_lakehouse_plots(cmp, data, views))
    if "loss_timeline.png" not in figures:
        timeline = _mlflow_timeline(client, cmp, data)
        if timeline is not None:
            figures["loss_timeline.png"] = timeline
    return figures


_CAPTIONS = {
    "pareto.png": "Acknowledged messages lost against p99 ack latency, one point per policy; colour is "
                  "availability (acked / produced), marker area unavailable partition-seconds. The dashed line "
                  "joins the policies no other policy beats on both axes.",
    "latency_cdf.png": "Ack latency of acknowledged messages (log scale).",
    "loss_timeline.png": "Per window of trace time: acknowledged messages later lost (by produce time), and "
                         "partition-seconds during which a produce could not be acknowledged (SPEC §4.3).",
    "partition_timeline.png": "Leader, ISR size and high watermark of the busiest partitions of {worst}, the "
                              "policy that lost the most acknowledged messages (then: was unavailable longest).",
}

#: Captions of the interactive charts (by the PNG they stand for in the page).
_CHART_CAPTIONS = {
    "pareto.png": "Acknowledged messages lost against p99 ack latency, one marker per policy (policies on the same "
                  "point share one marker); marker area is unavailable partition-seconds. Hover a marker for the "
                  "policies and their figures; click a family in the legend to hide or show it.",
    "latency_cdf.png": "Ack latency of acknowledged messages (log scale). Hover a line for its policy; click a "
                       "family in the legend to hide or show it, double-click to show it alone.",
    "loss_timeline.png": "Per window of trace time: acknowledged messages later lost (by produce time), and "
                         "partition-seconds during which a produce could not be acknowledged (SPEC §4.3). Drag to "
                         "zoom, double-click to reset.",
}


def policy_info(cmp: Comparison) -> list[Any]:
    from report.interactive import PolicyInfo

    return [PolicyInfo(r.label, r.name, r.policy, r.family or r.policy.partition(":")[0], i)
            for i, r in enumerate(cmp.results)]


def interactive_charts(cmp: Comparison, data: dict[str, Any]) -> dict[str, str]:
    """The interactive charts' HTML fragments by the PNG they stand for (see `figures_for`'s `data`)."""
    from report import interactive

    info = policy_info(cmp)
    charts = {}
    if "pareto.png" in data:
        charts["pareto.png"] = interactive.fragment(
            interactive.pareto(data["pareto.png"], info, title=f"Durability against latency: {cmp.experiment}"),
            "chart-pareto")
    if "latency_cdf.png" in data:
        charts["latency_cdf.png"] = interactive.fragment(
            interactive.latency_cdf(data["latency_cdf.png"], info, title="Ack latency CDF per policy"),
            "chart-latency-cdf")
    if "loss_timeline.png" in data:
        series, window_s = data["loss_timeline.png"]
        charts["loss_timeline.png"] = interactive.fragment(
            interactive.loss_timeline(series, info, window_s=window_s,
                                      title="Acknowledged-and-lost messages and unavailability per window"),
            "chart-loss-timeline")
    return charts




def render_html(cmp: Comparison, images: dict[str, bytes], extra_html: str = "",
                charts: dict[str, str] | None = None) -> str:
    """The page. A plot with an interactive chart in `charts` (by PNG name) is drawn as that chart, the others as
    embedded PNGs; plotly.js is inlined once, in the head, when there is a chart."""
    from report.interactive import CHART_CLASS, script_tag
    from report.tables import COMPARISON_COLUMNS

    charts = charts or {}
    needs_js = bool(charts) or CHART_CLASS in extra_html

    esc = html.escape
    traces = sorted({r.trace_id for r in cmp.results})
    head = "".join(f"<th>{esc(h)}</th>" for _, h, _ in COMPARISON_COLUMNS)
    body = []
    for r in cmp.results:
        cells = "".join(f'<td class="n">{esc(_fmt(r.metric(name), fmt, name))}</td>'
                        for name, _, fmt in COMPARISON_COLUMNS)
        cls = ' class="lost"' if count_of(r.metric("acked_lost")) else ""
        body.append(f'<tr{cls}><td class="policy"><code>{esc(r.label)}</code></td>{cells}</tr>')
    verdicts = "".join(f"<li><code>{esc(r.label)}</code>: {esc(cmp.verdicts[r.label])}</li>" for r in cmp.results)
    found = "".join(f"<li>{esc(line)}</li>" for line in cmp.findings)
    worst = worst_of(r for r in cmp.results if r.lakehouse is not None)
    figures = []
    for name, png in images.items():
        if name in charts:
            figures.append(f"<figure>{charts[name]}<figcaption>{esc(_CHART_CAPTIONS[name])}</figcaption></figure>")
            continue
        data = base64.b64encode(png).decode("ascii")
        figures.append(f'<figure><img alt="{esc(name)}" src="data:image/png;base64,{data}">'
                       f"<figcaption>{esc(_CAPTIONS.get(name, name).format(worst=worst.label if worst else '?'))}"
                       "</figcaption></figure>")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>replab: {esc(cmp.experiment)}</title>
<style>{page_css()}</style>{script_tag() if needs_js else ''}</head><body>
<h1>Replication policies compared: {esc(cmp.experiment)}</h1>
<p class="meta">trace{'s' if len(traces) > 1 else ''} {esc(', '.join(traces))} · {len(cmp.results)} policies ·
MLflow <code>{esc(cmp.tracking_uri)}</code> · generated {esc(tracking.utc_now_text())}</p>
<h2>Findings</h2><ul class="findings">{found}</ul>
<h2>Per policy</h2><ul>{verdicts}</ul>
<h2>Numbers</h2>
<table><thead><tr><th>policy</th>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>
<p class="meta">Acked lost: acknowledged to the producer, never readable by consumers (SPEC §4.1). Failed but
committed: the producer got an error, consumers will read it anyway. Stranded: acknowledged and committed but not
readable at the end of the trace. Availability: acked / produced. Unavailable partition-seconds: time during which
a produce to a partition could not be acknowledged, summed over partitions.</p>
<h2>Plots</h2>{''.join(figures)}
{extra_html}
</body></html>
"""


def default_out_dir(experiment: str) -> Path:
    """`reports/<experiment>`, the name made a single safe folder name (no path from input escapes, SPEC §11)."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", experiment).strip("._") or "experiment"
    return Path("reports") / slug


def build_report(experiment: str, out_dir: str | Path | None = None, tracking_uri: str | None = None, *,
                 console: Any | None = None, views: Sequence[RunViews] = ()) -> Path:
    """Write comparison.csv, the plots and report.html for the experiment, log them to MLflow; the HTML path.

    With a rich `console`, the comparison table and verdicts are printed there too. `views`
    (storage.report_data.RunViews, from the replay just run) spare the lakehouse queries of the runs they cover.
    """
    from report import plots

    client = tracking.client_for(tracking_uri)
    cmp = compare(client, experiment)
    out = Path(out_dir) if out_dir is not None else default_out_dir(experiment)
    out.mkdir(parents=True, exist_ok=True)
    comparison_frame(cmp).to_csv(out / "comparison.csv", index=False, quoting=csv.QUOTE_MINIMAL)
    images, data = {}, {}
    for name, fig in figures_for(client, cmp, data, views).items():
        images[name] = plots.png_bytes(fig)
        (out / name).write_bytes(images[name])
    # SPEC §12: the testbed's cases of the same tracking store, predicted beside observed.
    from report.testbed import FIGURE, section

    testbed = section(client)
    extra = ""
    if testbed is not None:
        png = plots.png_bytes(testbed.figure)
        (out / FIGURE).write_bytes(png)
        data = base64.b64encode(png).decode("ascii")
        extra = (testbed.html + f'<figure><img alt="testbed" src="data:image/png;base64,{data}">'
                 "<figcaption>Per testbed case: acknowledged messages lost and unavailable partition-seconds, "
                 "replab's prediction beside the real cluster.</figcaption></figure>")
    html_path = out / "report.html"
    html_path.write_text(render_html(cmp, images, extra, interactive_charts(cmp, data)), encoding="utf-8")
    cmp_tags = {"replab.policies": str(len(cmp.results)), "replab.version": _version()}
    traces = sorted({r.trace_id for r in cmp.results})
    if len(traces) == 1:
        cmp_tags[tracking.TAG_TRACE_ID] = traces[0]
    files = {"report.html": html_path, "comparison.csv": out / "comparison.csv",
             **{f"plots/{name}": out / name for name in images}}
    exp = tracking.find_experiment(client, experiment)
    tracking.log_report_run(client, exp.experiment_id, files, tags=cmp_tags)
    if console is not None:
        print_table(cmp, console)
    return html_path.resolve()


def _version() -> str:
    from schemas.version import __version__

    return __version__

