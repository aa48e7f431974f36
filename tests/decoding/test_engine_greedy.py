"""Greedy speculative output must equal the target's own greedy decoding, token for token.

The reference is Hugging Face ``generate(do_sample=False)`` on the same model object. A few
prompts and a few dozen tokens run in CI; the full language x drafter x depth matrix is ``slow``.
"""

from __future__ import annotations

import pytest
import torch

from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
from draftrl.decoding.generate import fixed_schedule, generate
from draftrl.drafters.layerskip import LayerSkipDrafter
from draftrl.drafters.ngram import NgramDrafter
from draftrl.prompts import LANGUAGES, load_prompts

NUM_TOKENS = 24


def chat_ids(tokenizer, text: str) -> list[int]:
    return list(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
    )


def prompts_by_language() -> dict[str, str]:
    """One tuning prompt per language (summaries) plus Python code editing."""
    out = {lang: load_prompts(languages=lang, tasks="summarize", split="tune")[0].prompt for lang in LANGUAGES}
    out["code"] = load_prompts(languages="en", tasks="code_edit", split="tune")[0].prompt
    return out


@pytest.fixture(scope="module")
def references(smollm2):
    """(prompt ids, greedy continuation) per language, from HF generate."""
    refs = {}
    for name, text in prompts_by_language().items():
        ids = chat_ids(smollm2.tokenizer, text)
        out = smollm2.model.generate(
            torch.tensor([ids]), max_new_tokens=NUM_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0
        )
        refs[name] = (ids, out[0, len(ids) :].tolist())
    return refs


def decode(model, drafter, ids, depth, width=1, verify_size=None) -> tuple[list[int], float]:
    engine = SpeculativeDecoder(model, drafter, EngineConfig(max_new_tokens=NUM_TOKENS))
    result = generate(engine, ids, fixed_schedule(depth, verify_size, width))
    return result.token_ids, result.mean_tokens_per_round


def make_drafter(kind: str, model):
    return NgramDrafter() if kind == "ngram" else LayerSkipDrafter(model, 12)


@pytest.mark.parametrize("depth", [0, 1, 2, 4, 8])
def test_ngram_chain_code(smollm2, references, depth):
    ids, ref = references["code"]
    out, tokens_per_round = decode(smollm2.model, NgramDrafter(), ids, depth)
    assert out == ref
    if depth >= 2:
        assert tokens_per_round > 1.0, "prompt lookup should accept something when editing code"


@pytest.mark.parametrize("language", ["en", "it", "zh", "es", "code"])
@pytest.mark.parametrize("kind", ["ngram", "layerskip"])
def test_chain_every_language(smollm2, references, language, kind):
    ids, ref = references[language]
    out, _ = decode(smollm2.model, make_drafter(kind, smollm2.model), ids, depth=3)
    assert out == ref


@pytest.mark.parametrize("kind", ["ngram", "layerskip"])
@pytest.mark.parametrize("depth,width,verify_size", [(3, 2, 4), (4, 3, 8), (2, 4, None)])
def test_tree_greedy_identity(smollm2, references, kind, depth, width, verify_size):
    ids, ref = references["code"]
    out, _ = decode(smollm2.model, make_drafter(kind, smollm2.model), ids, depth, width, verify_size)
    assert out == ref


@pytest.mark.slow
@pytest.mark.parametrize("language", ["en", "it", "zh", "es", "code"])
@pytest.mark.parametrize("kind", ["ngram", "layerskip"])
@pytest.mark.parametrize("depth,width,verify_size", [(1, 1, None), (2, 1, None), (4, 1, None), (8, 1, None),
                                                     (3, 2, 4), (4, 3, 8), (6, 4, 16)])
def test_full_matrix(smollm2, references, language, kind, depth, width, verify_size):
    ids, ref = references[language]
    out, _ = decode(smollm2.model, make_drafter(kind, smollm2.model), ids, depth, width, verify_size)
    assert out == ref


def test_width_one_tree_equals_chain(smollm2, references):
    """W = 1 through the tree path (V below the chain length) gives the chain's tokens."""
    ids, ref = references["en"]
    out, _ = decode(smollm2.model, LayerSkipDrafter(smollm2.model, 12), ids, depth=4, width=1, verify_size=2)
    assert out == ref


def test_prompt_beyond_the_context_is_refused_or_truncated_explicitly(capsys):
    """Finding 4: a prompt longer than the model's context minus max_new_tokens ran to the end with
    exit 0 and no warning; now the engine refuses it, and generate --truncate-prompt keeps its tail."""
    import pytest
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftrl.cli.generate import fit_prompt
    from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2,
                                         max_position_embeddings=32)).eval()
    engine = SpeculativeDecoder(model, None, EngineConfig(max_new_tokens=8))
    assert engine.max_context == 32
    with pytest.raises(ValueError, match=r"30 tokens and max_new_tokens=8, 38 in all, beyond the target's context of "
                                         r"32 tokens; shorten the prompt to 24 tokens"):
        engine.start(list(range(1, 31)))
    engine.start(list(range(1, 25)))  # 24 + 8 fits
    with pytest.raises(ValueError, match="truncate-prompt"):
        fit_prompt(list(range(30)), 8, 32, truncate=False)
    assert fit_prompt(list(range(30)), 8, 32, truncate=True) == list(range(6, 30))
    assert "truncated from 30 to its last 24 tokens" in capsys.readouterr().err


def test_tiny_lm_beyond_its_context_gets_the_engine_error():
    """The engine-law tests' TinyLM has 64 position embeddings and says so: a longer request fails with
    the engine's one-line error, not an IndexError from the model, and a request that fills it runs."""
    from tiny_lm import TinyLM, draft_of

    from draftrl.drafters.model import ModelDrafter

    target = TinyLM(3, max_len=64)
    engine = SpeculativeDecoder(target, ModelDrafter(draft_of(target, 0.7, 1), sampled=True),
                                EngineConfig(max_new_tokens=8, temperature=1.0, seed=0))
    assert engine.max_context == 64
    with pytest.raises(ValueError, match=r"60 tokens and max_new_tokens=8, 68 in all, beyond the target's context "
                                         r"of 64 tokens; shorten the prompt to 56 tokens") as err:
        engine.start([0, 1, 2] * 20)
    assert "\n" not in str(err.value)
    engine.start(([0, 1, 2] * 19)[:56])  # 56 + 8 = 64: every position the request reaches exists
    while not engine.finished:
        engine.round(4, None, 2)
    assert len(engine.output_ids) == 8
