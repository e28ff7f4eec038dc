"""Golden scenarios (tests/scenarios) on both engines without Spark: every expected message field, exactly.

Summary fields are asserted through the Spark pipeline in tests/pipelines/test_golden_spark.py, where the
run summary is computed; here the per-message facts and the unavailability total are checked.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replay.local import replay_local
from replay.policies import parse_policy
from schemas.outcomes import NULL_US, Error, Fate, Status
from storage.trace_loader import read_events_arrow

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


def golden_cases(prefixes: tuple[str, ...] = ("k",)) -> list:
    out = []
    for folder in sorted(SCENARIOS.iterdir()):
        if folder.is_dir() and folder.name.startswith(prefixes):
            for i, case in enumerate(json.loads((folder / "expected.json").read_text())):
                out.append(pytest.param(folder, case, id=f"{folder.name}[{i}]"))
    return out


def message_facts(results) -> dict[int, dict]:
    facts = {}
    for r in results:
        j = r.messages
        rec = j.records
        for i in range(len(rec)):
            facts[int(rec.msg_id[i])] = {
                "status": Status(int(rec.status[i])).label,
                "error": Error(int(rec.error[i])).label,
                "ack_us": None if rec.ack_us[i] == NULL_US else int(rec.ack_us[i]),
                "visible_us": None if rec.visible_us[i] == NULL_US else int(rec.visible_us[i]),
                "fate": Fate(int(j.fate[i])).label,
                "readable_at_end": bool(j.readable_at_end[i]),
                "offset": None if j.offset[i] == NULL_US else int(j.offset[i]),
            }
    return facts


@pytest.mark.parametrize("engine", ["reference", "kernel"])
@pytest.mark.parametrize(("folder", "case"), golden_cases(("k", "r", "d", "c")))
def test_golden_messages(folder, case, engine):
    manifest, table = read_events_arrow(folder)
    results = replay_local(parse_policy(case["policy"]), manifest, table, engine=engine)
    facts = message_facts(results)
    for msg_id, expected in case.get("messages", {}).items():
        got = facts[int(msg_id)]
        for field, value in expected.items():
            assert got[field] == value, f"{folder.name} m{msg_id}.{field}: {got[field]} != {value} ({case['why']})"
    summary = case.get("summary", {})
    if "produced" in summary:
        assert len(facts) == summary["produced"]
    if "unavailable_partition_seconds" in summary:
        total = sum(end - start for r in results for start, end in r.unavailable) / 1e6
        assert total == pytest.approx(summary["unavailable_partition_seconds"], abs=1e-6)
    for field in ("acked", "failed", "pending"):
        if field in summary:
            assert sum(f["status"] == field for f in facts.values()) == summary[field], field
    # SPEC §4.1's counts from the same facts, as `engine.metrics.run_summary` counts them on Spark
    counts = {
        "acked_lost": sum(f["status"] == "acked" and f["fate"] != "committed" for f in facts.values()),
        "failed_committed": sum(f["status"] == "failed" and f["fate"] == "committed" for f in facts.values()),
        "stranded": sum(f["status"] == "acked" and f["fate"] == "committed" and not f["readable_at_end"]
                        for f in facts.values()),
    }
    for name, value in counts.items():
        if name in summary:
            assert value == summary[name], f"{folder.name} {name}: {value} != {summary[name]} ({case['why']})"
