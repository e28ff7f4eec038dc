"""The RocketMQ kernels' pending messages: rows, answers (R1), visibility, compaction into records."""

from __future__ import annotations

import numpy as np

from replay.events import PartitionEvents
from replay.results import MessageRecords, runs_contain
from replay.rocketmq.control import (
    C_ARRIVE,
    INF,
    key_of,
)
from replay.rocketmq.kernels.common import (
    ACKED,
    FAILED,
    NEW,
    NONE,
    WAITING,
    set_state,
)
from replay.shared.kernels.arrays import runs_array
from replay.shared.kernels.records import hand_over_settled, settled_mask
from schemas.outcomes import NULL_US, Error, Status
from schemas.units import MS

_ACKED, _FAILED = int(ACKED), int(FAILED)
COMPACT_MIN = 4096  # pending rows below which a compaction is not worth its scan
#: Payload `delay` of a copy's pending row (C3: an attempt appended and retried, whose entry stays): its position
#: joins its message's at the end (`fold_copies`), its answer is not the send's.
COPY_ROW = -1


def fold_copies(rec: MessageRecords) -> MessageRecords:
    """The records (in msg_id order) with each copy's row folded into its message's (C3), as the reference holds a
    message's appends: the latest (epoch, offset) is the position, the earlier ones are extra positions in append
    order, and the message is visible from its first visible copy. Status, error and ack are the send's."""
    delay = (rec.payload or {}).get("delay")
    if delay is None or not (delay == COPY_ROW).any():
        return rec
    is_copy = delay == COPY_ROW
    main = np.flatnonzero(~is_copy)
    names = ("msg_id", "produce_us", "status", "error", "ack_us", "visible_us", "pos_epoch", "pos_offset")
    out = MessageRecords(*(getattr(rec, n)[main].copy() for n in names))
    out.payload = {k: v[main] for k, v in rec.payload.items()}
    positions: dict[int, list[tuple[int, int]]] = {}
    for m, e, o, v in zip(rec.msg_id[is_copy].tolist(), rec.pos_epoch[is_copy].tolist(),
                          rec.pos_offset[is_copy].tolist(), rec.visible_us[is_copy].tolist(), strict=True):
        if e < 0:
            continue  # refused (routing keeps this from happening): no entry
        positions.setdefault(m, []).append((e, o))
        i = int(np.searchsorted(out.msg_id, m))
        if v != NULL_US and (out.visible_us[i] == NULL_US or v < out.visible_us[i]):
            out.visible_us[i] = v
    extra = [tuple(x) for x in rec.extra_positions.tolist()]
    for m, pos in positions.items():
        i = int(np.searchsorted(out.msg_id, m))
        if out.pos_epoch[i] >= 0:
            pos.append((int(out.pos_epoch[i]), int(out.pos_offset[i])))
        pos.sort()  # DLedger epochs grow and offsets grow within one: append order
        out.pos_epoch[i], out.pos_offset[i] = pos[-1]
        extra.extend((m, e, o) for e, o in pos[:-1])
    extra.sort()
    out.extra_positions = np.array(extra, dtype=np.int64).reshape(-1, 3)
    return out


class GroupMessages:
    """Part of `group.GroupReplay`: the pending messages (R1) and their records."""

    # ================================================================================= messages
    def _add_payload_keys(self, payload: dict) -> None:
        """Columns carried to the outputs untouched; a key first seen in a later chunk is NONE before it."""
        new = sorted(set(payload) - set(self.payload_keys or ()))
        if self.payload_keys is not None and not new:
            return
        self.payload_keys = tuple(self.payload_keys or ()) + tuple(new)
        for k in new:
            for table in (self.pend, self.recs):
                table.dtypes[k] = np.int64
                table.cols[k] = np.full(len(table.cols["msg_id"]), NONE, dtype=np.int64)

    def _new_rows(self, msg, prod, size, arrive, payload: dict, state) -> np.ndarray:
        # scalars broadcast into the table's columns (no per-column temporaries)
        cols = dict(msg_id=msg, produce_us=prod, size=size, arrive_us=arrive,
                    deadline_us=prod + self.p.delivery_timeout_ms * MS, state=state, error=0, epoch=NONE, offset=NONE,
                    ack_us=NULL_US, visible_us=NULL_US, taker_broker=NONE, taker_incarnation=0, taker_epoch=NONE)
        for name in self.payload_keys or ():
            cols[name] = payload[name]
        return self.pend.append(**cols)

    def _settle_unrouted(self, ev: PartitionEvents, payload: dict, sel: np.ndarray) -> None:
        """SPEC §3.3 rule 3: no group took it: failed `no_route`, never appended."""
        # scalars broadcast into the table's columns
        self.recs.append(msg_id=ev.produce_msg[sel], produce_us=ev.produce_ts[sel], status=Status.FAILED,
                         error=Error.NO_ROUTE, ack_us=NULL_US, visible_us=NULL_US, epoch=NONE, offset=NONE,
                         **{name: payload[name][sel] for name in self.payload_keys or ()})

    def _schedule_arrivals(self, ev: PartitionEvents, payload: dict, sel: np.ndarray, delay: np.ndarray) -> None:
        ts = ev.produce_ts[sel]
        rows = self._new_rows(ev.produce_msg[sel], ts, ev.produce_size[sel], ts + delay[sel],
                              {k: v[sel] for k, v in payload.items()}, NEW)
        keys = np.concatenate([self.sched_key, key_of(ts + delay[sel], C_ARRIVE)])
        all_rows = np.concatenate([self.sched_row, rows])
        order = np.lexsort((self.pend["msg_id"][all_rows], keys))  # same instant: msg_id order
        self.sched_key, self.sched_row = keys[order], all_rows[order]

    def _schedule_copies(self, ev: PartitionEvents, payload: dict, copies: np.ndarray) -> None:
        """C3: the attempts appended here k × max_wait_ack_ms after the produce (k ≥ 1) and then retried arrive as
        rows of their own (`COPY_ROW`); k = 0 streams as the produce event itself (`advance`)."""
        marked = {**payload, "delay": np.full(len(copies), COPY_ROW, dtype=np.int64)}
        wait = self.p.max_wait_ack_ms * MS
        for k in range(1, int(copies.max(initial=0)).bit_length()):
            sel = ((copies >> k) & 1) == 1
            if sel.any():
                self._schedule_arrivals(ev, marked, sel, np.full(len(copies), k * wait, dtype=np.int64))

    def _limit(self, rows: np.ndarray) -> np.ndarray:
        """Last instant at which an ack still counts (R1): the broker's status or the client's deadline."""
        return np.minimum(self.pend["arrive_us"][rows] + self._answer_ms() * MS, self.pend["deadline_us"][rows])

    def _ack_rows(self, rows: np.ndarray, when: np.ndarray) -> None:
        ok = when <= self._limit(rows)
        set_state(self.pend.cols["state"], rows[ok], ACKED)
        self.pend.cols["ack_us"][rows[ok]] = when[ok]

    def _waiting_of(self, b: int, epoch: int) -> np.ndarray:
        """Rows waiting for an answer from broker b's current incarnation in `epoch`."""
        n = self.pend.n
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero((self.pend["state"] == WAITING) & (self.pend["taker_broker"] == b)
                              & (self.pend["taker_epoch"] == epoch)
                              & (self.pend["taker_incarnation"] == self.incarnation[self.ix[b]]))

    def _ack_upto(self, t: int, b: int, epoch: int, upto: int) -> None:
        rows = self._waiting_of(b, epoch)
        if len(rows):
            rows = rows[(self.pend["offset"][rows] < upto) & self._held(b, rows)]
            self._ack_rows(rows, np.full(len(rows), t, dtype=np.int64))

    def _held(self, b: int, rows: np.ndarray) -> np.ndarray:
        return runs_contain(runs_array(self.runs[self.ix[b]]), self.pend["epoch"][rows], self.pend["offset"][rows])

    def _mark_visible(self, t: int, b: int, lo: int, hi: int) -> None:
        if self.pend.n == 0 or hi <= lo:
            return
        offset, epoch = self.pend["offset"], self.pend["epoch"]
        vis = self.pend.cols["visible_us"]
        rows = np.flatnonzero((offset >= lo) & (offset < hi) & (vis[: self.pend.n] == NULL_US) & (epoch >= 0))
        if len(rows):
            rows = rows[self._held(b, rows)]
            vis[rows] = t

    def _resolve(self, t: int) -> None:
        """R1, lazily: waiting messages whose broker status or client deadline came before t fail."""
        n = self.pend.n
        if n == 0:
            return
        st = self.pend.cols["state"]
        rows = np.flatnonzero(st[:n] == WAITING)
        if not len(rows):
            return
        answer_at = self.pend["arrive_us"][rows] + self._answer_ms() * MS
        deadline_us = self.pend["deadline_us"][rows]
        tb, tinc = self.pend["taker_broker"][rows], self.pend["taker_incarnation"][rows]
        end = np.full(len(rows), INF, dtype=np.int64)
        for i, b in enumerate(self.order):
            sel = tb == b
            if sel.any() and self.inc_end[i]:
                ends = np.array(self.inc_end[i], dtype=np.int64)
                inc = tinc[sel]
                end[sel] = np.where(inc < len(ends), ends[np.minimum(inc, len(ends) - 1)], INF)
        answered = (answer_at <= deadline_us) & (end > answer_at)  # its incarnation still up at that instant
        fail_answer = answered & (answer_at < t)
        fail_dead = ~answered & (deadline_us < t)
        err = self.pend.cols["error"]
        set_state(st, rows[fail_answer], FAILED)
        err[rows[fail_answer]] = self.answer_error
        set_state(st, rows[fail_dead], FAILED)
        err[rows[fail_dead]] = Error.DELIVERY_TIMEOUT
        if fail_answer.any() or fail_dead.any():
            self._compact()

    def _compact(self) -> None:
        """Hand settled messages to the records: answered, and visible or held by no broker."""
        n = self.pend.n
        if n < COMPACT_MIN:
            return
        settled, count = settled_mask(self.pend, self.runs, None, _ACKED, _FAILED)
        if count < n // 2:  # a hand-over moves every kept row: worth it once half are settled
            return
        remap = hand_over_settled(self.pend, self.recs, settled, self.payload_keys or (), _ACKED, _FAILED)
        if len(self.sched_row):
            self.sched_row = remap[self.sched_row]
