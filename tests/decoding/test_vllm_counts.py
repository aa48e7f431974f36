"""vLLM's own speculative-decoding counts (``draftrl.decoding.vllm.counts``), fed by hand: no vLLM needed."""

from __future__ import annotations

from types import SimpleNamespace

from draftrl.decoding.vllm.counts import SpecDecodingCounts


def stats(drafts: int, draft_tokens: int, accepted: int, per_pos: list[int]) -> SimpleNamespace:
    """One step's counts, named as vLLM's ``SpecDecodingStats``."""
    return SimpleNamespace(num_drafts=drafts, num_draft_tokens=draft_tokens, num_accepted_tokens=accepted,
                           num_accepted_tokens_per_pos=per_pos)


def test_counts_add_up_and_a_span_is_the_difference_of_two_snapshots():
    counts = SpecDecodingCounts()
    assert counts.acceptance_length is None  # no drafts yet (vLLM without speculation)
    counts.observe(stats(2, 6, 3, [2, 1, 0]))
    before = counts.snapshot()
    counts.observe(stats(4, 12, 5, [3, 1, 1]))
    counts.observe(stats(1, 3, 3, [1, 1, 1]))
    span = counts.since(before)
    assert (span.num_drafts, span.num_draft_tokens, span.num_accepted) == (5, 15, 8)
    assert span.num_accepted_per_pos == [4, 2, 2] and before.num_accepted_per_pos == [2, 1, 0]
    assert span.acceptance_length == 1 + 8 / 5  # the bonus token counts
    assert span.summary() == {"num_drafts": 5, "num_draft_tokens": 15, "num_accepted": 8,
                              "num_accepted_per_pos": [4, 2, 2], "acceptance_length": 2.6}
