"""A golden scenario replayed once with MLflow on, shared by the tracking and compare tests.

Session-scoped rather than module-scoped: test_tracking.py and test_compare.py read the same store, and a
replay through `run_replay` (trace gate, replay, output gate, Delta writes, MLflow) takes minutes on a loaded
2-core machine. Tests that change the store (re-runs) say so and only leave it in a state every other test
accepts: one FINISHED run per policy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

K2 = Path(__file__).resolve().parents[1] / "scenarios" / "k2-acks1-leader-crash"


@dataclass
class MlflowReplay:
    trace: Path
    expected: list[dict[str, Any]]  # tests/scenarios/<name>/expected.json: hand-derived, not program output
    policies: list[Any]
    report: Any  # engine.plan.ReplayReport
    tracking_uri: str
    store: Path
    lakehouse: Path
    experiment: str

    def canonical(self, case: dict[str, Any]) -> str:
        from replay.policies import parse_policy

        return parse_policy(case["policy"]).canonical()


@pytest.fixture(scope="session")
def k2_mlflow_replay(spark, tmp_path_factory) -> MlflowReplay:
    from engine.plan import ReplayRequest
    from engine.replay import run_replay
    from replay.policies import parse_policy
    from report.figures import run_figures

    root = tmp_path_factory.mktemp("k2-mlflow")
    expected = json.loads((K2 / "expected.json").read_text())
    policies = [parse_policy(case["policy"]) for case in expected]
    uri = f"sqlite:///{root / 'mlflow.db'}"
    report = run_replay(spark, ReplayRequest(trace=str(K2), policies=policies, lakehouse=str(root / "lakehouse"),
                                             tracking_uri=uri, figures=run_figures))
    return MlflowReplay(K2, expected, policies, report, uri, root, root / "lakehouse", report.experiment)
