"""The batch cost model: best depth per batch size, the depth table, alpha fitted to a policy's rounds."""

from __future__ import annotations

import pytest

from draftrl.signals import batch_scaling as bs
from draftrl.signals.costs import CostTable
from draftrl.signals.speedup import expected_tokens


def test_cost_model_reproduces_the_design_vectors():
    g = [1.0] * 17
    assert expected_tokens(0.7, 6) == pytest.approx(3.058819, abs=1e-6)
    assert bs.best_depth(list(range(1, 17)), 0.7, 0.05, g, batch=1, saturation=1e9) == 6
    assert bs.best_depth(list(range(1, 17)), 0.7, 0.20, g, batch=1, saturation=1e9) == 3
    assert bs.best_depth(list(range(0, 17)), 0.0, 0.05, g, batch=1, saturation=1e9) == 0  # alpha 0: no speculation


def test_larger_batches_never_speculate_deeper():
    scale, k_star = bs.depth_scale(12, 0.8, 0.05, [1.0] * 13, saturation=256, max_batch=512)
    # batch 1 is memory-bound: argmax over d of (1 - 0.8^(d+1)) / 0.2 / (1 + 0.05 d) is d = 8 (3.092 tokens/step)
    assert k_star[0] == 8 and scale[0] == 1.0
    assert all(a >= b for a, b in zip(k_star, k_star[1:])) and k_star[-1] == 0
    table = bs.depth_by_batch(6, [0, 1, 2, 4, 6, 8], scale)
    assert table[0] == 6 and table[-1] == 0 and all(a >= b for a, b in zip(table, table[1:]))
    assert set(table) <= {0, 1, 2, 4, 6, 8}
    # memory-bound batches (B (n + 1) <= S) cost nothing extra: the batch-1 depth holds
    assert bs.verify_cost_at_batch([1.0] * 13, 6, batch=16, saturation=256) == 1.0
    assert bs.verify_cost_at_batch([1.0] * 13, 6, batch=256, saturation=256) == 7.0


def test_no_speculation_at_batch_one_keeps_the_policy_while_memory_bound():
    scale, k_star = bs.depth_scale(3, 0.0, 0.05, [1.0] * 4, saturation=8, max_batch=4)
    assert k_star == [0, 0, 0, 0] and scale == [1.0, 1.0, 0.0, 0.0]  # B (3 + 1) <= 8 for B <= 2


def test_alpha_is_fitted_to_the_policys_own_tokens_per_round():
    hist = {0: 5, 2: 10, 6: 30}
    mean = sum(n * expected_tokens(0.6, d) for d, n in hist.items()) / sum(hist.values())
    assert bs.fit_alpha(hist, mean) == pytest.approx(0.6, abs=1e-9)
    assert bs.fit_alpha(hist, 1.0) == 0.0 and bs.fit_alpha({0: 3}, 1.0) == 0.0
    assert bs.fit_alpha(hist, 100.0) == 1.0


def test_relative_costs_are_in_plain_target_steps():
    table = CostTable(num_tokens=[1, 2, 4], context_lens=[100, 300], verify_seconds=[[1.0, 1.2, 2.0], [3.0, 3.6, 6.0]],
                      draft_widths=[1, 2], draft_level_seconds=[0.2, 0.3])
    c, g = bs.relative_costs(table, width=2, max_depth=2)  # at the median context 200: verify(1) = 2.0
    assert c == pytest.approx(0.3 / 2.0)
    assert g == pytest.approx([1.0, 2.4 / 2.0, 3.2 / 2.0])  # one forward over n + 1 tokens: 2, then 3 (interpolated)
