"""`replab` (also `python -m pipelines`): thin commands over the jobs (SPEC §6.1). No logic of its own.

Exit codes: 0 success; 2 bad input (trace, policy, arguments) with a one-line reason on stderr; 3 a
data-quality gate failed; 1 anything else.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from schemas.errors import BadInput, ReplabError
from schemas.version import __version__

EPILOG = """\
examples:
  replab policies                                    every family, preset and parameter
  replab generate --scenario k2-acks1-leader-crash --out traces/k2
  replab replay --trace traces/k2 --policy kafka-acks1 --policy kafka-durable --summary-json k2.json
  replab demo                                        the whole pipeline on the embedded default
  replab durability --policy kafka-durable --budget-minutes 5   nines per year at the default failure rates
  replab testbed run --scenario testbed-leader-crash --policy kafka-acks1 --out tb   a real cluster beside it

Policies are FAMILY[:param=value,...] or PRESET[:param=value,...], e.g. kafka:acks=1 or kafka-durable.
Exit codes: 0 ok, 2 bad input, 3 a data-quality gate failed, 1 anything else.
"""


class _Parser(argparse.ArgumentParser):
    """argparse exits with 2 on bad arguments, as SPEC §6.1 wants; keep its one-line message."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="replab",
        description="Replay cluster traces under Kafka and RocketMQ replication policies and compare what each "
                    "costs: acknowledged messages lost, write unavailability, ack latency, brokers.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"replab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def command(name: str, help_text: str, handler: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(handler=handler)
        return p

    p = command("generate", "write a synthetic trace from a scenario (SPEC §8)", "pipelines.generate_job:cli")
    p.add_argument("--scenario", required=True, metavar="NAME|FILE.yaml", help="library name or a YAML file")
    p.add_argument("--seed", type=int, default=0, help="random seed (same seed, same bytes; default 0)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply rate and duration (default 1.0)")
    p.add_argument("--out", required=True, metavar="DIR", help="trace directory to write")
    p.add_argument("--live", action="store_true", help="append event files over time (for stream replays)")
    p.add_argument("--live-speed", type=float, default=1.0, metavar="X",
                   help="with --live: trace seconds per wall-clock second (default 1.0)")

    p = command("validate", "run the trace quality gate (SPEC §2.3, §7)", "pipelines.validate_job:cli")
    p.add_argument("--trace", required=True, metavar="DIR")
    p.add_argument("--lakehouse", default="lakehouse", metavar="DIR",
                   help="where the quarantine and validations tables go (default ./lakehouse)")

    p = command("replay", "replay a trace under one or more policies (SPEC §4)", "pipelines.replay_job:cli")
    p.add_argument("--trace", required=True, metavar="DIR")
    p.add_argument("--policy", required=True, action="append", metavar="SPEC",
                   help="FAMILY[:k=v,...] or PRESET[:k=v,...]; repeat for several (one pass)")
    p.add_argument("--mode", choices=("batch", "stream"), default="batch")
    p.add_argument("--lakehouse", default="lakehouse", metavar="DIR", help="Delta tables root (default ./lakehouse)")
    p.add_argument("--tracking-uri", default=None, metavar="URI", help="MLflow tracking URI (default local)")
    p.add_argument("--experiment", default=None, metavar="NAME", help="MLflow experiment (default: the trace id)")
    p.add_argument("--window-ms", type=int, default=1000, metavar="N", help="metric window (default 1000)")
    p.add_argument("--summary-json", default=None, metavar="FILE", help="write the run summaries as JSON")
    p.add_argument("--no-mlflow", action="store_true", help="skip MLflow logging")
    p.add_argument("--allowed-lateness-ms", type=int, default=0, metavar="N",
                   help="stream mode: event-time lateness tolerated before rows count as late")
    p.add_argument("--checkpoint", default=None, metavar="DIR", help="stream mode: checkpoint location")

    p = command("compare", "compare the runs of an experiment: table, Pareto plot, HTML report",
                "pipelines.compare_job:cli")
    p.add_argument("--experiment", required=True, metavar="NAME")
    p.add_argument("--out", default=None, metavar="DIR", help="report folder (default ./reports/<experiment>)")
    p.add_argument("--tracking-uri", default=None, metavar="URI")

    def sweep_options(p: argparse.ArgumentParser, *, required: bool = True) -> None:
        p.add_argument("--scenario", required=required, metavar="NAME|FILE.yaml", help="library name or a YAML file")
        p.add_argument("--seeds", type=int, required=required, metavar="N",
                       help="how many seeds (traces) to generate")
        p.add_argument("--scale", type=float, default=1.0, help="scenario scale of every trace (default 1.0)")
        p.add_argument("--first-seed", type=int, default=0, metavar="N", help="seeds N … N+seeds-1 (default 0)")
        p.add_argument("--lakehouse", default="lakehouse", metavar="DIR",
                       help="Delta tables root: tables sweeps, sweep_results (default ./lakehouse)")
        p.add_argument("--window-ms", type=int, default=1000, metavar="N", help="metric window (default 1000)")
        p.add_argument("--tracking-uri", default=None, metavar="URI", help="MLflow tracking URI (default local)")
        p.add_argument("--experiment", default=None, metavar="NAME",
                       help="MLflow experiment (default sweep-<scenario>[-x<scale>]-seeds<first>-<last>)")
        p.add_argument("--no-mlflow", action="store_true", help="skip MLflow logging")
        p.add_argument("--out", default=None, metavar="DIR",
                       help="results (sweep.json, sweep.csv) and kept traces (DIR/traces); "
                            "default ./sweeps/<experiment>")
        p.add_argument("--keep-traces", action="store_true", help="also write every seed's trace to DIR/traces")
        p.add_argument("--series", action="store_true",
                       help="keep per-window acked-lost and unavailable series in sweep_results")

    p = command("sweep", "many seeds × many policies as one Spark job: probabilities with confidence intervals",
                "pipelines.sweep_job:cli")
    sweep_options(p)
    p.add_argument("--policy", required=True, action="append", metavar="SPEC",
                   help="FAMILY[:k=v,...] or PRESET[:k=v,...]; repeat for several (one pass per trace)")
    p.add_argument("--reuse", action="store_true",
                   help="read a succeeded sweep with the same parameters from the lakehouse instead of running it")

    p = command("recommend", "the cheapest policy whose confidence intervals meet an SLO, from a sweep or a "
                "durability run", "pipelines.recommend_job:cli")
    sweep_options(p, required=False)
    p.add_argument("--slo", required=True, metavar="TERMS",
                   help="e.g. 'p_loss<=0.001,availability>=0.999,ack_p99_ms<=50' (per trace, from a sweep: "
                        "--scenario and --seeds; metrics p_loss, p_loss_day, mean_acked_lost, availability, "
                        "ack_p99_ms, unavailable_s) or 'nines_per_year>=9,unavailable_min_per_year<=30' (per year, "
                        "from --durability; metrics nines_per_year, p_loss_per_year, acked_lost_per_year, "
                        "unavailable_min_per_year, failed_committed_per_year)")
    p.add_argument("--durability", default=None, metavar="DIR",
                   help="a `replab durability --out DIR` run (DIR or DIR/durability.json) for per-year SLO terms")
    p.add_argument("--policy", action="append", metavar="SPEC", help="a policy of the space; repeat for several")
    p.add_argument("--space", action="append", metavar="ITEMS",
                   help="families or presets (kafka,dledger,...), or a grid such as "
                        "'kafka:replication_factor=2|3,min_insync_replicas=1|2,acks=1|all' (default: kafka)")
    p.add_argument("--no-reuse", action="store_true", help="run the sweep even if the lakehouse holds it")

    p = command("durability", "nines per year of each policy at your failure rates: rare-event replay with "
                "intervals", "pipelines.durability_job:cli")
    p.add_argument("--scenario", default="demo", metavar="NAME|FILE.yaml",
                   help="the cluster, workload and follower behaviour (its own faults are ignored; default demo)")
    p.add_argument("--cluster", default=None, metavar="BROKERSxRACKS",
                   help="override the scenario's cluster, e.g. 6x3: 6 brokers in 3 racks")
    p.add_argument("--rates", default=None, metavar="NAME|FILE.yaml",
                   help="failure rates (default conf/rates/default.yaml)")
    p.add_argument("--policy", action="append", metavar="SPEC",
                   help="FAMILY[:k=v,...] or PRESET[:k=v,...]; repeat (default: every preset)")
    p.add_argument("--target-rel-error", type=float, default=0.2, metavar="X",
                   help="stop when every policy's P(loss) has a relative half-width <= X (default 0.2)")
    p.add_argument("--budget-minutes", type=float, default=10.0, metavar="M", help="stop after M minutes (default 10)")
    p.add_argument("--max-episodes", type=int, default=100_000, metavar="N", help="stop after N episodes")
    p.add_argument("--batch", type=int, default=None, metavar="N", help="episodes per round (default 4 per core)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--trace-rate", type=float, default=50.0, metavar="MSG_PER_S",
                   help="message rate of the episodes' traces; counts are scaled to the scenario's rate (default 50)")
    p.add_argument("--max-gap-s", type=float, default=150.0, metavar="S",
                   help="longest quiet stretch kept in an episode's trace (default 150)")
    p.add_argument("--out", default="durability", metavar="DIR", help="where durability.json goes")
    p.add_argument("--lakehouse", default="lakehouse", metavar="DIR",
                   help="Delta tables root: durability_runs, durability_estimates (default ./lakehouse)")
    p.add_argument("--tracking-uri", default=None, metavar="URI", help="MLflow tracking URI (default local)")
    p.add_argument("--experiment", default=None, metavar="NAME",
                   help="MLflow experiment (default durability-<scenario>)")
    p.add_argument("--no-mlflow", action="store_true", help="skip MLflow logging")

    p = command("testbed", "replab's predictions beside a real Kafka or RocketMQ cluster (SPEC §12)",
                "pipelines.testbed_job:cli")
    tsub = p.add_subparsers(dest="testbed_command", metavar="ACTION", parser_class=_Parser, required=True)
    t = tsub.add_parser("run", help="run a scenario on a real Kafka (KRaft) or RocketMQ cluster, replay its trace, "
                        "compare", description="run a scenario on a real Kafka (KRaft) or RocketMQ cluster, replay "
                        "its trace, compare")
    t.add_argument("--scenario", required=True, metavar="NAME|FILE.yaml", help="e.g. testbed-leader-crash")
    t.add_argument("--policy", required=True, action="append", metavar="SPEC",
                   help="a Kafka, dledger, rocketmq or rocketmq-controller policy; repeat for several of one kind "
                   "and one cluster layout (one topic and producer each)")
    t.add_argument("--out", required=True, metavar="DIR", help="DIR/trace/ and DIR/comparison.json")
    t.add_argument("--client-debug", default=None, metavar="CONTEXTS",
                   help="Kafka: librdkafka debug contexts of the producers (e.g. eos,msg,broker), logged to "
                   "DIR/cluster/librdkafka-<topic>.log: what the real client did, request by request")
    _testbed_outputs(t, "DIR/trace/ and DIR/comparison.json")
    t = tsub.add_parser("recompare", help="judge a recorded run again with the current model (no cluster)",
                        description="judge a recorded run again with the current model, without a cluster: "
                        "DIR/recording.pkl and DIR/trace/ as `testbed run` left them")
    t.add_argument("--policy", required=True, action="append", metavar="SPEC",
                   help="the run's policies, in its order (a changed parameter is judged as given)")
    t.add_argument("--out", required=True, metavar="DIR", help="the run's folder (its --out)")
    _testbed_outputs(t, "DIR/comparison.json")
    t = tsub.add_parser("report", help="the agreement table from testbed_comparisons",
                        description="the agreement table from testbed_comparisons")
    t.add_argument("--lakehouse", default="lakehouse", metavar="DIR", help="Delta tables root (default ./lakehouse)")

    p = command("policies", "every family, preset and parameter with its default", "pipelines.catalog:policies_cli")
    p.add_argument("--format", choices=("table", "markdown", "json"), default="table")

    p = command("scenarios", "the scenario library", "pipelines.catalog:scenarios_cli")
    p.add_argument("--format", choices=("table", "markdown", "json"), default="table")

    p = command("demo", "the main job on the embedded default: generate, validate, replay every preset, "
                "lakehouse, MLflow, report", "pipelines.demo_job:cli")
    p.add_argument("--out", default="demo", metavar="DIR", help="where everything goes (default ./demo)")
    p.add_argument("--scenario", default=None, metavar="NAME", help="override the demo scenario")
    p.add_argument("--scale", type=float, default=None, help="override the demo scale")
    return parser


def _testbed_outputs(t: argparse.ArgumentParser, files: str) -> None:
    """The options `testbed run` and `testbed recompare` share: where the comparison goes and how it predicts."""
    t.add_argument("--lakehouse", default="lakehouse", metavar="DIR", help="Delta tables root (default ./lakehouse)")
    t.add_argument("--tracking-uri", default=None, metavar="URI", help="MLflow tracking URI (default local)")
    t.add_argument("--no-mlflow", action="store_true", help="skip MLflow logging")
    t.add_argument("--spark-replay", action="store_true",
                   help="predict with the whole `replab replay` path on Spark (default: the same kernels, locally)")
    t.add_argument("--no-tables", action="store_true",
                   help=f"no Delta tables nor MLflow runs: {files} only (no Spark)")


def _resolve(handler: str) -> Callable[[argparse.Namespace], int | None]:
    module_name, _, func = handler.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise ReplabError(f"this command is not available in replab {__version__} yet") from exc
        raise
    return getattr(module, func)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        if getattr(args, "policy", None):
            # Bad policy strings are bad input whatever the command (exit 2), checked before any work starts.
            from replay.policies import parse_policy

            args.policies = [parse_policy(p) for p in args.policy]
        code = _resolve(args.handler)(args)
        return int(code or 0)
    except ReplabError as exc:
        print(f"replab {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # a full disk, a folder that vanished: one line, exit 1 (SPEC §6.1 "anything else")
        print(f"replab {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


__all__ = ["BadInput", "build_parser", "main"]
