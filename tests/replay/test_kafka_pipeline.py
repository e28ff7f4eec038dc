"""SPEC §3.7 K-6's pieces on their own: who leads the other partitions (P_b), T as a step function, and the
compiled planner against the reference one on long request streams (the engine-level differential tests draw
short traces, which rarely fill max_in_flight_requests_per_connection slots or change T twice)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay.events import PartitionEvents
from replay.kafka.kernels.pipeline import plan_requests_compiled
from replay.kafka.leadership import leadership
from replay.kafka.pipeline import NEVER, ClientPipeline, Leadership, next_cycle, plan_requests
from replay.kafka.routing import kafka_assignment
from replay.policies import parse_policy
from replay.results import MessageRecords, StateRow
from schemas.outcomes import NULL_US, Error, Status
from schemas.trace import Kind

S = 1_000_000


def _faults(*events: tuple[int, Kind, int]) -> PartitionEvents:
    z = np.zeros(0, dtype=np.int64)
    ts, kind, who = zip(*events, strict=True) if events else ((), (), ())
    return PartitionEvents(z, z, z, np.array(ts, np.int64), np.array([int(k) for k in kind], np.int8),
                           np.array(who, np.int64), np.zeros(len(ts), np.int64))


def test_leaders_follow_the_elections_of_the_fault_events():
    """6 partitions on 3 brokers (seed: partition i led by broker i mod 3). Broker 2 crashes at 5 s and is fenced
    9 s later (KRaft, rule 6): its partitions 2 and 5 (replicas [2, 0, 1]) elect broker 0 (rule 8). It restarts at
    30 s as a follower: no election gives its partitions back (no preferred-leader election)."""
    policy = parse_policy("kafka:partitions=6,acks=all,partitions_per_request=1")
    replicas = dict(enumerate(kafka_assignment(6, 3, (0, 1, 2), policy.assignment)))
    lead = leadership(policy, replicas, _faults((5 * S, Kind.CRASH, 2), (30 * S, Kind.RESTART, 2)), 60 * S)
    assert lead.ts.tolist() == [0, 14 * S]
    assert lead.leader.tolist() == [[0, 1, 2, 0, 1, 2], [0, 1, 0, 0, 1, 0]]


def test_a_partition_without_a_leader_counts_for_none():
    """Both brokers crash (replication factor 2), at 1 s and 2 s: each partition's leader is fenced 9 s after its
    crash and the other replica, down too, cannot be elected, so both partitions are offline from 11 s (rule 8)."""
    policy = parse_policy("kafka:partitions=2,replication_factor=2,acks=all,partitions_per_request=1")
    replicas = dict(enumerate(kafka_assignment(2, 2, (0, 1), policy.assignment)))
    lead = leadership(policy, replicas, _faults((1 * S, Kind.CRASH, 0), (2 * S, Kind.CRASH, 1)), 60 * S)
    assert lead.ts.tolist() == [0, 10 * S, 11 * S]
    assert lead.leader.tolist() == [[0, 1], [-1, 1], [-1, -1]]


def _rows(*changes: tuple[int, int | None]) -> list[StateRow]:
    return [StateRow(t, b, 0, (0, 1, 2), None, None) for t, b in changes]


def test_turns_count_the_partitions_the_own_leader_leads_at_each_instant():
    """T = ⌈P_b / partitions_per_request⌉ with P_b = 1 + the other partitions the partition's own leader (its
    state rows) leads then: broker 0 leads 2 of 6 partitions, then 4 from 14 s; partition 0 itself moves to
    broker 1 at 20 s (its own rows), which leads 2 others then; no leader at 30 s: T = 1."""
    lead = Leadership.of([[(0, 0), (20 * S, 1), (30 * S, None)], [(0, 1)], [(0, 2), (14 * S, 0)],
                          [(0, 0)], [(0, 1)], [(0, 2), (14 * S, 0)]])
    rows = _rows((0, 0), (20 * S, 1), (30 * S, None))
    one = ClientPipeline(parse_policy("kafka:partitions=6,acks=all,partitions_per_request=1"), 0, (0, 1, 2),
                         60 * S, lead)
    ts, turns = one.turn_steps(rows)
    assert list(zip(ts.tolist(), turns.tolist(), strict=True)) == [(0, 2), (14 * S, 4), (20 * S, 3), (30 * S, 1)]
    two = ClientPipeline(parse_policy("kafka:partitions=6,acks=all,partitions_per_request=2"), 0, (0, 1, 2),
                         60 * S, lead)
    ts, turns = two.turn_steps(rows)
    assert list(zip(ts.tolist(), turns.tolist(), strict=True)) == [(0, 1), (14 * S, 2), (30 * S, 1)]
    java = ClientPipeline(parse_policy("kafka:partitions=6,acks=all"), 0, (0, 1, 2), 60 * S, lead)
    assert java.turn_steps(rows)[1].tolist() == [1]


def test_unclean_elections_of_the_fault_events_are_recorded_for_the_topic():
    """SPEC §3.7 K-8's instants (k24-unclean-election-fatal-producer's faults): 3 partitions, replicas [0, 1], [1, 2],
    [2, 0]. Broker 1 crashes at 5 s (fenced at 14 s), broker 0 at 20 s (fenced at 29 s: partition 0 offline). Broker
    1's restart at 40 s elects it uncleanly for partition 0 (rule 8), the topic's only unclean election; without
    unclean election partition 0 stays offline and there is none."""
    faults = _faults((5 * S, Kind.CRASH, 1), (20 * S, Kind.CRASH, 0), (40 * S, Kind.RESTART, 1))
    for unclean, expected in (("true", [40 * S]), ("false", [])):
        policy = parse_policy(f"kafka:partitions=3,replication_factor=2,acks=all,partitions_per_request=1,"
                              f"unclean_leader_election={unclean}")
        replicas = dict(enumerate(kafka_assignment(3, 2, (0, 1, 2), policy.assignment)))
        lead = leadership(policy, replicas, faults, 60 * S)
        assert lead.unclean_us.tolist() == expected
        assert lead.leader[-1].tolist() == [1 if unclean == "true" else -1, 2, 2]


def _records(produce, status, ack) -> MessageRecords:
    n = len(produce)
    status = np.array([int(s) for s in status], np.int8)
    error = np.where(status == int(Status.FAILED), int(Error.NO_LEADER), int(Error.NONE)).astype(np.int8)
    none = np.full(n, NULL_US, np.int64)
    return MessageRecords(np.arange(1, n + 1, dtype=np.int64), np.array(produce, np.int64), status, error,
                          np.array(ack, np.int64), none, none, none)


def test_a_fatal_producer_fails_what_it_still_holds():
    """SPEC §3.7 K-8: unclean elections at 10 s and 30 s, client_failover_ms 100 ms, round trip 1 ms: the producer
    fails at 10.101 s and its successor at 30.101 s. Delivery timeout 5 s. Failed there with
    out_of_order_sequence_number: m2 (answered at 10.2 s), m3 (pending at the end), m5 (failed at its deadline,
    13 s), m8 (the second producer's, answered at 30.5 s). Kept: m1 (answered at 10.101 s, by the fatal instant),
    m4 (failed at 9 s, before it), m6 (produced at 10.101 s: the new producer's, answered at 11 s), m7, m9
    (produced after the last fatal instant). The Java producer (partitions_per_request null) keeps them all."""
    A, F, P = Status.ACKED, Status.FAILED, Status.PENDING
    rec = _records([1 * S, 2 * S, 3 * S, 4 * S, 8 * S, 10_101_000, 20 * S, 29 * S, 31 * S],
                   [A, A, P, F, F, A, A, A, A],
                   [10_101_000, 10_200_000, NULL_US, NULL_US, NULL_US, 11 * S, 21 * S, 30_500_000, 32 * S])
    lead = Leadership.of([[(0, 0)]], [30 * S, 10 * S, 30 * S])
    timeout = 5 * S
    for per, failed in (("1", [2, 3, 5, 8]), (None, [])):
        policy = parse_policy("kafka:partitions=1,acks=all,unclean_leader_election=true,delivery_timeout_ms=5000"
                              + ("" if per is None else f",partitions_per_request={per}"))
        client = ClientPipeline(policy, 0, (0, 1, 2), 60 * S, lead, round_trip_us=1000)
        out = client.fatal(rec, timeout)
        fatal = rec.msg_id[out.error == int(Error.OUT_OF_ORDER_SEQUENCE_NUMBER)].tolist()
        assert fatal == failed
        assert (out.status[np.array(failed, int) - 1] == int(Status.FAILED)).all()
        assert (out.ack_us[np.array(failed, int) - 1] == NULL_US).all()
        kept = np.setdiff1d(rec.msg_id, failed) - 1
        assert np.array_equal(out.status[kept], rec.status[kept]) and np.array_equal(out.ack_us[kept], rec.ack_us[kept])



def test_only_a_live_leader_answers_and_a_new_one_once_clients_reach_it():
    """SPEC §3.7 K-6 (live leader): the timeline the planner reads, from the engine's rows and the fault events.
    k26-down-leader-answers-nothing: B1 (0) leads with ISR {0, 1, 2}; B2 (1) crashes at 2 s (nothing changes for
    the planner), B1 at 5 s (not live: no answers, though it still leads), B2's fencing at 11 s shrinks the ISR
    while B1 is down (still not live), B3 (2) is elected at 14 s (a new leadership, answering once clients reach it
    at 14.1 s). Then B3 is isolated at 20 s and heals at 21 s: live in between, as the ISR it knew held itself
    alone (rule 10), and the same leadership after (its clients stayed); it crashes at 30 s and restarts at 32 s,
    re-elected: a new incarnation, reached at 32.1 s. With ISR {B3, B1} when cut off, it is not live while
    isolated (no follower reaches it)."""
    rows = [StateRow(0, 0, 0, (0, 1, 2), 0, 0), StateRow(11 * S, 0, 0, (0, 2), 0, 0),
            StateRow(14 * S, 2, 1, (2,), 0, 0), StateRow(32 * S, 2, 2, (2,), 0, 0)]
    faults = _faults((2 * S, Kind.CRASH, 1), (5 * S, Kind.CRASH, 0), (20 * S, Kind.ISOLATE, 2),
                     (21 * S, Kind.HEAL, 2), (30 * S, Kind.CRASH, 2), (32 * S, Kind.RESTART, 2))
    client = ClientPipeline(parse_policy("kafka:partitions=1,acks=all"), 0, (0, 1, 2), 60 * S)
    st_ts, mask, lead, live, start = client.timeline(rows, faults.broker_ts, faults.broker_kind, faults.broker_id)
    assert list(zip(st_ts.tolist(), mask.tolist(), lead.tolist(), live.tolist(), start.tolist(), strict=True)) == [
        (0, 0b110, 0, True, 100_000), (5 * S, 0b110, 0, False, 100_000), (11 * S, 0b100, 0, False, 100_000),
        (14 * S, 0, 1, True, 14_100_000), (30 * S, 0, 1, False, 14_100_000), (32 * S, 0, 2, True, 32_100_000)]
    # a request read at 1.005 s that B3 fetched past at 1.5 s: not answered at the ISR change of 11 s, but when
    # clients reach B3; one read at 20.5 s, while B3 is isolated alone, at once; one read while it is down, when
    # clients reach its new incarnation
    f_off, f_ts, f_upto = np.array([0, 0, 0, 1]), np.array([1_500_000]), np.array([1_500_000])
    assert next_cycle(1_005_000, f_off, f_ts, f_upto, st_ts, mask, lead, live, start) == 14_100_000
    assert next_cycle(20_500_000, f_off, f_ts, f_upto, st_ts, mask, lead, live, start) == 20_500_000
    assert next_cycle(30_500_000, f_off, f_ts, f_upto, st_ts, mask, lead, live, start) == 32_100_000
    rows[2] = StateRow(14 * S, 2, 1, (0, 2), 0, 0)  # had B3's ISR held a follower when it was cut off
    st_ts, mask, lead, live, start = client.timeline(rows, faults.broker_ts, faults.broker_kind, faults.broker_id)
    assert list(zip(st_ts.tolist(), live.tolist(), strict=True))[3:] == [
        (14 * S, True), (20 * S, False), (21 * S, True), (30 * S, False), (32 * S, True)]

@st.composite
def plans(draw):
    """A partition's messages (bursts, some not acknowledged by the engine), its followers' fetches (brokers 1 and
    2, sometimes stopping early), an ISR timeline, T steps and the client's settings."""
    n = draw(st.integers(1, 120))
    gaps = draw(st.lists(st.integers(0, 80_000), min_size=n, max_size=n))
    prod = np.cumsum(np.array(gaps, np.int64)) + 1_000
    eng = prod + np.array(draw(st.lists(st.integers(0, 300_000), min_size=n, max_size=n)), np.int64)
    ok = np.ones(n, np.bool_)
    ok[draw(st.lists(st.integers(0, n - 1), max_size=3))] = False  # refused or failed in the engine
    eng[n - draw(st.integers(0, min(n, 4))):] = NEVER  # left pending at the end by the engine
    eng[draw(st.lists(st.integers(0, n - 1), max_size=2))] = NEVER
    size = np.array(draw(st.lists(st.sampled_from([100, 3000, 9000]), min_size=n, max_size=n)), np.int64)
    every = draw(st.sampled_from([20_000, 100_000, 250_000]))
    end = int(prod[-1]) + draw(st.sampled_from([0, 2 * S, 30 * S]))
    ts, who, upto = [], [], []
    for b in (1, 2):
        stop = draw(st.sampled_from([end, end // 2]))
        for t in range(every, stop + 1, every):
            ts.append(t)
            who.append(b)
            upto.append(t - draw(st.sampled_from([0, 0, every // 2])))
    order = np.lexsort((np.array(who), np.array(ts))) if ts else np.zeros(0, np.int64)
    b_ts = np.array(ts, np.int64)[order]
    b_who = np.array(who, np.int64)[order]
    b_upto = np.array(upto, np.int64)[order]
    b_kind = np.full(len(b_ts), int(Kind.REPLICATE), np.int8)
    st_ts, st_mask, st_lead, st_live, st_from = [0], [0b110], [0], [True], [100_000]
    for t in sorted(set(draw(st.lists(st.integers(1, end), max_size=3)))):
        # an ISR change, a leader that goes down, no leader, or a new leader clients reach some time later
        lead = draw(st.sampled_from([st_lead[-1], -1, max(st_lead) + 1]))
        st_ts.append(t)
        st_mask.append(draw(st.sampled_from([0b010, 0b100, 0])))
        st_lead.append(lead)
        st_live.append(lead >= 0 and draw(st.booleans()))
        st_from.append(st_from[-1] if lead == st_lead[-2] else t + draw(st.sampled_from([0, 100_000])))
    # T changes, at fetch instants too (answers come at them: the step in force at an answer is T's own)
    at = st.one_of(st.integers(1, end), st.integers(1, max(end // every, 1)).map(lambda k: k * every))
    steps = sorted(set(draw(st.lists(at, max_size=4))))
    tn_ts = np.array([0, *steps], np.int64)
    tn = np.array(draw(st.lists(st.integers(1, 6), min_size=len(tn_ts), max_size=len(tn_ts))), np.int64)
    slots = draw(st.integers(1, 5))
    rtt = draw(st.sampled_from([0, 1000]))
    return (prod, eng, ok, size, 5000, rtt, tn_ts, tn, rtt if slots == 1 else 0, slots,
            draw(st.sampled_from([100, 16384])), np.array([0, 1, 2], np.int64), b_ts, b_kind, b_who, b_upto,
            np.array(st_ts, np.int64), np.array(st_mask, np.int64), np.array(st_lead, np.int64),
            np.array(st_live, np.bool_), np.array(st_from, np.int64))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(plans())
def test_compiled_planner_matches_the_reference(args):
    ref, ref_made = plan_requests(*args)
    ker, ker_made = plan_requests_compiled(*args)
    assert ker.tolist() == ref.tolist()
    assert ker_made[args[2]].tolist() == ref_made[args[2]].tolist()  # when each planned message's request was made


def test_a_request_carries_what_waited_when_its_slot_freed():
    """SPEC §3.7 K-6 with 2 slots, one message every 30 ms, fetches every 100 ms (k23-client-pipeline-slots): the
    request read at 200 ms was made at the 100 ms answer and carries the two messages sent by then, not the three
    sent by 200 ms; with one slot it is made when read and carries all three."""
    prod = np.arange(5_000, 400_000, 30_000, dtype=np.int64)
    n = len(prod)
    fetch = np.arange(100_000, 1_000_001, 100_000, dtype=np.int64)
    b_ts, b_who = np.repeat(fetch, 2), np.tile(np.array([1, 2], np.int64), len(fetch))
    common = dict(reps=np.array([0, 1, 2], np.int64), b_ts=b_ts, b_kind=np.full(len(b_ts), int(Kind.REPLICATE),
                  np.int8), b_who=b_who, b_upto=b_ts.copy(), st_ts=np.array([0], np.int64),
                  st_mask=np.array([0b110], np.int64), st_lead=np.array([0], np.int64), st_live=np.array([True]),
                  st_from=np.array([0], np.int64))
    ones = np.array([0], np.int64), np.array([1], np.int64)

    def acks(slots: int, gap: int) -> list[int]:
        out, _ = plan_requests(prod, prod.copy(), np.ones(n, np.bool_), np.full(n, 100, np.int64), 0, 0, *ones,
                               gap, slots, 16384, **common)
        assert NEVER not in out.tolist()
        return [int(a) // 1000 for a in out]

    assert acks(2, 0) == [100, 200, 300, 300, 400, 400, 400, 500, 500, 500, 600, 600, 600, 600]
    assert acks(1, 1000) == [100, 200, 200, 200, 300, 300, 300, 400, 400, 400, 500, 500, 500, 500]


def test_a_request_answered_after_the_trace_holds_its_slot_and_the_other_turns_behind_it():
    """SPEC §3.7 K-6 with 5 slots and one message per request, a message every 30 ms, fetches every 100 ms until
    1 s; the engine leaves every message from 305 ms on pending (its high watermark never passes them). Those go
    through the pipeline too: a request carrying one is answered after the trace and its slot never frees. With
    T = 1 the five requests of m11-m15 are in flight at the end and m16-m24 are never made. With T = 3 the two
    other partitions' requests behind each unanswered one take slots too: only m5 and m6 are in flight at the end
    (with the other turns' four), m7-m24 are never made."""
    prod = np.arange(5_000, 700_000, 30_000, dtype=np.int64)
    n = len(prod)
    fetch = np.arange(100_000, 1_000_001, 100_000, dtype=np.int64)
    b_ts, b_who = np.repeat(fetch, 2), np.tile(np.array([1, 2], np.int64), len(fetch))
    eng = np.where(prod > 300_000, NEVER, prod)
    common = dict(reps=np.array([0, 1, 2], np.int64), b_ts=b_ts, b_kind=np.full(len(b_ts), int(Kind.REPLICATE),
                  np.int8), b_who=b_who, b_upto=b_ts.copy(), st_ts=np.array([0], np.int64),
                  st_mask=np.array([0b110], np.int64), st_lead=np.array([0], np.int64), st_live=np.array([True]),
                  st_from=np.array([0], np.int64))

    def plan(turns: int, planner) -> tuple[list, list]:
        out, made = planner(prod, eng, np.ones(n, np.bool_), np.full(n, 100, np.int64), 0, 0,
                            np.array([0], np.int64), np.array([turns], np.int64), 0, 5, 100, **common)
        ms = [None if m == NEVER else int(m) // 1000 for m in made]
        return [None if a == NEVER else int(a) // 1000 for a in out], ms

    for planner in (plan_requests, plan_requests_compiled):
        out, made = plan(1, planner)
        assert out == [100, 200, 300, 400, 500, 600, 700, 800, 900, 1000] + [None] * 14
        assert made == [5, 35, 65, 95, 125, 155, 200, 300, 400, 500, 600, 700, 800, 900, 1000] + [None] * 9
        out, made = plan(3, planner)
        assert out == [100, 400, 700, 1000] + [None] * 20
        assert made == [5, 35, 200, 500, 600, 900] + [None] * 18
