"""Keyed sampling (``EngineConfig.keyed``): a sampled run checked token for token like a greedy one.

Each output position t draws its token by the inverse CDF at a uniform keyed by (request seed, t)
(``models.distribution.sample_keyed``). With deterministic drafts, speculative decoding accepts a child
iff it equals that position's draw, so in float32 it must emit exactly what plain decoding with the
same keyed stream emits, whatever the depth, width or verify size; and the law stays the target's.

Tests, each with a control that the same test rejects:

- ``sample_keyed`` draws the seeds' test vector p = (0.5, 0.3, 0.2): chi-square at alpha 1e-4 over
  20,000 keys (power 0.9 against any deviation of total variation 0.027); the control squares the
  keyed uniform (a biased stream) and misses by far more;
- the keyed engine (chains, trees, verify sizes, top-k, top-p, n-gram and model drafters) equals a
  plain keyed decoder written independently (full forwards, no cache) on every request; the
  off-by-one rule (one accepted token too many at the first rejection) diverges;
- the law of the first 5 tokens of the keyed engine over 1,000 requests (chi-square, alpha 1e-4;
  detects any total variation of 0.126 with probability 0.9, ``worst_case_detectable_tv``); the
  control keys the stream by the seed alone (every position the same noise) and is rejected.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_lm import TinyLM, chisquare_law, draft_of, sequence_law, worst_case_detectable_tv

import draftrl.models.distribution as distribution
from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
from draftrl.drafters.model import ModelDrafter
from draftrl.drafters.ngram import NgramDrafter
from draftrl.models.distribution import SamplingParams, logits_to_probs, sample_keyed

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

ALPHA = 1e-4
P = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)


def frequencies(draw, n: int) -> np.ndarray:
    counts = np.bincount([int(draw(seed)) for seed in range(n)], minlength=3)
    return counts


def test_sample_keyed_follows_the_row_and_the_wrong_trick_does_not():
    from scipy import stats

    n = 20_000
    good = frequencies(lambda seed: sample_keyed(P[None], seed, [7])[0], n)
    assert stats.chisquare(good, P.numpy() * n).pvalue > ALPHA
    assert worst_case_detectable_tv(n, 2, ALPHA) < 0.03

    def wrong(seed):  # the keyed uniform squared: biased toward the first tokens of the row
        u = distribution.keyed_uniforms(seed, [7], "cpu")[:, None] ** 2
        return distribution.sample_rows(P[None], None, u=u)[0]

    bad = frequencies(wrong, n)
    assert stats.chisquare(bad, P.numpy() * n).pvalue < ALPHA
    assert 0.5 * np.abs(bad / n - P.numpy()).sum() > 0.05


def test_the_key_decides_the_draw():
    row = torch.softmax(torch.randn(1, 50, generator=torch.Generator().manual_seed(0)), -1)
    assert sample_keyed(row, 3, [5]) == sample_keyed(row, 3, [5])
    draws = {int(sample_keyed(row, 3, [t])[0]) for t in range(40)}
    assert len(draws) > 5  # positions get different streams
    assert len({int(sample_keyed(row, s, [5])[0]) for s in range(40)}) > 5  # so do seeds
    with pytest.raises(ValueError, match="non-negative"):
        sample_keyed(torch.tensor([[0.5, -0.1, 0.6]]), 0, [0])


VOCAB = 12
PROMPT = [0, 1, 2, 3, 1, 2]


@torch.inference_mode()
def plain_keyed(model, prompt: list[int], tokens: int, params: SamplingParams, seed: int) -> list[int]:
    """Plain decoding from the keyed stream, written apart from the engine: a full forward per token."""
    ids = list(prompt)
    for t in range(tokens):
        logits = model(torch.tensor([ids])).logits[0, -1:]
        ids.append(int(sample_keyed(logits_to_probs(logits.float(), params), seed, [t])[0]))
    return ids[len(prompt):]


@pytest.fixture(scope="module")
def models():
    target = TinyLM(VOCAB, seed=3, scale=3.0)
    return target, draft_of(target, noise=0.5, seed=4)


def keyed_engine(models, drafter: str, params: SamplingParams, tokens: int, sampler: str = "correct"):
    target, draft = models
    made = NgramDrafter(1, 3) if drafter == "ngram" else ModelDrafter(draft, sampled=False)
    config = EngineConfig(max_new_tokens=tokens, temperature=params.temperature, top_k=params.top_k,
                          top_p=params.top_p, keyed=True, sampler=sampler)
    return SpeculativeDecoder(target, made, config)


CASES = [  # (drafter, sampling, width, verify_size)
    ("model", SamplingParams(temperature=1.0), 1, None),
    ("model", SamplingParams(temperature=0.7), 2, None),
    ("model", SamplingParams(temperature=1.0, top_k=4), 2, 3),
    ("model", SamplingParams(temperature=0.8, top_p=0.8), 3, None),
    ("ngram", SamplingParams(temperature=1.0), 2, None),
]


@pytest.mark.parametrize("drafter, params, width, verify_size", CASES)
def test_keyed_engine_emits_what_plain_keyed_decoding_emits(models, drafter, params, width, verify_size):
    tokens, depths = 20, (3, 1, 4, 2, 0)
    engine = keyed_engine(models, drafter, params, tokens)
    accepted = 0
    for seed in range(12):
        engine.start(PROMPT, seed=seed, prefill=seed % 2 == 0)
        rounds = 0
        while not engine.finished:
            accepted += engine.round(depths[rounds % len(depths)], verify_size, width).num_accepted
            rounds += 1
        assert engine.output_ids == plain_keyed(models[0], PROMPT, tokens, params, seed), seed
    assert accepted > 12  # the drafts were accepted often enough to exercise the walk


def test_off_by_one_breaks_the_identity(models):
    params = SamplingParams(temperature=1.0)
    engine = keyed_engine(models, "model", params, 20, sampler="off-by-one")
    differ = 0
    for seed in range(12):
        engine.start(PROMPT, seed=seed)
        while not engine.finished:
            engine.round(3)
        differ += engine.output_ids != plain_keyed(models[0], PROMPT, 20, params, seed)
    assert differ >= 6


def test_keyed_needs_deterministic_drafts(models):
    config = EngineConfig(max_new_tokens=4, temperature=1.0, keyed=True)
    engine = SpeculativeDecoder(models[0], ModelDrafter(models[1], sampled=True), config)
    with pytest.raises(ValueError, match="deterministic drafts"):
        engine.start(PROMPT)


LAW_PROMPT = [0, 1, 2]
LENGTH = 5


def keyed_heads(models, runs: int) -> list[tuple[int, ...]]:
    params = SamplingParams(temperature=1.0)
    engine = keyed_engine(models, "model", params, LENGTH)
    heads = []
    for seed in range(runs):
        engine.start(LAW_PROMPT, seed=10_000 + seed)
        while not engine.finished:
            engine.round(4 if not engine.output_ids else 2, None, 2)
        heads.append(tuple(engine.output_ids))
    return heads


def test_keyed_engine_law_and_a_stream_without_positions(monkeypatch):
    target = TinyLM(3, seed=0)
    models = (target, draft_of(target, noise=0.7, seed=1))
    law = sequence_law(target, LAW_PROMPT, LENGTH, SamplingParams(temperature=1.0))
    runs = 1000
    p_good, _, df = chisquare_law(keyed_heads(models, runs), law)
    assert p_good > ALPHA
    assert worst_case_detectable_tv(runs, df, ALPHA) < 0.13
    # control: a stream keyed by the seed alone repeats one noise at every position
    real = distribution.keyed_seed
    monkeypatch.setattr(distribution, "keyed_seed", lambda seed, position: real(seed, 0))
    p_bad, _, _ = chisquare_law(keyed_heads(models, 300), law)
    assert p_bad < ALPHA


def test_a_request_samples_as_start_says(models):
    """``start(sampling=...)`` decodes that request as an engine built with that sampling would."""
    target, draft = models
    mixed = SpeculativeDecoder(target, ModelDrafter(draft), EngineConfig(max_new_tokens=12, temperature=1.0))
    for params in (SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(), SamplingParams(temperature=1.0)):
        alone = SpeculativeDecoder(target, ModelDrafter(draft), EngineConfig(
            max_new_tokens=12, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p))
        for seed in range(3):
            outputs = []
            for engine, sampling in ((mixed, params), (alone, None)):
                engine.start(PROMPT, seed=seed, sampling=sampling)
                while not engine.finished:
                    engine.round(3, None, 2)
                outputs.append(list(engine.output_ids))
                assert engine.sampling == params
            assert outputs[0] == outputs[1]
    mixed.start(PROMPT, seed=0)
    assert mixed.sampling == SamplingParams(temperature=1.0)  # None: the engine config's again


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.8, top_k=5)])
def test_target_features_are_what_the_forward_computed(models, params):
    """``RoundResult.target_features``: raw softmax top-1 and entropy at the row of the last emitted token,
    and the mean p of the accepted drafts, each recomputed here with a full forward."""
    target, draft = models
    engine = SpeculativeDecoder(target, ModelDrafter(draft), EngineConfig(
        max_new_tokens=40, temperature=params.temperature, top_k=params.top_k, seed=1))
    engine.start(PROMPT)
    seen_accepted = 0
    while not engine.finished:
        before = list(engine.ids)
        rnd = engine.round(3)
        ids = before + rnd.tokens
        with torch.inference_mode():
            logits = target(torch.tensor([ids[:-1]])).logits[0].double()
        raw = torch.softmax(logits[-1], -1)
        features = rnd.target_features
        assert features["target_top1_prob"] == pytest.approx(float(raw.max()), rel=1e-5)
        entropy = float(-(raw * raw.log()).sum())
        assert features["target_entropy"] == pytest.approx(entropy, rel=1e-4, abs=1e-6)
        p = logits_to_probs(logits[len(before) - 1:], params).double()
        p = p / p.sum(-1, keepdim=True)
        accepted = [float(p[i, tok]) for i, tok in enumerate(rnd.tokens[: rnd.num_accepted])]
        expected = sum(accepted) / len(accepted) if accepted else 0.0
        assert features["accepted_mean_p"] == pytest.approx(expected, rel=1e-5, abs=1e-9)
        seen_accepted += rnd.num_accepted
    assert seen_accepted > 3
