"""`replab testbed recompare` refuses a folder without a recording: exit 2, naming the folder and the rule."""

from __future__ import annotations

from pipelines.cli import main


def test_a_folder_without_a_recording_exits_2_naming_it(tmp_path, capsys):
    (tmp_path / "trace").mkdir()
    assert main(["testbed", "recompare", "--policy", "dledger", "--out", str(tmp_path), "--no-tables"]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path) in err and "recording.pkl" in err and "testbed-recompare" in err
    assert not (tmp_path / "comparison.json").exists()
