"""fast_linear computes the same products as nn.Linear: same logits with a KV cache, same weights."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache

from draftrl.models import apply_fast_linear, has_fast_linear, remove_fast_linear
from draftrl.models import fast_linear as fl
from draftrl.models.kv import cache_argument

#: Max |fast - plain| over logits of magnitude ~10-30; float32 summation-order noise is ~1e-5.
LOGIT_ATOL = 5e-4


@contextlib.contextmanager
def fast_linear_set(model: nn.Module, on: bool) -> Iterator[None]:
    """Temporarily switch fast_linear on or off on the shared session model."""
    was_on = has_fast_linear(model)
    (apply_fast_linear if on else remove_fast_linear)(model)
    try:
        yield
    finally:
        (apply_fast_linear if was_on else remove_fast_linear)(model)


@pytest.mark.parametrize("num_rows", [1, 2, 3, fl.MAX_ROWS, fl.MAX_ROWS + 1, 70])
@pytest.mark.parametrize("bias", [False, True])
def test_fast_linear_layer_matches_f_linear(num_rows: int, bias: bool) -> None:
    torch.manual_seed(0)
    layer = nn.Linear(96, 200, bias=bias)
    x = torch.randn(1, num_rows, 96)
    expected = F.linear(x, layer.weight, layer.bias)
    apply_fast_linear(layer)
    out = layer(x)
    assert out.shape == expected.shape
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer(x.transpose(0, 1)), expected.transpose(0, 1), rtol=1e-5, atol=1e-5)


def test_apply_and_remove_keep_weights_tied_and_keys(smollm2) -> None:
    model = smollm2.model
    keys = list(model.state_dict())
    num_linear = sum(isinstance(m, nn.Linear) for m in model.modules())
    with fast_linear_set(model, on=False):
        assert not has_fast_linear(model)
        assert apply_fast_linear(model) == num_linear == 30 * 7 + 1  # q k v o gate up down + lm_head
        assert apply_fast_linear(model) == 0
        assert model.lm_head.weight is model.model.embed_tokens.weight
        assert list(model.state_dict()) == keys
        assert remove_fast_linear(model) == num_linear
        assert all(type(m) is nn.Linear for m in model.modules() if isinstance(m, nn.Linear))


def test_logits_match_plain_with_kv_cache(smollm2) -> None:
    model, tokenizer = smollm2.model, smollm2.tokenizer
    text = "The quick brown fox jumps over the lazy dog. " * 12
    ids = tokenizer(text, return_tensors="pt")["input_ids"]  # [1, >= 100]
    prefix, rest = ids[:, :32], ids[:, 32:]
    cache = DynamicCache(config=model.config)
    cache_kw = cache_argument(model)  # `cache` in transformers >= 5.2x, `past_key_values` before
    with torch.inference_mode():
        model(input_ids=prefix, **{cache_kw: cache})
        for k in sorted({1, 2, 4, fl.MAX_ROWS, 16, 64}):  # both ends of the fast range, and past it
            new = rest[:, :k]
            logits = {}
            for on in (False, True):
                with fast_linear_set(model, on=on):
                    logits[on] = model(input_ids=new, **{cache_kw: cache}).logits  # [1, k, vocab]
                cache.crop(-k)
            assert cache.get_seq_length() == prefix.shape[1]
            diff = (logits[True] - logits[False]).abs().max().item()
            assert diff < LOGIT_ATOL, f"k={k}: max |fast - plain| = {diff:.2e}"
            assert torch.equal(logits[True].argmax(-1), logits[False].argmax(-1))
