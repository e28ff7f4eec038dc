"""MLflow tracking of replays (SPEC §6.4): one experiment per trace, one run per policy.

Life of a replay's runs:

- `ReplayTracker.start` (before any Delta write) creates one run per policy, named by the preset when one was
  typed (else the canonical policy string), with its params and identity tags, status RUNNING. Its MLflow
  run id goes into the `runs` table.
- `finish` logs every run_summary figure, the per-window series, the gate reports, the summary JSON and the
  plots, then ends the runs FINISHED; `fail` ends them FAILED (output gate or anything else raised).

Re-running a replay gives the same replab run_id (SPEC §4.4), and the experiment keeps one run per run_id:
`start` deletes earlier runs of the same run_id that never finished (a killed or failed attempt), and `finish`
deletes the earlier FINISHED one it supersedes. A failed re-run therefore leaves the previous FINISHED run in
place, matching the lakehouse, which keeps the previous succeeded version of a run whose re-run failed
(SPEC §5, §7).

The default store is local: `sqlite:///<cwd>/mlflow.db` (or `MLFLOW_TRACKING_URI`). Experiments this module
creates in a SQLite store get an explicit artifact location, `mlruns/<experiment>` next to the database file,
so that artifacts land beside the store whatever the working directory of a later run.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import os
import re
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from engine.plan import PolicyRun, RunFigures
    from schemas.trace import Manifest
    from storage.report_data import RunViews

# Before mlflow is imported anywhere through this module: no usage telemetry from a data pipeline.
os.environ.setdefault("MLFLOW_ENABLE_TELEMETRY", "false")

log = logging.getLogger(__name__)

TAG_KIND = "replab.kind"
KIND_POLICY = "policy"
KIND_COMPARISON = "comparison"
TAG_RUN_ID = "replab.run_id"
TAG_TRACE_ID = "replab.trace_id"
TAG_LAKEHOUSE = "replab.lakehouse"
TAG_WINDOW_MS = "replab.window_ms"
TAG_POLICY = "replab.policy"
#: The policy's position among the --policy arguments: reports list policies in the order they were asked.
TAG_POLICY_INDEX = "replab.policy_index"
#: One id per replay invocation (all its policies): reports keep an invocation's policies together.
TAG_INVOCATION = "replab.invocation"
#: Per-window series (step = window index). Unavailability is in partition-seconds, summed over partitions.
SERIES_ACKED_LOST = "window/acked_lost"
SERIES_UNAVAILABLE = "window/unavailable_partition_seconds"
SERIES_P99 = "window/ack_latency_p99_ms"
SERIES_KEYS = (SERIES_ACKED_LOST, SERIES_UNAVAILABLE, SERIES_P99)
SCENARIO_PREFIX = "scenario."
#: The testbed's MLflow experiment (SPEC §12: one run per scenario and policy), and the tag that marks its runs.
TESTBED_EXPERIMENT = "testbed"
TAG_SOURCE = "source"
SOURCE_TESTBED = "testbed"
#: MLflow's limits (mlflow.utils.validation): values per param, entities per log_batch call.
MAX_PARAM_VALUE_CHARS = 6000
MAX_METRICS_PER_CALL = 1000
MAX_PARAMS_PER_CALL = 100
MAX_TAG_VALUE_CHARS = 5000


# ------------------------------------------------------------------------------------------------ store
def resolve_tracking_uri(tracking_uri: str | None = None) -> str:
    """`--tracking-uri`, else MLFLOW_TRACKING_URI, else `sqlite:///<cwd>/mlflow.db` (absolute: runs started
    from another folder must find the same store)."""
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        return f"sqlite:///{Path.cwd().resolve() / 'mlflow.db'}"
    if "://" not in uri:
        # A bare path is a file store folder for MLflow; make it absolute for the same reason.
        return Path(uri).resolve().as_uri()
    return uri


def check_tracking_uri(tracking_uri: str | None = None) -> str:
    """The resolved URI, refused before any work if MLflow cannot use it: a file store (bad input, exit 2; MLflow
    3.x refuses it) or a tracking server that does not answer (exit 1). A probe of its own, with a short timeout
    (MLFLOW_HTTP_REQUEST_TIMEOUT, default 10 s), because MLflow's client retries a dead server for minutes."""
    import urllib.error
    import urllib.request
    from importlib.metadata import version
    from urllib.parse import urlparse

    from schemas.errors import BadInput, ReplabError

    uri = resolve_tracking_uri(tracking_uri)
    scheme = urlparse(uri).scheme
    if scheme == "file" and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() != "true":
        raise BadInput(f"tracking URI {tracking_uri or uri}: MLflow {version('mlflow')} refuses the file store; "
                       f"use a database such as sqlite:///mlflow.db", rule="tracking-uri")
    if scheme in ("http", "https"):
        timeout = float(os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT") or 10)
        try:
            urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout).close()
        except urllib.error.HTTPError:
            pass  # it answered (an auth proxy or an older server without /health): MLflow's client decides
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ReplabError(f"MLflow tracking server {uri} does not answer ({reason}); start it, or pass "
                              "--no-mlflow") from exc
    return uri


def _sqlite_path(uri: str) -> Path | None:
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///"):]
    return None if path in ("", ":memory:") else Path(path).resolve()


def default_artifact_location(uri: str, experiment_name: str) -> str | None:
    """`mlruns/<experiment>` beside a SQLite database; None (the store decides) for servers and file stores."""
    db = _sqlite_path(uri)
    if db is None:
        return None
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", experiment_name).strip("._") or "experiment"
    return (db.parent / "mlruns" / slug).as_uri()


def client_for(tracking_uri: str | None = None):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=resolve_tracking_uri(tracking_uri))


#: MLflow 3.x opens an experiment on its GenAI traces overview unless the experiment says it holds model runs;
#: replab's runs are model-development runs (a policy's figures), so the UI should open on the runs table.
TAG_EXPERIMENT_KIND = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"


def ensure_experiment(client, experiment_name: str) -> str:
    """The experiment's id, created (with an explicit artifact location and the experiment-kind tag) or
    restored if it was deleted; an experiment made by an older replab gains the tag."""
    from mlflow.exceptions import MlflowException

    exp = client.get_experiment_by_name(experiment_name)
    if exp is None:
        location = default_artifact_location(client.tracking_uri, experiment_name)
        try:
            return client.create_experiment(experiment_name, artifact_location=location,
                                            tags={TAG_EXPERIMENT_KIND: EXPERIMENT_KIND})
        except MlflowException:
            # Another replay of the same trace created it between our lookup and create.
            exp = client.get_experiment_by_name(experiment_name)
            if exp is None:
                raise
    if exp.lifecycle_stage == "deleted":
        client.restore_experiment(exp.experiment_id)
    if exp.tags.get(TAG_EXPERIMENT_KIND) != EXPERIMENT_KIND:
        client.set_experiment_tag(exp.experiment_id, TAG_EXPERIMENT_KIND, EXPERIMENT_KIND)
    return exp.experiment_id


def find_experiment(client, experiment_name: str):
    """The active experiment of that name, or None."""
    exp = client.get_experiment_by_name(experiment_name)
    return exp if exp is not None and exp.lifecycle_stage == "active" else None


def search_all_runs(client, experiment_ids: Sequence[str], filter_string: str = "",
                    order_by: Sequence[str] | None = None) -> list[Any]:
    """Every active run matching the filter (search_runs pages at 1000)."""
    out, token = [], None
    while True:
        page = client.search_runs(list(experiment_ids), filter_string=filter_string, max_results=1000,
                                  order_by=list(order_by) if order_by else None, page_token=token)
        out.extend(page)
        token = page.token
        if not token:
            return out


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


# ------------------------------------------------------------------------------------------------ values
@functools.cache
def git_sha() -> str:
    """HEAD of the repository replab runs from, or "unknown" (installed wheel, no git)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, timeout=10,
                             capture_output=True, text=True, check=False)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    sha = out.stdout.strip()
    return sha if out.returncode == 0 and re.fullmatch(r"[0-9a-f]{40}", sha) else "unknown"


def _param_text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text[:MAX_PARAM_VALUE_CHARS]


def _param_key(key: str) -> str:
    # MLflow keys: alphanumerics, underscores, dashes, periods, spaces and slashes; at most 250 characters.
    return re.sub(r"[^A-Za-z0-9_\-. /]", "_", key)[:250]


def scenario_params(generator: Mapping[str, Any] | None, seed: int | None = None) -> dict[str, str]:
    """The generator's scenario and parameters flattened to `scenario.*` params (SPEC §6.4).

    `generator` is what generators write in the manifest: the scenario's name, seed, scale and its resolved
    `parameters`. Parameters go straight under `scenario.` (scenario.workload.rate_per_s), nested objects
    become dotted keys, lists stay one JSON value (a fault schedule is one thing to read), and every value
    is cut at MLflow's 6000-character limit.
    """
    out: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping) and value:
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            # First writer wins: the manifest's own name/description/seed over the parameters' copies.
            out.setdefault(_param_key(SCENARIO_PREFIX + prefix), _param_text(value))

    if generator:
        for key, value in generator.items():
            if key == "parameters" and isinstance(value, Mapping):
                continue
            # {"scenario": "rolling-restart", ...}: the scenario's name reads better as scenario.name.
            walk("name" if key == "scenario" else str(key), value)
        if isinstance(generator.get("parameters"), Mapping):
            walk("", generator["parameters"])
    if seed is not None:
        out.setdefault(SCENARIO_PREFIX + "seed", str(seed))
    return out


def run_params(policy, manifest) -> dict[str, str]:
    """Every policy parameter (canonical names, SPEC §3), trace_id and the scenario parameters."""
    params = {name: _param_text(value) for name, value in policy.params().items()}
    params["trace_id"] = manifest.trace_id
    params.update(scenario_params(manifest.generator, manifest.seed))
    return params


def summary_metrics(summary: Mapping[str, Any]) -> dict[str, float]:
    """Every run_summary field with a value (SPEC §4.4); None (e.g. no acked message: no p99) is skipped."""
    from schemas.tables import SUMMARY_FIELDS

    return {k: float(summary[k]) for k in SUMMARY_FIELDS if summary.get(k) is not None}


def window_metrics(series, run_id: str, timestamp_ms: int) -> list[Any]:
    """The run's per-window series as MLflow Metrics, step = window index (SPEC §6.4)."""
    from mlflow.entities import Metric

    rows = series[series["run_id"] == run_id]
    out = []
    for window, lost, unavailable_us, p99 in zip(rows["window"], rows["acked_lost"], rows["unavailable_us"],
                                                 rows["ack_latency_p99_ms"], strict=True):
        step = int(window)
        out.append(Metric(SERIES_ACKED_LOST, float(lost), timestamp_ms, step))
        out.append(Metric(SERIES_UNAVAILABLE, float(unavailable_us) / 1e6, timestamp_ms, step))
        if p99 == p99 and p99 is not None:  # NaN: no acknowledged message produced in that window
            out.append(Metric(SERIES_P99, float(p99), timestamp_ms, step))
    return out


def log_in_chunks(client, run_id: str, *, metrics: Sequence[Any] = (), params: Mapping[str, str] | None = None,
                  tags: Mapping[str, str] | None = None) -> None:
    """log_batch within MLflow's per-call limits (1000 metrics, 100 params/tags)."""
    from mlflow.entities import Param, RunTag

    for i in range(0, len(metrics), MAX_METRICS_PER_CALL):
        client.log_batch(run_id, metrics=list(metrics[i:i + MAX_METRICS_PER_CALL]), synchronous=True)
    items = [Param(k, v) for k, v in (params or {}).items()]
    for i in range(0, len(items), MAX_PARAMS_PER_CALL):
        client.log_batch(run_id, params=items[i:i + MAX_PARAMS_PER_CALL], synchronous=True)
    tag_items = [RunTag(k, str(v)[:MAX_TAG_VALUE_CHARS]) for k, v in (tags or {}).items()]
    for i in range(0, len(tag_items), MAX_PARAMS_PER_CALL):
        client.log_batch(run_id, tags=tag_items[i:i + MAX_PARAMS_PER_CALL], synchronous=True)


def _now_ms() -> int:
    return int(time.time() * 1000)


# ------------------------------------------------------------------------------------------------ tracker
@dataclass
class ReplayTracker:
    """The MLflow runs of one replay invocation (one per policy), from before the writes to the end."""

    client: MlflowClient
    experiment_id: str
    experiment_name: str
    trace_id: str
    runs: list[PolicyRun]
    mode: str
    #: replab run_id -> MLflow run id (the `runs` table's mlflow_run_id)
    run_ids: dict[str, str] = field(default_factory=dict)
    manifest: Manifest | None = None
    ended: bool = False
    #: Draws each run's plots (artifact name -> PNG bytes); None logs no plots
    figures: RunFigures | None = None
    #: The window series and latency quantiles `finish` logged (storage.report_data.RunViews), for the report
    views: RunViews | None = None

    @property
    def tracking_uri(self) -> str:
        return self.client.tracking_uri

    @classmethod
    def start(cls, tracking_uri: str | None, experiment_name: str | None, manifest, runs: Sequence[Any],
              mode: str = "batch", figures: RunFigures | None = None,
              labels: Sequence[str] | None = None) -> ReplayTracker:
        """`labels`: the policies as typed; a run is named by its preset when one was typed (canonical strings
        are long and the runs table cuts them off)."""
        from schemas.version import __version__

        client = client_for(tracking_uri)
        name = experiment_name or manifest.trace_id
        experiment_id = ensure_experiment(client, name)
        tracker = cls(client, experiment_id, name, manifest.trace_id, list(runs), mode, manifest=manifest,
                      figures=figures)
        invocation = uuid.uuid4().hex
        for run in runs:
            tracker._delete_earlier(run.run_id, keep_finished=True)
            tags = {
                TAG_KIND: KIND_POLICY, TAG_RUN_ID: run.run_id, TAG_TRACE_ID: manifest.trace_id,
                TAG_POLICY: run.canonical, TAG_POLICY_INDEX: str(run.index), "replab.family": run.policy.family,
                "replab.mode": mode, "replab.version": __version__, "replab.git_sha": git_sha(),
                TAG_INVOCATION: invocation,
            }
            name = labels[run.index] if labels and run.index < len(labels) else run.canonical
            created = client.create_run(experiment_id, start_time=_now_ms(), tags=tags, run_name=name)
            tracker.run_ids[run.run_id] = created.info.run_id
            log_in_chunks(client, created.info.run_id, params=run_params(run.policy, manifest))
        return tracker

    def _delete_earlier(self, replab_run_id: str, *, keep_finished: bool) -> None:
        """Delete this experiment's other policy runs of the same replab run (see the module docstring)."""
        current = self.run_ids.get(replab_run_id)
        found = search_all_runs(self.client, [self.experiment_id],
                                f"tags.`{TAG_RUN_ID}` = {_quote(replab_run_id)} "
                                f"and tags.`{TAG_KIND}` = {_quote(KIND_POLICY)}")
        for r in found:
            if r.info.run_id == current or (keep_finished and r.info.status == "FINISHED"):
                continue
            log.info("MLflow: deleting earlier run %s (%s) of replab run %s", r.info.run_id, r.info.status,
                     replab_run_id)
            self.client.delete_run(r.info.run_id)

    def fail(self, exc: BaseException) -> None:
        """End every run FAILED with the error as a tag; the previous FINISHED runs stay (module docstring)."""
        if self.ended:
            return
        self.ended = True
        message = f"{type(exc).__name__}: {exc}"
        for mlflow_id in self.run_ids.values():
            try:
                self.client.set_tag(mlflow_id, "replab.error", message[:MAX_TAG_VALUE_CHARS])
                self.client.set_terminated(mlflow_id, status="FAILED", end_time=_now_ms())
            except Exception:  # the original error matters more than a tracking hiccup
                log.exception("MLflow: could not mark run %s failed", mlflow_id)

    def finish(self, report, lakehouse, *, window_ms: int = 1000, trace_dir: str | Path | None = None,
               gate_reports: Iterable[str | Path] = ()) -> None:
        """Log summaries, series, artifacts and plots of every run, then end them FINISHED."""
        try:
            self._log_results(report, lakehouse, window_ms, trace_dir, [Path(p) for p in gate_reports])
        except BaseException as exc:
            self.fail(exc)
            raise
        for run in self.runs:
            self.client.set_terminated(self.run_ids[run.run_id], status="FINISHED", end_time=_now_ms())
            self._delete_earlier(run.run_id, keep_finished=False)
        self.ended = True

    # ------------------------------------------------------------------------------------------- logging
    def _log_results(self, report, lakehouse, window_ms: int, trace_dir, gate_reports: list[Path]) -> None:
        from storage import report_data

        ids = [r.run_id for r in self.runs]
        window_us = int(window_ms) * 1000
        series = report_data.window_series(lakehouse, ids, window_us)
        quantiles = report_data.latency_quantiles(lakehouse, ids)
        self.views = report_data.RunViews(Path(lakehouse.root).resolve(), tuple(ids), window_us, series, quantiles)
        validations = report_data.report_paths(lakehouse, self.trace_id, ids)
        summaries = {s["run_id"]: s for s in report.summary_json()}
        duration_us = int(self.manifest.duration_us) if self.manifest is not None else int(
            series["window_start_us"].max() + window_us if len(series) else 0)
        now = _now_ms()
        for run in self.runs:
            mlflow_id = self.run_ids[run.run_id]
            summary = summaries[run.run_id]
            metrics = [_metric(k, v, now) for k, v in summary_metrics(summary).items()]
            metrics += window_metrics(series, run.run_id, now)
            tags = {TAG_LAKEHOUSE: str(Path(report.lakehouse).resolve()) if report.lakehouse else "",
                    TAG_WINDOW_MS: str(window_ms)}
            if trace_dir is not None:
                tags["replab.trace_dir"] = str(Path(trace_dir).resolve())
            log_in_chunks(self.client, mlflow_id, metrics=metrics, tags=tags)
            self.client.log_dict(mlflow_id, summary, "summary.json")
            self._log_gate_reports(mlflow_id, gate_reports, validations.get(run.run_id, []))
        self._log_plots(lakehouse, series, quantiles, window_us, duration_us)

    def _log_gate_reports(self, mlflow_id: str, given: list[Path], recorded: list[tuple[str, str]]) -> None:
        """The trace gate's reports (given) and the output gate's (its `validations` row), HTML and JSON."""
        files: dict[Path, str] = {}
        for path in given:
            files.setdefault(path.resolve(), "gate_reports/trace_gate")
        for suite, report_path in recorded:
            html = Path(report_path)
            for path in (html, html.with_name("result.json")):
                files.setdefault(path.resolve(), f"gate_reports/{suite}")
        for path, folder in files.items():
            if path.is_file():
                self.client.log_artifact(mlflow_id, str(path), folder)

    def _log_plots(self, lakehouse, series, quantiles, window_us: int, duration_us: int) -> None:
        # The plots come from the caller (`report.figures.run_figures`): drawing is the report floor's job.
        if self.figures is None:
            return
        with tempfile.TemporaryDirectory(prefix="replab-plots-") as tmp:
            for run_id, pngs in self.figures(self.runs, lakehouse, series, quantiles, window_us, duration_us):
                folder = Path(tmp) / run_id
                for artifact, png in pngs.items():
                    path = folder / artifact
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(png)
                self.client.log_artifacts(self.run_ids[run_id], str(folder))  # keeps `plots/...` as named


def _metric(key: str, value: float, timestamp_ms: int, step: int = 0):
    from mlflow.entities import Metric

    return Metric(key, value, timestamp_ms, step)


def log_report_run(client, experiment_id: str, files: Mapping[str, Path], *, tags: Mapping[str, str],
                   run_name: str = "comparison", metrics: Mapping[str, float] | None = None) -> str:
    """A `replab.kind=comparison` run holding a report's files (one per experiment: earlier ones deleted)."""
    for r in search_all_runs(client, [experiment_id], f"tags.`{TAG_KIND}` = {_quote(KIND_COMPARISON)}"):
        client.delete_run(r.info.run_id)
    run = client.create_run(experiment_id, start_time=_now_ms(), run_name=run_name,
                            tags={TAG_KIND: KIND_COMPARISON, **tags})
    run_id = run.info.run_id
    try:
        if metrics:
            now = _now_ms()
            log_in_chunks(client, run_id, metrics=[_metric(k, float(v), now) for k, v in metrics.items()])
        with tempfile.TemporaryDirectory(prefix="replab-report-") as tmp:
            for artifact, path in files.items():
                # Copy under the artifact name wanted (log_artifact keeps the file's own name).
                target = Path(tmp) / artifact
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(Path(path).read_bytes())
            client.log_artifacts(run_id, tmp)
    except BaseException:
        client.set_terminated(run_id, status="FAILED", end_time=_now_ms())
        raise
    client.set_terminated(run_id, status="FINISHED", end_time=_now_ms())
    return run_id


def utc_now_text() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
