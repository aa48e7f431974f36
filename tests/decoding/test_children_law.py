"""The exact law of sampled draft children: draftrl's float64 sampler vs ``torch.multinomial`` (issue 14).

Verification treats the children of a sampled tree node as i.i.d. draws from q normalised in
float64. These tests compute, without sampling, the law each sampler draws from and its total
variation (TV) from q (reference in extended precision):

- ``multinomial``: PyTorch's CPU kernel for more than one sample with replacement (what
  ``ModelDrafter`` used for width >= 2 before issue 14): a float32 running sum divided by the
  float32 total, the last entry forced to 1, then the first entry >= a float64 uniform;
- ``draftrl``: :func:`draftrl.models.distribution.sample` (float64 CDF, searchsorted).

Rows: the adversarial row (one head token, 49151 tail tokens 1.4 float32 steps below 1 each), and
SmolLM2-135M's next-token distributions at temperature 1 at the last positions of chat prompts.
Each law's model is checked against real draws of its sampler.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import norm

from draftrl.decoding.workload import encode
from draftrl.models.distribution import SamplingParams, logits_to_probs, sample
from draftrl.prompts import load_prompts

VOCAB = 49152  # SmolLM2's vocabulary
DRAWS = 2_000_000
FALSE_ALARM = 1e-4  # two-sided probability that a correct model fails the draw check


def multinomial_law(q: np.ndarray) -> np.ndarray:
    """Law of torch.multinomial(q, n >= 2, replacement=True) on the CPU (float32 q)."""
    cdf = np.add.accumulate(q.astype(np.float32), dtype=np.float32)  # sequential, as the kernel's loop
    cdf = (cdf / cdf[-1]).astype(np.float32)
    cdf[-1] = 1.0
    return np.diff(cdf.astype(np.float64), prepend=0.0)


def draftrl_law(q: np.ndarray) -> np.ndarray:
    """Law of draftrl's sample(): float64 cumulative sum, point u * total searched in it."""
    cdf = np.cumsum(q.astype(np.float64))
    return np.diff(cdf.astype(np.longdouble), prepend=0.0) / np.longdouble(cdf[-1])


def tv(law: np.ndarray, q: np.ndarray) -> float:
    ref = q.astype(np.longdouble) / q.astype(np.longdouble).sum()
    return float(0.5 * np.abs(law.astype(np.longdouble) - ref).sum())


def adversarial_row() -> np.ndarray:
    q = np.full(VOCAB, 1.4 * 2.0**-24)
    q[0] = 1.0 - (VOCAB - 1) * 1.4 * 2.0**-24
    return q.astype(np.float32)


def tail_within_tolerance(draws: torch.Tensor, tail_mass: float) -> tuple[bool, float]:
    """Is the observed frequency of non-head draws within z(FALSE_ALARM) standard errors of ``tail_mass``?"""
    observed = float((draws != 0).double().mean())
    z = (observed - tail_mass) / (tail_mass * (1 - tail_mass) / draws.numel()) ** 0.5
    return abs(z) <= norm.isf(FALSE_ALARM / 2), z


def test_draftrl_draws_the_adversarial_tail_exactly_where_multinomial_does_not():
    q = adversarial_row()
    assert tv(draftrl_law(q), q) < 1e-12
    assert tv(multinomial_law(q), q) > 1e-3  # the float32 CDF moves the tail's mass by more than 0.1%


@pytest.mark.parametrize("sampler", ["multinomial", "draftrl"])
def test_each_law_model_matches_its_sampler_on_real_draws(sampler):
    """The laws above are models of code; real draws of each sampler must follow its model."""
    q = adversarial_row()
    gen = torch.Generator().manual_seed(0)
    if sampler == "multinomial":
        law = multinomial_law(q)
        draws = torch.multinomial(torch.from_numpy(q), DRAWS, replacement=True, generator=gen)
    else:
        law = draftrl_law(q)
        draws = sample(torch.from_numpy(q), gen, num_samples=DRAWS)
    ok, z = tail_within_tolerance(draws, float(law[1:].sum()))
    assert ok, f"{sampler}: tail frequency {z:+.1f} standard errors from its law's model"


def test_draftrl_law_is_exact_on_smollm2_rows(smollm2):
    """Real next-token rows at temperature 1 (no top-k / top-p): draftrl's law is q to float64
    rounding, while the float32 CDF of multinomial is measurably off on the same rows."""
    rows = []
    for prompt in load_prompts(languages="en", tasks="chat", split="tune", limit_per_group=2):
        ids = encode(smollm2.tokenizer, prompt.prompt, chat_template=True)
        with torch.inference_mode():
            logits = smollm2.model(input_ids=torch.tensor([ids])).logits[0].float()
        rows.append(logits_to_probs(logits[-10:], SamplingParams(temperature=1.0)).numpy())
    rows = np.concatenate(rows)
    tv_draftrl = max(tv(draftrl_law(r), r) for r in rows)
    tv_multinomial = max(tv(multinomial_law(r), r) for r in rows)
    assert tv_draftrl < 1e-12
    assert tv_multinomial > 100 * tv_draftrl
