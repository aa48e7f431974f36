"""The HF anchors at temperature > 0 sample exactly draftrl's distribution (temperature, top-k, top-p).

HF ``generate`` defaults to top-k 50 and merges a model's ``generation_config.json`` into every
keyword left unset (repetition penalty, min-p, ...). The anchors pass every one of them, so that
``generate(do_sample=True)`` draws from ``logits_to_probs(logits, SamplingParams(T, k, p))``: checked
on the resolved generation config and, statistically, on first-token frequencies against our
probabilities (chi-square), with a negative control (HF's own top-k default) that the test rejects.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from draftrl.eval.round.anchors import Anchor, anchors_for, assistant_of, generation_kwargs, run_anchor

PROMPT = [1, 2, 3, 4, 5]


def tiny_model(vocab: int = 256, seed: int = 0, spread: float = 12.0):
    """A one-layer Llama whose next-token logits spread over a few units (not near-uniform), with a
    hostile ``generation_config`` (what a shipped model may carry): every field our anchors must undo."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(spread)
    gc = model.generation_config
    gc.top_k, gc.top_p, gc.temperature, gc.repetition_penalty, gc.min_p = 50, 0.6, 2.0, 1.5, 0.05
    return model


def our_probs(model, params) -> np.ndarray:
    import torch

    from draftrl.models.distribution import logits_to_probs

    with torch.no_grad():
        logits = model(torch.tensor([PROMPT])).logits[0, -1]
    return logits_to_probs(logits, params).double().numpy()


def hf_first_tokens(model, kwargs: dict, n: int, seed: int = 0) -> np.ndarray:
    """``n`` first tokens drawn by ``generate`` with ``kwargs`` (one batch of the same prompt)."""
    import torch

    ids = torch.tensor([PROMPT] * n)
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, eos_token_id=[],
                             pad_token_id=0, **kwargs)
    return out[:, -1].numpy()


def chi2_pvalue(tokens: np.ndarray, probs: np.ndarray) -> float:
    """Pearson's chi-square of ``tokens`` against ``probs``; cells with expected count < 5 pooled
    into one; a token drawn where ``probs`` is 0 gives p = 0 (impossible under it)."""
    from scipy.stats import chi2

    counts = np.bincount(tokens, minlength=probs.size).astype(float)
    if counts[probs == 0].sum() > 0:
        return 0.0
    expected = probs * tokens.size
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    return float(chi2.sf(stat, keep.sum() - 1))


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 1.0), (1.0, 0, 0.8), (1.0, 8, 1.0), (0.7, 20, 0.9)])
def test_the_resolved_generation_config_is_ours(temperature, top_k, top_p) -> None:
    """What ``generate`` resolves from the anchor's keywords over the hostile model config: our
    temperature, top-k (0 stays 0: off) and top-p, and every other processor neutral."""
    from draftrl.models.distribution import SamplingParams

    model = tiny_model(vocab=64)
    kwargs = generation_kwargs(Anchor(), SamplingParams(temperature, top_k, top_p))
    gc, model_kwargs = model._prepare_generation_config(None, **kwargs)
    assert not model_kwargs  # every keyword is a generation-config field, none reaches forward()
    assert (gc.do_sample, gc.temperature, gc.top_k, gc.top_p) == (True, temperature, top_k, top_p)
    assert (gc.repetition_penalty, gc.min_p, gc.typical_p, gc.num_beams) == (1.0, None, 1.0, 1)
    greedy, _ = model._prepare_generation_config(None, **generation_kwargs(Anchor(2), None))
    assert greedy.do_sample is False and greedy.prompt_lookup_num_tokens == 2 and greedy.repetition_penalty == 1.0


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 1.0), (1.0, 0, 0.8), (1.0, 8, 1.0), (0.7, 20, 0.9)])
def test_hf_samples_our_distribution(temperature, top_k, top_p) -> None:
    """4,000 first tokens from HF's sampled anchor against ``logits_to_probs`` at the same
    (T, top-k, top-p): the chi-square does not reject (p > 1e-3; seeded, so the verdict is fixed).
    The support is exactly ours: no token outside our top-k / top-p set is ever drawn."""
    from draftrl.models.distribution import SamplingParams

    model = tiny_model()
    params = SamplingParams(temperature, top_k, top_p)
    probs = our_probs(model, params)
    tokens = hf_first_tokens(model, generation_kwargs(Anchor(), params), 4000)
    assert probs[tokens].min() > 0
    assert chi2_pvalue(tokens, probs) > 1e-3


def test_the_negative_controls_are_rejected() -> None:
    """The same test catches an anchor that leaves HF's defaults in place: ``do_sample`` and the
    temperature alone (HF's top-k 50 and the model config's top-p and penalties apply), and a wrong
    top-k passed explicitly."""
    from draftrl.models.distribution import SamplingParams

    model = tiny_model()
    params = SamplingParams(1.0, 0, 1.0)
    probs = our_probs(model, params)
    naive = hf_first_tokens(model, {"do_sample": True, "temperature": 1.0}, 4000)
    assert chi2_pvalue(naive, probs) < 1e-6
    wrong_k = hf_first_tokens(model, generation_kwargs(Anchor(), SamplingParams(1.0, 50, 1.0)), 4000)
    assert chi2_pvalue(wrong_k, probs) < 1e-6


def request(max_new_tokens: int = 12):
    return SimpleNamespace(prompt_ids=PROMPT, max_new_tokens=max_new_tokens,
                           prompt=SimpleNamespace(id="p", language="en", task="chat"))


def test_sampled_anchors_are_seeded_per_request() -> None:
    """The same seed gives the same sampled tokens, another seed other ones (T = 1 over 12 tokens);
    prompt lookup with sampling runs too."""
    from draftrl.models.distribution import SamplingParams

    model = tiny_model(spread=2.0)
    params = SamplingParams(1.0, 0, 1.0)
    a = run_anchor(model, Anchor(), request(), eos_token_ids=[], sampling=params, seed=7)
    b = run_anchor(model, Anchor(), request(), eos_token_ids=[], sampling=params, seed=7)
    c = run_anchor(model, Anchor(), request(), eos_token_ids=[], sampling=params, seed=8)
    assert a.token_ids == b.token_ids and a.token_ids != c.token_ids and len(a.token_ids) == 12
    lookup = run_anchor(model, Anchor(2), request(), eos_token_ids=[], sampling=params, seed=7)
    assert lookup.policy == "hf-lookup:2" and len(lookup.token_ids) == 12


def test_assisted_anchor_with_a_draft_model() -> None:
    """``hf-assisted`` decodes with the engine's draft model as HF's ``assistant_model``, greedy (equal to
    plain HF greedy) and sampled; engines without a separate draft model give no assistant."""
    import torch

    from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
    from draftrl.drafters.model import ModelDrafter
    from draftrl.drafters.ngram import NgramDrafter
    from draftrl.models.distribution import SamplingParams

    target, draft = tiny_model(vocab=64, spread=2.0), tiny_model(vocab=64, seed=1, spread=2.0)
    engine = SpeculativeDecoder(target, ModelDrafter(draft), EngineConfig(max_new_tokens=12), eos_token_ids=[])
    assert assistant_of(engine) is draft
    assert assistant_of(SpeculativeDecoder(target, NgramDrafter(), EngineConfig(), eos_token_ids=[])) is None
    assert assistant_of(SpeculativeDecoder(target, ModelDrafter(target, name="self"), EngineConfig(),
                                           eos_token_ids=[])) is None
    assert [a.label for a in anchors_for((2,), assisted=True)] == ["hf", "hf-lookup:2", "hf-assisted"]
    greedy = run_anchor(target, Anchor(assisted=True), request(), eos_token_ids=[], assistant=draft)
    plain = run_anchor(target, Anchor(), request(), eos_token_ids=[])
    assert greedy.policy == "hf-assisted" and greedy.token_ids == plain.token_ids
    sampled = run_anchor(target, Anchor(assisted=True), request(), eos_token_ids=[], assistant=draft,
                         sampling=SamplingParams(0.7, 0, 0.9), seed=3)
    assert len(sampled.token_ids) == 12 and torch.is_grad_enabled()
    with pytest.raises(ValueError, match="draft model"):
        run_anchor(target, Anchor(assisted=True), request(), eos_token_ids=[])
