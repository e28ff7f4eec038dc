"""The `kafka` reference interpreter's clients: failover, metadata refresh, produce, retries, acknowledgements and
deadlines (SPEC §3.1, §3.2 rules 3-4, 8, 10; §3.7 K-2)."""

from __future__ import annotations

from replay.kafka.reference.state import CLIENT, DEADLINE, RETRY, Entry, Msg, MsgState
from replay.policies import Acks
from schemas.outcomes import Error, Status
from schemas.units import MS


class KafkaReferenceClients:
    """Part of `replay.kafka.reference.interpreter.KafkaReference`, which holds the state these methods use."""

    # --------------------------------------------------------------------------------- clients (§3.1)
    def _schedule_switch(self, t: int) -> None:
        self._push(t + self.p.client_failover_ms * MS, CLIENT, "switch", 0)

    def _schedule_refresh(self, t: int) -> None:
        """Clients writing to an isolated leader refresh metadata every metadata_max_age_ms (rule 10)."""
        self._push(t + self.p.metadata_max_age_ms * MS, CLIENT, "refresh", t)

    def _on_refresh(self, t: int, since: int) -> None:
        tgt = self.target
        if tgt is None or not self.rep[tgt].isolated or self.rep[tgt].isolated_since > since:
            return  # clients moved on, or the broker healed (and maybe was isolated again) meanwhile
        if self.leader != tgt:
            self._schedule_switch(t)
        else:
            self._schedule_refresh(t)

    def _on_switch(self, t: int, _: int) -> None:
        """Clients reach the current leader; unacknowledged messages within their deadline are retried (rule 8)."""
        if self.virtual:
            return
        self.target = self.leader
        self.zombie = None
        unsettled = (MsgState.WAITING, MsgState.REFUSED, MsgState.APPENDED)
        pending = sorted(m for m, msg in self.msgs.items() if msg.state in unsettled and t <= msg.deadline_us)
        held = self._held_positions()
        for m in pending:
            msg = self.msgs[m]
            if any(p in held for p in msg.positions):
                self._set_state(msg, MsgState.APPENDED)  # idempotent retry of a copy the leader holds
                msg.request_us = t
            else:
                self._attempt(t, msg)
        self._ack_committed(t)

    def _held_positions(self) -> set[tuple[int, int]]:
        if self._serving() is None:
            return set()
        return {(e.epoch, o) for o, e in enumerate(self.rep[self.target].log) if e.msg_id in self.msgs}

    # --------------------------------------------------------------------------- produce (rules 3-4)
    def _produce(self, t: int, msg_id: int, size: int) -> None:
        msg = Msg(msg_id, t, size, t + self.p.delivery_timeout_ms * MS)
        self.msgs[msg_id] = msg
        if self.p.acks is Acks.ZERO:
            # acks=0: the client counts the message as sent when it leaves; no retries (rule 4).
            msg.status, msg.ack_us = Status.ACKED, t
            self._set_state(msg, MsgState.ACKED)
            if self._serving() is not None:
                self._append(t, msg)
            return
        self._push(msg.deadline_us, DEADLINE, "deadline", msg_id)
        self._attempt(t, msg)

    def _attempt(self, t: int, msg: Msg) -> None:
        msg.retry_at = None
        if self._serving() is None:
            self._set_state(msg, MsgState.WAITING)  # retried when clients reach a leader
            return
        if self.p.acks is Acks.ALL and self._serving_view_size() < self.min_isr:
            self._set_state(msg, MsgState.REFUSED)  # NotEnoughReplicas before append (rule 3), retriable
            msg.refusals += 1
            retry = t + self._retry_backoff_us(msg.refusals)
            if retry <= msg.deadline_us:
                msg.retry_at = retry
                self._push(retry, RETRY, "retry", msg.msg_id)
            return
        self._append(t, msg)

    def _retry_backoff_us(self, n: int) -> int:
        """The wait before the n-th retry of a refused message (SPEC §3.7 K-2, KIP-580: `CommonClientConfigs`
        retry.backoff.max.ms, `RecordAccumulator`): min(retry_backoff_max_ms, retry_backoff_ms × 2^(n−1)), without
        the 20 % jitter (deterministic replay). n counts the message's refusals over its whole life, as the
        producer's batch attempt count never resets."""
        return min(self.p.retry_backoff_max_ms, self.p.retry_backoff_ms * 2 ** (n - 1)) * MS

    def _on_retry(self, t: int, msg_id: int) -> None:
        msg = self.msgs[msg_id]
        if msg.state == MsgState.REFUSED and msg.retry_at == t:
            self._attempt(t, msg)

    def _append(self, t: int, msg: Msg) -> None:
        tgt = self.target
        r = self.rep[tgt]
        offset = len(r.log)
        epoch = self._serving_epoch()
        r.log.append(Entry(epoch, msg.msg_id, t, msg.size))
        r.written_us.append(t)
        msg.positions.append((epoch, offset))
        if msg.status is not Status.ACKED:  # acks=0 messages are already acked
            self._set_state(msg, MsgState.APPENDED)
            msg.request_us = t
            if self.p.acks is Acks.ONE:
                self._ack(t, msg)
        if self.zombie is not None and tgt == self.zombie.broker:
            self._zombie_hw(t)
        else:
            self._recompute_hw(t)

    def _ack(self, t: int, msg: Msg) -> None:
        msg.status, msg.ack_us = Status.ACKED, t
        self._set_state(msg, MsgState.ACKED)

    def _ack_committed(self, t: int) -> None:
        """Acknowledge requests held by the serving broker: acks=1 at once, acks=all below its HW (rule 4)."""
        srv = self._serving()
        if srv is None or self.p.acks is Acks.ZERO:
            return
        hw = self._serving_hw()
        log = self.rep[srv].log
        for msg_id in sorted(self.unacked):
            msg = self.msgs[msg_id]
            if msg.request_us is None or msg.request_us > t or t > msg.deadline_us:
                continue
            for epoch, offset in msg.positions:
                if offset < len(log) and (log[offset].epoch, log[offset].msg_id) == (epoch, msg_id):
                    if self.p.acks is Acks.ONE or offset < hw:
                        self._ack(t, msg)
                    break

    def _on_deadline(self, t: int, msg_id: int) -> None:
        msg = self.msgs[msg_id]
        if msg.state == MsgState.ACKED:
            return
        if msg.state == MsgState.APPENDED:
            msg.error = Error.REQUEST_TIMEOUT
        elif self._serving() is not None and self.p.acks is Acks.ALL and self._serving_view_size() < self.min_isr:
            msg.error = Error.NOT_ENOUGH_REPLICAS
        else:
            msg.error = Error.NO_LEADER
        msg.status = Status.FAILED
        self._set_state(msg, MsgState.FAILED)
