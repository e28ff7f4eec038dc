"""Where a testbed run lands (SPEC §12): the Delta tables `testbed_outcomes` and `testbed_comparisons`
(through the lakehouse writer: one run's rows replaced atomically), and one MLflow run per (scenario, policy)
tagged `source=testbed` with the predicted and observed figures."""

from __future__ import annotations

from typing import Any

import pandas as pd

from testbed.compare import COMPARED, Case, now_utc


def _none(v: Any) -> Any:
    return None if v is None or (isinstance(v, float) and v != v) else v


def write_tables(spark, lake, cases: list[Case], manifest) -> None:
    from schemas.tables import TABLES

    ids = [c.run_id for c in cases]
    frames = []
    for c in cases:
        obs: pd.DataFrame = c._observed_rows  # type: ignore[attr-defined]
        pred: pd.DataFrame = c._predicted_rows  # type: ignore[attr-defined]
        both = obs.merge(pred[["msg_id", "status", "error", "ack_us", "fate"]], on="msg_id", how="left",
                         suffixes=("", "_p"))
        frames.append(pd.DataFrame({
            "run_id": c.run_id, "scenario": c.scenario, "policy": c.policy, "msg_id": both["msg_id"],
            "partition": both["partition"], "produce_us": both["produce_us"], "observed_status": both["status"],
            "observed_error": both["error"], "observed_ack_us": both["ack_us"], "observed_fate": both["fate"],
            "observed_offset": both["offset"], "predicted_status": both["status_p"],
            "predicted_error": both["error_p"], "predicted_ack_us": both["ack_us_p"],
            "predicted_fate": both["fate_p"]}))
    spec = TABLES["testbed_outcomes"]
    data = pd.concat(frames, ignore_index=True)
    # Nullable integers stay integers through Arrow (NaN would make them doubles).
    for name, typ, _ in spec.fields:
        if typ in ("BIGINT", "INT"):
            data[name] = data[name].astype("Int64" if typ == "BIGINT" else "Int32")
        elif typ == "STRING":
            data[name] = data[name].astype(object).where(data[name].notna(), None)
    lake.replace_run("testbed_outcomes", ids, spark.createDataFrame(data, schema=spec.spark_schema()))

    at = now_utc().replace(tzinfo=None)
    comp = []
    for c in cases:
        row: dict[str, Any] = {"run_id": c.run_id, "scenario": c.scenario, "policy": c.policy,
                               "trace_id": manifest.trace_id}
        for k in COMPARED:
            row[f"predicted_{k}"] = _none(c.predicted.get(k))
            row[f"observed_{k}"] = _none(c.observed.get(k))
        row["predicted_failover_ms"] = c.failover_ms.get("predicted")
        row["observed_failover_ms"] = c.failover_ms.get("observed")
        row.update(status_agreement=c.agreement["status"], fate_agreement=c.agreement["fate"],
                   loss_agrees=c.loss_agrees, mlflow_run_id=c.mlflow_run_id, recorded_at=at)
        comp.append(row)
    cschema = TABLES["testbed_comparisons"].spark_schema()
    data = [tuple(_cast(r[f.name], f.dataType.simpleString()) for f in cschema.fields) for r in comp]
    lake.replace_run("testbed_comparisons", ids, spark.createDataFrame(data, schema=cschema))


def _cast(v: Any, typ: str) -> Any:
    if v is None:
        return None
    if typ in ("bigint", "int"):
        return int(v)
    if typ == "double":
        return float(v)
    return v


def log_mlflow(cases: list[Case], rec, manifest, policies, tracking_uri: str | None) -> None:
    from mlflow.entities import Metric

    from engine.tracking import (
        SOURCE_TESTBED,
        TAG_SOURCE,
        TESTBED_EXPERIMENT,
        client_for,
        ensure_experiment,
        git_sha,
        log_in_chunks,
        run_params,
    )
    from testbed.instruments import flat

    def _metric(key: str, value: float, ts: int) -> Metric:
        return Metric(key, value, ts, 0)

    client = client_for(tracking_uri)
    exp = ensure_experiment(client, TESTBED_EXPERIMENT)
    for c, policy in zip(cases, policies, strict=True):
        run = client.create_run(exp, run_name=f"{c.scenario} · {c.policy}",
                                tags={TAG_SOURCE: SOURCE_TESTBED, "family": policy.family, "scenario": c.scenario,
                                      "replab.run_id": c.run_id, "git_sha": git_sha()})
        mid = run.info.run_id
        try:
            ts = int(now_utc().timestamp() * 1000)
            metrics = []
            for side, figures in (("predicted", c.predicted), ("observed", c.observed)):
                for k, v in figures.items():
                    if _none(v) is not None:
                        metrics.append(_metric(f"{side}.{k}", float(v), ts))
            for side, v in c.failover_ms.items():
                if v is not None:
                    metrics.append(_metric(f"{side}.failover_ms", float(v), ts))
            metrics += [_metric(k, v, ts) for k, v in flat(c.instruments).items()]
            metrics += [_metric("agreement.status", c.agreement["status"], ts),
                        _metric("agreement.fate", c.agreement["fate"], ts),
                        _metric("agreement.loss_zero_vs_nonzero", 1.0 if c.loss_agrees else 0.0, ts)]
            log_in_chunks(client, mid, metrics=metrics, params=run_params(policy, manifest))
        except BaseException:
            client.set_terminated(mid, status="FAILED")
            raise
        client.set_terminated(mid, status="FINISHED")
        c.mlflow_run_id = mid


def agreement_rows(lakehouse) -> list[dict[str, Any]]:
    """The latest comparison of every (scenario, policy) in the lakehouse, in scenario then policy order."""
    from storage.lakehouse import Lakehouse
    from storage.session import get_spark

    lake = Lakehouse(lakehouse, get_spark("replab-testbed-report"), create=False)
    if lake.version("testbed_comparisons") is None:
        return []
    rows = [r.asDict() for r in lake.read("testbed_comparisons").collect()]
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    for r in sorted(rows, key=lambda r: r["recorded_at"]):
        latest[(r["scenario"], r["policy"])] = r
    return [latest[k] for k in sorted(latest)]


def markdown_table(rows: list[dict[str, Any]]) -> str:
    def f(v: Any, fmt: str = "{:,.0f}") -> str:
        return "–" if v is None else fmt.format(v)

    head = ("| scenario | policy | acked (pred / obs) | acked lost (pred / obs) | failed (pred / obs) | "
            "unavailable partition-s (pred / obs) | ack p99 ms (pred / obs) | failover ms (pred / obs) | "
            "status agree | fate agree | 0 vs >0 loss |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
    body = ""
    for r in rows:
        body += (f"| {r['scenario']} | `{r['policy']}` | {f(r['predicted_acked'])} / {f(r['observed_acked'])} | "
                 f"{f(r['predicted_acked_lost'])} / {f(r['observed_acked_lost'])} | "
                 f"{f(r['predicted_failed'])} / {f(r['observed_failed'])} | "
                 f"{f(r['predicted_unavailable_partition_seconds'], '{:,.1f}')} / "
                 f"{f(r['observed_unavailable_partition_seconds'], '{:,.1f}')} | "
                 f"{f(r['predicted_ack_latency_p99_ms'])} / {f(r['observed_ack_latency_p99_ms'])} | "
                 f"{f(r['predicted_failover_ms'])} / {f(r['observed_failover_ms'])} | "
                 f"{r['status_agreement']:.1%} | {r['fate_agreement']:.1%} | "
                 f"{'agrees' if r['loss_agrees'] else '**differs**'} |\n")
    return head + body
