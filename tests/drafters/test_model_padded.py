"""Draft models whose embedding matrix is padded differently from the target's, over one tokenizer
(Qwen2.5-7B's 152,064 rows with Qwen2.5-0.5B's 151,936, tokenizer 151,665): the draft proposes
only the tokenizer's ids, its q lives in the target's id space (zero elsewhere, renormalised), the
target's p is untouched. Checked on both sides of the padding:

- a padded draft (``SharedVocab(3, 5, 3)``: 2 rows past a 3-id tokenizer, with large logits there,
  so a draft that proposed them would be caught), and
- a padded target (``SharedVocab(5, 3, 3)``: the target's 2 extra rows carry mass, so it emits ids
  the draft has no row for; the draft reads them as id 0),

by test_engine_law's law tests at temperature 1 (deterministic and sampled trees; chains in the
``slow`` set, about 40 s each; resample-from-p rejected by the same tests), by float32 greedy identity
with real Llamas and tokenizers through the drafter registry, and by the q vectors a sampled tree carries.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "decoding"))
from test_engine_law import (  # noqa: E402
    ALPHA,
    CONTROL_TOKENS,
    LENGTH,
    NOISE,
    PARAMS,
    POSITIONS,
    PROMPT,
    REQUEST_TOKENS,
    RUNS,
    check,
    run_requests,
)
from tiny_lm import (  # noqa: E402
    TinyLM,
    chisquare_law,
    draft_of,
    next_token_laws,
    pooled_law_test,
    sequence_law,
    worst_case_detectable_tv,
)

from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder  # noqa: E402
from draftrl.drafters.model import ModelDrafter  # noqa: E402
from draftrl.drafters.registry import build_drafter  # noqa: E402
from draftrl.models import LoadedModel, SharedVocab  # noqa: E402
from draftrl.models.distribution import SamplingParams, generator_for  # noqa: E402

TOKENS = 3  # the tokenizer's ids
PADDING = 2  # rows past them
#: resample-from-p requests against the padded target: its first 5 tokens have 5 ** 5 sequences, and
#: test_engine_law's 300 requests left that chi-square's p-value at 0.02-0.05 (per position: 1e-46)
PADDED_TARGET_CONTROL_RUNS = 1000

pytestmark = pytest.mark.usefixtures("one_thread")


def padded(model: TinyLM, rows: int, seed: int, bias: float = 0.0) -> TinyLM:
    """``model`` with its embedding and output matrices grown to ``rows`` ids; the new output columns
    random, shifted by ``bias`` (large: a draft that proposed them would do so often)."""
    dim, vocab = model.out.shape
    out = TinyLM(rows, dim, max_len=model.pos.shape[0])
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        out.pos.copy_(model.pos)
        out.qkv.copy_(model.qkv)
        out.embed[:vocab] = model.embed
        out.embed[vocab:] = torch.randn(rows - vocab, dim, generator=g)
        out.out[:, :vocab] = model.out
        out.out[:, vocab:] = 1.5 * torch.randn(dim, rows - vocab, generator=g) / dim**0.5 + bias  # TinyLM's spread
    return out


def cropped(model: TinyLM, rows: int) -> TinyLM:
    """``model`` keeping only its first ``rows`` ids."""
    dim = model.out.shape[0]
    out = TinyLM(rows, dim, max_len=model.pos.shape[0])
    with torch.no_grad():
        out.pos.copy_(model.pos)
        out.qkv.copy_(model.qkv)
        out.embed.copy_(model.embed[:rows])
        out.out.copy_(model.out[:, :rows])
    return out


def with_vocab(vocab: SharedVocab):
    return lambda target, draft, sampled: ModelDrafter(draft, sampled, vocab=vocab)


# ------------------------------------------------------------------------------- a padded draft
@pytest.fixture(scope="module")
def padded_draft_models():
    target = TinyLM(TOKENS, seed=0)
    return target, padded(draft_of(target, noise=NOISE, seed=1), TOKENS + PADDING, seed=2, bias=3.0)


@pytest.fixture(scope="module")
def padded_draft_law(padded_draft_models):
    return sequence_law(padded_draft_models[0], PROMPT, LENGTH, PARAMS)


@pytest.mark.parametrize("shape", [pytest.param("chain", marks=pytest.mark.slow), "deterministic-tree", "sampled-tree"])
def test_a_padded_draft_keeps_the_targets_law(padded_draft_models, padded_draft_law, shape):
    """test_engine_law's check (power 0.9 against a mean total variation of 0.02; resample-from-p rejected)."""
    check(padded_draft_models, padded_draft_law, shape, RUNS, REQUEST_TOKENS,
          make_drafter=with_vocab(SharedVocab(TOKENS, TOKENS + PADDING, TOKENS)))


def test_a_padded_drafts_q_lives_on_the_tokenizers_ids(padded_draft_models):
    target, draft = padded_draft_models
    drafter = ModelDrafter(draft, sampled=True, vocab=SharedVocab(TOKENS, TOKENS + PADDING, TOKENS))
    drafter.reset(PROMPT)
    tree = drafter.propose(PROMPT, 3, 2, PARAMS, generator_for("cpu", 0))
    assert set(tree.tokens) <= set(range(TOKENS)) and len(tree.q) >= 3
    for q in tree.q.values():
        assert q.shape == (TOKENS,) and abs(float(q.sum()) - 1) < 1e-6
    bare = ModelDrafter(draft, sampled=True)  # unmapped, the padded rows' logits dominate
    bare.reset(PROMPT)
    assert max(bare.propose(PROMPT, 3, 2, PARAMS, generator_for("cpu", 0)).tokens) >= TOKENS


# ------------------------------------------------------------------------------ a padded target
@pytest.fixture(scope="module")
def padded_target_models():
    target = padded(TinyLM(TOKENS, seed=0), TOKENS + PADDING, seed=3)
    return target, draft_of(cropped(target, TOKENS), noise=NOISE, seed=1)


def law_tests(target, run, law) -> tuple[float, float, int, int]:
    """(chi-square p of the first ``LENGTH`` tokens, pooled per-position p, its df, tokens) for ``run``
    against the target's whole law (test_engine_law's two tests, over the target's 5 ids)."""
    laws = np.concatenate([next_token_laws(target, PROMPT + out, len(PROMPT), PARAMS) for out in run.outputs])
    tokens = np.concatenate([np.array(out) for out in run.outputs])
    classes = np.minimum(np.concatenate([np.array(where) for where in run.positions]), POSITIONS)
    p_pos, _, df = pooled_law_test(classes, tokens, laws)
    return chisquare_law(run.heads, law)[0], p_pos, df, len(tokens)


@pytest.mark.parametrize("shape", [pytest.param("chain", marks=pytest.mark.slow), "sampled-tree"])
def test_a_padded_target_keeps_its_own_law(padded_target_models, shape):
    """The target's p keeps its padding rows (exactness is w.r.t. its own distribution): it emits
    ids 3 and 4, which the draft never proposes (reachable through recovery) and reads as 0. Both
    law tests pass at false alarm 1e-4; the per-position one detects a mean total variation of
    0.03 with power 0.9 whatever its shape; resample-from-p (``PADDED_TARGET_CONTROL_RUNS``
    requests) fails both."""
    target, draft = padded_target_models
    law = sequence_law(target, PROMPT, LENGTH, PARAMS)
    make = with_vocab(SharedVocab(TOKENS + PADDING, TOKENS, TOKENS))
    good = run_requests(padded_target_models, shape, "correct", RUNS, tokens=REQUEST_TOKENS, make_drafter=make)
    p_good, pos_good, df, num_tokens = law_tests(target, good, law)
    bad = run_requests(padded_target_models, shape, "resample-from-p", PADDED_TARGET_CONTROL_RUNS, seed=1,
                       tokens=CONTROL_TOKENS, make_drafter=make)
    p_bad, pos_bad, _, _ = law_tests(target, bad, law)
    emitted = np.concatenate([np.array(out) for out in good.outputs])
    print(f"\n{shape}: accepted/round={good.mean_accepted:.2f} "
          f"padding ids emitted={float((emitted >= TOKENS).mean()):.3f} "
          f"p(correct)={p_good:.3g} positions p(correct)={pos_good:.3g} p(resample-from-p)={p_bad:.3g} "
          f"positions p(resample-from-p)={pos_bad:.3g} "
          f"detectable mean tv={worst_case_detectable_tv(num_tokens, df, ALPHA):.4f}")
    assert good.mean_accepted > 0.3 and (emitted >= TOKENS).mean() > 0.05
    assert worst_case_detectable_tv(num_tokens, df, ALPHA) <= 0.03
    assert p_good > ALPHA and pos_good > ALPHA
    assert p_bad < ALPHA and pos_bad < ALPHA


# ------------------------------------------------------------- real Llamas, through the registry
def tokenizer(size: int) -> PreTrainedTokenizerFast:
    vocab = {f"t{i}": i for i in range(size)}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="t0")))


def llama(rows: int, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=rows, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)  # a peaked law: greedy ties are out of reach
    return model


def resized(model: LlamaForCausalLM, rows: int, boost: bool = False) -> LlamaForCausalLM:
    """A copy of ``model`` with ``rows`` embedding rows (the new output rows small, or with ``boost``
    the largest: a draft that proposed them would do so at every step)."""
    copy = llama(model.config.vocab_size)
    copy.load_state_dict(model.state_dict())
    copy.resize_token_embeddings(rows, mean_resizing=False)
    if boost:
        with torch.no_grad():
            copy.lm_head.weight[model.config.vocab_size :] = (
                5.0 * copy.lm_head.weight[: model.config.vocab_size].abs().max())
    return copy.eval()


@torch.no_grad()
def greedy(model, prompt: list[int], tokens: int) -> list[int]:
    """Plain greedy decoding, one full forward per token (no EOS: the engine here has none either)."""
    ids = list(prompt)
    for _ in range(tokens):
        ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


PAIRS = {
    # name: (target rows, draft rows); the tokenizer has 40 ids
    "padded-draft": (40, 48),
    "padded-target": (48, 40),
    "both-padded": (44, 48),
}


@pytest.mark.parametrize("pair", list(PAIRS))
def test_float32_greedy_output_is_the_targets_through_the_registry(pair):
    """The draft is the target itself, its padding rows scoring highest (proposed at every step if
    the draft were not restricted to the tokenizer's ids): over those ids it agrees with the target,
    so most drafts are accepted, and greedy output is the target's, chain and tree."""
    target_rows, draft_rows = PAIRS[pair]
    words = tokenizer(40)
    base = llama(40)
    target_model = resized(base, target_rows) if target_rows != 40 else base
    target = LoadedModel(target_model, words, "target")
    draft = LoadedModel(resized(base, draft_rows, boost=True) if draft_rows != 40 else base, words, "draft")
    prompt = [3, 9, 27, 1, 17, 5]
    plain = greedy(target_model, prompt, 20)
    for width in (1, 3):
        drafter = build_drafter("draft", target, load=lambda spec, dtype, device: draft)
        assert isinstance(drafter, ModelDrafter) and drafter.vocab == SharedVocab(target_rows, draft_rows, 40)
        engine = SpeculativeDecoder(target_model, drafter, EngineConfig(max_new_tokens=20))
        engine.start(prompt)
        accepted = proposed = 0
        while not engine.finished:
            result = engine.round(3, None, width)
            accepted, proposed = accepted + result.num_accepted, proposed + result.num_proposed
        assert engine.output_ids == plain
        assert accepted >= 0.5 * 20, (pair, width, accepted)


def test_another_tokenizer_is_refused_in_one_line():
    base = llama(40)
    target = LoadedModel(base, tokenizer(40), "target")
    other = LoadedModel(resized(base, 48), tokenizer(48), "draft")
    with pytest.raises(ValueError, match=r"tokenizers differ at token id 40") as info:
        build_drafter("draft", target, load=lambda spec, dtype, device: other)
    assert "\n" not in str(info.value)


def test_the_sampled_q_of_a_padded_llama_draft_is_zero_past_the_tokenizer():
    base = llama(40)
    drafter = ModelDrafter(resized(base, 48, boost=True), sampled=True, vocab=SharedVocab(44, 48, 40))
    drafter.reset([3, 9, 27])
    tree = drafter.propose([3, 9, 27], 3, 2, SamplingParams(temperature=1.0), generator_for("cpu", 0))
    assert max(tree.tokens) < 40
    for q in tree.q.values():
        assert q.shape == (44,) and float(q[40:].sum()) == 0.0 and abs(float(q.sum()) - 1) < 1e-5
