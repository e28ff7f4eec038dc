"""`replab --help`, `replab policies` and exit codes (SPEC §6.1)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pipelines.cli import main
from replay.policies import FAMILIES, presets


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipelines", *args], capture_output=True, text=True, timeout=120)


def test_help_lists_every_command():
    out = run_cli("--help")
    assert out.returncode == 0
    for command in ("generate", "validate", "replay", "compare", "sweep", "policies", "scenarios", "demo"):
        assert command in out.stdout
    assert "Exit codes" in out.stdout


def test_no_command_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "usage: replab" in capsys.readouterr().out


def test_bad_argument_exits_2():
    out = run_cli("replay", "--trace", "x")
    assert out.returncode == 2 and "--policy" in out.stderr


def test_bad_policy_exits_2_with_one_line_reason(tmp_path):
    out = run_cli("replay", "--trace", str(tmp_path), "--policy", "kafka:acks=2")
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "acks must be one of 0, 1, all" in lines[0]


def test_policies_json_reads_the_single_definition():
    out = run_cli("policies", "--format", "json")
    assert out.returncode == 0
    data = json.loads(out.stdout)
    assert set(data["families"]) == set(FAMILIES)
    kafka = {p["name"]: p for p in data["families"]["kafka"]["params"]}
    assert kafka["acks"]["default"] == "all" and kafka["acks"]["allowed"] == ["0", "1", "all"]
    assert kafka["replica_lag_time_max_ms"]["default"] == "30000" and kafka["replica_lag_time_max_ms"]["unit"] == "ms"
    assert set(data["presets"]) == set(presets())
    assert data["presets"]["kafka-durable"]["policy"] == "kafka:min_insync_replicas=2"


@pytest.mark.parametrize("fmt", ["table", "markdown"])
def test_policies_text_formats(fmt):
    out = run_cli("policies", "--format", fmt)
    assert out.returncode == 0
    assert "min_insync_replicas" in out.stdout and "kafka-durable" in out.stdout
