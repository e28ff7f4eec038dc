"""`replab compare` / `build_report` on the k2 experiment (SPEC §6.1, §6.4). Expected figures: expected.json."""

from __future__ import annotations

import re

import pandas as pd
import pytest
from mlflow import MlflowClient

from pipelines.cli import main
from report.compare import build_report
from report.interactive import chart_count

pytestmark = pytest.mark.spark

PNGS = ("pareto.png", "latency_cdf.png", "loss_timeline.png", "partition_timeline.png")


def _comparison_runs(replay):
    client = MlflowClient(tracking_uri=replay.tracking_uri)
    exp = client.get_experiment_by_name(replay.experiment)
    return client, client.search_runs([exp.experiment_id], filter_string="tags.`replab.kind` = 'comparison'")


def test_build_report_writes_html_csv_and_plots(k2_mlflow_replay, tmp_path):
    replay = k2_mlflow_replay
    out = tmp_path / "report"
    html_path = build_report(replay.experiment, out, replay.tracking_uri)
    assert html_path == (out / "report.html").resolve()
    for png in PNGS:
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png

    html = html_path.read_text()
    # Self-contained: the partition timeline as a PNG, three interactive charts drawn by one inline copy of
    # plotly.js; nothing is fetched from elsewhere.
    page = re.sub(r"<script[^>]*>.*?</script>", "", html, flags=re.S)  # the markup, without plotly.js's code
    assert page.count('src="data:image/png;base64,') == 1
    assert chart_count(html) == 3
    assert html.count("<script") == 4 and "<script src" not in html and "<link" not in page
    assert not re.search(r'(src|href)="(https?:)?//', page)
    assert len(re.findall(r"plotly\.js v\d", html)) == 1  # plotly.js's own banner: the library inlined once
    # Hover names the policies as typed beside their canonical forms; the legend groups by family.
    assert "kafka:partitions=1,acks=1,controller=zookeeper" in html and '"legendgroup":"kafka"' in html

    csv = pd.read_csv(out / "comparison.csv")
    assert len(csv) == len(replay.expected)
    by_policy = csv.set_index("policy")
    for case in replay.expected:
        row = by_policy.loc[replay.canonical(case)]
        for field, value in case["summary"].items():
            assert row[field] == pytest.approx(value), (case["policy"], field)

    # Verdicts: the policies that lost an acknowledged message are named, with the count; the safe one too.
    losers = [replay.canonical(c) for c in replay.expected if c["summary"]["acked_lost"] > 0]
    safe = [replay.canonical(c) for c in replay.expected if c["summary"]["acked_lost"] == 0]
    assert losers == ["kafka:partitions=1,acks=1", "kafka:partitions=1,acks=1,controller=zookeeper"]
    assert safe == ["kafka:partitions=1"]
    for policy in losers:
        assert by_policy.loc[policy, "verdict"].startswith("lost 1 acknowledged message (33.33 % of acknowledged)")
    assert by_policy.loc["kafka:partitions=1", "verdict"].startswith(
        "never lost an acknowledged message; unavailable 14.973 partition-seconds")
    assert ("Lost acknowledged messages: kafka:partitions=1,acks=1 (1), "
            "kafka:partitions=1,acks=1,controller=zookeeper (1).") in html
    assert "Fastest p99 among the policies that lost nothing: kafka:partitions=1" in html

    client, runs = _comparison_runs(replay)
    assert len(runs) == 1 and runs[0].info.run_name == "comparison" and runs[0].info.status == "FINISHED"
    names = {f.path for f in client.list_artifacts(runs[0].info.run_id)}
    assert {"report.html", "comparison.csv", "plots"} <= names
    plots = {f.path for f in client.list_artifacts(runs[0].info.run_id, "plots")}
    assert plots == {f"plots/{p}" for p in PNGS}


def test_cli_compare_prints_the_table_and_keeps_one_comparison_run(k2_mlflow_replay, tmp_path, capsys):
    replay = k2_mlflow_replay
    code = main(["compare", "--experiment", replay.experiment, "--out", str(tmp_path / "cli"),
                 "--tracking-uri", replay.tracking_uri])
    assert code == 0
    out = capsys.readouterr().out
    assert "kafka:partitions=1,acks=1: lost 1 acknowledged message" in out
    assert (tmp_path / "cli" / "report.html").is_file()
    # A second report replaces the comparison run: policy runs stay one per policy, one comparison run.
    client, runs = _comparison_runs(replay)
    assert len(runs) == 1
    exp = client.get_experiment_by_name(replay.experiment)
    policy_runs = client.search_runs([exp.experiment_id], filter_string="tags.`replab.kind` = 'policy'")
    assert len(policy_runs) == len(replay.expected)


def test_unknown_experiment_is_bad_input(k2_mlflow_replay, tmp_path, capsys):
    code = main(["compare", "--experiment", "no-such-trace", "--out", str(tmp_path / "x"),
                 "--tracking-uri", k2_mlflow_replay.tracking_uri])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no MLflow experiment named 'no-such-trace'" in err[0]
    assert "k2-acks1-leader-crash" in err[0]  # the experiments that do exist are listed
    assert not (tmp_path / "x").exists()


def test_the_replays_views_stand_in_for_the_lakehouse_queries_of_the_runs_they_cover(k2_mlflow_replay):
    """`make demo` hands the report the window series and latency quantiles its MLflow step computed
    (ReplayReport.views): they equal the lakehouse's, the report takes them for the runs they cover, and views of
    other runs or another window length are not taken."""
    from dataclasses import replace

    from report.compare import figures_for
    from report.findings import compare

    replay = k2_mlflow_replay
    views = replay.report.views
    assert views is not None and set(views.run_ids) == {r.run_id for r in replay.report.runs}
    client = MlflowClient(tracking_uri=replay.tracking_uri)
    cmp = compare(client, replay.experiment)

    def plotted(view_list) -> tuple[pd.DataFrame, pd.DataFrame]:
        data: dict = {}
        figures_for(client, cmp, data, view_list)
        q = data["latency_cdf.png"].sort_values(["run_id", "quantile"]).reset_index(drop=True)
        s = data["loss_timeline.png"][0].sort_values(["run_id", "window"]).reset_index(drop=True)
        return q, s

    queried_q, queried_s = plotted([])
    given_q, given_s = plotted([views])
    pd.testing.assert_frame_equal(given_q, queried_q)
    pd.testing.assert_frame_equal(given_s, queried_s)
    assert len(queried_q) and len(queried_s)

    tenfold = replace(views, quantiles=views.quantiles.assign(latency_ms=views.quantiles["latency_ms"] * 10))
    used_q, _ = plotted([tenfold])
    assert (used_q["latency_ms"] == queried_q["latency_ms"] * 10).all()
    for other in (replace(tenfold, run_ids=("another-run",)), replace(tenfold, window_us=tenfold.window_us * 2)):
        pd.testing.assert_frame_equal(plotted([other])[0], queried_q)
