"""RocketMQ golden scenarios (reference §E R1-R6) on both engines, beyond what test_golden_local checks: the queue
each message is reported in (payload `part`, -1 = no_route), every message field, and each group's
unavailability. Expectations in tests/scenarios/{r,d,c}*/expected.json were derived by hand from SPEC §3.3-3.5.
"""

from __future__ import annotations

import pytest

from replay.local import replay_local
from replay.policies import parse_policy
from schemas.outcomes import Fate, Status
from storage.trace_loader import read_events_arrow

from .test_golden_local import golden_cases, message_facts

ROCKETMQ_FAMILIES = ("rocketmq", "dledger", "rocketmq-controller")


def rocketmq_cases() -> list:
    return [c for c in golden_cases(("r", "d", "c"))
            if parse_policy(c.values[1]["policy"]).family in ROCKETMQ_FAMILIES]


def partitions(results) -> dict[int, int | None]:
    out = {}
    for r in results:
        rec = r.messages.records
        for msg_id, part in zip(rec.msg_id.tolist(), rec.payload["part"].tolist(), strict=True):
            out[msg_id] = None if part < 0 else part
    return out


@pytest.mark.parametrize("engine", ["reference", "kernel"])
@pytest.mark.parametrize(("folder", "case"), rocketmq_cases())
def test_rocketmq_golden(folder, case, engine):
    manifest, table = read_events_arrow(folder)
    results = replay_local(parse_policy(case["policy"]), manifest, table, engine=engine)
    facts = message_facts(results)
    why = f"{folder.name} [{case['policy']}]: {case['why']}"
    if "messages" in case:
        assert sorted(facts) == sorted(int(k) for k in case["messages"]), why
        for msg_id, expected in case["messages"].items():
            assert facts[int(msg_id)] == expected, f"m{msg_id}: {why}"
    if "partitions" in case:
        assert {str(k): v for k, v in partitions(results).items()} == case["partitions"], why
    if "unit_unavailable_s" in case:
        unavailable = [sum(end - start for start, end in r.unavailable) / 1e6 for r in results]
        assert unavailable == pytest.approx(case["unit_unavailable_s"], abs=1e-9), why
    summary = case["summary"]
    statuses = [f["status"] for f in facts.values()]
    assert len(facts) == summary["produced"]
    for field in ("acked", "failed", "pending"):
        if field in summary:
            assert statuses.count(field) == summary[field], field
    acked_lost = sum(f["status"] == "acked" and f["fate"] != "committed" for f in facts.values())
    failed_committed = sum(f["status"] == "failed" and f["fate"] == "committed" for f in facts.values())
    stranded = sum(f["status"] == "acked" and f["fate"] == "committed" and not f["readable_at_end"]
                   for f in facts.values())
    for name, value in (("acked_lost", acked_lost), ("failed_committed", failed_committed), ("stranded", stranded)):
        if name in summary:
            assert value == summary[name], f"{name}: {why}"


def test_golden_cases_cover_every_rocketmq_family():
    families = {parse_policy(c.values[1]["policy"]).family for c in rocketmq_cases()}
    assert families == set(ROCKETMQ_FAMILIES)
    assert Status.ACKED.label == "acked" and Fate.LOST.label == "lost"
