"""`replab demo` end to end at a tiny scale (SPEC §6.1): lakehouse, MLflow experiment and report, all under --out.

Run in-process through the CLI entry point, so it shares the session's SparkSession (get_spark returns it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.spark


def test_demo_writes_lakehouse_experiment_and_report(spark, tmp_path, capsys):
    from engine import tracking
    from pipelines.cli import main
    from pipelines.demo_job import DemoLayout
    from replay.policies import all_presets
    from storage.lakehouse import Lakehouse

    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--scale", "0.05"]) == 0
    printed = capsys.readouterr().out
    layout = DemoLayout(out.resolve())
    presets = sorted(p.canonical() for _, p in all_presets())  # the demo's 6 brokers fit every preset

    # Lakehouse: one succeeded run per preset, each with its summary and its MLflow run id.
    lakehouse = Lakehouse(layout.lakehouse, spark, create=False)
    runs = lakehouse.read("runs").collect()
    assert sorted(r.policy for r in runs) == presets
    assert {r.status for r in runs} == {"succeeded"} and len({r.trace_id for r in runs}) == 1
    trace_id = runs[0].trace_id
    assert trace_id == "demo-s0-x0.05"
    assert lakehouse.read("run_summary").count() == len(presets)

    # MLflow: the experiment named after the trace has one finished run per preset, named by the policy.
    client = tracking.client_for(layout.tracking_uri)
    experiment = client.get_experiment_by_name(trace_id)
    assert experiment is not None
    assert experiment.artifact_location.startswith(layout.mlruns.as_uri())
    policy_runs = tracking.search_all_runs(client, [experiment.experiment_id],
                                           f"tags.`{tracking.TAG_KIND}` = '{tracking.KIND_POLICY}'")
    assert sorted(r.info.run_name for r in policy_runs) == presets
    assert {r.info.status for r in policy_runs} == {"FINISHED"}
    assert {r.info.run_id for r in policy_runs} == {r.mlflow_run_id for r in runs}
    assert all("acked_lost" in r.data.metrics and "availability" in r.data.metrics for r in policy_runs)
    # Each run's three plots (drawn in worker processes: 15 runs), each its own (titled with its policy).
    from report.figures import RUN_PLOTS

    pngs = []
    for r in policy_runs:
        assert sorted(a.path for a in client.list_artifacts(r.info.run_id, "plots")) == sorted(RUN_PLOTS)
        folder = Path(client.download_artifacts(r.info.run_id, "plots", str(tmp_path / r.info.run_id)))
        pngs += [(folder / Path(name).name).read_bytes() for name in RUN_PLOTS]
    assert all(png[:8] == b"\x89PNG\r\n\x1a\n" for png in pngs) and len(set(pngs)) == len(pngs)

    # Report: the HTML and the CSV name every preset.
    html = (layout.report / "report.html").read_text()
    assert all(policy in html for policy in presets)
    assert len((layout.report / "comparison.csv").read_text().strip().splitlines()) == 1 + len(presets)

    # What the demo printed: where things are and how to open the UI bound to 127.0.0.1.
    table = printed[:printed.index("demo finished in")]
    assert all(f" {preset.name} " in table for preset, _ in all_presets())  # rows named as conf/policies.yaml
    assert str(layout.report / "report.html") in printed
    assert f"mlflow ui --backend-store-uri {layout.tracking_uri}" in printed and "--host 127.0.0.1" in printed


def test_every_preset_means_every_preset_that_fits_the_cluster():
    """A 3-broker trace cannot host `dledger-5` (5 brokers per group): it is named and skipped, not fatal."""
    from pathlib import Path

    from pipelines.demo_job import fitting_presets
    from replay.policies import presets
    from schemas.trace import Manifest

    k2 = Manifest.read(Path(__file__).resolve().parents[1] / "scenarios" / "k2-acks1-leader-crash")
    fitting, skipped = fitting_presets(k2)
    assert [name for name, _ in skipped] == ["dledger-5"] and "need 5 brokers" in skipped[0][1]
    assert len(fitting) == len(presets()) - 1
