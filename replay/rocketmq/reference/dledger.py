"""The `dledger` family's reference (SPEC §3.4): Raft groups, majority commit, heartbeat-leak detection,
deterministic vote delay (C6)."""

from __future__ import annotations

from collections.abc import Callable

from replay.policies import DLedgerPolicy
from replay.results import StateRow
from replay.rocketmq.control import C_DETECT, C_ELECT, C_POLL, RouteClock, majority
from replay.rocketmq.reference.group import GroupReference
from replay.rocketmq.reference.state import Entry, Msg, common_prefix, last_epoch
from replay.shared.reference.records import epoch_runs
from schemas.outcomes import Error
from schemas.trace import Kind
from schemas.units import MS


class DLedgerReference(GroupReference):
    """SPEC §3.4: Raft groups, majority commit, heartbeat-leak detection, deterministic vote delay."""

    answer_error = Error.IN_SYNC_REPLICAS_NOT_ENOUGH

    def __init__(self, policy: DLedgerPolicy, unit: int, members: tuple[int, ...], duration_us: int,
                 clock: RouteClock | None = None) -> None:
        super().__init__(policy, unit, members, duration_us, clock)
        self.q = majority(len(members))
        self.detect_us = policy.heartbeat_ms * policy.max_heartbeat_leak * MS
        self.vote_us = policy.vote_delay_ms * MS
        self.wait_us = policy.vote_wait_ms * MS
        self.hb_us = policy.heartbeat_ms * MS
        self.elected_at: int | None = None  # the initial leader leads from before the trace
        self.leader: int | None = members[0]
        self.target: int | None = members[0]  # the leader clients know from their last route poll
        self.commit = 0
        self.silent_since: int | None = None
        self.stepdown_at: int | None = None
        self.elect_at: int | None = None
        self.await_majority = False

    def _leader_for_fetch(self) -> int | None:
        return self.leader

    def _writable(self) -> bool:
        """Rule 1 with SPEC §3.7 R-1: a group takes writes while the broker its clients know from their last route
        poll (`MQClientInstance` pollNameServerInterval, `DefaultMQProducerImpl.tryToFindTopicPublishInfo`) is
        still its leader and is up. SPEC §3.7 R-4 (`DLedgerServer.handleAppend` checks only leadership and a full
        pending queue): an isolated leader still appends until it steps down; its entries cannot commit, fail
        with IN_SYNC_REPLICAS_NOT_ENOUGH after max_wait_ack_ms (R1) and survive if its log wins a later vote."""
        ldr = self.leader
        return ldr is not None and self.target == ldr and self.rep[ldr].up

    def _can_commit(self) -> bool:
        # the leader reaches a majority, itself included; a one-member group is its own majority, so its
        # leader commits while isolated too (isolation only cuts it from other brokers)
        ldr = self.leader
        return ldr is not None and self.rep[ldr].up and self._reach() >= self.q

    def _arrive(self, t: int, msg: Msg) -> None:
        if not self._writable():
            self._fail(msg, Error.NO_LEADER)  # R2 (routing keeps this from happening)
            return
        self._append(t, self.leader, self.epoch, msg, self.p.max_wait_ack_ms)
        self._recommit(t)

    def _copy(self, t: int, msg: Msg) -> None:
        """SPEC §3.4 rule 2 (C3, `DLedgerServer.handleAppend`): the leader appended the attempt before it failed
        with IN_SYNC_REPLICAS_NOT_ENOUGH and the producer retried the send; the entry stays in the log, commits or
        is truncated like any other, and is one more position of the message (its fate counts every copy)."""
        if not self._writable():
            return  # routing keeps this from happening
        r = self.rep[self.leader]
        msg.positions.append((self.epoch, len(r.log)))
        self._write(r, [Entry(self.epoch, msg.msg_id, t, msg.size)], t)
        self._recommit(t)

    def _progress(self, t: int, b: int) -> None:
        self._recommit(t)

    def _recommit(self, t: int) -> None:
        """Rule 2: an entry commits when a majority holds it (leader included); the ack comes at commit."""
        ldr = self.leader
        if ldr is None or not self.rep[ldr].up or (self.rep[ldr].isolated and self.q > 1):
            return  # an isolated leader commits only as a one-member group, its own majority
        ends = sorted((len(self.rep[b].log) if b == ldr else self.rep[b].fetched for b in self.order), reverse=True)
        cand = ends[self.q - 1]
        if cand > self.commit:
            self._mark_visible(t, self.rep[ldr], self.commit, cand)  # rule 4: consumers see committed entries
            self.commit = cand
        if not self.virtual:
            self._ack_upto(t, ldr, self.epoch, self.commit)

    # ----- control (rule 3, C6)
    def _heard_last(self, t: int) -> int:
        """SPEC §3.7 R-3 (`DLedgerLeaderElector`: followers notice leader loss when
        elapsed(lastLeaderHeartBeatTime) > maxHeartBeatLeak × heartBeatTimeIntervalMs): the leader heartbeats at
        every multiple of heartbeat_ms from 0 and none at the instant it fails, so the last heartbeat before a
        failure at t is the greatest multiple strictly before t; a leader elected later than that heartbeats at its
        election (maintainAsLeader with lastSendHeartBeatTime = -1)."""
        last = (t - 1) // self.hb_us * self.hb_us
        return last if self.elected_at is None else max(last, self.elected_at)

    def _election_after_loss(self, heard: int) -> int:
        """SPEC §3.7 R-7 (`DLedgerLeaderElector.maintainAsCandidate`): a follower that noticed the loss (R-3) votes
        first in the lost leader's term, where every member has voted (`handleVote`: REJECT_ALREADY_VOTED), so the
        vote fails; it waits for every answer or voteLatch.await(2000 + random(maxVoteIntervalMs)), and the lost
        leader never answers (RocketMQ's `NettyRemotingClient.invokeAsync` reports a failed connection only to
        `InvokeCallback.operationFail`, which DLedger's callback leaves empty): vote_wait_ms. The vote in the next
        term, vote_delay_ms later, elects."""
        return heard + self.detect_us + self.wait_us + self.vote_us

    def _reach(self) -> int:
        return 1 if self.rep[self.leader].isolated else len(self._alive_members())

    def _quorum_check(self, t: int) -> None:
        if self.leader is None or not self.rep[self.leader].up:
            return
        if self._reach() < self.q:
            if self.stepdown_at is None:
                self.stepdown_at = self._heard_last(t) + self.detect_us  # from its last good round
                self._push(self.stepdown_at, C_DETECT, "stepdown")
        else:
            self.stepdown_at = None

    def _schedule_election(self, at: int) -> None:
        self.elect_at = at
        self._push(at, C_ELECT, "elect")

    def _lose_leader(self, t: int) -> None:
        self.leader = None
        self.silent_since = None
        self.stepdown_at = None
        self._push(self._next_poll(t), C_POLL, "poll")  # the next poll finds no master

    def _handlers(self) -> dict[str, Callable[[int, int], None]]:
        return {**super()._handlers(), "poll": self._on_poll, "refetch": self._on_poll, "stepdown": self._on_stepdown,
                "elect": self._on_elect}

    def _on_poll(self, t: int, _: int) -> None:
        """SPEC §3.7 R-1: at every route poll clients learn the group's leader of that moment (none if none)."""
        self.target = self.leader

    def _stop(self, t: int, b: int, kind: Kind) -> None:
        was_iso = self.rep[b].isolated
        self._lose_data(t, self.rep[b], kind)
        if b == self.leader:
            silent = self.silent_since if was_iso and self.silent_since is not None else t
            heard = self._heard_last(silent)
            self._lose_leader(t)
            # noticed, then a vote (a lone member's isolated leader may die after that delay: vote now)
            self._schedule_election(max(self._election_after_loss(heard), t))
        elif self.leader is not None:
            self._quorum_check(t)

    def _isolate(self, t: int, b: int) -> None:
        if b == self.leader:
            self.silent_since = t
            self._quorum_check(t)  # an isolated leader reaches no majority: it steps down detect_us later
            self._schedule_election(self._election_after_loss(self._heard_last(t)))
        elif self.leader is not None:
            self._quorum_check(t)

    def _heal(self, t: int, b: int) -> None:
        if b == self.leader:
            self.silent_since = None
            self.elect_at = None  # healed before anyone noticed
        self._member_back(t, b)

    def _restart(self, t: int, b: int) -> None:
        self._member_back(t, b)

    def _member_back(self, t: int, b: int) -> None:
        if self.leader is not None:
            self._quorum_check(t)
        elif self.await_majority and len(self._alive_members()) >= self.q:
            self.await_majority = False
            self._schedule_election(t + self.vote_us)

    def _on_stepdown(self, t: int, _: int) -> None:
        if self.stepdown_at != t or self.leader is None:
            return
        isolated = self.rep[self.leader].isolated
        self._lose_leader(t)
        if not isolated:
            self.await_majority = True  # no majority: the group takes no writes until one returns

    def _on_elect(self, t: int, _: int) -> None:
        if self.elect_at != t or self.leader is not None:
            return
        self.elect_at = None
        voters = self._alive_members()
        if len(voters) < self.q:
            self.await_majority = True
            return
        self._elect(t, voters)
        if self.leader != self.target:
            self._push(self._next_poll(t), C_POLL, "poll")  # a re-elected known leader needs no poll
        self._quorum_check(t)

    def _elect(self, t: int, voters: list[int]) -> None:
        """Rule 3 with C1: the first voter leads with the longest voter log (Raft order: last epoch, length)."""
        best = max(voters, key=lambda b: (last_epoch(self.rep[b].log), len(self.rep[b].log), -self.order.index(b)))
        new = voters[0]
        self._adopt(t, self.rep[new], self.rep[best])
        self.leader = new
        self.elected_at = t
        self.epoch += 1
        lead = self.rep[new].log
        for b in self.order:  # others truncate to the common prefix with the new leader
            r = self.rep[b]
            if b != new:
                self._truncate(r, common_prefix(r.log, lead))
            r.fetched = len(r.log) if r.alive else 0  # R4
        ends = sorted((len(lead) if b == new else self.rep[b].fetched for b in self.order), reverse=True)
        self.commit = ends[self.q - 1]
        self._mark_visible(t, self.rep[new], 0, self.commit)

    # ----- records
    def _state_row(self, t: int) -> StateRow:
        return self._row(t, self.leader, tuple(self._alive_members()), self.commit)

    def _availability(self) -> tuple[bool, int | None]:
        if not self._writable() or not self._can_commit():
            return True, None  # R7: no leader clients know, or one that cannot reach a majority
        return False, self._stall_from(self.leader, self.commit, self.p.max_wait_ack_ms)

    def _end_view(self):
        ldr = self.leader
        if ldr is None or not self.rep[ldr].up:
            return epoch_runs([]), 0, False
        return epoch_runs(self.rep[ldr].log), self.commit, True

    def _recover(self, t: int) -> list[Entry]:
        for r in self.rep.values():
            r.up, r.isolated = True, False
        if self.leader is None:
            self._elect(t, list(self.order))
        return self.rep[self.leader].log
