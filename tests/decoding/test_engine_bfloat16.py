"""Greedy speculative decoding in bfloat16 (vLLM's CPU default) against the target's own greedy decoding.

In bfloat16 a forward over k tokens and k forwards over one token round differently, so a
speculative run may legitimately take the other branch where the target's top two logits tie
within rounding (vLLM's own ngram differs from its plain decoding in bf16 for that reason). The
test therefore demands token identity up to the first divergence and, at a divergence, that the
reference's top-two gap there is within bfloat16 rounding of the logits: a real verification bug
(accepting a draft token the target did not choose) leaves a large gap and fails. A negative
control that accepts every draft token is rejected by the same check.

``slow``: bfloat16 matmuls are emulated on CPUs without AVX512-BF16/AMX (about 10 minutes here on
a loaded 2-core AVX2 machine); run with ``pytest -m slow tests/decoding/test_engine_bfloat16.py``.
"""

from __future__ import annotations

import pytest
import torch

from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
from draftrl.decoding.generate import fixed_schedule, generate
from draftrl.drafters.ngram import NgramDrafter
from draftrl.prompts import load_prompts

pytestmark = pytest.mark.slow

NUM_TOKENS = 24
#: bfloat16 keeps 8 significant bits: two roundings of a logit of size |x| differ by up to ~2 * 2^-8 |x|.
RELATIVE_TIE = 2.0 ** -7


@pytest.fixture(scope="module")
def bf16_model():
    from draftrl.models import load_model

    return load_model("smollm2-135m", dtype="bfloat16", kernels="stock")


def _reference(model, ids: list[int]) -> tuple[list[int], torch.Tensor]:
    """Greedy continuation one token at a time, with each step's logits (the target's own decoding)."""
    out = model.generate(torch.tensor([ids]), max_new_tokens=NUM_TOKENS, do_sample=False, eos_token_id=None,
                         pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    return out.sequences[0, len(ids):].tolist(), torch.stack(out.scores)[:, 0].float()


def _agrees_up_to_ties(tokens: list[int], reference: list[int], scores: torch.Tensor) -> tuple[bool, str]:
    for i, (a, b) in enumerate(zip(tokens, reference)):
        if a != b:
            top = scores[i].topk(2).values
            gap, scale = float(top[0] - top[1]), float(top[0].abs())
            tie = gap <= RELATIVE_TIE * scale
            return tie, f"position {i}: {a} vs {b}, top-2 gap {gap:.4f} (tie bound {RELATIVE_TIE * scale:.4f})"
    return tokens == reference, "identical"


def _prompts(tokenizer) -> list[list[int]]:
    prompts = load_prompts(languages=("en", "zh"), tasks=("summarize", "code_edit"), split="tune", limit_per_group=1)
    return [list(tokenizer.apply_chat_template([{"role": "user", "content": p.prompt}], add_generation_prompt=True,
                                               tokenize=True, return_dict=False)) for p in prompts]


def _decode(model, ids: list[int], depth: int, sampler: str = "correct") -> list[int]:
    engine = SpeculativeDecoder(model, NgramDrafter(), EngineConfig(max_new_tokens=NUM_TOKENS, sampler=sampler))
    return generate(engine, ids, fixed_schedule(depth)).token_ids


@pytest.mark.parametrize("depth", [0, 4])
def test_bfloat16_greedy_matches_the_target_up_to_rounding_ties(bf16_model, depth):
    model = bf16_model.model
    assert next(model.parameters()).dtype == torch.bfloat16
    with torch.inference_mode():
        for ids in _prompts(bf16_model.tokenizer):
            reference, scores = _reference(model, ids)
            ok, where = _agrees_up_to_ties(_decode(model, ids, depth), reference, scores)
            assert ok, f"depth {depth}: speculative bf16 output leaves the target's greedy path at {where}"


def test_the_tie_check_rejects_a_sampler_that_accepts_what_the_target_did_not_choose(bf16_model):
    """Negative control: an 'accept every draft token' verifier diverges where the target clearly disagrees."""
    model = bf16_model.model
    rejected = 0
    with torch.inference_mode():
        for ids in _prompts(bf16_model.tokenizer):
            reference, scores = _reference(model, ids)
            tokens = _accept_all(model, ids, depth=4)
            ok, _ = _agrees_up_to_ties(tokens, reference, scores)
            rejected += not ok
    assert rejected >= 1


def _accept_all(model, ids: list[int], depth: int) -> list[int]:
    """Prompt lookup that keeps every drafted token (the bug a verifier must not have); a plain
    greedy step where nothing is drafted."""
    from draftrl.models.distribution import SamplingParams

    drafter = NgramDrafter()
    out: list[int] = []
    context = list(ids)
    while len(out) < NUM_TOKENS:
        taken = drafter.propose(context, depth, 1, SamplingParams(), None).tokens[: NUM_TOKENS - len(out)]
        if not taken:
            taken = [int(model(torch.tensor([context])).logits[0, -1].argmax())]
        out += taken
        context += taken
    return out
