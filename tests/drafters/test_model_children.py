"""Sampled draft children follow exactly the q that verification assumes (issue 14).

Verification treats a node's children as i.i.d. draws from q normalised in float64. The children
must therefore come from a float64 routine: ``torch.multinomial`` with several samples builds its
CPU cumulative distribution in float32, so on a full 49152-token row whose head carries almost all
the mass the tail tokens (each ~1.4 float32 steps below 1) are drawn at the wrong rate.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from scipy.stats import norm
from torch import nn

from draftrl.drafters.model import ModelDrafter
from draftrl.models.distribution import SamplingParams

VOCAB = 49152  # SmolLM2's vocabulary
TAIL_PROB = 1.4 * 2.0**-24  # 1.4 float32 steps just below 1: 8.3e-8 per tail token, 0.0041 in all
WIDTH = 2048
CALLS = 125  # WIDTH * CALLS = 256,000 children (the law of a draw does not depend on the width)
FALSE_ALARM = 1e-4  # two-sided probability that a correct sampler fails


class FixedLogits(nn.Module):
    """A 'language model' whose next-token logits are always ``row``: every node's q is softmax(row)."""

    def __init__(self, row: torch.Tensor):
        super().__init__()
        self.row = nn.Parameter(row, requires_grad=False)

    def forward(self, input_ids, position_ids=None, attention_mask=None, past_key_values=None, use_cache=True):
        return SimpleNamespace(logits=self.row.expand(1, input_ids.shape[1], -1))


def adversarial_logits() -> torch.Tensor:
    """Token 0 carries 0.9959 of the mass; the other 49151 tokens TAIL_PROB each."""
    q = torch.full((VOCAB,), TAIL_PROB, dtype=torch.float64)
    q[0] = 1.0 - (VOCAB - 1) * TAIL_PROB
    return q.log().float()


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_sampled_children_draw_the_tail_of_q_at_its_float64_rate():
    """Tail frequency of 256,000 children vs q's tail mass: the tolerance is z(FALSE_ALARM) standard
    errors (3.9 x 1.3e-4 = 4.9e-4), so a 1e-3 difference (7.9 standard errors) fails."""
    drafter = ModelDrafter(FixedLogits(adversarial_logits()), sampled=True)
    params = SamplingParams(temperature=1.0)
    gen = torch.Generator().manual_seed(0)
    num_tail = num = 0
    for _ in range(CALLS):
        tree = drafter.propose([0], 1, WIDTH, params, gen)
        tokens = torch.tensor(tree.tokens)
        num_tail += int((tokens != 0).sum())
        num += len(tokens)
    q = tree.q[-1].double()
    tail_mass = float(q[1:].sum() / q.sum())  # what verification assumes
    assert tail_mass == pytest.approx(0.00410, abs=1e-5)
    stderr = math.sqrt(tail_mass * (1 - tail_mass) / num)
    z = float(norm.isf(FALSE_ALARM / 2))
    assert 1e-3 >= z * stderr + 2.5 * stderr  # power: a 1e-3 shift is caught with probability > 0.99
    observed = num_tail / num
    print(f"tail frequency {observed:.6f} vs q {tail_mass:.6f} (n={num}, stderr {stderr:.2e})")
    assert abs(observed - tail_mass) <= z * stderr, (
        f"children put {observed:.5f} on the tail, q has {tail_mass:.5f}: {(observed - tail_mass) / stderr:.1f} SE"
    )
