"""The reports and the MLflow UI in a real browser: headless Chromium (Debian's `chromium`, `make browser`).

- `replab compare`'s report.html, opened from disk with no network: plotly really drew every chart (the DOM
  after its scripts ran holds one plotly graph per chart and its traces), and a screenshot is not blank;
- `mlflow server` on 127.0.0.1 over the k2 replay's sqlite store: the experiment's runs page lists every policy
  run, and the compare view of those runs has acked_lost, availability and ack p99 as rows; the values it shows
  are asserted through the same server's REST API (the compare table renders its value columns lazily, so the
  dumped DOM holds only the first run's).

Skipped, with the reason, where Chromium is not installed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

from report.compare import build_report
from report.interactive import chart_count
from tests.report import chromium as browser

pytestmark = pytest.mark.spark

@browser.needs_chromium
def test_report_charts_render_in_chromium(k2_mlflow_replay, tmp_path):
    replay = k2_mlflow_replay
    page = build_report(replay.experiment, tmp_path / "report", replay.tracking_uri)
    html = page.read_text()
    charts = chart_count(html)
    assert charts == 3

    dom = browser.dom(page.as_uri(), tmp_path / "profile")
    # plotly marks each graph it drew with js-plotly-plot and draws into main-svg layers; traces are g.trace.
    assert len(re.findall(r'<div[^>]*class="[^"]*js-plotly-plot', dom)) == charts
    assert dom.count('class="main-svg"') >= charts
    traces = len(re.findall(r'class="trace scatter', dom))
    # Pareto: one trace per family (1); the CDF: one line per policy (3); the timeline: two panels per policy (6).
    assert traces == 1 + 3 + 2 * 3, traces
    # The legend names the family and the policies (as typed: canonical strings here).
    legend = re.findall(r'class="legendtext"[^>]*>([^<]*)<', dom)
    assert "kafka" in legend and "kafka:partitions=1,acks=1" in legend, legend

    shot = browser.screenshot(page.as_uri(), tmp_path / "report.png", tmp_path / "profile")
    inked, coloured = browser.ink(shot)
    # The charts' markers and lines in the policies' colours: not a blank page, nor text and tables alone.
    assert inked > 0.02 and coloured > 0.0015, (inked, coloured)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mlflow_server(k2_mlflow_replay, tmp_path):
    """`mlflow server` on 127.0.0.1 over the k2 replay's store; stopped by its process group, also on failure."""
    port = _free_port()
    log = (tmp_path / "mlflow-server.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", k2_mlflow_replay.tracking_uri],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "MLFLOW_ENABLE_TELEMETRY": "false", "DO_NOT_TRACK": "true"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "mlflow-server.log").read_text()
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def _api(url: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"{url}/api/2.0/mlflow/{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


@browser.needs_chromium
def test_mlflow_ui_lists_every_policy_with_its_key_figures(k2_mlflow_replay, mlflow_server, tmp_path):
    replay = k2_mlflow_replay
    with urllib.request.urlopen(f"{mlflow_server}/api/2.0/mlflow/experiments/get-by-name?experiment_name="
                                f"{urllib.parse.quote(replay.experiment)}", timeout=30) as r:
        exp = json.loads(r.read())["experiment"]
    runs = _api(mlflow_server, "runs/search", {"experiment_ids": [exp["experiment_id"]],
                                                "filter": "tags.`replab.kind` = 'policy'"})["runs"]
    names = sorted(r["info"]["run_name"] for r in runs)
    assert names == sorted(replay.canonical(c) for c in replay.expected)

    # What the UI shows, from the same server: each policy's key figures equal the replay's own summaries.
    by_name = {r["info"]["run_name"]: {m["key"]: m["value"] for m in r["data"]["metrics"]} for r in runs}
    for run, summary in zip(replay.report.runs, replay.report.summaries, strict=True):
        shown = by_name[run.canonical]
        for metric in ("acked_lost", "availability", "ack_latency_p99_ms"):
            assert shown[metric] == pytest.approx(summary[metric]), (run.canonical, metric)
    lost = {c["policy"]: c["summary"]["acked_lost"] for c in replay.expected}
    assert sorted(by_name[replay.canonical(c)]["acked_lost"] for c in replay.expected) == sorted(lost.values())

    profile = tmp_path / "profile"
    # The experiment's runs page (the "Model training" view) lists every policy run by name.
    dom = browser.dom(f"{mlflow_server}/#/experiments/{exp['experiment_id']}/runs", profile, 40_000)
    every = _api(mlflow_server, "runs/search", {"experiment_ids": [exp["experiment_id"]]})["runs"]
    assert f"<strong>{len(every)}</strong> matching runs" in dom  # the policies (and a comparison run, if any)
    for name in names:
        assert name in dom, name

    # The compare view of the policy runs: acked_lost, availability and ack p99 as rows, one column per run.
    ids = json.dumps([r["info"]["run_id"] for r in runs])
    compare = (f"{mlflow_server}/#/compare-runs?runs={urllib.parse.quote(ids)}"
               f"&experiments={urllib.parse.quote(json.dumps([exp['experiment_id']]))}")
    dom = browser.dom(compare, profile, 40_000)
    assert f"Comparing {len(runs)} Runs" in dom
    for metric in ("acked_lost", "availability", "ack_latency_p99_ms"):
        assert f">{metric}<" in dom, metric
    for run in runs:
        assert run["info"]["run_name"] in dom and run["info"]["run_id"] in dom
    shot = browser.screenshot(compare, tmp_path / "compare.png", profile, 40_000)
    inked, _ = browser.ink(shot)
    assert inked > 0.01, inked  # the page drew (a failed load is blank)
