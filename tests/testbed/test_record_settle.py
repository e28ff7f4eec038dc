"""The recorder's reads of the followers' log ends after a crash or an isolation (`testbed.observe.settled_reads`):
read again every SETTLE_MS until two reads agree, for at most SETTLE_MAX_MS. No cluster: a scripted sampler."""

from __future__ import annotations

from testbed.observe import SETTLE_MAX_MS, SETTLE_MS, Sample, settled_reads


class ScriptedSampler:
    """Each broker's log end for its successive reads (the last one repeats); None for a broker not answering."""

    def __init__(self, script: dict[int, list[int] | None]) -> None:
        self.script, self.reads = script, {b: 0 for b in script}

    def read(self, broker: int) -> Sample | None:
        ends = self.script[broker]
        if ends is None:
            return None
        n = self.reads[broker]
        self.reads[broker] = n + 1
        return Sample(0, broker, {("t", 0): ends[min(n, len(ends) - 1)]}, set())


def test_reads_until_two_agree_and_keeps_the_settled_log_ends():
    sampler = ScriptedSampler({1: [10, 15, 15, 99], 2: [7], 3: None})  # broker 1 still appending a fetch
    got = settled_reads(sampler, [1, 2, 3], producers=[])
    assert [(s.broker, s.leo[("t", 0)]) for s in got] == [(1, 15), (2, 7)]
    assert sampler.reads == {1: 3, 2: 3, 3: 0}  # stopped at the first agreement: the 99 is never read


def test_gives_up_after_the_longest_wait_with_the_last_read():
    sampler = ScriptedSampler({1: list(range(1000))})  # never settles
    got = settled_reads(sampler, [1], producers=[])
    assert len(got) == 1 and got[0].leo[("t", 0)] == sampler.reads[1] - 1
    assert 2 <= sampler.reads[1] <= SETTLE_MAX_MS // SETTLE_MS + 1
