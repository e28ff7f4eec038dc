"""`replab replay` and `spark-submit pipelines/replay_job.py`: replay a trace under policies on Spark (SPEC §4).

Thin: the arguments become an `engine.replay.ReplayRequest`; the batch replay (`engine.replay.run_replay`) or
the stream replay (`engine.stream.query.run_stream_replay`) does the work; the comparison table is printed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

if __name__ == "__main__" and __package__ in (None, ""):
    # spark-submit pipelines/replay_job.py without --py-files: the repo root holds the packages.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def prefetch_imports(modules: Sequence[str]) -> None:
    """Import heavy libraries in a background thread while the JVM starts: Great Expectations (both gates) and
    MLflow take seconds each to import, which the Spark start can hide on a second core. A failure here is the
    later real import's to report."""
    import importlib
    import threading

    def load() -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:  # the job's own import raises it where it matters
                return

    threading.Thread(target=load, name="replab-prefetch", daemon=True).start()


def cli(args: argparse.Namespace) -> int:
    from engine.plan import ReplayRequest
    from engine.replay import run_replay, short_lived_jvm
    from engine.stream.query import run_stream_replay
    from report.figures import run_figures
    from report.tables import print_comparison
    from report.terminal import console as terminal
    from storage.session import get_spark

    console = terminal()
    request = ReplayRequest(
        trace=args.trace, policies=args.policies, lakehouse=args.lakehouse, window_ms=args.window_ms,
        mode=args.mode, tracking_uri=args.tracking_uri, experiment=args.experiment,
        mlflow=not args.no_mlflow, summary_json=args.summary_json, checkpoint=args.checkpoint,
        allowed_lateness_ms=args.allowed_lateness_ms, figures=run_figures, labels=list(args.policy))
    prefetch_imports(["great_expectations", *(["mlflow"] if request.mlflow else [])])
    console.log("Spark session")
    spark = get_spark("replab-replay", short_lived=short_lived_jvm(request))
    replay = run_stream_replay if request.mode == "stream" else run_replay
    report = replay(spark, request, progress=lambda t: console.log(t))
    report.labels = list(args.policy)  # as the user wrote them (preset names read better than canonical forms)
    print_comparison(report, console)
    console.print(f"lakehouse: {report.lakehouse}")
    if report.experiment:
        console.print(f"MLflow experiment: {report.experiment} ({len(report.mlflow)} runs)")
    if request.summary_json:
        console.print(f"summary JSON: {request.summary_json}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """spark-submit entry point: the same arguments as `replab replay`."""
    from pipelines.cli import main as cli_main

    return cli_main(["replay", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
