"""How many Py4J round trips the driver makes in a small replay, and where replab's code makes them.

    python -m bench.py4j_calls                  # 3 replays of a 3-message trace in one session, the last counted
    python -m bench.py4j_calls --top 40 --json out.json

Every `send_command` of the Python driver (a round trip to the JVM) during the last replay is counted under the
first frame of replab's own code on the calling thread's stack; calls with none of it (py4j's collection of the
driver's JVM objects, on a thread of its own) count as "(no replab frame)". The earlier replays warm the JVM, so
the seconds are those of a session that stays up. Round trips do not depend on the machine's load, unlike the
seconds (which include the JVM's work the driver waits for).
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

_REPO = str(Path(__file__).resolve().parents[1]) + "/"


def call_site(frame) -> str:
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(_REPO) and "/.venv/" not in name and not name.endswith("bench/py4j_calls.py"):
            return f"{name[len(_REPO):]}:{frame.f_lineno} {frame.f_code.co_name}"
        frame = frame.f_back
    return "(no replab frame)"


def count(replays: int = 3, workdir: str | None = None) -> tuple[dict[str, int], dict[str, float], list[float]]:
    """Round trips and their seconds by call site during the last of `replays` replays, and each replay's wall
    seconds."""
    import py4j.clientserver as clientserver

    from bench.fixed_cost_bench import write_tiny_trace
    from engine.plan import ReplayRequest
    from engine.replay import run_replay
    from replay.policies import parse_policy
    from report.figures import run_figures
    from storage.session import get_spark

    root = Path(workdir or tempfile.mkdtemp(prefix="replab-bench-py4j-"))
    trace = write_tiny_trace(root / "trace")
    calls: collections.Counter[str] = collections.Counter()
    seconds: collections.Counter[str] = collections.Counter()
    counting = [False]
    send = clientserver.ClientServerConnection.send_command

    def counted(self, command):
        if not counting[0]:
            return send(self, command)
        t0 = time.perf_counter()
        try:
            return send(self, command)
        finally:
            site = call_site(sys._getframe(1))
            calls[site] += 1
            seconds[site] += time.perf_counter() - t0

    clientserver.ClientServerConnection.send_command = counted
    spark = get_spark("replab-bench-py4j")
    walls = []
    try:
        for i in range(replays):
            counting[0] = i == replays - 1
            t0 = time.monotonic()
            run_replay(spark, ReplayRequest(trace=str(trace), policies=[parse_policy("kafka-acks1")],
                                            lakehouse=str(root / f"lh{i}"), tracking_uri=f"sqlite:///{root}/mlflow.db",
                                            figures=run_figures))
            walls.append(time.monotonic() - t0)
    finally:
        counting[0] = False
        clientserver.ClientServerConnection.send_command = send
        spark.stop()
        if workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    return dict(calls), dict(seconds), walls


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replays", type=int, default=3, help="replays in the session; the last is counted")
    parser.add_argument("--top", type=int, default=20, help="call sites to print")
    parser.add_argument("--workdir", help="where the trace and lakehouses go (default: temp)")
    parser.add_argument("--json", help="write the counts as JSON")
    args = parser.parse_args(argv)
    calls, seconds, walls = count(max(1, args.replays), args.workdir)
    total = sum(calls.values())
    print(f"replays: {' '.join(f'{w:.1f}' for w in walls)} s; the last: {total} Py4J round trips, "
          f"{sum(seconds.values()):.2f} s in them (summed over threads)")
    for site, n in sorted(calls.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"{n:7d} {seconds[site]:7.3f}s  {site}")
    if args.json:
        Path(args.json).write_text(json.dumps({"replay_seconds": walls, "round_trips": total, "by_site": calls,
                                               "seconds_by_site": seconds}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
