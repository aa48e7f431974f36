"""``EngineConfig.compile``: the target's verify forward through ``torch.compile`` (issue 40).

Off by default (not yet measured on a GPU). What must hold whatever it is set to: float32 greedy
output token for token identical to plain decoding, for chains and trees, with the n-gram drafter
and a draft model. The fast test checks that verification (and only it) goes through what
``torch.compile`` returns; the slow ones run dynamo's graph capture of the engine's calls (eager
backend, a minute) and inductor's compilation (minutes on a CPU).
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from draftrl.config.env import EnvConfig
from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
from draftrl.drafters.model import ModelDrafter
from draftrl.drafters.ngram import NgramDrafter

PROMPT = [1, 5, 9, 2, 5, 9, 3]
NEW_TOKENS = 24


def _llama(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                         tie_word_embeddings=False)
    return LlamaForCausalLM(config).eval()


def _decode(target, drafter, compile: str, depth: int, width: int) -> list[int]:
    engine = SpeculativeDecoder(target, drafter, EngineConfig(max_new_tokens=NEW_TOKENS, compile=compile))
    engine.start(PROMPT)
    while not engine.finished:
        engine.round(depth, None, width)
    return engine.output_ids


def _check_identity(compile: str, cases: tuple[tuple[int, str], ...]) -> None:
    """(width, drafter kind) cases decode exactly as plain decoding does."""
    target, draft = _llama(0), _llama(1)
    plain = _decode(target, None, "off", 0, 1)
    for width, kind in cases:
        drafter = NgramDrafter() if kind == "ngram" else ModelDrafter(draft)
        assert _decode(target, drafter, compile, 4, width) == plain, (width, kind)


ALL = ((1, "ngram"), (1, "model"), (2, "ngram"), (2, "model"))


def test_the_verify_forward_calls_what_torch_compile_returns(monkeypatch):
    """The engine hands the target to torch.compile (the configured mode, dynamic shapes) and every
    verification goes through what it returns; the prefill stays eager; off compiles nothing."""
    asked, calls = [], []

    def fake_compile(model, **kwargs):
        asked.append(kwargs)
        return lambda **inputs: calls.append(inputs["input_ids"].shape[1]) or model(**inputs)

    monkeypatch.setattr(torch, "compile", fake_compile)
    target = _llama(0)
    plain = _decode(target, None, "off", 0, 1)
    assert asked == [] and calls == []
    engine = SpeculativeDecoder(target, NgramDrafter(),
                                EngineConfig(max_new_tokens=NEW_TOKENS, compile="reduce-overhead"))
    engine.start(PROMPT, prefill=False)  # no prefill: every round runs one verify forward
    rounds = 0
    while not engine.finished:
        engine.round(4)
        rounds += 1
    assert engine.output_ids == plain
    assert asked == [{"mode": "reduce-overhead", "dynamic": True}]
    assert len(calls) == rounds > 1 and calls[0] >= len(PROMPT)  # the first fed the prompt (and its drafts)


@pytest.mark.slow
def test_dynamo_captured_verify_forward_keeps_greedy_identity(monkeypatch):
    """dynamo's graph capture of the engine's verify calls (masks, positions, KV cache), with the
    eager backend: about a minute on a CPU."""
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: real(model, backend="eager", dynamic=True))
    torch._dynamo.reset()
    _check_identity("max-autotune", ((1, "ngram"), (2, "model")))  # a chain, and a tree under its mask


@pytest.mark.slow
def test_inductor_compiled_verify_forward_keeps_greedy_identity():
    torch._dynamo.reset()
    _check_identity("default", ALL)


def test_compile_modes_are_validated():
    with pytest.raises(ValueError, match="compile='fast' is not a torch.compile mode.*reduce-overhead"):
        EngineConfig(compile="fast")
    with pytest.raises(ValueError, match=r"env.compile='on' is not a torch.compile mode"):
        EnvConfig(compile="on")
    assert EngineConfig().compile == EnvConfig().compile == "off"
