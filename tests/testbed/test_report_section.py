"""The testbed's MLflow runs and the section they give `replab compare`'s HTML report (no cluster, no Spark)."""

from __future__ import annotations

from replay.policies import parse_policy
from report.testbed import load_cases, section
from schemas.trace import Broker, Manifest
from testbed.compare import Case
from testbed.publish import log_mlflow, markdown_table


def _case(policy: str, pred_lost: int, obs_lost: int) -> Case:
    fig = {"produced": 100, "acked": 90, "failed": 0, "pending": 10, "failed_committed": 0,
           "unavailable_partition_seconds": 9.5, "ack_latency_p50_ms": 1.0, "ack_latency_p99_ms": 9000.0}
    return Case("testbed-leader-crash", policy, parse_policy(policy).canonical(), f"run-{policy}",
                {**fig, "acked_lost": pred_lost}, {**fig, "acked_lost": obs_lost},
                {"status": 0.99, "fate": 0.98, "messages": 100}, {"predicted": 9100.0, "observed": 9800.0})


def test_one_tagged_run_per_case_and_the_report_section(tmp_path):
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    manifest = Manifest("testbed-leader-crash-recorded-s0", (Broker(0, "a"), Broker(1, "b"), Broker(2, "c")), 10**6)
    policies = ["kafka-acks1", "kafka:acks=all,min_insync_replicas=2"]
    cases = [_case(policies[0], 3, 2), _case(policies[1], 0, 1)]
    log_mlflow(cases, None, manifest, [parse_policy(p) for p in policies], uri)

    client = mlflow.MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("testbed").experiment_id], "tags.source = 'testbed'")
    assert len(runs) == 2 and all(c.mlflow_run_id for c in cases)
    frame = load_cases(client)
    assert list(frame["policy"]) == sorted(policies)
    observed = dict(zip(frame["policy"], frame["observed_acked_lost"], strict=True))
    assert observed == {policies[0]: 2.0, policies[1]: 1.0}
    sec = section(client)
    assert sec is not None and sec.figure is not None
    assert "Testbed: predicted versus observed" in sec.html and "3 / 2" in sec.html and "0 / 1" in sec.html
    assert cases[0].loss_agrees and not cases[1].loss_agrees


def test_markdown_table_says_where_zero_versus_nonzero_differs():
    row = {"scenario": "s", "policy": "p", "predicted_acked": 10, "observed_acked": 9, "predicted_acked_lost": 0,
           "observed_acked_lost": 2, "predicted_failed": 0, "observed_failed": 1,
           "predicted_unavailable_partition_seconds": 1.0, "observed_unavailable_partition_seconds": 2.0,
           "predicted_ack_latency_p99_ms": 5.0, "observed_ack_latency_p99_ms": 6.0, "predicted_failover_ms": None,
           "observed_failover_ms": 3.0, "status_agreement": 0.5, "fate_agreement": 1.0, "loss_agrees": False}
    text = markdown_table([row])
    assert "| s | `p` | 10 / 9 | 0 / 2 | 0 / 1 | 1.0 / 2.0 | 5 / 6 | – / 3 | 50.0% | 100.0% | **differs** |" in text
