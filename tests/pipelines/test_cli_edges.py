"""The edges of `replab replay` (SPEC §6.1): what a user can get wrong, or what the machine can refuse, ends in one
line on stderr and an exit code, never a traceback, and leaves every Delta table at the version it had."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from pipelines.cli import main
from storage.lakehouse import Lakehouse
from tests.conftest import K2

pytestmark = pytest.mark.spark


def replay_args(lakehouse: Path, *extra: str) -> list[str]:
    return ["replay", "--trace", str(K2), "--policy", "kafka-acks1", "--lakehouse", str(lakehouse), *extra]


def one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_a_file_store_tracking_uri_names_the_sqlite_form(tmp_path, capsys):
    lakehouse = tmp_path / "lh"
    assert main(replay_args(lakehouse, "--tracking-uri", "file:./mlruns")) == 2
    line = one_line(capsys.readouterr().err)
    assert "refuses the file store" in line and "sqlite:///mlflow.db" in line and "file:./mlruns" in line
    assert not lakehouse.exists()  # refused before any work


def test_a_lakehouse_under_a_file_is_not_writable(tmp_path, capsys):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder\n")
    assert main(replay_args(blocker / "lh", "--no-mlflow")) == 2
    line = one_line(capsys.readouterr().err)
    assert "not writable" in line and str(blocker) in line


def test_a_tracking_server_that_does_not_answer(spark, tmp_path, capsys, monkeypatch):
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    lakehouse = Lakehouse(tmp_path / "lh", spark)  # every table at version 0
    before = lakehouse.versions()
    assert main(replay_args(lakehouse.root, "--tracking-uri", f"http://127.0.0.1:{port}")) == 1
    line = one_line(capsys.readouterr().err)
    assert f"http://127.0.0.1:{port}" in line and "does not answer" in line
    assert lakehouse.versions() == before


@pytest.fixture
def tmpfs(tmp_path):
    """A small tmpfs of our own (root may mount; other users get a skip naming why)."""
    mounts = []

    def mount(name: str, options: str) -> Path:
        target = tmp_path / name
        target.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)], capture_output=True,
                              text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip() or proc.returncode}): needs root "
                        "or CAP_SYS_ADMIN")
        mounts.append(target)
        return target

    yield mount
    for target in reversed(mounts):
        subprocess.run(["umount", str(target)], check=True)


def test_a_read_only_lakehouse_is_not_writable(tmpfs, capsys):
    disk = tmpfs("ro", "ro,size=1m")
    assert main(replay_args(disk / "lh", "--no-mlflow")) == 2
    line = one_line(capsys.readouterr().err)
    assert "not writable" in line and "read-only" in line


def test_a_full_disk_leaves_every_table_as_it_was(spark, tmpfs, capsys):
    disk = tmpfs("full", "size=16m")
    lakehouse = Lakehouse(disk / "lh", spark)  # every table at version 0, then nothing left for the replay
    before = lakehouse.versions()
    with (disk / "filler").open("wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 16))
                f.flush()
        except OSError:
            pass
    assert main(replay_args(lakehouse.root, "--no-mlflow")) == 1
    line = one_line(capsys.readouterr().err)
    assert "no space left on device" in line.lower()
    assert lakehouse.versions() == before
