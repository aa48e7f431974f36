"""The batch budget admission (pure numpy): the budget's best positions, prefixes, edge cases."""

from __future__ import annotations

import numpy as np
import pytest

from draftrl.decoding.admission import (
    RequestAcceptance,
    StepAction,
    acceptance_estimate,
    admit,
    position_scores,
)


def test_unlimited_budget_admits_every_existing_position():
    scores = position_scores(np.array([0.9, 0.5, 0.2]), np.array([4, 0, 2]), 4)
    assert admit(scores, None).tolist() == [4, 0, 2]
    assert admit(scores, 100).tolist() == [4, 0, 2]


def test_zero_budget_admits_nothing():
    scores = position_scores(np.array([0.9, 0.5]), np.array([4, 4]), 4)
    assert admit(scores, 0).tolist() == [0, 0]


def test_budget_takes_the_globally_best_survival_scores():
    # survival: r0 = .9,.81,.729,.656 ; r1 = .5,.25 ; r2 = .7,.49,.343
    scores = position_scores(np.array([0.9, 0.5, 0.7]), np.array([4, 2, 3]), 4)
    assert admit(scores, 1).tolist() == [1, 0, 0]
    assert admit(scores, 3).tolist() == [3, 0, 0]
    assert admit(scores, 4).tolist() == [3, 0, 1]  # .7 beats .656
    assert admit(scores, 5).tolist() == [4, 0, 1]  # .656 beats .5
    assert admit(scores, 6).tolist() == [4, 1, 1]  # .5 beats .49


@pytest.mark.parametrize("seed", range(20))
def test_random_batches_respect_budget_and_prefixes(seed):
    rng = np.random.default_rng(seed)
    rows, depth = int(rng.integers(1, 9)), int(rng.integers(1, 9))
    acceptance = rng.uniform(0.01, 0.99, rows)
    capacity = rng.integers(0, depth + 1, rows)
    scores = position_scores(acceptance, capacity, depth)
    budget = int(rng.integers(0, rows * depth + 2))
    counts = admit(scores, budget)
    assert counts.sum() == min(budget, capacity.sum())
    assert (counts <= capacity).all()
    # nothing left out scores above anything admitted
    taken = [scores[r, j] for r in range(rows) for j in range(counts[r])]
    left = [scores[r, j] for r in range(rows) for j in range(counts[r], capacity[r])]
    if taken and left:
        assert min(taken) >= max(left)


def test_ties_between_positions_of_one_request_keep_a_prefix():
    scores = np.array([[1.0, 1.0, 1.0], [1.0, 1.0, -np.inf]])
    counts = admit(scores, 3)
    assert counts.tolist() == [2, 1]


def test_acceptance_estimate_grows_with_match_and_history():
    none = acceptance_estimate(np.zeros(1), np.zeros(1), np.zeros(1))[0]
    match = acceptance_estimate(np.zeros(1), np.zeros(1), np.array([3]))[0]
    good = acceptance_estimate(np.array([8.0]), np.array([8.0]), np.zeros(1))[0]
    bad = acceptance_estimate(np.array([0.0]), np.array([8.0]), np.zeros(1))[0]
    assert bad < none < match and none < good < 1


def test_request_acceptance_counts_accepted_drafts_from_returned_tokens():
    req = RequestAcceptance(last_proposed=4)
    assert req.observe(3, decay=1.0) == 2  # 3 tokens back = 2 accepted + 1
    req.last_proposed = 2
    assert req.observe(5, decay=1.0) == 2  # never more than were proposed
    assert (req.num_accepted, req.num_proposed) == (4.0, 6.0)


def test_bad_actions_name_the_value():
    with pytest.raises(ValueError, match="depth=-1"):
        StepAction(-1)
    with pytest.raises(ValueError, match="budget=-2"):
        StepAction(2, -2)
    with pytest.raises(ValueError, match="shape"):
        admit(np.zeros(3), 1)
