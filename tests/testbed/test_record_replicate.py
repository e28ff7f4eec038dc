"""The recorder's replicate events from the followers' log ends (`testbed.trace_writer.replicate_events`). No cluster:
a scripted recording where every record reaches its leader 0.8-2.2 ms after it was sent, as on a busy host."""

from __future__ import annotations

from schemas.trace import Kind
from testbed.observe import Delivery, Recording, Sample, Transition
from testbed.schedule import topic_of
from testbed.trace_writer import HANDOVER_READ_US, HELD_BACK_US, replicate_events

TOPIC = topic_of(0)
#: msg_id -> (sent µs, offset, LogAppendTime ms); the clock starts at 0
RECORDS = {10: (1_000, 0, 2), 11: (5_000, 1, 6), 12: (8_200, 2, 9), 13: (9_800, 3, 11)}


def _recording(samples: list[Sample]) -> Recording:
    rec = Recording(schedule=None, policies=[], t0_us=0)
    rec.sent_us = {m: sent for m, (sent, _, _) in RECORDS.items()}
    rec.partition = [dict.fromkeys(RECORDS, 0)]
    rec.deliveries = [{m: Delivery(sent + 2_000, None, off, ms) for m, (sent, off, ms) in RECORDS.items()}]
    rec.reads = [{}]
    rec.replicas = [{0: (0, 1, 2)}]
    rec.samples = [Sample(0, 0, {(TOPIC, 0): 0}, {(TOPIC, 0)}), *samples]
    return rec


def _upto(samples: list[Sample]) -> dict[int, int]:
    return {b: upto for _, b, upto in replicate_events(_recording(samples))}


def test_a_follower_short_of_a_record_holds_nothing_sent_from_that_record_on():
    # Broker 1 holds offsets 0-1; offset 2 (sent at 8.2 ms, appended at 9.x ms) it lacks. Its append time − 1 µs
    # (8 999) would count the record as held, and an acks=1 crash here would predict no loss where Kafka loses it.
    upto = _upto([Sample(10_000, 1, {(TOPIC, 0): 2}, set())])
    assert upto == {1: 8_199}
    assert RECORDS[11][0] <= upto[1] < RECORDS[12][0]


def test_a_caught_up_follower_lacks_the_record_still_on_its_way():
    # Broker 2 holds offsets 0-2 at 10 ms; offset 3 was sent at 9.8 ms and reached the leader after the sample.
    upto = _upto([Sample(10_000, 2, {(TOPIC, 0): 3}, set())])
    assert upto == {2: 9_799}


def test_a_follower_past_every_known_record_is_caught_up_at_the_sample():
    upto = _upto([Sample(12_000, 1, {(TOPIC, 0): 4}, set())])
    assert upto == {1: 12_000}


def test_a_reused_offset_reads_as_the_record_there_at_the_sample():
    # After a truncation offset 3 held another record (msg 14, sent at 20 ms, appended at 21 ms): a sample at 30 ms
    # with log end 3 lacks msg 14, a sample at 10 ms lacks msg 13.
    rec = _recording([Sample(10_000, 1, {(TOPIC, 0): 3}, set()), Sample(30_000, 2, {(TOPIC, 0): 3}, set())])
    rec.sent_us[14] = 20_000
    rec.partition[0][14] = 0
    rec.reads = [{14: (0, 3, 21)}]
    assert {b: upto for _, b, upto in replicate_events(rec)} == {1: 9_799, 2: 19_999}


def test_a_record_its_producer_held_back_counts_from_its_append():
    # msg 15 was sent at 12 ms and queued by its (acks=all) producer until 7.05 s: a follower short of it at 7.5 s
    # holds everything sent before it reached the leader, less HELD_BACK_US, not only what was sent before 12 ms.
    rec = _recording([Sample(7_500_000, 1, {(TOPIC, 0): 4}, set())])
    rec.sent_us[15] = 12_000
    rec.partition[0][15] = 0
    rec.deliveries[0][15] = Delivery(8_000_000, None, 4, 7_050)
    assert {b: upto for _, b, upto in replicate_events(rec)} == {1: 7_050_000 - HELD_BACK_US - 1}



def test_a_record_only_an_isolated_leader_took_does_not_hold_its_successors_followers_back():
    # Broker 0 leads and is cut off at 15 ms (healed at 50 ms); a client with old metadata has it append msg 20 (sent
    # at 16 ms) at offset 4, truncated at the heal. Broker 1 leads from 25 ms; broker 2, its follower, holds offsets
    # 0-3 at 30 ms, everything broker 1 has: caught up. Had msg 20 survived (read back at offset 4), broker 2 would
    # lack it.
    def upto(survives: bool) -> dict[int, int]:
        rec = _recording([Sample(25_000, 1, {(TOPIC, 0): 4}, {(TOPIC, 0)}), Sample(30_000, 2, {(TOPIC, 0): 4}, set())])
        rec.faults = [(15_000, Kind.ISOLATE, 0), (50_000, Kind.HEAL, 0)]
        rec.sent_us[20] = 16_000
        rec.partition[0][20] = 0
        rec.deliveries[0][20] = Delivery(18_000, None, 4, 17)
        rec.reads = [{20: (0, 4, 17)} if survives else {}]
        return {b: u for _, b, u in replicate_events(rec)}

    assert upto(survives=False) == {2: 30_000}
    assert upto(survives=True) == {2: 15_999}

#: Broker 0 leads and shuts down: the signal at 11.5 ms, the handover (its log turning follower) at 20 ms.
HANDOVER_US = 20_000


def _shutdown(samples: list[Sample]) -> Recording:
    rec = _recording(samples)
    rec.faults = [(11_500, Kind.SHUTDOWN, 0)]
    rec.transitions = [Transition(0, Kind.SHUTDOWN, 0, 11_500, resigned_us=HANDOVER_US)]
    return rec


def test_a_follower_keeps_fetching_from_a_leader_that_shuts_down_until_the_handover():
    # Broker 1 was short of offsets 2-3 at its last sample before the handover and held them all right after it:
    # it fetched them before the handover (a leader in controlled shutdown serves fetches until it turns
    # follower), so the new leader keeps msgs 12 and 13 (no acks=1 loss), as the cluster did.
    rec = _shutdown([Sample(10_000, 1, {(TOPIC, 0): 2}, set()), Sample(30_000, 1, {(TOPIC, 0): 4}, set())])
    assert replicate_events(rec) == [(10_000, 1, 8_199), (HANDOVER_US - 1, 1, HANDOVER_US - 1)]


def test_a_new_leader_that_took_new_records_at_the_offsets_it_lacked_does_not_hold_the_old_ones():
    # Broker 1 lacked offsets 2-3 at the handover; as leader it appended msgs 20 and 21 there (26 and 27 ms). Its
    # log end 4 after the handover says nothing of msgs 12 and 13: it held what was sent before msg 12.
    rec = _shutdown([Sample(10_000, 1, {(TOPIC, 0): 2}, set()), Sample(30_000, 1, {(TOPIC, 0): 4}, {(TOPIC, 0)})])
    for mid, sent, off, ms in ((20, 25_000, 2, 26), (21, 25_500, 3, 27)):
        rec.sent_us[mid] = sent
        rec.partition[0][mid] = 0
        rec.deliveries[0][mid] = Delivery(sent + 3_000, None, off, ms)
    assert replicate_events(rec) == [(10_000, 1, 8_199), (HANDOVER_US - 1, 1, 8_199)]


def test_a_sample_long_after_the_handover_says_nothing_of_it():
    rec = _shutdown([Sample(10_000, 1, {(TOPIC, 0): 2}, set()),
                     Sample(HANDOVER_US + HANDOVER_READ_US + 1, 1, {(TOPIC, 0): 4}, set())])
    assert replicate_events(rec) == [(10_000, 1, 8_199)]
