"""``AcceptanceCounts`` on hand-built rounds: conditional acceptance per position, the share of
rounds accepting at least i, and the acceptance length with its bonus token."""

from __future__ import annotations

import pytest

from draftrl.decoding.counts import AcceptanceCounts


def test_counts_are_conditional_and_count_the_bonus_token():
    counts = AcceptanceCounts(3)
    for drafted, accepted in [(3, 3), (3, 1), (3, 0), (1, 1), (0, 0)]:  # the last is a plain step: not counted
        counts.observe(drafted, accepted, accepted + 1)
    # position 1: drafted by 4 rounds, accepted by 3; position 2: reached by 2 (the (1, 1) round drafted
    # only one), accepted by 1; position 3: reached by 1, accepted by 1
    assert counts.num_reached == [4, 2, 1] and counts.num_accepted_per_pos == [3, 1, 1]
    assert counts.acceptance_per_position == pytest.approx([3 / 4, 1 / 2, 1.0])
    assert counts.accepted_at_least == pytest.approx([3 / 4, 1 / 4, 1 / 4])
    assert counts.acceptance_length == pytest.approx((4 + 2 + 1 + 2) / 4)
    assert counts.summary() == {"rounds": 4, "acceptance_per_position": [0.75, 0.5, 1.0],
                                "accepted_at_least": [0.75, 0.25, 0.25], "acceptance_length": 2.25}


def test_counts_add_up_and_stay_none_without_rounds():
    empty = AcceptanceCounts(2)
    assert empty.summary() == {"rounds": 0, "acceptance_per_position": [None, None],
                               "accepted_at_least": [None, None], "acceptance_length": None}
    a, b = AcceptanceCounts(2), AcceptanceCounts(2)
    a.observe(2, 2, 3)
    b.observe(5, 4, 5)  # positions beyond num_positions are not tracked
    total = a + b
    assert ((total.num_rounds, total.num_emitted, total.num_reached, total.num_accepted_per_pos)
            == (2, 8, [2, 2], [2, 2]))
    with pytest.raises(ValueError, match="2 and 3 positions"):
        a + AcceptanceCounts(3)
