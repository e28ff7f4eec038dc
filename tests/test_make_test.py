"""`make test` itself (the Makefile's recipe): the testbed's fast case runs beside the suite, the suite at nice 10,
and either run failing fails `make test`, with the testbed's output printed after the suite's.

The recipe runs with `PY` set to a stand-in interpreter that records each pytest run (which one, its niceness, and
for the suite whether the testbed's run had started meanwhile) and exits with the code the test asks for; `STAMP`
points at a fresh file so that make does not bootstrap the virtualenv.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

STAND_IN = textwrap.dedent("""\
    #!{python}
    import json, os, sys, time
    from pathlib import Path
    testbed = "testbed and not slow" in sys.argv
    started = Path(os.environ["RUNS_LOG"] + ".testbed-started")
    if testbed:
        started.touch()
        saw_the_other = None
    else:  # the suite waits (at most 20 s) for the testbed's run: it has started only if they run side by side
        deadline = time.time() + 20
        while not started.exists() and time.time() < deadline:
            time.sleep(0.05)
        saw_the_other = started.exists()
    print("testbed output" if testbed else "suite output", flush=True)
    with open(os.environ["RUNS_LOG"], "a") as log:
        log.write(json.dumps({{"testbed": testbed, "nice": os.nice(0), "saw_testbed": saw_the_other}}) + "\\n")
    sys.exit(int(os.environ["TESTBED_RC" if testbed else "SUITE_RC"]))
""")


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize(("suite_rc", "testbed_rc", "ok"), [(0, 0, True), (1, 0, False), (0, 1, False)],
                         ids=["both-pass", "suite-fails", "testbed-fails"])
def test_make_test_runs_the_testbed_beside_the_niced_suite_and_fails_if_either_fails(tmp_path, suite_rc,
                                                                                      testbed_rc, ok):
    python = tmp_path / "python"
    python.write_text(STAND_IN.format(python=os.path.realpath(shutil.which("python3") or "/usr/bin/python3")))
    python.chmod(0o755)
    stamp, runs = tmp_path / "stamp", tmp_path / "runs.jsonl"
    stamp.touch()
    # Not the flags of a `make test` this suite may be running under (its variables would reach this make).
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env.update(RUNS_LOG=str(runs), SUITE_RC=str(suite_rc), TESTBED_RC=str(testbed_rc))
    proc = subprocess.run(["make", "-s", "test", f"PY={python}", f"STAMP={stamp}",
                           f"TESTBED_LOG={tmp_path / 'testbed.log'}"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    assert (proc.returncode == 0) is ok, proc.stdout + proc.stderr
    by_kind = {r["testbed"]: r for r in map(json.loads, runs.read_text().splitlines())}
    suite, testbed = by_kind[False], by_kind[True]
    assert suite["saw_testbed"]  # side by side: the testbed's run had started while the suite's ran
    assert suite["nice"] == min(19, testbed["nice"] + 10)  # 19 is the ceiling (under `make test`, already 10)
    # The testbed's output comes after the suite's, with its exit code.
    out = proc.stdout
    assert out.index("suite output") < out.index(f"testbed's fast case (run beside the suite; exit {testbed_rc})") \
        < out.index("testbed output")
