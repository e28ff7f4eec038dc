"""Predicted beside observed (SPEC §12): the recorded trace replayed by replab, the real outcomes, agreement.

- Predicted: `engine.replay.run_replay` on DIR/trace (trace gate, replay, output gate, Delta tables);
  its message outcomes are read back from the lakehouse.
- Observed: one row per message and policy in the `message_outcomes` shape: status/error/ack time from the
  producer's delivery report (a report after duration_us means `pending` at the end, as a replay judges it);
  fate `committed` when the verifying consumer read it, else `lost` (acknowledged or sent, never read: an
  observer cannot tell a truncated write from one never appended, so fate agreement compares committed versus
  not committed). readable_at_end and visible_us are not observed (stranded and visibility lag are null).
- Unavailability, on both sides from the message outcomes by one definition (`outcome_unavailability`): a
  partition is unavailable from the produce of a message it did not acknowledge within UNAVAILABLE_AFTER_MS
  (failed, still pending, or acknowledged later) until that message's acknowledgement, or for a failed message
  until the next produce the partition did acknowledge in time; summed over the replay's units on both sides
  (`in_replay_units`: a RocketMQ group, whose queues the replay does not tell apart). The replay's own
  unavailability (§4.3) is kept beside it as `replay_unavailable_partition_seconds`.
- Both summaries come from the same code (`engine.metrics.run_summary`).
- Failover: for each crash, shutdown or isolation, the partitions the broker led (sampled just before), the
  mean time from the fault to the first acknowledgement of a message produced after it, on both sides.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from schemas.trace import Kind
from testbed.observe import Recording
from testbed.schedule import topic_of

#: SPEC §12's figures, in the order comparison.json and the tables give them.
COMPARED = ("produced", "acked", "failed", "pending", "acked_lost", "failed_committed",
            "unavailable_partition_seconds", "ack_latency_p50_ms", "ack_latency_p99_ms")
#: Longer than the worst normal acks=all latency seen here (a 300 ms fetch cadence on a shared 2-core machine).
UNAVAILABLE_AFTER_MS = 2000
_ERRORS = {
    "_MSG_TIMED_OUT": "delivery_timeout", "REQUEST_TIMED_OUT": "request_timeout", "_TIMED_OUT": "request_timeout",
    "NOT_ENOUGH_REPLICAS": "not_enough_replicas", "NOT_ENOUGH_REPLICAS_AFTER_APPEND": "not_enough_replicas",
    "LEADER_NOT_AVAILABLE": "no_leader", "NOT_LEADER_OR_FOLLOWER": "no_leader",
}


@dataclass
class Case:
    """One (scenario, policy) of a run: both sides and how far they agree."""

    scenario: str
    policy: str  # as the user wrote it
    canonical: str
    run_id: str
    predicted: dict[str, Any]
    observed: dict[str, Any]
    agreement: dict[str, float]
    failover_ms: dict[str, float | None] = field(default_factory=dict)
    mlflow_run_id: str | None = None
    #: where the time went, from Kafka's and librdkafka's instruments (`testbed.instruments.case_instruments`)
    instruments: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "policy": self.policy, "run_id": self.run_id,
                "predicted": self.predicted, "observed": self.observed, "agreement": self.agreement,
                "failover_ms": self.failover_ms, "instruments": self.instruments}

    @property
    def loss_agrees(self) -> bool:
        return (self.predicted["acked_lost"] > 0) == (self.observed["acked_lost"] > 0)


def observed_outcomes(rec: Recording, i: int, run_id: str, duration_us: int) -> pd.DataFrame:
    sch = rec.schedule
    deliveries, reads, parts = rec.deliveries[i], rec.reads[i], rec.partition[i]
    # Offsets as the prediction counts them: the warm-up record ahead of the scenario's first is not one of them.
    warmup = rec.warmup[i] if rec.warmup else 0
    rows = []
    for mid, key, producer in zip(sch.produce["msg_id"].to_pylist(), sch.produce["key"].to_pylist(),
                                  sch.produce["producer_id"].to_pylist(), strict=True):
        if mid not in rec.sent_us:
            continue
        sent = rec.sent_us[mid]
        d = deliveries.get(mid)
        status, error, ack = "pending", None, None
        if d is not None and d.report_us <= duration_us:
            if d.error is None:
                status, ack = "acked", d.report_us
            else:
                status, error = "failed", _ERRORS.get(d.error, d.error.lower().lstrip("_"))
        read = reads.get(mid)
        fate = "committed" if read is not None else "lost"
        rows.append((run_id, mid, key, producer, parts[mid], sent, status, error, ack,
                     None if ack is None else ack - sent, fate, read is not None,
                     None if read is None else read[1] - warmup, None, d.report_us if d is not None else None))
    return pd.DataFrame(rows, columns=["run_id", "msg_id", "key", "producer_id", "partition", "produce_us", "status",
                                       "error", "ack_us", "latency_us", "fate", "readable_at_end", "offset",
                                       "visible_us", "_answer_us"])


def outcome_unavailability(outcomes: pd.DataFrame, duration_us: int) -> pd.DataFrame:
    """Unavailable intervals per partition from message outcomes alone (module docstring), so that predicted and
    observed are measured alike: a message not acknowledged within UNAVAILABLE_AFTER_MS opens an interval at its
    produce; an acknowledged one closes it at its acknowledgement, a failed or pending one at the next produce of
    the partition acknowledged in time (the end of the run if none). Measured where there is traffic, as §4.3."""
    from replay.results import merge_intervals

    slow = UNAVAILABLE_AFTER_MS * 1000
    rows = []
    run_ids = outcomes["run_id"] if "run_id" in outcomes else pd.Series(None, index=outcomes.index, dtype=object)
    frame = pd.DataFrame({"run_id": run_ids, "partition": outcomes["partition"],
                          "produce_us": outcomes["produce_us"].astype("int64"), "status": outcomes["status"],
                          "ack_us": pd.to_numeric(outcomes["ack_us"], errors="coerce")})
    for (run_id, p), g in frame.groupby(["run_id", "partition"], dropna=False, sort=True):
        g = g.sort_values("produce_us", kind="stable")
        produce = g["produce_us"].to_numpy()
        acked = (g["status"] == "acked").to_numpy()
        ack = g["ack_us"].to_numpy()
        in_time = acked & (ack - produce <= slow)
        # for each message, the produce of the next message acknowledged in time (the run's end if none)
        after = np.searchsorted(np.flatnonzero(in_time), np.arange(len(produce)), side="right")
        nxt = np.append(produce[in_time], duration_us)[after]
        spans = [(int(produce[j]), min(int(ack[j]) if acked[j] else int(nxt[j]), duration_us))
                 for j in np.flatnonzero(~in_time)]
        rows += [(None if pd.isna(run_id) else run_id, int(p), s, e) for s, e in merge_intervals(spans)]
    return pd.DataFrame(rows, columns=["run_id", "partition", "start_us", "end_us"])


def in_replay_units(observed: pd.DataFrame, predicted: pd.DataFrame) -> pd.DataFrame:
    """The observed outcomes with each message's partition replaced by the unit the replay judged it in (a
    RocketMQ group holds many queues and the replay models the group; a Kafka partition is its own unit), so
    that unavailability is summed over the same units on both sides."""
    unit = observed["msg_id"].map(predicted.set_index("msg_id")["partition"])
    return observed.assign(partition=unit.fillna(observed["partition"]).astype("int64"))


def unavailable_seconds(spans: pd.DataFrame, duration_us: int) -> float:
    """Partition-seconds of unavailability, intervals clipped to [0, duration_us] as `engine.metrics` does."""
    clipped = (spans["end_us"].clip(upper=duration_us) - spans["start_us"].clip(lower=0)).clip(lower=0)
    return float(clipped.sum()) / 1e6


def failover_ms(rec: Recording, i: int, outcomes: pd.DataFrame) -> float | None:
    """Mean time from a leader's failure to the first acknowledgement by its successor (SPEC §12), in ms."""
    waits = []
    acked = outcomes[outcomes["status"] == "acked"]
    for t, kind, b in rec.state_faults():
        if kind not in (Kind.CRASH, Kind.SHUTDOWN, Kind.ISOLATE):
            continue
        before = [s for s in rec.samples if s.broker == b and s.ts_us <= t]
        if not before:
            continue
        led = [p for (topic, p) in before[-1].leads if topic == topic_of(i)]
        for p in led:
            later = acked[(acked["partition"] == p) & (acked["produce_us"] >= t)]
            if len(later):
                waits.append((int(later["ack_us"].min()) - t) / 1000)
    return float(np.mean(waits)) if waits else None


def agreement(predicted: pd.DataFrame, observed: pd.DataFrame) -> dict[str, float]:
    both = predicted.merge(observed, on="msg_id", suffixes=("_p", "_o"))
    if not len(both):
        return {"status": 0.0, "fate": 0.0, "messages": 0}
    status = float((both["status_p"] == both["status_o"]).mean())
    fate = float(((both["fate_p"] == "committed") == (both["fate_o"] == "committed")).mean())
    return {"status": round(status, 4), "fate": round(fate, 4), "messages": len(both)}


def summarize(spark, outcomes: pd.DataFrame, unavailable: pd.DataFrame, run_info) -> dict[str, Any]:
    from engine import metrics
    from schemas.tables import TABLES

    cols = TABLES["message_outcomes"].columns
    out_df = spark.createDataFrame(outcomes[cols].astype(object).where(outcomes[cols].notna(), None),
                                   schema=TABLES["message_outcomes"].spark_schema())
    un_df = spark.createDataFrame(unavailable.astype(object), schema=TABLES["unavailability"].spark_schema())
    row = metrics.run_summary(out_df, un_df, [run_info], spark=spark).first().asDict()
    row.pop("run_id")
    # Not observable from outside the cluster (module docstring).
    row["stranded"] = row["visibility_lag_p99_ms"] = row["replication_bytes"] = None
    return row


def now_utc() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# ------------------------------------------------------------------------------------------------ no Spark
def predict_local(policy, manifest, table) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The prediction without Spark: the same kernels through `replay/local.py` (the fast test and `--local`);
    outcomes and unavailability in the table shapes."""
    from replay.local import replay_local
    from schemas.outcomes import ERROR_LABELS, FATE_LABELS, NULL_US, STATUS_LABELS

    frames, spans = [], []
    for r in replay_local(policy, manifest, table):
        m, rec = r.messages, r.messages.records
        ack = np.where(rec.ack_us == NULL_US, np.nan, rec.ack_us)
        frames.append(pd.DataFrame({
            "msg_id": rec.msg_id, "partition": r.partition, "produce_us": rec.produce_us,
            "status": [STATUS_LABELS[s] for s in rec.status], "error": [ERROR_LABELS[e] for e in rec.error],
            "ack_us": ack, "fate": [FATE_LABELS[f] for f in m.fate]}))
        spans += [(r.partition, s, e) for s, e in r.unavailable]
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["msg_id", "partition", "produce_us", "status", "error", "ack_us", "fate"])
    spans_df = pd.DataFrame(spans, columns=["partition", "start_us", "end_us"])
    return out.sort_values("msg_id", ignore_index=True), spans_df


def summary_local(outcomes: pd.DataFrame, unavailable: pd.DataFrame, duration_us: int) -> dict[str, Any]:
    """SPEC §12's compared figures from outcomes, with run_summary's definitions (`engine/metrics.py`: exact
    percentiles with linear interpolation, intervals clipped to [0, duration_us]); the Spark path checks that
    both give the same numbers (tests/testbed)."""
    acked = outcomes["status"] == "acked"
    committed = outcomes["fate"] == "committed"
    lat = (outcomes.loc[acked, "ack_us"] - outcomes.loc[acked, "produce_us"]).to_numpy(dtype=float)
    pct = (lambda q: float(np.percentile(lat, q)) / 1000) if len(lat) else (lambda q: None)
    return {
        "produced": len(outcomes), "acked": int(acked.sum()), "failed": int((outcomes["status"] == "failed").sum()),
        "pending": int((outcomes["status"] == "pending").sum()), "acked_lost": int((acked & ~committed).sum()),
        "failed_committed": int(((outcomes["status"] == "failed") & committed).sum()),
        "unavailable_partition_seconds": unavailable_seconds(unavailable, duration_us),
        "ack_latency_p50_ms": pct(50), "ack_latency_p99_ms": pct(99),
    }
