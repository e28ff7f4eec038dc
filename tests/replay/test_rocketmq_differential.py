"""The RocketMQ kernels against the reference interpreter (SPEC §9), and chunked against one pass.

Every family (`rocketmq`, `dledger`, `rocketmq-controller`) on random valid traces (faults, stalls, bursts,
same-instant collisions) and random parameters. A failing case prints the policy and the trace.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings, target
from hypothesis import strategies as st

from replay.events import split_trace_table
from replay.families import family_of
from replay.local import control_events, replay_local
from replay.results import coalesce_states
from replay.rocketmq.control import key_of, unpack_delay
from schemas.outcomes import FATE_LABELS, Error, Status
from schemas.trace import Kind

from .strategies import ROCKETMQ_POLICY_STRATEGIES, event_table, group_traces

WINDOW_US = 1_000_000
# CI draws the same cases every run (derandomize, as the Kafka suite): a red CI is a regression, never a lucky
# draw; `make test-slow` explores at random.
FAST = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
SLOW = settings(max_examples=10000, deadline=None, suppress_health_check=list(HealthCheck))
FAMILIES = sorted(ROCKETMQ_POLICY_STRATEGIES)


def outcome_rows(result) -> list[tuple]:
    j = result.messages
    r = j.records
    part = (r.payload or {}).get("part", r.msg_id[:0])
    assert len(part) == len(r.msg_id)
    return sorted(zip(r.msg_id.tolist(), r.produce_us.tolist(), r.status.tolist(), r.error.tolist(),
                      r.ack_us.tolist(), r.visible_us.tolist(), j.fate.tolist(), j.readable_at_end.tolist(),
                      j.offset.tolist(), part.tolist(), strict=True))


@st.composite
def cases(draw, family: str):
    manifest, table = draw(group_traces())
    # the producers' route-poll phase (SPEC §2, §3.7 R-1): polls at phase + k × route_refresh_ms
    phase = draw(st.sampled_from([0, 0, 0, 1, 250_000, 1_700_000, 6_000_000]))
    manifest = replace(manifest, route_poll_phase_us=phase)
    policy = draw(ROCKETMQ_POLICY_STRATEGIES[family](len(manifest.brokers)))
    return manifest, table, policy


def context(manifest, table, policy) -> str:
    return (f"{policy.canonical()}\n{table.to_pandas().to_string()}\nduration={manifest.duration_us} "
            f"phase={manifest.route_poll_phase_us}")


def check_case(manifest, table, policy) -> None:
    ref = replay_local(policy, manifest, table, engine="reference")
    ker = replay_local(policy, manifest, table, engine="kernel")
    ctx = context(manifest, table, policy)
    assert len(ref) == len(ker)
    for r, k in zip(ref, ker, strict=True):
        assert outcome_rows(k) == outcome_rows(r), ctx
        assert k.states == coalesce_states(r.states, WINDOW_US), ctx
        assert k.unavailable == r.unavailable, ctx
        assert k.replication_bytes == r.replication_bytes, ctx
        # routing and the reference's own control rules agree on when a group takes writes (C1-C7): only the
        # controller's SyncStateSet case, which routing cannot see, may send a message to a group without one
        if policy.family != "rocketmq-controller":
            assert Error.NO_LEADER not in r.messages.records.error.tolist(), ctx


def check_chunks(manifest, table, policy, cuts) -> None:
    one = replay_local(policy, manifest, table, engine="kernel")
    cuts = sorted({c for c in cuts if 0 < c <= manifest.duration_us})
    chunked = replay_local(policy, manifest, table, engine="kernel", chunks=cuts)
    assert len(chunked) == len(one), (policy.canonical(), cuts)  # a missing result must not zip away
    for a, b in zip(one, chunked, strict=True):
        assert outcome_rows(a) == outcome_rows(b), (policy.canonical(), cuts)
        assert a.states == b.states and a.unavailable == b.unavailable, (policy.canonical(), cuts)
        assert a.replication_bytes == b.replication_bytes


@pytest.mark.parametrize("family", FAMILIES)
def test_kernel_matches_reference(family):
    @FAST
    @given(cases(family))
    def run(case):
        check_case(*case)

    run()


@pytest.mark.parametrize("family", FAMILIES)
def test_chunked_equals_one_pass(family):
    @FAST
    @given(cases(family), st.lists(st.integers(0, 60_000_000), max_size=6))
    def run(case, cuts):
        check_chunks(*case, cuts)

    run()


def check_refusals_predicted_are_real(manifest, table, policy) -> int:
    """C9 (SPEC §3.7 C-2): with no retry, every send routed to a group at an instant where routing predicts a
    refusal is refused by the replayed group (`in_sync_replicas_not_enough`; `no_leader` if the new master has no
    eligible log, C7). Returns how many such sends the case had."""
    policy = replace(policy, retry_times_when_send_failed=0)  # each send stays at its first group
    _, broker_events = split_trace_table(table)
    model = family_of(policy).model(policy, manifest, control_events(broker_events))
    seen = 0
    for r in replay_local(policy, manifest, table, engine="reference"):
        tl = model.timelines[r.partition]
        rec = r.messages.records
        if not len(rec.msg_id):
            continue
        predicted = tl.refused[tl.at(key_of(rec.produce_us, int(Kind.PRODUCE)))] & (rec.payload["part"] >= 0)
        errors = rec.error[predicted]
        assert np.isin(errors, [Error.IN_SYNC_REPLICAS_NOT_ENOUGH, Error.NO_LEADER]).all(), \
            context(manifest, table, policy)
        seen += int(predicted.sum())
    return seen


def test_predicted_refusals_are_real():
    seen = []

    @FAST
    @given(cases("rocketmq-controller"))
    def run(case):
        seen.append(check_refusals_predicted_are_real(*case))

    run()
    assert sum(seen) > 0  # the draw reaches predicted refusals (else the check above checked nothing)


@pytest.mark.slow
def test_predicted_refusals_are_real_many():
    seen = []

    @SLOW
    @given(cases("rocketmq-controller"))
    def run(case):
        seen.append(check_refusals_predicted_are_real(*case))

    run()
    assert sum(seen) > 0


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_kernel_matches_reference_many(family):
    @SLOW
    @given(cases(family), st.lists(st.integers(0, 60_000_000), max_size=4))
    def run(case, cuts):
        check_case(*case)
        check_chunks(*case, cuts)

    run()


# --------------------------------------------------------------------------- mid-size generated traces
# Thousands of messages per group: the kernels' compaction of settled messages and the folding of flush history
# only start above a few thousand rows, which the small random traces above never reach.
LIBRARY_CASES = [
    ("r4-dledger-leader-crash", 0.2, ("dledger-3", "dledger-5", "dledger:group_size=3,max_wait_ack_ms=300")),
    ("r6-controller-mode-failover", 0.2, ("rocketmq-controller", "rocketmq-controller-allack")),
    ("rack-power-loss", 0.1, ("rocketmq-async", "rocketmq-sync", "rocketmq-ordered",
                              "rocketmq:reconcile=union,flush_least_bytes=4096")),
]
SLOW_LIBRARY_CASES = [
    (name, 0.1, ("rocketmq-async", "rocketmq-sync-syncflush", "rocketmq5-sync-default", "dledger-3",
                 "rocketmq-controller", "rocketmq-controller-allack",
                 "rocketmq-controller:enable_elect_unclean_master=true"))
    # chaos: every fault kind, and hundreds of SyncStateSet checks, most of them quiet (`ControllerReplay._quiet`)
    for name in ("rolling-restart", "flaky-network", "slow-disk", "full-cluster-power-loss", "rack-power-loss",
                 "chaos")
]


def _library_case(name: str, scale: float, policy_text: str) -> None:
    from replay.policies import parse_policy
    from studies.dledger_vs_kafka import load_trace

    manifest, table = load_trace(name, 1, scale)
    policy = parse_policy(policy_text)
    ref = replay_local(policy, manifest, table, engine="reference")
    ker = replay_local(policy, manifest, table, engine="kernel")
    chunked = replay_local(policy, manifest, table, engine="kernel", chunks=list(range(
        3_000_000, manifest.duration_us, 3_000_000)))
    assert sum(len(r.messages.records) for r in ref) > 4096
    for r, k, c in zip(ref, ker, chunked, strict=True):
        assert outcome_rows(k) == outcome_rows(r), (name, policy_text)
        assert k.states == coalesce_states(r.states, WINDOW_US), (name, policy_text)
        assert k.unavailable == r.unavailable and k.replication_bytes == r.replication_bytes
        assert outcome_rows(c) == outcome_rows(k) and c.states == k.states and c.unavailable == k.unavailable


@pytest.mark.parametrize(("name", "scale", "policy"), [(n, s, p) for n, s, ps in LIBRARY_CASES for p in ps])
def test_library_traces_kernel_matches_reference(name, scale, policy):
    _library_case(name, scale, policy)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "scale", "policy"), [(n, s, p) for n, s, ps in SLOW_LIBRARY_CASES for p in ps])
def test_library_traces_kernel_matches_reference_slow(name, scale, policy):
    _library_case(name, scale, policy)


# --------------------------------------------------------------------------------- pinned regressions
# Cases the slow suite found (minimized): (policy, brokers, duration_us, events as (ts_us, kind, broker|msg_id)).
_CTRL = ("rocketmq-controller:delivery_timeout_ms=800,slaves_per_master=1,queues_per_group=1,"
         "flush_least_bytes=0,ha_max_time_slave_not_catchup_ms=2000,all_ack_in_sync_state_set=true,"
         "slave_timeout_ms=400,controller_heartbeat_timeout_ms=1000,controller_scan_ms=300,"
         "retry_times_when_send_failed=0")
REGRESSIONS = [
    # clients stuck on a zombie master keep writing to it through a later election from an offline group
    (_CTRL, 2, 10_004_000, [(0, "produce", 1), (1_000_000, "replicate", 0, 1_000_000), (3_000_000, "produce", 2),
                            (3_000_000, "isolate", 0), (3_032_000, "replicate", 1, 3_031_025),
                            (4_011_000, "produce", 3), (6_011_000, "crash", 1), (7_004_000, "produce", 4),
                            (8_004_000, "restart", 1), (8_004_000, "produce", 5)]),
    # a master that loses its disk and restarts while isolated must not append under its old epoch
    (_CTRL.replace("slaves_per_master=1", "slaves_per_master=0"), 2, 10_000_000,
     [(0, "produce", 1), (1000, "replicate", 0, 1000), (1000, "disk_loss", 0), (1000, "isolate", 0),
      (1000, "restart", 0), (1000, "produce", 2), (1000, "produce", 3)]),
]


@pytest.mark.parametrize(("policy", "brokers", "duration_us", "events"), REGRESSIONS)
def test_pinned_regressions(policy, brokers, duration_us, events):

    from replay.policies import parse_policy
    from schemas.trace import Broker, Manifest

    table = event_table(events)
    manifest = Manifest("regression", tuple(Broker(i, f"r{i}") for i in range(brokers)), duration_us)
    check_case(manifest, table, parse_policy(policy))
    check_chunks(manifest, table, parse_policy(policy), [1000, 3_000_000, 8_004_000])


def test_offline_group_reelection_waits_for_the_route_poll():
    """Found by a derandomized run, when the engines ended the second unavailability interval 1 ms
    apart (101 vs 102 ms: client_failover_ms after the 1 ms or the 2 ms election); decided by SPEC §3.7 R-1.
    Controller mode, route_refresh_ms=700: both brokers crash at 0 (no master: unavailable from 0). Broker 0
    restarts at 1 ms, registers and is elected at once; it is the master clients know from the initial route
    (R-1: re-electing the client-known broker needs no poll), so writes resume at 1 ms. It crashes again at
    2 ms (noticed at once) while broker 1 restarts: broker 1 is elected at 2 ms, and clients learn it at the
    first route poll at or after that, 700 ms. Every send (0 ms, 2 ms) goes to a down broker 0: no_route."""
    from replay.policies import parse_policy
    from schemas.trace import Broker, Manifest

    events = [(0, "crash", 0), *[(0, "produce", m) for m in (1, 2, 3)], (0, "crash", 1), (1000, "restart", 0),
              (2000, "crash", 0), (2000, "restart", 1), *[(2000, "produce", m) for m in range(4, 19)]]
    policy = parse_policy(
        "rocketmq-controller:delivery_timeout_ms=800,slaves_per_master=1,queues_per_group=1,flush_least_bytes=0,"
        "ha_max_time_slave_not_catchup_ms=2000,check_sync_state_set_period_ms=700,enable_elect_unclean_master=true,"
        "slave_timeout_ms=400,controller_heartbeat_timeout_ms=1000,controller_scan_ms=300,"
        "retry_times_when_send_failed=0,route_refresh_ms=700")
    manifest = Manifest("regression", (Broker(0, "r0"), Broker(1, "r1")), 40_000_000)
    table = event_table(events)
    check_case(manifest, table, policy)
    for engine in ("reference", "kernel"):
        [result] = replay_local(policy, manifest, table, engine=engine)
        assert result.unavailable == [(0, 1000), (2000, 700_000)], engine
        assert set(result.messages.records.error.tolist()) == {int(Error.NO_ROUTE)}, engine


def test_master_restarted_while_isolated_is_no_zombie():
    """Found by the slow suite (minimized to one broker): the kernel stopped on its own invariant (an
    epoch's leader appends contiguously) because the engines made a master that restarted while isolated a zombie,
    appending under the epoch its lost disk no longer held; decided by C7 (`rocketmq.control`): such a master
    serves nothing until its new incarnation registers, so it is no zombie either. Controller mode, one group {0},
    no slaves, controller_scan_ms=300 (scans at 2000 ms + k·300 ms), heartbeat timeout 10 s. Messages 1 and 2 are
    acked and visible at 400 ms (async flush, in_sync_replicas=1) and lost with the disk at 6.4 s. The controller
    would notice at the first scan 10 s later, 16.4 s; broker 0, isolated at 10.8 s while down, restarts at 13.9 s
    and cannot register. At 16.4 s no member is reachable: the group goes offline with no zombie. Messages 3, 4
    (18 s) and 5 (22 s) go to a broker that serves nothing: no_route (no retry). Unavailable from 6.4 s to the
    end. Before the fix both engines acked messages 3 and 4 at 18 s."""
    from replay.policies import parse_policy
    from schemas.trace import Broker, Manifest

    policy = parse_policy("rocketmq-controller:slaves_per_master=0,queues_per_group=1,controller_scan_ms=300,"
                          "retry_times_when_send_failed=0,route_refresh_ms=5000")
    events = [(400_000, "produce", 1), (400_000, "produce", 2), (6_400_000, "disk_loss", 0),
              (10_800_000, "isolate", 0), (13_900_000, "restart", 0), (18_000_000, "produce", 3),
              (18_000_000, "produce", 4), (22_000_000, "produce", 5)]
    manifest = Manifest("regression", (Broker(0, "r0"),), 40_000_000)
    table = event_table(events)
    check_case(manifest, table, policy)
    check_chunks(manifest, table, policy, [1000, 13_900_000, 16_400_000])
    acked, failed, lost = int(Status.ACKED), int(Status.FAILED), FATE_LABELS.index("lost")
    for engine in ("reference", "kernel"):
        [result] = replay_local(policy, manifest, table, engine=engine)
        # (msg_id, produce_us, status, error, ack_us, visible_us, fate)
        assert [row[:7] for row in outcome_rows(result)] == [
            (1, 400_000, acked, int(Error.NONE), 400_000, 400_000, lost),
            (2, 400_000, acked, int(Error.NONE), 400_000, 400_000, lost),
            *[(m, ts, failed, int(Error.NO_ROUTE), -1, -1, FATE_LABELS.index("absent"))
              for m, ts in ((3, 18_000_000), (4, 18_000_000), (5, 22_000_000))]], engine
        assert result.unavailable == [(6_400_000, 40_000_000)], engine


def test_isolated_one_member_dledger_group_commits_alone():
    """Found by the slow suite (minimized): the engines disagreed (ack at the heal vs
    in_sync_replicas_not_enough) on sends to an isolated DLedger leader of a one-member group; decided by SPEC §3.7
    R-4. group_size=1, two brokers: groups {0} and {1}, one queue each. Broker 0 crashes at 0, so messages 1, 3, 5
    (round-robin to group 0, no retry) fail with no_route. Broker 1 is isolated at 1 ms: `isolate` only cuts it
    from other brokers and the NameServer (SPEC §2.2), clients still reach it and it still leads (R-4: it has a
    reachable majority, itself, so it never steps down). Messages 2 and 4 are appended at 1 ms and commit at once
    (§3.4 rule 2: a majority of the group, the leader alone, holds them; flush is async): acked and visible at
    1 ms, offsets 0 and 1, readable at the end. The group takes writes throughout: no unavailability."""
    from replay.policies import parse_policy
    from schemas.trace import Broker, Manifest

    policy = parse_policy("dledger:delivery_timeout_ms=800,group_size=1,queues_per_group=1,heartbeat_ms=300,"
                          "max_heartbeat_leak=1,vote_delay_ms=0,max_wait_ack_ms=300,retry_times_when_send_failed=0,"
                          "route_refresh_ms=300")
    events = [(0, "produce", 1), (0, "crash", 0), (0, "replicate", 1, 0), (1000, "isolate", 1),
              *[(1000, "produce", m) for m in (2, 3, 4, 5)], (2000, "heal", 1), (2000, "replicate", 1, 2000)]
    manifest = Manifest("regression", (Broker(0, "r0"), Broker(1, "r1")), 40_000_000)
    table = event_table(events)
    check_case(manifest, table, policy)
    check_chunks(manifest, table, policy, [1000, 2000, 300_000])
    for engine in ("reference", "kernel"):
        dead, lone = replay_local(policy, manifest, table, engine=engine)
        failed, acked = int(Status.FAILED), int(Status.ACKED)
        # (msg_id, produce_us, status, error, ack_us, visible_us)
        assert [row[:6] for row in outcome_rows(dead)] == [(m, ts, failed, int(Error.NO_ROUTE), -1, -1)
                                                          for m, ts in ((1, 0), (3, 1000), (5, 1000))], engine
        # (msg_id, produce_us, status, error, ack_us, visible_us), then (readable_at_end, offset)
        assert [(row[:6], row[7:9]) for row in outcome_rows(lone)] == [
            ((2, 1000, acked, int(Error.NONE), 1000, 1000), (True, 0)),
            ((4, 1000, acked, int(Error.NONE), 1000, 1000), (True, 1))], engine
        assert lone.unavailable == [], engine


def test_quiet_sync_state_set_checks_end_no_segment_and_a_silent_slave_still_leaves(monkeypatch):
    """A SyncStateSet check that would change nothing ends no compiled segment (`ControllerReplay._quiet`), and one
    that would still runs: one group {0, 1, 2}, a message every 100 ms, both slaves caught up by every report (5 ms
    later) until slave 2 falls silent after 19.905 s (up and reachable, a stalled fetcher). Checks at 3 s, then
    every 5 s to 58 s (12); ha_max_time_slave_not_catchup_ms 15 s. Seen from the segment before each: the checks
    at 3, 8 and 13 s are quiet (the slaves' catch-up time 0 + 15 s), 18 s is not and runs; from there 23 and 28 s
    are (caught up at 17.905 s), 33 s runs, 38 s runs and removes slave 2 (18.1 s since its last catch-up). With
    allAckInSyncStateSet the confirm offset moves again there, and both engines agree on every outcome, timeline row
    and unavailability. After 38 s slave 2, outside the set but up, could rejoin with its old catch-up time: the
    checks at 43-58 s run."""
    from replay.policies import parse_policy
    from replay.rocketmq.kernels.controller import ControllerReplay
    from schemas.trace import Broker, Manifest

    policy = parse_policy("rocketmq-controller:all_ack_in_sync_state_set=true,min_insync_replicas=2,"
                          "slaves_per_master=2,queues_per_group=1")
    events = []
    for i in range(600):
        ts = i * 100_000
        events.append((ts, "produce", i + 1))
        events.append((ts + 5_000, "replicate", 1, ts + 1))
        if ts < 20_000_000:
            events.append((ts + 5_000, "replicate", 2, ts + 1))
    manifest = Manifest("quiet-checks", tuple(Broker(i, f"r{i}") for i in range(3)), 60_000_000)
    table = event_table(events)
    ran: list[int] = []
    on_check = ControllerReplay._on_check
    monkeypatch.setattr(ControllerReplay, "_on_check", lambda self, t, arg: (ran.append(t), on_check(self, t, arg)))
    check_case(manifest, table, policy)
    assert ran == [s * 1_000_000 for s in (18, 33, 38, 43, 48, 53, 58)]
    [ref] = replay_local(policy, manifest, table, engine="reference")
    isr = {row.ts_us: row.isr for row in ref.states}
    assert isr[max(t for t in isr if t < 38_000_000)] == (0, 1, 2) and isr[38_000_000] == (0, 1)
    check_chunks(manifest, table, policy, [10_000_000, 30_000_000, 40_000_000])


def copies_of(manifest, table, policy) -> int:
    """C3 (SPEC §3.4 R-8): how many entries of failed, retried DLedger attempts routing leaves in the replayed
    groups (the copies packed into the payload `delay`)."""
    from replay.local import SplitTrace

    fam = family_of(policy)
    split = SplitTrace(table)
    routed, _ = split.route(policy, manifest, fam.layout(policy, manifest))
    copies = unpack_delay(routed.delay_us)[1]
    return sum(bin(int(c)).count("1") for c in copies[copies > 0])


def _golden_d15(policy: str) -> tuple:
    from replay.policies import parse_policy
    from storage.trace_loader import read_events_arrow

    from .test_golden_local import SCENARIOS

    return (*read_events_arrow(SCENARIOS / "d15-dledger-failed-entry-stays"), parse_policy(policy))


def test_dledger_copies_match():
    """The engines agree on sends that leave entries behind (C3, SPEC §3.4 R-8), one pass and chunked: on golden
    d15 (whose copies the first example must find) and on every drawn case that has some; the draw is steered
    towards them (`target`), as a fixed number of draws may hold none."""
    seen = []

    @FAST
    @given(cases("dledger"), st.lists(st.integers(0, 60_000_000), max_size=4))
    @example(_golden_d15("dledger:queues_per_group=1,route_refresh_ms=1000"), [11_000_000, 14_600_000])
    def run(case, cuts):
        n = copies_of(*case)
        target(float(n))
        if n:
            check_case(*case)
            check_chunks(*case, cuts)
        seen.append(n)

    run()
    assert seen[0] >= 2


def test_dledger_copies_across_chunks():
    """Golden d15 (SPEC §3.4 R-8) cut between each send's copies and its last attempt: a copy scheduled in one
    chunk is appended in the next."""
    from replay.policies import parse_policy
    from storage.trace_loader import read_events_arrow

    from .test_golden_local import SCENARIOS

    manifest, table = read_events_arrow(SCENARIOS / "d15-dledger-failed-entry-stays")
    for policy in ("dledger:queues_per_group=1,route_refresh_ms=1000",
                   "dledger:queues_per_group=1,route_refresh_ms=1000,max_wait_ack_ms=1000"):
        assert copies_of(manifest, table, parse_policy(policy)) >= 2
        check_case(manifest, table, parse_policy(policy))
        check_chunks(manifest, table, parse_policy(policy), [11_000_000, 11_500_000, 12_500_000, 14_600_000,
                                                             15_700_000, 30_700_000])
