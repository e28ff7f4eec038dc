"""The replay plan that batch and stream modes share: the policies of one invocation (layouts, run ids, route
classes), the request and the report, and the run records and infos the outputs are written with."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from engine.groups import RouteClass
    from replay.family import Layout
    from replay.policies import Policy
    from storage.report_data import RunViews

#: Draws the policy runs' plots for their MLflow runs: (runs, lakehouse, window series, latency quantiles,
#: window_us, duration_us) -> (run_id, {artifact name: PNG bytes}) for each run;
#: `report.figures.run_figures` is the one in use.
RunFigures = Callable[..., Iterable[tuple[str, dict[str, Any]]]]


@dataclass
class OutcomeFrames:
    """A replay's results for every run of one invocation, as Spark DataFrames in the table schemas
    (`schemas/tables.py`): what batch and stream mode derive from the kernels' output rows
    (`engine.replay.frames_from_raw`) and what `engine.publish` writes."""

    message_outcomes: DataFrame
    partition_states: DataFrame
    unavailability: DataFrame
    #: (run_id, partition, window_start_us, engine.metrics.WINDOW_COUNTS + WINDOW_TIMES): the message figures per
    #: partition and window, derived in the replay tasks (`engine.metrics.message_windows`); None: they are
    #: aggregated from message_outcomes instead.
    windows: DataFrame | None = None
    #: (run_id, metric, value, frequency): how often each ack latency and visibility lag occurs in a unit
    #: (`engine.groups._histogram_batches`); with `windows`, run_summary is read off them; None: run_summary
    #: aggregates message_outcomes instead.
    histograms: DataFrame | None = None
    #: Bytes replicated per run_id.
    replication_bytes: dict[str, int] = field(default_factory=dict)


@dataclass
class PolicyRun:
    """One policy of an invocation, with everything the outputs need to know about it."""

    index: int
    policy: Policy
    run_id: str
    layout: Layout
    partitions: int
    #: unit -> the partitions (Kafka) or queues (RocketMQ) its timeline and unavailability apply to
    unit_partitions: dict[int, tuple[int, ...]]
    min_insync_replicas: int | None

    @property
    def canonical(self) -> str:
        return self.policy.canonical()


@dataclass
class ReplayReport:
    """What `run_replay` returns: one summary per policy, in --policy order, and where things went."""

    trace_id: str
    runs: list[PolicyRun]
    summaries: list[dict[str, Any]]
    lakehouse: str | None
    quarantined: int = 0
    mlflow: dict[str, str] = field(default_factory=dict)
    experiment: str | None = None
    trace_gate_report: str | None = None
    output_gate_report: str | None = None
    #: How to name each policy in tables (default: its canonical string)
    labels: list[str] | None = None
    #: The window series and latency quantiles logged to MLflow, for a report that follows
    views: RunViews | None = None

    def summary_json(self) -> list[dict[str, Any]]:
        """SPEC §6.1: one object per policy in --policy order: policy, run_id and every run_summary field."""
        from schemas.tables import SUMMARY_FIELDS

        return [{"policy": r.canonical, "run_id": r.run_id, **{k: s.get(k) for k in SUMMARY_FIELDS}}
                for r, s in zip(self.runs, self.summaries, strict=True)]


@dataclass
class ReplayRequest:
    trace: str
    policies: list[Policy]
    lakehouse: str = "lakehouse"
    window_ms: int = 1000
    mode: str = "batch"
    tracking_uri: str | None = None
    experiment: str | None = None
    mlflow: bool = True
    summary_json: str | None = None
    checkpoint: str | None = None
    allowed_lateness_ms: int = 0
    #: The plots logged with each MLflow run (`report.figures.run_figures`); None logs none
    figures: RunFigures | None = None
    #: The policies as typed (MLflow run names: a preset name rather than the canonical string)
    labels: list[str] | None = None


def policy_runs(policies: Sequence[Policy], manifest) -> list[PolicyRun]:
    """Layouts, run ids and partition maps of the policies; the same policy twice is bad input."""
    from replay.families import family_of
    from replay.policies import run_id
    from schemas.errors import BadInput
    from schemas.version import __version__

    seen: dict[str, int] = {}
    out = []
    for i, policy in enumerate(policies):
        canonical = policy.canonical()
        if canonical in seen:
            raise BadInput(f"--policy #{i + 1} ({canonical}) is the same policy as --policy #{seen[canonical] + 1}",
                           rule="policy-duplicate")
        seen[canonical] = i
        fam = family_of(policy)
        layout = fam.layout(policy, manifest)
        unit_parts = {u: tuple(fam.partitions_of(policy, layout, u)) for u in layout.units}
        out.append(PolicyRun(i, policy, run_id(manifest.trace_id, policy, __version__), layout,
                             fam.partition_count(policy, layout), unit_parts, fam.min_insync_replicas(policy)))
    return out


def route_classes(runs: Sequence[PolicyRun]):
    """Group policies that route every message identically (`Family.routing_key`): one shuffle group each."""
    from engine.groups import RouteClass
    from replay.families import family_of

    classes: dict[Any, RouteClass] = {}
    for r in runs:
        key = family_of(r.policy).routing_key(r.policy)
        if key not in classes:
            classes[key] = RouteClass(len(classes), [])
        classes[key].members.append((r.index, r.policy, r.layout))
    return list(classes.values())


def place_groups(classes: Sequence[RouteClass], tasks: int) -> dict[tuple[int, int], int]:
    """Each (class, unit) group's replay task: heaviest group first onto the least-loaded task (LPT), ties to the
    lowest task. A group's expected work is its class's policies over its class's units (its share of the trace's
    messages, replayed once per policy). Spark starts a stage's tasks in index order, so with a task per group
    the heaviest start first and the last to run are the lightest; a hash of (class, unit) put two groups on some
    tasks and none on others, and on large traces whole tasks then ran alone at the end."""
    groups = sorted(((len(rc.members) / max(1, len(rc.units)), rc.index, u) for rc in classes for u in rc.units),
                    key=lambda g: (-g[0], g[1], g[2]))
    load = [0.0] * max(1, tasks)
    placed = {}
    for weight, class_id, unit in groups:
        task = min(range(len(load)), key=lambda t: (load[t], t))
        load[task] += weight
        placed[(class_id, unit)] = task
    return placed


def run_infos(runs: Sequence[PolicyRun], manifest, replication_bytes: dict[str, int]):
    from engine.metrics import RunInfo

    return [RunInfo(r.run_id, manifest.duration_us, r.partitions, r.min_insync_replicas, r.layout.brokers_used,
                    r.layout.replicas_per_message, replication_bytes.get(r.run_id, 0)) for r in runs]


def run_records(runs: Sequence[PolicyRun], trace_id: str, mode: str, mlflow_ids: dict[str, str] | None = None):
    from storage.lakehouse import RunRecord

    ids = mlflow_ids or {}
    return [RunRecord(r.run_id, trace_id, r.canonical, r.policy.family, r.policy.params(), mode,
                      mlflow_run_id=ids.get(r.run_id)) for r in runs]
