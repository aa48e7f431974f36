"""The article's cost model in closed form (docs/design.md, "Cost model" test vectors)."""

from __future__ import annotations

import pytest

from draftrl.signals.speedup import expected_speedup, expected_tokens

GRID = range(1, 17)  # the article's grid, depth 1..16


def best_depth(alpha: float, draft_cost: float, depths=GRID, verify_cost: float = 1.0) -> int:
    return max(depths, key=lambda d: expected_speedup(alpha, d, draft_cost, verify_cost))


def test_expected_tokens_edge_cases():
    assert expected_tokens(0.7, 0) == 1.0
    assert expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0.0, 9) == 1.0
    for alpha in (0.1, 0.5, 0.9, 0.999):
        for depth in (1, 4, 12):
            closed = (1 - alpha ** (depth + 1)) / (1 - alpha)
            assert expected_tokens(alpha, depth) == pytest.approx(closed, rel=1e-12)
    assert expected_speedup(0.7, 0, 0.05, verify_cost=3.0) == 1.0  # depth 0 is plain decoding


def test_article_grid_cheap_draft():
    assert best_depth(0.7, 0.05) == 6
    assert expected_tokens(0.7, 6) == pytest.approx(3.058819, abs=1e-6)
    assert expected_speedup(0.7, 6, 0.05) == pytest.approx(2.353, abs=1e-3)


def test_article_grid_expensive_draft():
    assert best_depth(0.7, 0.20) == 3
    assert expected_speedup(0.7, 3, 0.20) == pytest.approx(1.583, abs=1e-3)


def test_article_costly_verification():
    assert expected_speedup(0.7, 6, 0.05, verify_cost=3.0) == pytest.approx(0.927, abs=1e-3)


def test_zero_acceptance_prefers_no_speculation():
    assert best_depth(0.0, 0.05, depths=range(0, 17)) == 0
    assert all(expected_speedup(0.0, d, 0.05) < 1.0 for d in GRID)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: expected_tokens(1.5, 3), "not a probability"),
        (lambda: expected_tokens(0.5, -1), "non-negative integer"),
        (lambda: expected_speedup(0.5, 3, -0.1), "draft_cost"),
        (lambda: expected_speedup(0.5, 3, 0.1, verify_cost=0.0), "verify_cost"),
    ],
)
def test_pure_function_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()
