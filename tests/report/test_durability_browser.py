"""durability.html in headless Chromium (Debian's `chromium`, `make browser`), opened from disk with no network,
from a small real durability run (in-process: the same episodes and figures a Spark run gives): plotly drew the
nines chart and one sensitivity chart per re-weighted rate and for the restart times, one trace per policy on
each; the restart-time chart is drawn against restart seconds; a screenshot is not blank.

Skipped, with the reason, where Chromium is not installed."""

from __future__ import annotations

import json
import re

import pytest

from engine.durability.job import DurabilityReport, durability_id_for, write_json
from engine.durability.judge import TraceShape
from engine.durability.run import RESTART_TIME, SENSITIVITY, DurabilitySpec, estimate_local, sensitivity
from generators.library import resolve_scenario
from generators.rates import load_rates
from replay.policies import parse_policy
from report.durability import write_html
from report.interactive import chart_count
from tests.report.chromium import dom, ink, needs_chromium, screenshot

LABELS = ["kafka-acks1", "rocketmq-async"]


@needs_chromium
def test_durability_page_renders_every_chart_in_chromium(tmp_path):
    spec = DurabilitySpec(resolve_scenario("demo"), load_rates(), tuple(parse_policy(p) for p in LABELS),
                          shape=TraceShape(trace_rate_per_s=20.0, max_gap_s=60.0), seed=5)
    est = estimate_local(spec, episodes=8, batch=8)
    report = DurabilityReport(durability_id_for(spec), est, LABELS, est.figures(), sensitivity(est), 0.0,
                              "max episodes", json_path=tmp_path / "durability.json")
    write_json(report)
    doc = json.loads(report.json_path.read_text())
    page = write_html(doc, tmp_path / "durability.html")
    charts = chart_count(page.read_text())
    processes = [*SENSITIVITY, RESTART_TIME]
    assert charts == 1 + len(processes)

    page_dom = dom(page.as_uri(), tmp_path / "profile")
    assert len(re.findall(r'<div[^>]*class="[^"]*js-plotly-plot', page_dom)) == charts
    assert page_dom.count('class="main-svg"') >= charts
    # one trace per policy on the nines chart and on every sensitivity chart
    assert len(re.findall(r'class="trace scatter', page_dom)) == len(LABELS) * charts
    legend = set(re.findall(r'class="legendtext"[^>]*>([^<]*)<', page_dom))
    assert set(LABELS) <= legend, legend
    assert "mean broker restart time after a crash, s" in page_dom
    assert "nines against the brokers' restart times" in page_dom

    shot = screenshot(page.as_uri(), tmp_path / "durability.png", tmp_path / "profile")
    inked, coloured = ink(shot)
    assert inked > 0.02 and coloured > 0.0015, (inked, coloured)


def test_restart_rows_cover_every_factor_and_policy(tmp_path):
    """Without a browser: the sensitivity table holds the restart-time rows the page draws, x increasing."""
    spec = DurabilitySpec(resolve_scenario("demo"), load_rates(), (parse_policy("kafka-acks1"),),
                          shape=TraceShape(trace_rate_per_s=20.0, max_gap_s=60.0), seed=5)
    est = estimate_local(spec, episodes=8, batch=8)
    rows = [r for r in sensitivity(est) if r["process"] == RESTART_TIME]
    assert [r["factor"] for r in rows] == [0.5, 1.0, 2.0, 4.0]
    xs = [r["x"] for r in rows]
    assert xs == sorted(xs) and 60 < xs[1] < 200  # the model's crash restart: median 60 s, clipped 10 s - 1 h
    base = est.figures()[0]
    assert rows[1]["p_loss_per_year"] == pytest.approx(base["p_loss_per_year"])  # × 1 is the plain estimate
