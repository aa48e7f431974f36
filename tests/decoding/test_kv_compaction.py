"""After tree rounds, both KV caches must equal a fresh prefill of the accepted text."""

from __future__ import annotations

import torch

from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
from draftrl.drafters.model import ModelDrafter
from draftrl.drafters.tree import DraftTree
from draftrl.models.kv import cache_length


def test_caches_equal_fresh_prefill_after_tree_rounds(smollm2):
    model, tok = smollm2.model, smollm2.tokenizer
    ids = tok("def mean(xs):\n    return sum(xs) / len(xs)\n\ndef", add_special_tokens=False)["input_ids"]
    drafter = ModelDrafter(model)  # a real second KV cache that also needs compaction
    engine = SpeculativeDecoder(model, drafter, EngineConfig(max_new_tokens=40, temperature=0.8, top_k=8, seed=3))
    engine.start(ids)
    accepted = 0
    for depth, width, verify_size in [(3, 2, 4), (4, 3, 6), (2, 2, None), (5, 1, None)]:
        rnd = engine.round(depth, verify_size, width)
        accepted += rnd.num_accepted
    assert accepted > 0, "the test must exercise accepted paths, not only rejections"
    history = engine.ids
    assert cache_length(engine.cache) == len(history) - 1
    with torch.inference_mode():
        fresh = model(torch.tensor([history])).logits[0, -1]
        cached = engine.verify_forward(DraftTree())[0]
        engine.rewind(len(history))
        draft_cached = drafter.root_logits(history)
    torch.testing.assert_close(cached, fresh, atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(draft_cached, fresh, atol=2e-4, rtol=1e-4)  # the draft is the same model


def test_rewind_restores_an_earlier_state(smollm2):
    model, tok = smollm2.model, smollm2.tokenizer
    ids = tok("One, two, three, four,", add_special_tokens=False)["input_ids"]
    engine = SpeculativeDecoder(model, ModelDrafter(model), EngineConfig(max_new_tokens=20))
    engine.start(ids)
    engine.round(3, None, 2)
    mark = len(engine.ids)
    first = engine.round(3, None, 2).tokens
    engine.rewind(mark)
    assert engine.round(3, None, 2).tokens == first  # greedy: same state, same round


def test_prefills_project_only_the_last_position(smollm2):
    """The target's prefill and the draft's catch-up feed score one position, not the whole prompt
    (HF generate does the same). The prefill feeds the whole prompt and keeps the last token's
    logits, so the first verification feeds only the drafts; later ones feed the root and drafts."""
    model = smollm2.model
    rows: list[int] = []
    hook = model.lm_head.register_forward_hook(lambda _m, inputs, _out: rows.append(inputs[0].shape[1]))
    try:
        prompt = list(range(100, 140))
        engine = SpeculativeDecoder(model, ModelDrafter(model), EngineConfig(max_new_tokens=8))
        engine.start(prompt)
        assert rows == [1]  # the target's prefill
        first = engine.round(3)
        assert rows[1] == 1  # the draft's feed of the 40-token prompt, for the root's logits
        assert rows[-1] == first.num_verified > 0  # the drafts only: the root came with the prefill
        second = engine.round(3)
        assert rows[-1] == 1 + second.num_verified  # the root and every draft
        plain = SpeculativeDecoder(model, None, EngineConfig(max_new_tokens=8))
        plain.start(prompt)
        before = len(rows)
        plain.round(0)
        assert len(rows) == before  # a plain first step takes its token from the prefill
        # start(prefill=False): no forward yet; the first round feeds prompt + drafts and scores root + drafts
        fused = SpeculativeDecoder(model, ModelDrafter(model), EngineConfig(max_new_tokens=8))
        before = len(rows)
        fused.start(prompt, prefill=False)
        assert len(rows) == before  # no forward yet
        first = fused.round(3)
        assert rows[before] == 1  # the draft's catch-up feed
        assert first.prompt_fed
        assert rows[-1] == 1 + first.num_verified > 1  # the target's one forward: prompt + drafts, root + drafts scored
        again = fused.round(3)
        assert again.tokens == second.tokens  # greedy: the same state as after the eager prefill
        assert not again.prompt_fed  # only the first round fed the prompt
    finally:
        hook.remove()
