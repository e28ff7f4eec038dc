"""Compiled replay of the `kafka` family for one partition (SPEC §3.1-3.2, §4): the production engine.

The reference interpreter (`replay/kafka/reference/interpreter.py`) applies one event at a time; so does this kernel, in
two parts. The timeline splits at *control points* (faults, fencing deadlines, ISR check ticks, client switches,
ISR expansions). Between two of them the leader, ISR and serving broker are fixed: produce and replicate events
and NotEnoughReplicas retries of such a *steady stretch* run in one compiled loop over arrays
(`steady.steady`, called by `stretch`): appends (rules 3-4), follower reports (rule 5), the high
watermark (rule 4), acknowledgements and visibility (rule 12), stalls and timeline rows. Control points, which
are few, run scalar Python handlers that mirror the reference rule by rule (`control`, `clients`).

State lives in the object and is carried across calls to `advance()`, so a partition replays in time chunks
(bounded memory, streaming micro-batches) with exactly the result of one pass. Logs are held as runs of
`(leader_epoch, start, end)` per replica plus, per epoch, the append times and sizes of the entries that epoch's
leader appended (16 bytes per appended message); messages are kept only until their outcome is settled
(`outputs`).
"""

from __future__ import annotations

import heapq

import numpy as np

from replay.events import PartitionEvents
from replay.kafka.kernels import steady
from replay.kafka.kernels.clients import KafkaClients
from replay.kafka.kernels.common import (
    ACKED,
    C_REPLICATE,
    EXTRA_COLS,
    FAILED,
    PAYLOAD,
    PENDING_COLS,
    key,
)
from replay.kafka.kernels.control import KafkaControl
from replay.kafka.kernels.outputs import KafkaOutputs
from replay.kafka.kernels.pipeline import plan_requests_compiled, shift_acks_compiled
from replay.kafka.kernels.steady import C_TICK, CODES_PER_INSTANT, INF, Durability, Flush, FlushCode
from replay.kafka.kernels.stream import merge_stream
from replay.kafka.kernels.stretch import KafkaStretches
from replay.kafka.pipeline import ClientPipeline, Leadership
from replay.kafka.reference.state import ISR_CHECKS_PER_LAG_TIME
from replay.policies import OS_WRITEBACK_EXPIRE_MS, OS_WRITEBACK_PERIOD_MS, Acks, FlushMode, KafkaPolicy
from replay.results import (
    FinalView,
    PartitionResult,
    merge_intervals,
)
from replay.shared.kernels.arrays import (
    Grow,
    Table,
    Timeline,
    append_time_at,
    member_index,
    prefix_runs,
    reserve,
    reserve_rows,
    runs_array,
)
from replay.shared.kernels.judge import judge
from replay.shared.kernels.records import all_records, record_table
from schemas.trace import DEFAULT_CLIENT_ROUND_TRIP_US, Kind
from schemas.units import MS, S


class KafkaPartitionReplay(KafkaStretches, KafkaOutputs, KafkaControl, KafkaClients):
    """Chunked replay of one partition: `advance()` time chunks in order, then `finish()`."""

    def __init__(self, policy: KafkaPolicy, partition: int, replicas: tuple[int, ...], duration_us: int,
                 window_us: int = S, leadership: Leadership | None = None,
                 round_trip_us: int = DEFAULT_CLIENT_ROUND_TRIP_US) -> None:
        self.p = policy
        # SPEC §3.7 K-6, K-7: the client's side of each acknowledgement, applied when the partition finishes
        self.client = ClientPipeline(policy, partition, tuple(replicas), duration_us, leadership, round_trip_us)
        self.partition = partition
        self.order = tuple(replicas)
        self.ix = {b: i for i, b in enumerate(self.order)}
        self.duration_us = duration_us
        self.window_us = window_us
        self.min_isr = policy.effective_min_isr
        self.session_us = policy.session_timeout_ms * MS
        self.acks = policy.acks
        n = len(self.order)
        self.up = np.ones(n, dtype=bool)
        self.iso = np.zeros(n, dtype=bool)
        self.unclean = np.zeros(n, dtype=bool)
        self.log_len = np.zeros(n, dtype=np.int64)
        self.fetched = np.zeros(n, dtype=np.int64)
        self.lcu = np.zeros(n, dtype=np.int64)
        self.unreach = np.full(n, -1, dtype=np.int64)
        self.iso_since = np.full(n, -1, dtype=np.int64)
        self.must_register = np.zeros(n, dtype=bool)
        self.flushed_all = np.zeros(n, dtype=np.int64)
        self.runs: list[list[list[int]]] = [[] for _ in range(n)]
        # per replica, writes not yet surely on disk: (durable_at_us, length) buckets (`steady.wrote`)
        self.durable_at_us = np.zeros((n, steady.DUR_CAP), dtype=np.int64)
        self.durable_len = np.zeros((n, steady.DUR_CAP), dtype=np.int64)
        self.durable_n = np.zeros(n, dtype=np.int64)
        if policy.flush is FlushMode.SYNC:
            self.flush = Flush(int(FlushCode.SYNC), period_us=1, expire_us=0)
        elif policy.flush_interval_ms is None:
            self.flush = Flush(int(FlushCode.OS), OS_WRITEBACK_PERIOD_MS * MS, OS_WRITEBACK_EXPIRE_MS * MS)
        else:
            self.flush = Flush(int(FlushCode.INTERVAL), policy.flush_interval_ms * MS, expire_us=0)
        self.epochs: dict[int, tuple[int, Grow, Grow]] = {0: (0, Grow(), Grow())}  # epoch -> (start, app, size)
        # Rule 2: the first replica leads; the ISR starts as all replicas.
        self.leader = self.order[0]
        self.epoch = 0
        self.isr: list[int] = list(self.order)
        self.elr: list[int] = []
        self.hw = 0
        self.epoch_start = 0  # the leader's log end when its epoch began (SPEC §3.7 K-5)
        self.iso_view: tuple[int, ...] | None = None
        self.down_pub: tuple[int, int] | None = None
        self.lead_app = Grow()
        self.lead_cum = Grow(np.zeros(1, dtype=np.int64))
        self.target = self.order[0]
        self.unaware = False  # the leader was elected while isolated and has not learned it yet (SPEC §3.7 K-3)
        self.last_leader = self.order[0]  # the last broker elected (SPEC §3.7 K-4)
        self.zombie: dict | None = None
        self.heap: list[tuple[int, int, str, int]] = []
        self._new_scratch()
        self.handlers = {"fence": self._on_fence, "switch": self._on_switch, "refresh": self._on_refresh}
        self.seq = 0
        # Rule 6: ISR check ticks from time 0, kept apart from the heap: the compiled loop passes the idle ones
        self.tick_key = key(0, C_TICK)
        self.tick_period_us = policy.replica_lag_time_max_ms * MS // ISR_CHECKS_PER_LAG_TIME
        self.pend = Table(PENDING_COLS)
        self.extra = Table(EXTRA_COLS)  # earlier appends of retried messages
        self.sched_key = np.zeros(0, dtype=np.int64)  # scheduled NotEnoughReplicas retries
        self.sched_row = np.zeros(0, dtype=np.int64)
        self.room = 0  # messages the current chunk may append (`advance`)
        self.recs = record_table(PAYLOAD)  # settled messages, handed over from `pend` (`_compact`)
        self.replication_bytes = 0
        # per-instant bookkeeping
        self.cur_t = 0
        self.timeline = Timeline(self.window_us)  # timeline rows and unavailability (SPEC §4.2-4.3)
        self.finished = False

    # =========================================================================================== API
    def _new_scratch(self) -> None:
        """`steady`'s output buffers and its offset -> pending row map: kept across stretches (fresh large arrays
        cost a page fault per 4 KiB), not part of the replay's state."""
        self.scratch = tuple(np.empty((0, w), dtype=np.int64) for w in steady.OUTPUT_WIDTHS)
        self.orow = Grow()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["scratch"], state["orow"]  # stream snapshots stay small
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._new_scratch()

    def advance(self, events: PartitionEvents, until_us: int) -> None:
        """Apply every event of the chunk (all with ts_us < until_us) and every derived event before until_us."""
        ev = events
        self.client.observe(ev)
        rep_ix = member_index(ev.broker_id, np.array(self.order, dtype=np.int64))  # each broker event's replica
        ctrl = (ev.broker_kind < C_REPLICATE) & (rep_ix >= 0)
        c_key = key(ev.broker_ts[ctrl], ev.broker_kind[ctrl].astype(np.int64))
        c_kind, c_b = ev.broker_kind[ctrl], ev.broker_id[ctrl]
        none = np.full(len(ev.produce_ts), -1, dtype=np.int64)
        payload = [np.asarray((ev.payload or {}).get(name, none), dtype=np.int64) for name in PAYLOAD]
        self.s_key, self.s_src = merge_stream(ev.broker_ts, ev.broker_kind, rep_ix, ev.produce_ts)
        # the columns the merged stream points into (`merge_stream`): the chunk's reports and produce events
        self.s_reports = (rep_ix, ev.broker_upto)
        self.s_produce = (ev.produce_msg, ev.produce_size, *payload)
        self.s_pos = 0
        # room for every message this chunk may settle and append: the records and the logs grow once, not by
        # doubling copies (a copy and fresh pages each time)
        self.room = room = self.pend.n + len(ev.produce_ts)
        reserve_rows(self.recs, room)
        for log in (self.lead_app, self.lead_cum, *self.epochs.get(self.epoch, (0,))[1:]):
            reserve(log, room)
        until_key = key(until_us, 0)
        ci = 0
        while True:
            ck = int(c_key[ci]) if ci < len(c_key) else INF
            dk = self.heap[0][0] if self.heap else INF
            limit = min(ck, dk, until_key)
            self._stream(limit)  # stops early at an ISR check tick that is not idle
            k = min(limit, self.tick_key)
            if k == until_key:
                break
            t = k // CODES_PER_INSTANT
            self._resolve_deadlines(t)
            self._clock(t)
            if k == ck:
                self._trace_control(t, Kind(int(c_kind[ci])), int(c_b[ci]))
                ci += 1
            elif k == self.tick_key:
                self._on_tick(t)
            else:
                _, _, what, arg = heapq.heappop(self.heap)
                self.handlers[what](t, arg)
            self._reschedule_pool(t)

    def finish(self) -> PartitionResult:
        """End of trace: settle every message and judge fates (SPEC §4.1)."""
        self.finished = True
        if self.heap or self.tick_key < INF or self.s_pos < len(getattr(self, "s_key", ())) - 1:
            self.advance(PartitionEvents.empty(), self.duration_us + 1)
        self._resolve_deadlines(self.duration_us + 1)
        self._clock(INF)  # close the last instant
        rows = self.timeline.finish(self.duration_us)
        view = self._final_view()
        records = all_records(self.pend, self.recs, PAYLOAD, int(ACKED), int(FAILED)).sorted_by_msg_id()
        if self.extra.n:
            m, e, o = self.extra["msg_id"], self.extra["epoch"], self.extra["offset"]
            order = np.lexsort((o, e, m))
            records.extra_positions = np.stack([m[order], e[order], o[order]], axis=1)
        records = self.client.apply(records, rows, plan_requests_compiled, shift_acks_compiled)
        result = PartitionResult(self.partition, judge(records, view), rows,
                                 merge_intervals(self.timeline.unavail), self.replication_bytes)
        result.view = view  # type: ignore[attr-defined]
        return result

    # ======================================================================================= helpers
    def _push(self, t: int, code: int, what: str, arg: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (key(t, code), self.seq, what, arg))

    def _in_order(self, brokers) -> list[int]:
        s = set(brokers)
        return [b for b in self.order if b in s]

    def _eligible(self, b: int) -> bool:
        i = self.ix[b]
        return bool(self.up[i] and not self.iso[i])

    def _can_be_zombie(self, b: int) -> bool:
        """Up, isolated and still the incarnation that led (SPEC §3.2 rule 10); as `Replica.can_be_zombie`."""
        i = self.ix[b]
        return bool(self.up[i] and self.iso[i] and not self.must_register[i])

    def _view(self) -> tuple[int, ...]:
        return self.iso_view if self.iso_view is not None else tuple(self.isr)

    def _frozen(self, size: int) -> bool:
        """strict_min_isr, against the effective min ISR (SPEC §3.7 K-1, as `KafkaReference._frozen`)."""
        return self.p.strict_min_isr and size < self.min_isr

    def _is_zombie_target(self) -> bool:
        return self.zombie is not None and self.target == self.zombie["broker"]

    def _serving(self) -> int:
        t = self.target
        if t < 0 or not self.up[self.ix[t]] or self.must_register[self.ix[t]]:
            return -1  # a restarted broker serves nothing until its new incarnation registers
        if t == self.leader and self.unaware:
            return -1  # NOT_LEADER_OR_FOLLOWER until it learns of its election (SPEC §3.7 K-3)
        if t == self.leader or self._is_zombie_target():
            return t
        return -1

    def _serving_hw(self) -> int:
        return self.zombie["hw"] if self._is_zombie_target() else self.hw

    def _serving_view_size(self) -> int:
        return len(self.zombie["view"]) if self._is_zombie_target() else len(self._view())

    def _serving_epoch(self) -> int:
        return self.zombie["epoch"] if self._is_zombie_target() else self.epoch

    def _refusing(self) -> bool:
        return self.acks is Acks.ALL and self._serving_view_size() < self.min_isr

    def _app_at(self, b: int, offset: int) -> int:
        """Append time of the entry at `offset` of broker b's log."""
        return append_time_at(self.runs[self.ix[b]], self.epochs, offset)

    # -------------------------------------------------------------------------------- durability
    def _wrote(self, i: int, t: int, length: int) -> None:
        """Replica i's log reached `length` at t (kept for a power loss, SPEC §3.1)."""
        steady.wrote(i, t, length, self.durability, self.flush)

    @property
    def durability(self) -> Durability:
        """The replicas' durability state as the compiled code reads it (`steady.Durability`)."""
        return Durability(self.flushed_all, self.durable_at_us, self.durable_len, self.durable_n)

    def _truncate(self, i: int, length: int) -> None:
        length = min(length, int(self.log_len[i]))
        self.log_len[i] = length
        self.runs[i] = prefix_runs(self.runs[i], length)
        self.flushed_all[i] = min(self.flushed_all[i], length)
        self.fetched[i] = min(self.fetched[i], length)
        np.minimum(self.durable_len[i], length, out=self.durable_len[i])

    # ---------------------------------------------------------------------------------- end of trace
    def _final_view(self) -> FinalView:
        srv = self._serving()
        if srv < 0:
            end_runs, end_hw, end_up = np.zeros((0, 3), dtype=np.int64), 0, False
        else:
            end_runs, end_hw, end_up = runs_array(self.runs[self.ix[srv]]), self._serving_hw(), True
        # SPEC §4.1: every down broker restarts and every isolation heals, then the rules run to the end.
        saved = (self.heap, self.pend, self.extra, self.cur_t)
        self.heap, self.pend = [], Table(PENDING_COLS)
        t = self.duration_us
        for b in sorted(self.order):
            if not self.up[self.ix[b]]:
                self._restart(t, b)
        for b in sorted(self.order):
            if self.iso[self.ix[b]]:
                self._heal(t, b)
        if self.leader >= 0:
            for i in range(len(self.order)):
                self._truncate_to_leader(i)
        final_runs = None if self.leader < 0 else runs_array(self.runs[self.ix[self.leader]])
        self.heap, self.pend, self.extra, self.cur_t = saved
        return FinalView(final_runs, end_runs, end_hw, end_up)


def replay_partition(policy: KafkaPolicy, partition: int, replicas: tuple[int, ...], events: PartitionEvents,
                     duration_us: int, leadership: Leadership | None = None,
                     round_trip_us: int = DEFAULT_CLIENT_ROUND_TRIP_US) -> PartitionResult:
    """Kernel replay of one partition in one pass."""
    replay = KafkaPartitionReplay(policy, partition, replicas, duration_us, leadership=leadership,
                                  round_trip_us=round_trip_us)
    replay.advance(events, duration_us + 1)
    return replay.finish()
