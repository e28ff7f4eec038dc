"""DIR/trace/ from a recording (SPEC §2 format): the produce events as sent, the faults at the instants the
brokers changed state, and `replicate` events from the followers' sampled log ends (SPEC §3.2 rule 5: a
follower holding offsets < LEO holds every message its leader appended before the record at offset LEO, so
upto_us = that record's send instant − 1 µs, or its append time − HELD_BACK_US if its producer held it back, at
most the sample instant; see `replicate_events`; at a controlled shutdown the followers' first samples after the
handover stand for what they held at it, `handover_samples`)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from schemas.trace import EVENT_ARROW_SCHEMA, Kind, Manifest
from testbed.instruments import client_round_trip_us
from testbed.observe import Recording, Sample
from testbed.schedule import topic_of


def away_at(faults: list[tuple[int, Kind, int]]):
    """broker -> sorted (ts_us, away?) transitions: down or isolated brokers send no replicate event."""
    trans: dict[int, list[tuple[int, bool]]] = defaultdict(list)
    for t, kind, b in faults:
        trans[b].append((t, kind not in (Kind.RESTART, Kind.HEAL)))

    def away(b: int, t: int) -> bool:
        state = False
        for ft, a in trans.get(b, ()):
            if ft <= t:
                state = a
        return state
    return away


def replicate_events(rec: Recording) -> list[tuple[int, int, int]]:
    """(ts_us, broker, upto_us) from the samples: one per follower sample (module docstring).

    A follower whose log end is LEO in a partition holds every record below LEO and not the record at LEO. The
    trace gives messages their send instants (SPEC §12: produce events as sent) and SPEC §2 reads upto_us as
    "every message its leader appended at or before it", so upto_us is the instant of the record at offset
    LEO − 1 µs (`_instant`), capped at the sample. Its LogAppendTime (ms) says which record held offset LEO at
    the sample (offsets are reused after a truncation): the latest appended by then, else the next one to come.
    The append time alone trails the send by the request's trip, so a record the follower lacked could read as
    held (a prediction of no acked loss under acks=1 where the cluster lost the one record a late fetch left).
    The broker's upto_us is the minimum over the partitions it follows (of every topic: a follower fetches all
    of them from a leader in one request, so they share a position in time). Records truncated later are known
    from the producers' delivery reports (offset and append time), the others from the verifying consumer.
    """
    # (topic, partition, offset) -> [(append_us, instant_us)] of every record seen at that offset
    known: dict[tuple[str, int, int], list[tuple[int, int]]] = defaultdict(list)
    faults = rec.state_faults()
    zombie = zombie_windows(rec, faults)
    for i, deliveries in enumerate(rec.deliveries):
        for mid, d in deliveries.items():
            if d.offset is None or d.append_ms is None:
                continue
            key, append_us = (topic_of(i), rec.partition[i][mid]), d.append_ms * 1000 - rec.t0_us
            read = rec.reads[i].get(mid) if i < len(rec.reads) else None
            if (read is None or read[1] != d.offset) and any(a < append_us <= b for a, b in zombie.get(key, ())):
                continue  # appended by an isolated leader, truncated when it healed: no follower ever held it
            known[(*key, d.offset)].append(_instant(append_us, rec.sent_us[mid]))
    for i, reads in enumerate(rec.reads):
        for mid, (p, off, ms) in reads.items():
            known[(topic_of(i), p, off)].append(_instant(ms * 1000 - rec.t0_us, rec.sent_us[mid]))
    replicas = {(topic_of(i), p): set(r) for i, reps in enumerate(rec.replicas) for p, r in reps.items()}
    away = away_at(faults)

    out = []
    leads: dict[int, set[tuple[str, int]]] = {}  # each broker's latest view of what it leads
    last: dict[int, int] = {}
    for s in sorted([*rec.samples, *handover_samples(rec.samples, faults, known, away)], key=lambda s: s.ts_us):
        leads[s.broker] = s.leads
        if away(s.broker, s.ts_us):
            continue
        upto, follows = s.ts_us, False
        for key, leo in s.leo.items():
            if s.broker not in replicas.get(key, ()) or key in s.leads:
                continue
            leaders = {b for b, ls in leads.items() if key in ls and b != s.broker and not away(b, s.ts_us)}
            if not leaders:
                continue  # no reachable leader: nothing to fetch from (SPEC §2.2)
            follows = True
            at_leo = _record_at(known.get((*key, leo), []), s.ts_us)
            if at_leo is not None:
                upto = min(upto, at_leo - 1)
        if not follows:
            continue
        upto = max(0, min(upto, s.ts_us), last.get(s.broker, 0))
        last[s.broker] = upto
        out.append((s.ts_us, s.broker, upto))
    return out


def zombie_windows(rec: Recording, faults: list[tuple[int, Kind, int]]) -> dict[tuple[str, int], list[tuple[int, int]]]:
    """(topic, partition) -> the (isolate, heal] windows of each broker that led it when it was cut off. Clients
    that have not refreshed their metadata keep writing to such a leader (acks=0 and acks=1 are answered, SPEC §3.2
    rule 10) at offsets its successor fills with other records; no follower fetches from it, and it truncates them
    when it heals. Read as the follower's next record, one of those would hold the follower's upto_us back to its
    instant for every partition it follows."""
    out: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    for t, kind, b in faults:
        if kind is not Kind.ISOLATE:
            continue
        heal = min([u for u, k, c in faults if c == b and u > t and k in (Kind.HEAL, Kind.CRASH, Kind.SHUTDOWN)],
                   default=2**62)
        before = [s for s in rec.samples if s.broker == b and s.ts_us <= t]
        if before:
            for key in max(before, key=lambda s: s.ts_us).leads:
                out[key].append((t, heal))
    return out


#: How long after a controlled shutdown's handover a follower's first sample still says what it held at the handover.
HANDOVER_READ_US = 1_000_000


def handover_samples(samples: list[Sample], faults: list[tuple[int, Kind, int]],
                     known: dict[tuple[str, int, int], list[tuple[int, int]]], away) -> list[Sample]:
    """Every other broker's log ends at each `shutdown` (its handover instant R, SPEC §2.2), as of R − 1 µs.

    Until R the leader that shuts down keeps serving its followers' fetches, so what they hold at R, which
    decides what the new leader truncates (SPEC §3.2 rules 8-9), can be a whole fetch ahead of their last sample
    before R. After R they fetch nothing more from it (it has turned follower and stopped its partitions,
    `ReplicaManager.applyLocalFollowersDelta`), and the new leader starts its epoch from the log end it has
    (`Partition.makeLeader`), so their first
    sample after R (within HANDOVER_READ_US, before any other fault) is read as of R − 1 µs. A partition's log end
    is cut to the first offset any leader appended at after R: a follower held nothing appended later, and a new
    leader that lacked records and has since taken new ones at their offsets does not count as holding the old
    ones. Its view of what it leads is its last one before R (the new leaders have not taken over yet)."""
    by_broker: dict[int, list[Sample]] = defaultdict(list)
    for s in sorted(samples, key=lambda s: s.ts_us):
        by_broker[s.broker].append(s)
    out = []
    for r, kind, gone in faults:
        if kind is not Kind.SHUTDOWN:
            continue
        until = min([t for t, _, _ in faults if t > r] + [r + HANDOVER_READ_US + 1])
        first_new: dict[tuple[str, int], int] = {}
        for (topic, p, off), seen in known.items():
            if any(append_us > r for append_us, _ in seen) and off < first_new.get((topic, p), off + 1):
                first_new[(topic, p)] = off
        for b, own in by_broker.items():
            before = [s for s in own if s.ts_us < r]
            after = next((s for s in own if r < s.ts_us < until), None)
            if b == gone or not before or after is None or away(b, after.ts_us):
                continue
            leo = {key: min(v, first_new.get(key, v)) for key, v in after.leo.items()}
            out.append(Sample(r - 1, b, leo, before[-1].leads))
    return out


#: A record that reached its leader later than this after its send was held back by its producer, not delayed
#: on the way: the idempotent acks=all producer keeps at most 5 requests in flight, each waiting for a follower
#: fetch (up to fetch_interval_ms), so under load its records reach the leader seconds after their send. A record
#: not held back takes linger.ms (5 ms) and one request's trip (the testbed's acks=0/1 round trips: 2-13 ms); a
#: larger margin reads every follower of a held-back topic as that much behind, one more fetch cycle per request.
HELD_BACK_US = 20_000


def _instant(append_us: int, sent_us: int) -> tuple[int, int]:
    """(append_us, the record's instant for upto_us). The instant is its send, the time the trace gives it, unless
    its producer held it back (HELD_BACK_US): the leader had no such record then, and its followers share one
    upto_us with every other topic's (one trace serves every policy), so a follower of that topic would read as
    seconds behind the records it had in the others. Then the instant is its append time − HELD_BACK_US."""
    return append_us, max(sent_us, append_us - HELD_BACK_US)


def _record_at(records: list[tuple[int, int]], ts_us: int) -> int | None:
    """The instant of the record at one offset as of ts_us, from every (append_us, instant_us) seen there: the
    latest appended by then, else the first appended after (the follower is caught up and that record is next)."""
    before = [r for r in records if r[0] <= ts_us]
    if before:
        return max(before)[1]
    return min(records)[1] if records else None


def write_trace(rec: Recording, out: Path, replicates: list[tuple[int, int, int]] | None = None,
                route_poll_phase_us: int = 0) -> Manifest:
    """DIR/trace/ in the SPEC §2 format: manifest.json and events/part-000000.parquet. `replicates` (ts_us, broker,
    upto_us) when the family's recorder derives them itself (RocketMQ: ledger ends), else from the Kafka samples;
    `route_poll_phase_us` the real client's route poll phase (RocketMQ); the round trip the Kafka clients
    measured (`client_round_trip_us`)."""
    sch = rec.schedule
    # The run is judged where the producers stopped (SPEC §4.1: at duration_us; the testbed purges what is
    # still queued then). A state change seen after that (a restart whose JVM was RUNNING only after the trace
    # ended) is outside the observed window: it stays in comparison.json, not in the trace.
    duration = max(sch.duration_us, max(rec.sent_us.values(), default=0))
    faults = [f for f in rec.state_faults() if f[0] <= duration]
    rows: list[tuple] = []
    for mid, t in rec.sent_us.items():
        rows.append((t, Kind.PRODUCE, None, mid))
    for t, kind, b in faults:
        rows.append((t, kind, b, None))
    reps = []
    for t, b, upto in replicate_events(rec) if replicates is None else replicates:
        if t <= duration:
            reps.append((t, b, upto))
    produce = {int(m): j for j, m in enumerate(sch.produce["msg_id"].to_pylist())}
    keys = sch.produce["key"].to_pylist()
    sizes = sch.produce["size_bytes"].to_pylist()
    prods = sch.produce["producer_id"].to_pylist()
    cols: dict[str, list] = {n: [] for n in EVENT_ARROW_SCHEMA.names}
    events = [(t, int(k), m if m is not None else -1, b if b is not None else -1, "f", m, b) for t, k, b, m in rows]
    events += [(t, int(Kind.REPLICATE), -1, b, "r", upto, b) for t, b, upto in reps]
    events.sort(key=lambda e: (e[0], e[1], e[2], e[3]))
    for t, k, _, _, what, val, b in events:
        kind = Kind(k)
        cols["ts_us"].append(t)
        cols["kind"].append(kind.label)
        if kind is Kind.PRODUCE:
            j = produce[val]
            cols["broker"].append(None)
            cols["msg_id"].append(val)
            cols["key"].append(keys[j])
            cols["size_bytes"].append(sizes[j])
            cols["producer_id"].append(prods[j])
            cols["upto_us"].append(None)
        else:
            cols["broker"].append(b)
            cols["msg_id"].append(None)
            cols["key"].append(None)
            cols["size_bytes"].append(None)
            cols["producer_id"].append(None)
            cols["upto_us"].append(val if what == "r" else None)
    table = pa.Table.from_pydict(cols, schema=EVENT_ARROW_SCHEMA)
    manifest = Manifest(sch.trace_id, sch.brokers, duration, None, sch.generator,
                        route_poll_phase_us=route_poll_phase_us, client_round_trip_us=client_round_trip_us(rec))
    (out / "events").mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out / "events" / "part-000000.parquet")
    manifest.write(out)
    return manifest

