"""What `replab compare` finds (SPEC §6.1): the experiment's finished policy runs as MLflow holds them (one per
policy, SPEC §6.4), a one-line verdict per policy, the experiment's headline facts and the comparison table's
rows. `report.compare` renders them (HTML, plots, the terminal table)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from engine import tracking

#: run_summary fields that are counts (SPEC §4.4): integers in the CSV and the table.
COUNT_FIELDS = ("produced", "acked", "failed", "pending", "acked_lost", "failed_committed", "stranded",
                "brokers_used", "replication_bytes")


@dataclass
class PolicyResult:
    """One policy's run as MLflow holds it."""

    policy: str
    trace_id: str
    run_id: str  # replab's
    mlflow_run_id: str
    family: str
    start_time: int
    policy_index: int
    metrics: dict[str, float]
    params: dict[str, str]
    tags: dict[str, str]
    label: str = ""
    name: str = ""  # the run's name: the policy as typed (a preset name), else its canonical string

    @property
    def lakehouse(self) -> Path | None:
        path = self.tags.get(tracking.TAG_LAKEHOUSE)
        if not path:
            return None
        root = Path(path)
        # A lakehouse that was moved or deleted since the replay: the report falls back to MLflow data.
        return root if (root / "message_outcomes" / "_delta_log").is_dir() else None

    @property
    def window_ms(self) -> int | None:
        value = self.tags.get(tracking.TAG_WINDOW_MS)
        return int(value) if value and value.isdigit() else None

    def metric(self, name: str) -> float | None:
        return self.metrics.get(name)


@dataclass
class Comparison:
    """What the report says: results in policy order, a verdict per policy and the overall findings."""

    experiment: str
    tracking_uri: str
    results: list[PolicyResult]
    verdicts: dict[str, str] = field(default_factory=dict)
    findings: list[str] = field(default_factory=list)


def load_results(client, experiment: str) -> list[PolicyResult]:
    """The experiment's finished policy runs, one per (trace, policy): the latest if a policy ran twice."""
    from schemas.errors import BadInput

    exp = tracking.find_experiment(client, experiment)
    if exp is None:
        known = sorted(e.name for e in client.search_experiments())
        shown = ", ".join(known[:10]) + (" …" if len(known) > 10 else "")
        raise BadInput(f"no MLflow experiment named {experiment!r} at {client.tracking_uri} "
                       f"(experiments there: {shown or 'none'})", rule="experiment")
    runs = tracking.search_all_runs(
        client, [exp.experiment_id],
        f"tags.`{tracking.TAG_KIND}` = '{tracking.KIND_POLICY}' and attributes.status = 'FINISHED'")
    latest: dict[tuple[str, str], PolicyResult] = {}
    for run in runs:
        tags = dict(run.data.tags)
        policy = tags.get(tracking.TAG_POLICY) or run.info.run_name
        index = tags.get(tracking.TAG_POLICY_INDEX, "")
        result = PolicyResult(
            policy=policy, trace_id=tags.get(tracking.TAG_TRACE_ID, ""), run_id=tags.get(tracking.TAG_RUN_ID, ""),
            mlflow_run_id=run.info.run_id, family=tags.get("replab.family", ""), start_time=run.info.start_time or 0,
            policy_index=int(index) if index.isdigit() else 0, metrics=dict(run.data.metrics),
            params=dict(run.data.params), tags=tags, name=run.info.run_name or policy)
        key = (result.trace_id, policy)
        if key not in latest or latest[key].start_time < result.start_time:
            latest[key] = result
    if not latest:
        raise BadInput(f"MLflow experiment {experiment!r} has no finished policy runs (replay a trace into it "
                       "first: replab replay --experiment ...)", rule="experiment")
    # Policies in the order they were asked: invocations by their first run, then --policy order within one.
    first: dict[str, int] = {}
    for r in latest.values():
        inv = r.tags.get(tracking.TAG_INVOCATION, r.mlflow_run_id)
        first[inv] = min(first.get(inv, r.start_time), r.start_time)
    results = sorted(latest.values(), key=lambda r: (
        r.trace_id, first[r.tags.get(tracking.TAG_INVOCATION, r.mlflow_run_id)], r.policy_index, r.policy))
    several_traces = len({r.trace_id for r in results}) > 1
    for r in results:
        r.label = f"{r.policy} [{r.trace_id}]" if several_traces else r.policy
    return results


def count_of(value: float | None) -> int:
    return round(value or 0)


def seconds_text(value: float) -> str:
    """Partition-seconds to the trace's ms resolution without trailing zeros: 14.973, 9.1, 0."""
    return f"{value:,.3f}".rstrip("0").rstrip(".")


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def verdict(r: PolicyResult) -> str:
    """One factual sentence from the run's figures (SPEC §4.1, §4.4 definitions)."""
    lost, acked = count_of(r.metric("acked_lost")), count_of(r.metric("acked"))
    parts = []
    if lost:
        rate = r.metric("acked_lost_rate")
        rate_text = f" ({rate * 100:.2f} % of acknowledged)" if rate is not None else ""
        parts.append(f"lost {_plural(lost, 'acknowledged message')}{rate_text}")
    elif acked:
        parts.append("never lost an acknowledged message")
    else:
        parts.append("acknowledged no message")
    unavailable = r.metric("unavailable_partition_seconds") or 0.0
    parts.append(f"unavailable {seconds_text(unavailable)} partition-seconds" if unavailable > 0
                 else "never unavailable")
    p99 = r.metric("ack_latency_p99_ms")
    if p99 is not None:
        parts.append(f"ack p99 {p99:,.1f} ms")
    failed, produced = count_of(r.metric("failed")), count_of(r.metric("produced"))
    if failed:
        parts.append(f"{_plural(failed, 'send')} of {produced:,} failed")
    if count_of(r.metric("failed_committed")):
        parts.append(f"{_plural(count_of(r.metric('failed_committed')), 'failed send')} committed anyway")
    if count_of(r.metric("stranded")):
        parts.append(f"{_plural(count_of(r.metric('stranded')), 'acknowledged message')} stranded at the end")
    if count_of(r.metric("pending")):
        parts.append(f"{count_of(r.metric('pending')):,} still pending at the end")
    return "; ".join(parts)


def findings(results: Sequence[PolicyResult]) -> list[str]:
    """The experiment's headline facts: who lost acknowledged messages, the fastest safe policy, the most
    available one."""
    out = []
    losers = [r for r in results if count_of(r.metric("acked_lost"))]
    safe = [r for r in results if not count_of(r.metric("acked_lost")) and count_of(r.metric("acked"))]
    if losers:
        listed = ", ".join(f"{r.label} ({count_of(r.metric('acked_lost')):,})" for r in losers)
        out.append(f"Lost acknowledged messages: {listed}.")
    else:
        out.append("No policy lost an acknowledged message.")
    timed = [r for r in safe if r.metric("ack_latency_p99_ms") is not None]
    if timed:
        best = min(timed, key=lambda r: (r.metric("ack_latency_p99_ms"), r.policy_index))
        out.append(f"Fastest p99 among the policies that lost nothing: {best.label} "
                   f"({best.metric('ack_latency_p99_ms'):,.1f} ms).")
    elif losers:
        out.append("Every policy that acknowledged messages lost some.")
    if results:
        most = min(results, key=lambda r: (r.metric("unavailable_partition_seconds") or 0.0, r.policy_index))
        out.append(f"Least unavailable: {most.label} "
                   f"({seconds_text(most.metric('unavailable_partition_seconds') or 0.0)} partition-seconds).")
    return out


def compare(client, experiment: str) -> Comparison:
    results = load_results(client, experiment)
    return Comparison(experiment, client.tracking_uri, results, {r.label: verdict(r) for r in results},
                      findings(results))


def comparison_frame(cmp: Comparison) -> pd.DataFrame:
    from schemas.tables import SUMMARY_FIELDS

    rows = []
    for r in cmp.results:
        row: dict[str, Any] = {"policy": r.label, "trace_id": r.trace_id, "run_id": r.run_id,
                               "mlflow_run_id": r.mlflow_run_id, "family": r.family}
        row.update({k: r.metric(k) for k in SUMMARY_FIELDS})
        row["verdict"] = cmp.verdicts[r.label]
        rows.append(row)
    frame = pd.DataFrame(rows)
    for name in COUNT_FIELDS:
        # MLflow keeps every metric as a float; counts go back to integers (nullable: a metric may be missing).
        frame[name] = frame[name].round().astype("Int64")
    return frame


def worst_of(results) -> PolicyResult | None:
    """The policy that lost the most acknowledged messages (then: the most unavailable)."""
    ranked = sorted(results, key=lambda r: (-(r.metric("acked_lost") or 0),
                                            -(r.metric("unavailable_partition_seconds") or 0), r.policy_index))
    return ranked[0] if ranked else None


