"""The `kafka` reference interpreter's faults, fencing and elections (SPEC §3.2 rules 6, 8-11; §3.7 K-3, K-4)."""

from __future__ import annotations

from replay.kafka.reference.state import FENCE, Replica, Zombie
from schemas.trace import Kind


class KafkaReferenceControl:
    """Part of `replay.kafka.reference.interpreter.KafkaReference`, which holds the state these methods use."""

    # ------------------------------------------------------------------------------ faults (rules 6, 8-11)
    def _became_unreachable(self, t: int, r: Replica) -> None:
        if r.unreachable_since is None:
            r.unreachable_since = t
            self._push(t + self.session_us, FENCE, "fence", r.broker)

    def _zombie_stops(self, b: int) -> None:
        if self.zombie is not None and self.zombie.broker == b:
            self.zombie = None  # a zombie that stops or rejoins no longer believes it leads

    def _stop_unclean(self, t: int, b: int, kind: Kind) -> None:
        r = self.rep[b]
        if b == self.leader and self.down_published is None:
            self.down_published = (len(r.log), self.hw)
        r.up = False
        r.unclean_stop = True
        if kind is Kind.POWER_LOSS:  # rule 11: cut to the durable prefix
            self._truncate(r, self._durable_prefix(r, t))
        elif kind is Kind.DISK_LOSS:
            self._truncate(r, 0)
        r.flushed_all = len(r.log)  # what is left is on disk
        self._became_unreachable(t, r)
        self._zombie_stops(b)
        if b == self.target and self.leader is not None and self.leader != b:
            self._schedule_switch(t)  # clients of a zombie learn when it stops answering

    def _shutdown(self, t: int, b: int) -> None:
        """Controlled shutdown (SPEC §2.2, §3.2 rule 8): flush, leave the ISR, hand leadership over at once."""
        r = self.rep[b]
        if b == self.leader and self.down_published is None:
            self.down_published = (len(r.log), self.hw)
        r.up = False
        r.unclean_stop = False
        r.flushed_all = len(r.log)
        r.unreachable_since = None  # no detection delay: the controller knows now
        self._zombie_stops(b)
        self._leave_isr(b)
        if b == self.leader:
            self._elect(t)
        else:
            self._recompute_hw(t)
            if b == self.target and self.leader is not None:
                self._schedule_switch(t)

    def _isolate(self, t: int, b: int) -> None:
        r = self.rep[b]
        r.isolated = True
        r.isolated_since = t
        if b == self.leader:
            self.iso_view = tuple(self.isr)
            if b == self.target:
                self._schedule_refresh(t)
        self._became_unreachable(t, r)

    def _restart(self, t: int, b: int) -> None:
        r = self.rep[b]
        r.up = True
        r.flushed_all = len(r.log)
        if r.isolated:
            r.must_register = True  # it cannot reach the controller yet
            return
        self._register(t, b)

    def _register(self, t: int, b: int) -> None:
        """A new incarnation of broker b registers with the controller."""
        r = self.rep[b]
        r.must_register = False
        if self.p.eligible_leader_replicas and r.unclean_stop:
            # KIP-966: a new incarnation after an unclean shutdown leaves ISR and ELR.
            if b in self.isr:
                self.isr.remove(b)
                self._recompute_hw(t)
            if b in self.elr:
                self.elr.remove(b)
        if r.unreachable_since is not None:
            self._fence(t, b, at_restart=True)  # rule 6: fenced at once when it registers again
        if self.leader is None:
            self._elect(t)  # rule 8: an offline partition elects again when a replica comes back

    def _heal(self, t: int, b: int) -> None:
        r = self.rep[b]
        r.isolated = False
        r.isolated_since = None
        self._zombie_stops(b)
        if r.up and r.must_register:
            self._register(t, b)
        elif r.up:
            r.unreachable_since = None  # an isolation that heals before the deadline causes no fencing (rule 6)
        if b == self.leader and self.unaware and r.up and not r.must_register:
            self.unaware = False  # SPEC §3.7 K-3: it learns of its election and leads from now
            self._lead(t)
        elif b == self.leader:
            self.iso_view = None
            self._recompute_hw(t)
        elif r.up and self.leader is not None and not self.unaware:
            self._truncate_to_leader(r)  # rule 10: the zombie is truncated once it rejoins
        if b == self.target and self.leader != b:
            self._schedule_switch(t)
        if self.leader is None and r.up:
            self._elect(t)

    def _on_fence(self, t: int, b: int) -> None:
        r = self.rep[b]
        if r.unreachable_since is None or r.unreachable_since + self.session_us != t:
            return  # came back before the deadline
        self._fence(t, b, at_restart=False)

    def _fence(self, t: int, b: int, *, at_restart: bool) -> None:
        self.rep[b].unreachable_since = None
        self._leave_isr(b)
        if b == self.leader:
            self._elect(t)
        else:
            self._recompute_hw(t)  # a smaller ISR may let the high watermark advance

    def _leave_isr(self, b: int) -> None:
        """Rule 6/8: leave the ISR unless last (pre-ELR); with ELR, a replica leaving below min ISR is in ELR."""
        if b not in self.isr:
            return
        if len(self.isr) == 1 and not self.p.eligible_leader_replicas:
            return
        self.isr.remove(b)
        self._maybe_elr(b)

    def _maybe_elr(self, b: int) -> None:
        if self.p.eligible_leader_replicas and len(self.isr) < self.min_isr and b not in self.elr:
            self.elr.append(b)

    # --------------------------------------------------------------------------- election (rules 8-9)
    def _electable(self, b: int) -> bool:
        """The controller's view (SPEC §3.7 K-3, `ClusterControlManager.isActive` used by
        `ReplicationControlManager`): it excludes only fenced or shutting-down brokers, so an isolated broker is
        electable until its fencing deadline. A broker that is down is not (v1 rule 8), nor a new incarnation
        that has not registered yet."""
        r = self.rep[b]
        if not r.up or r.must_register:
            return False
        return not r.isolated or r.unreachable_since is not None  # isolated: only until it is fenced

    def _elect(self, t: int) -> None:
        candidates = [b for b in self._in_order(self.isr) if self._electable(b)]
        chosen, new_isr = (candidates[0], self.isr) if candidates else (None, None)
        if chosen is None and self.p.eligible_leader_replicas:
            elr = [b for b in self._in_order(self.elr) if self._electable(b)]
            if elr:
                chosen, new_isr = elr[0], [elr[0]]
                self.elr.remove(elr[0])
        if chosen is None and self.p.eligible_leader_replicas and not self.p.unclean_leader_election \
                and not self.isr and not self.elr and self._electable(self.last_leader):
            # SPEC §3.7 K-4 (KIP-966, `PartitionChangeBuilder`): with ISR and ELR both empty, the last known
            # leader leads again when it comes back, keeping what it holds.
            chosen, new_isr = self.last_leader, [self.last_leader]
        if chosen is None and self.p.unclean_leader_election:
            up = [b for b in self.order if self._electable(b)]
            if up:
                chosen, new_isr = up[0], [up[0]]
                self.elr = []
                if not self.virtual:
                    self.unclean_us.append(t)  # SPEC §3.7 K-8, through `replay.kafka.leadership`
        old = self.leader
        if old is not None and self.rep[old].can_be_zombie and old == self.target and self.zombie is None \
                and not self.unaware:  # a leader that never knew it led answers no client as leader
            self.zombie = Zombie(old, self.epoch, self.iso_view or (old,), self.hw)
        self.unaware = False
        if chosen is None:
            self.leader = None  # offline
            self.iso_view = None
            return
        self.isr = self._in_order(new_isr)
        self._set_leader(t, chosen)

    def _clients_stay(self) -> bool:
        """Clients keep their broker across an election only while it answers them as leader (a zombie, rule
        10) or is a restarted, unregistered old leader they cannot tell from one; an isolated broker that
        answers NOT_LEADER_OR_FOLLOWER (SPEC §3.7 K-3) makes them refresh metadata."""
        tgt = self.target
        if tgt is None or not self.rep[tgt].up or not self.rep[tgt].isolated:
            return False
        return self.rep[tgt].must_register or (self.zombie is not None and self.zombie.broker == tgt)

    def _set_leader(self, t: int, n: int) -> None:
        """The controller elects n (a new leader epoch). An isolated n cannot learn of it (SPEC §3.7 K-3): it
        takes no writes, and nothing else changes until it heals (`_lead`) or is fenced (a new election)."""
        self.leader = n
        self.last_leader = n
        self.epoch += 1
        self.iso_view = None
        self.down_published = None
        self._zombie_stops(n)
        if self.p.eligible_leader_replicas and len(self.isr) >= self.min_isr:
            self.elr = []
        if self.rep[n].isolated:
            self.unaware = True
            self.hw = min(self.hw, len(self.rep[n].log))
            if not self._clients_stay():
                self._schedule_switch(t)
            return
        self._lead(t)

    def _lead(self, t: int) -> None:
        """The leader takes over (at its election, or when an isolated one heals, SPEC §3.7 K-3): followers keep
        the prefix they share with it (rule 9), count as caught up, and the high watermark restarts."""
        n = self.leader
        lead = self.rep[n]
        self.epoch_start = len(lead.log)
        for b, r in self.rep.items():
            if b != n and not (self.zombie is not None and b == self.zombie.broker):
                self._truncate_to_leader(r)  # rule 9: keep only the prefix shared with the new leader
            if b != n:
                r.fetched = len(r.log)
                r.lcu = t  # after a leader change every follower counts as caught up
        if self._frozen(len(self.isr)):
            self.hw = min(self.hw, len(lead.log))
        else:
            self.hw = min(len(lead.log) if b == n else self.rep[b].fetched for b in self.isr)
        self._mark_visible(t, n, self.hw)
        if not self._clients_stay():
            self._schedule_switch(t)
        if not self.virtual:
            # Clients already writing to the new leader (it led before, e.g. an ex-zombie re-elected) need no
            # failover: what the election committed is acknowledged now (rule 4), not at the next HW move.
            self._ack_committed(t)

    def _truncate_to_leader(self, r: Replica) -> None:
        if self.leader is None or r.broker == self.leader:
            return
        lead = self.rep[self.leader].log
        # Leader-epoch truncation (KIP-101/279): entries match when written by the same leader epoch.
        common = 0
        while common < min(len(r.log), len(lead)) and (
                r.log[common].epoch, r.log[common].msg_id) == (lead[common].epoch, lead[common].msg_id):
            common += 1
        self._truncate(r, common)
