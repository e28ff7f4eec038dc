"""`replab testbed recompare` refuses a folder without a recording: exit 2, naming the folder and the rule."""

from __future__ import annotations

from pipelines.cli import main


def test_a_folder_without_a_recording_exits_2_naming_it(tmp_path, capsys):
    (tmp_path / "trace").mkdir()
    assert main(["testbed", "recompare", "--policy", "dledger", "--out", str(tmp_path), "--no-tables"]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path) in err and "recording.pkl" in err and "testbed-recompare" in err
    assert not (tmp_path / "comparison.json").exists()


def test_a_second_cluster_of_one_scenario_gets_a_folder_any_path_may_hold():
    from pipelines.testbed_job import SUITE, run_folder

    policies = ("rocketmq:broker_role=SYNC_MASTER,delivery_timeout_ms=10000,slave_not_available=false",)
    assert run_folder("testbed-rmq-sync-slave-down", policies, again=False) == "testbed-rmq-sync-slave-down"
    assert run_folder("testbed-rmq-sync-slave-down", policies, again=True) == (
        "testbed-rmq-sync-slave-down-rocketmq_broker_role_SYNC_MASTER_delivery_timeout_ms_10000_"
        "slave_not_available_false")
    seen: set[str] = set()
    folders = []
    for scenario, pols in SUITE:
        folders.append(run_folder(scenario, pols, again=scenario in seen))
        seen.add(scenario)
    assert len(set(folders)) == len(SUITE) and all("," not in f and ":" not in f for f in folders)
