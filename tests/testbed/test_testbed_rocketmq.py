"""The testbed against a real RocketMQ cluster (SPEC §12): one 3-node DLedger group, its leader killed once.

Real parts only: RocketMQ 5.3.3 from Maven Central (cached under .cache/rocketmq), the official Java client in the
testbed's harness, network namespaces. The prediction runs the kernels without Spark (`publish=False`), so that
the run fits the fast suite.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from replay.policies import parse_policy
from schemas.trace import Kind

pytestmark = pytest.mark.testbed

POLICIES = ["dledger"]
SCENARIO = "testbed-rmq-dledger-leader-crash"


@pytest.fixture(scope="module")
def leader_crash(tmp_path_factory):
    from testbed.job import run_testbed

    if shutil.which("java") is None or shutil.which("javac") is None:
        pytest.fail("the RocketMQ testbed cannot run here: it needs a JDK (java and javac)")
    if os.geteuid() != 0:
        pytest.fail("the RocketMQ testbed cannot run here: it makes network namespaces (root only)")
    out = tmp_path_factory.mktemp("testbed-rmq")
    return run_testbed(None, SCENARIO, [parse_policy(p) for p in POLICIES], POLICIES, out, publish=False,
                       progress=lambda _t: None)


def test_trace_carries_the_crash_the_progress_and_the_client_poll_phase(leader_crash):
    from storage.trace_loader import read_events_arrow

    manifest, table = read_events_arrow(leader_crash.trace)
    rec = leader_crash.recording
    assert manifest.broker_ids == (0, 1, 2)
    rows = table.to_pandas()
    assert rows["kind"].tolist().count("crash") == 1
    assert (rows["kind"] == "produce").sum() == len(rec.sent_us) > 2500
    # The successors' ledger ends were read from DLedger's index files about every 50 ms (SPEC §12: ≤ 200 ms).
    rep = rows[rows["kind"] == "replicate"]
    for b in (1, 2):
        gaps = rep[(rep["broker"] == b) & (rep["ts_us"] < 15_000_000)]["ts_us"].diff().dropna()
        assert len(gaps) > 50 and gaps.median() <= 200_000
    assert (rep["upto_us"] <= rep["ts_us"]).all()
    # The real client's route polls: the scheduled ones fall every route_refresh_ms from the recorded phase.
    period = rec.route_refresh_ms * 1000
    assert manifest.route_poll_phase_us == rec.route_poll_phase_us and 0 <= rec.route_poll_phase_us < period
    polls = [r["t"] for r in rec.route_requests if r["thread"].startswith("MQClientFactoryScheduledThread")
             and 0 <= r["t"] <= manifest.duration_us]
    assert len(polls) >= 2
    # (scheduleAtFixedRate keeps the grid; a loaded machine may start a poll's request late, never early)
    assert all(abs((t - rec.route_poll_phase_us + period // 2) % period - period // 2) < 1_000_000 for t in polls)


def test_comparison_has_both_sides_and_the_observed_outage(leader_crash):
    data = json.loads((leader_crash.out / "comparison.json").read_text())
    assert [d["policy"] for d in data] == POLICIES
    d = data[0]
    for side in ("predicted", "observed"):
        assert d[side]["produced"] == len(leader_crash.recording.sent_us)
        assert d[side]["acked"] > 0
    # DLedger commits at a majority: one crash of three loses no acknowledged message, on the real cluster.
    assert d["observed"]["acked_lost"] == 0
    # The crash stopped the group's writes until the client learned the successor: an outage of seconds,
    # seen as failed sends, as unavailable time of the group (measured alike on both sides, from the outcomes)
    # and as the time to the successor's first acknowledgement.
    assert d["observed"]["failed"] > 0 and d["observed"]["unavailable_partition_seconds"] > 5.0
    # (the prediction's outage may be shorter: R-3 elects 4.65-6.65 s after the crash, by the heartbeat phase)
    predicted = d["predicted"]
    assert predicted["unavailable_partition_seconds"] > 0 and predicted["replay_unavailable_partition_seconds"] > 0
    assert d["failover_ms"]["observed"] is not None and d["failover_ms"]["observed"] > 5000
    # The successor registered as master seconds after the SIGKILL (DLedger's election, 2000 ms × 3 + the vote).
    (election,) = d["elections"]
    assert election["broker"] == 0 and election["new_master"] in (1, 2)
    assert 5_000 < election["election_ms"] < 30_000
    assert election["master_dropped_us"] - election["fault_us"] < 2_000_000  # the NameServer drops it at once
    crash, restart = d["faults"]
    assert (crash["kind"], restart["kind"]) == ("crash", "restart")
    assert [k for _, k, _ in leader_crash.recording.faults] == [Kind.CRASH, Kind.RESTART]
    # The run started once the cluster answered steadily: the harness's warm-up settled (every send answered
    # within a second for 3 s), having taken at least its 3 s floor.
    warm = d["warm_up"]
    assert warm["settled"] is True and warm["warmed"] > 0 and 3_000 <= warm["warm_ms"] < 90_000


def test_a_recorded_run_is_judged_again_without_a_cluster(leader_crash):
    """`recompare_testbed` reads the run's recording back and gives the same comparison (the model unchanged)."""
    from testbed.job import recompare_testbed

    before = (leader_crash.out / "comparison.json").read_text()
    again = recompare_testbed(None, [parse_policy(p) for p in POLICIES], POLICIES, leader_crash.out, publish=False,
                              progress=lambda _t: None)
    assert (leader_crash.out / "comparison.json").read_text() == before
    assert again.cases[0].observed == json.loads(before)[0]["observed"]


def test_every_process_and_namespace_is_gone(leader_crash):
    from testbed.cluster import marked_java_pids
    from testbed.netns import leftover_namespaces

    rec = leader_crash.recording
    assert len(rec.pgids) >= 1 + 3 + 1 + 2  # NameServer, brokers, the restarted broker, the harness runs
    for pgid in rec.pgids:
        with pytest.raises(ProcessLookupError):
            os.killpg(pgid, 0)
    assert marked_java_pids(rec.tag) == []
    assert leftover_namespaces(rec.tag) == []


def test_the_restarted_broker_booted_at_the_lowest_priority_and_got_the_normal_one_back(leader_crash):
    """One restart during the trace (the killed leader, at 35 s): started under `nice -n 19`, every thread back to
    niceness 0 once its boot line was printed, or when the trace ended (`RocketMQCluster.restart_low_priority`)."""
    from testbed.rocketmq.cluster import BOOT_NICENESS

    logs = sorted((leader_crash.out / "cluster").glob("broker-*/priority.log"))
    assert len(logs) == 1
    (line,) = logs[0].read_text().splitlines()
    m = re.fullmatch(rf"[\d.]+ (booted|trace over) after ([\d.]+) CPU-s at niceness {BOOT_NICENESS}; "
                     r"niceness 0 from now", line)
    assert m is not None, line
    assert float(m[2]) > 1.0  # a JVM at work, not a process that died at once


def test_policies_lay_out_the_groups_and_refuse_mixed_runs():
    """No cluster needed: the groups a run starts (DLedger, master/slave, controller mode), the brokers' settings
    the policy sets, and the policies one cluster cannot serve together."""
    from pathlib import Path

    from schemas.errors import BadInput
    from testbed.job import rocketmq
    from testbed.rocketmq.cluster import RocketMQCluster
    from testbed.rocketmq.record import groups_of

    groups, qpg, refresh, ms = groups_of([parse_policy("dledger:group_size=3,queues_per_group=8")], 7)
    assert [g.members for g in groups] == [(0, 1, 2), (3, 4, 5)] and (qpg, refresh, ms) == (8, 30000, None)
    with pytest.raises(BadInput):
        groups_of([parse_policy("dledger"), parse_policy("dledger:route_refresh_ms=10000")], 3)

    groups, _, _, ms = groups_of([parse_policy("rocketmq-sync")], 4)
    assert [g.members for g in groups] == [(0, 1), (2, 3)]
    assert (ms.broker_role, ms.in_sync_replicas, ms.slave_timeout_ms, ms.controller) == ("SYNC_MASTER", 2, 3000, False)
    cluster = RocketMQCluster(None, groups, Path("/nonexistent"), "t", master_slave=ms)  # type: ignore[arg-type]
    assert cluster._replication(0, groups[0])["brokerRole"] == "SYNC_MASTER"
    slave = cluster._replication(3, groups[1])
    assert (slave["brokerRole"], slave["brokerId"]) == ("SLAVE", 1)
    assert cluster.is_master(2) and not cluster.is_master(3)

    groups, _, _, ms = groups_of([parse_policy("rocketmq-controller-allack")], 3)
    assert [g.members for g in groups] == [(0, 1, 2)] and ms.controller
    assert (ms.all_ack_in_sync_state_set, ms.min_insync_replicas) == (True, 2)
    with pytest.raises(BadInput):  # allAckInSyncStateSet is a broker setting: one cluster cannot serve both
        groups_of([parse_policy("rocketmq-controller"), parse_policy("rocketmq-controller-allack")], 3)
    with pytest.raises(BadInput):
        groups_of([parse_policy("rocketmq"), parse_policy("dledger")], 4)
    with pytest.raises(BadInput):
        rocketmq([parse_policy("dledger"), parse_policy("kafka-acks1")])
    assert rocketmq([parse_policy("dledger")]) and not rocketmq([parse_policy("kafka-acks1")])


def test_sigterm_during_a_run_unwinds_like_ctrl_c():
    """SIGTERM while a cluster runs raises KeyboardInterrupt, so the cluster's context manager stops every process
    group it started and deletes its namespaces; the previous handler is back afterwards."""
    import signal
    import time

    from testbed.job import terminate_as_interrupt

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), terminate_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    assert signal.getsignal(signal.SIGTERM) == before


def test_slave_progress_covers_exactly_the_messages_below_its_acknowledged_offset():
    """No cluster needed: a slave at acknowledged offset O holds the messages that end at or below O (a message
    ends where the group's next one starts), so its `replicate` event's upto_us is just before the earliest send
    among the others; samples after the slave's crash are left out, and the master's own are never events."""
    import pyarrow as pa

    from testbed.rocketmq.cluster import Group
    from testbed.rocketmq.record import RocketMQRecording, replicate_events
    from testbed.schedule import Schedule

    produce = pa.table({"ts_us": [1000, 2000, 3000], "msg_id": [1, 2, 3], "key": [None, None, None],
                        "size_bytes": [100, 100, 100], "producer_id": [0, 0, 0]})
    schedule = Schedule("s", "s", (), 10_000_000, produce, [], 10, {})
    rec = RocketMQRecording(schedule, [], 0, groups=[Group("g0", (0, 1))], master_slave=True)
    rec.sent_us = {1: 1000, 2: 2000, 3: 3000}
    rec.clo_ids = {("g0", 0): 1, ("g0", 400): 2, ("g0", 800): 3}  # message 2 ends at 800
    rec.faults = [(9_000_000, Kind.CRASH, 1)]
    rec.broker_of_ip = {"10.0.0.1": 0, "10.0.0.2": 1}
    rec.ha = [{"t": 5000, "addr": "10.0.0.1:10911", "master": True, "max": 1200, "acks": {"/10.0.0.2:4001": 799}},
              {"t": 6000, "addr": "10.0.0.2:10911", "master": False, "max": 800},
              {"t": 7000, "addr": "10.0.0.2:10911", "master": False, "max": 1200},
              {"t": 9_500_000, "addr": "10.0.0.2:10911", "master": False, "max": 1200}]
    assert replicate_events(rec) == [(5000, 1, 1999), (6000, 1, 2999), (7000, 1, 7000)]


def test_a_slaves_first_sample_after_its_master_crashed_is_what_it_held_at_the_crash():
    """No cluster needed: from its master's crash until a master registers again a slave receives nothing, so its
    first sample in that window is dated 1 µs before the crash. Without it the last sample before the crash (up to
    a sampling period earlier) would stand, and the messages acknowledged in that period would read as lost. A new
    master's connection whose slave has not reported yet (ack -1) is no progress: the slave rejoins the
    SyncStateSet only once its report arrives."""
    import pyarrow as pa

    from testbed.rocketmq.cluster import Group
    from testbed.rocketmq.record import RocketMQRecording, replicate_events
    from testbed.schedule import Schedule

    produce = pa.table({"ts_us": [1000, 2000, 3000], "msg_id": [1, 2, 3], "key": [None, None, None],
                        "size_bytes": [100, 100, 100], "producer_id": [0, 0, 0]})
    schedule = Schedule("s", "s", (), 10_000_000, produce, [], 10, {})
    rec = RocketMQRecording(schedule, [], 0, groups=[Group("g0", (0, 1, 2))], master_slave=True, controller=True)
    rec.sent_us = {1: 1000, 2: 2000, 3: 3000}
    rec.clo_ids = {("g0", 0): 1, ("g0", 400): 2, ("g0", 800): 3}
    rec.faults = [(8000, Kind.CRASH, 0)]
    rec.ns_routes = [{"t": -1000, "route": {"g0": {"0": 0, "1": 1, "2": 2}}},
                     {"t": 8200, "route": {"g0": {"0": 2, "1": 1}}}]
    rec.broker_of_ip = {"10.0.0.1": 0, "10.0.0.2": 1, "10.0.0.3": 2}
    rec.ha = [{"t": 5000, "addr": "10.0.0.1:10911", "master": True, "max": 1200,
               "acks": {"/10.0.0.2:4001": 799, "/10.0.0.3:4002": 399}},
              {"t": 8100, "addr": "10.0.0.2:10911", "master": False, "max": 1200},  # all three, at the crash
              {"t": 8300, "addr": "10.0.0.3:10911", "master": True, "max": 1200, "acks": {"/10.0.0.2:4003": -1}},
              {"t": 8400, "addr": "10.0.0.3:10911", "master": True, "max": 1200, "acks": {"/10.0.0.2:4003": 1200}}]
    # (a controller-mode master's own line is an event too: the replay ignores its leader's, SPEC §2.2)
    assert replicate_events(rec) == [(5000, 0, 5000), (5000, 1, 1999), (5000, 2, 999), (7999, 1, 7999),
                                     (8100, 1, 8100), (8300, 2, 8300), (8400, 2, 8400), (8400, 1, 8400)]
