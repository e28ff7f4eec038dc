"""The README stays a front door: short, and its quick start runs as written."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from pipelines.cli import main

README = Path(__file__).resolve().parent.parent / "README.md"


def readme() -> str:
    return README.read_text()


#: The README is a front door; everything longer belongs on a page of docs/.
README_MAX_LINES = 200


def test_readme_is_a_front_door():
    text = readme()
    assert len(text.splitlines()) <= README_MAX_LINES
    for section in ("## Two commands", "## Quick start", "## What else it does", "## Layout"):
        assert section in text, section


def readme_commands(name: str) -> list[list[str]]:
    """The commands of the ```bash block after `<!-- readme-test: NAME -->` (comments and continuations handled)."""
    text = readme()
    start = text.index(f"<!-- readme-test: {name} -->")
    block = re.search(r"```bash\n(.*?)```", text[start:], re.S).group(1)
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words:
            assert words[0] == "replab", line
            commands.append(words[1:])
    return commands


@pytest.mark.spark
def test_quick_start_runs_as_written(spark, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    commands = readme_commands("cli")
    assert [c[0] for c in commands] == ["scenarios", "generate", "validate", "replay", "compare"]
    for words in commands:
        assert main(words) == 0, words
    out = capsys.readouterr().out
    assert "k2-acks1-leader-crash" in out and "kafka-durable" in out
    summary = json.loads((tmp_path / "k2.json").read_text())
    assert [s["policy"] for s in summary] == ["kafka:acks=1", "kafka:min_insync_replicas=2",
                                              "rocketmq:broker_role=SYNC_MASTER"]
    assert all(s["produced"] > 0 for s in summary)
    assert (tmp_path / "lakehouse" / "message_outcomes" / "_delta_log").is_dir()
    assert (tmp_path / "mlflow.db").is_file() and (tmp_path / "reports" / "k2" / "report.html").is_file()
