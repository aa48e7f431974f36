"""Engine-level exactness with power: the real SpeculativeDecoder on tiny synthetic models.

Target and draft are :class:`tiny_lm.TinyLM` attention models (vocabulary of 3, fixed random
weights; the draft's output weights carry extra noise so that it is often rejected). Requests start
after a fixed prompt; rounds draft at depths 4, 2, 3, 1, 4, ... (the first at depth 4), so a round
emits up to 5 tokens. Two laws are tested on the same requests, each at false alarm ``ALPHA``, and
the engine with the known-wrong ``resample-from-p`` sampler must fail both:

- The whole law of the first ``LENGTH`` = 5 tokens (243 sequences, enumerated from the target's
  conditionals; one depth-4 round can emit all of them), chi-square over the requests. Against a
  deviation of any shape it detects (probability 0.9) a total variation of
  ``worst_case_detectable_tv(n, df, ALPHA)``: 0.126 with the ``RUNS`` requests of the fast tests,
  0.02 with the ``RUNS_SLOW`` requests of the ``slow`` ones.
- The per-position law of every emitted token (``REQUEST_TOKENS`` per request): each token, given
  everything before it, must follow the target's exact next-token law in its context (computed by
  one causal forward), whatever round emitted it. Tokens are classed by their position in their
  round (1, 2, 3-5: known before the token is drawn; positions 4 and 5 are rare), and
  ``tiny_lm.pooled_law_test`` tests, per class, the mean of the tokens' conditional laws (6
  degrees of freedom). The fast tests' 24,000 tokens detect any deviation of 0.02 in mean total
  variation with probability 0.9 (``test_power_of_the_design``; each run also computes the exact
  worst case for the contexts it visited, about 0.017). What it cannot see: deviations that cancel
  between contexts of the same class; the first test covers those, at a coarser resolution.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from tiny_lm import (
    TinyLM,
    chisquare_law,
    draft_of,
    next_token_laws,
    pooled_law_test,
    pooled_worst_case_tv,
    sequence_law,
    tiny_llama,
    worst_case_detectable_tv,
)

from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
from draftrl.drafters.eagle3 import Eagle3Config, Eagle3Drafter, Eagle3Head
from draftrl.drafters.mixed import MixedDrafter
from draftrl.drafters.model import ModelDrafter
from draftrl.drafters.ngram import NgramDrafter
from draftrl.models.distribution import SamplingParams

VOCAB = 3
PROMPT = [0, 1, 2]
LENGTH = 5  # emitted tokens per request: one depth-4 round can emit them all
DEPTHS = (4, 2, 3, 1)  # first round at depth 4, then cycling: every depth up to 4 occurs
ALPHA = 1e-4  # probability that a correct engine fails one test
RUNS = 1000  # requests of the correct engine per fast test
REQUEST_TOKENS = 24  # tokens per request in the fast tests: 24,000 tokens detect a mean TV of 0.02
POSITIONS = 3  # classes of the per-position test: round positions 1, 2 and 3-5
CONTROL_RUNS = 300  # requests of the wrong engine: it misses by far more than the correct one may
# 4,800 tokens: at 10 tokens a request, resample-from-p on sampled-tree-verify-4 passed the per-position test
# (p = 0.03)
CONTROL_TOKENS = 16
TV = 0.02  # total variation detected with probability 0.9
RUNS_SLOW = 82_000  # the correct engine in the slow tests: any total variation of 0.02 is detected (~23 min a shape)
NOISE = 0.7  # the draft's extra output noise: about 0.9-1.2 accepted draft tokens per round
TEMPERATURE = 1.0
PARAMS = SamplingParams(temperature=TEMPERATURE)

#: (sampled drafter, width, verify_size)
SHAPES = {
    "chain": (True, 1, None),
    "deterministic-tree": (False, 2, None),
    "sampled-tree": (True, 2, None),
    "sampled-tree-verify-4": (True, 2, 4),  # the target verifies whole sibling groups, 4 nodes at most
    # the first round's tree verified inside the prefill (start(prefill=False), as generate and the envs run)
    "sampled-tree-fused": (True, 2, None),
}
FAST = ["chain", "deterministic-tree", "sampled-tree", "sampled-tree-fused"]
#: the same shapes drafted by an EAGLE-3 head (drafters/eagle3.py) over a 3-layer Llama target's hidden
#: states; its draft vocabulary leaves one of the 3 tokens out (q = 0 there: reachable only by recovery)
EAGLE3_SHAPES = {"eagle3-chain": (True, 1, None), "eagle3-sampled-tree": (True, 2, None),
                 # rounds drafted by n-gram lookup (one-hot q) when a 3-gram matches, else by the sampled head
                 "sam-sampled-tree": (True, 2, None)}
SHAPES.update(EAGLE3_SHAPES)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def models():
    target = TinyLM(VOCAB, seed=0)
    return target, draft_of(target, noise=NOISE, seed=1)


@pytest.fixture(scope="module")
def law(models):
    return sequence_law(models[0], PROMPT, LENGTH, PARAMS)


def eagle3_head(target, seed: int = 1) -> Eagle3Head:
    """A random EAGLE-3 head for ``target`` over the draft vocabulary {0, 1}, its logits spread like the target's."""
    torch.manual_seed(seed)
    head = Eagle3Head(Eagle3Config.for_target(target.config, draft_vocab_size=2, aux_layers=(0, 1, 2)))
    head.set_draft_vocab(torch.tensor([0, 1]))
    with torch.no_grad():
        head.lm_head.weight.normal_(0.0, 1.0)
    return head.eval()


@pytest.fixture(scope="module")
def eagle3_models():
    target = tiny_llama(VOCAB, seed=0)
    return target, eagle3_head(target)


@pytest.fixture(scope="module")
def eagle3_law(eagle3_models):
    return sequence_law(eagle3_models[0], PROMPT, LENGTH, PARAMS)


@dataclass
class Run:
    """What ``run_requests`` saw: per request its output and each token's position in its round."""

    outputs: list[list[int]]
    positions: list[list[int]]
    mean_accepted: float
    """accepted draft tokens per round"""

    @property
    def heads(self) -> list[tuple[int, ...]]:
        """The first ``LENGTH`` tokens of every request: independent draws of the enumerated law."""
        return [tuple(out[:LENGTH]) for out in self.outputs]


def run_requests(models, shape: str, sampler: str, runs: int, seed: int = 0, tokens: int = LENGTH,
                 make_drafter=None) -> Run:
    """``runs`` independent requests of ``tokens`` tokens each through the real engine; the drafter is
    ``make_drafter(target, draft, sampled)`` when given, else the draft's natural one."""
    target, draft = models
    sampled, width, verify_size = SHAPES[shape]
    config = EngineConfig(max_new_tokens=tokens, temperature=TEMPERATURE, seed=seed, sampler=sampler)
    if make_drafter is not None:
        drafter = make_drafter(target, draft, sampled)
    elif isinstance(draft, Eagle3Head):
        drafter = Eagle3Drafter(draft, target, sampled)
    else:
        drafter = ModelDrafter(draft, sampled)
    if shape.startswith("sam-"):
        drafter = MixedDrafter(NgramDrafter(1, 3, first="latest"), drafter, min_match=3)
    engine = SpeculativeDecoder(target, drafter, config)
    outputs, positions, accepted, rounds = [], [], 0, 0
    for _ in range(runs):
        engine.start(PROMPT, prefill=not shape.endswith("-fused"))
        where: list[int] = []
        while not engine.finished:
            result = engine.round(DEPTHS[rounds % len(DEPTHS)] if engine.output_ids else DEPTHS[0], verify_size, width)
            where.extend(range(1, result.num_emitted + 1))
            accepted += result.num_accepted
            rounds += 1
        outputs.append(list(engine.output_ids))
        positions.append(where)
    return Run(outputs, positions, accepted / rounds)


def position_test(target, run: Run) -> tuple[float, float, int, float, int]:
    """``pooled_law_test`` of all tokens of ``run``, classed by their position in their round
    (1, 2, ..., ``POSITIONS`` and later): (p-value, statistic, df, exact worst-case detectable mean
    TV, tokens)."""
    laws = np.concatenate([next_token_laws(target, PROMPT + out, len(PROMPT), PARAMS) for out in run.outputs])
    tokens = np.concatenate([np.array(out) for out in run.outputs])
    classes = np.minimum(np.concatenate([np.array(where) for where in run.positions]), POSITIONS)
    p, stat, df = pooled_law_test(classes, tokens, laws)
    return p, stat, df, pooled_worst_case_tv(classes, laws, ALPHA), len(tokens)


def empirical_tv(samples: list[tuple[int, ...]], law: dict[tuple[int, ...], float]) -> float:
    keys, counts = np.unique(np.array(samples), axis=0, return_counts=True)
    freq = {tuple(k): c / len(samples) for k, c in zip(keys.tolist(), counts)}
    return 0.5 * sum(abs(freq.get(k, 0.0) - law.get(k, 0.0)) for k in set(freq) | set(law))


def check(models, law, shape: str, runs: int, tokens: int, make_drafter=None, control_runs: int = CONTROL_RUNS,
          min_accepted: float = 0.4) -> None:
    """``runs`` requests of ``tokens`` tokens pass both tests (the enumerated law of the first
    ``LENGTH`` tokens, the per-position law of all tokens, the latter with power 0.9 against a mean
    TV of ``TV`` for the contexts visited); resample-from-p (``control_runs`` requests) fails both.
    The drafts must be accepted ``min_accepted`` tokens a round at least, or the rules go unexercised."""
    good = run_requests(models, shape, "correct", runs, tokens=tokens, make_drafter=make_drafter)
    p_good, stat, df = chisquare_law(good.heads, law)
    pos_good, pos_stat, pos_df, detectable, num_tokens = position_test(models[0], good)
    bad = run_requests(models, shape, "resample-from-p", control_runs, seed=1, tokens=CONTROL_TOKENS,
                       make_drafter=make_drafter)
    p_bad = chisquare_law(bad.heads, law)[0]
    pos_bad, _, _, _, bad_tokens = position_test(models[0], bad)
    print(
        f"\n{shape}: accepted/round={good.mean_accepted:.2f}\n"
        f"  first {LENGTH} tokens: n={runs} df={df} p(correct)={p_good:.3g} "
        f"tv(correct)={empirical_tv(good.heads, law):.4f} "
        f"p(resample-from-p, n={control_runs})={p_bad:.3g} tv(resample-from-p)={empirical_tv(bad.heads, law):.4f} "
        f"worst-case detectable tv={worst_case_detectable_tv(runs, df, ALPHA):.3f}\n"
        f"  positions: tokens={num_tokens} df={pos_df} p(correct)={pos_good:.3g} "
        f"p(resample-from-p, {bad_tokens} tokens)={pos_bad:.3g} worst-case detectable mean tv={detectable:.4f} "
        f"(bound {worst_case_detectable_tv(num_tokens, pos_df, ALPHA):.4f})"
    )
    assert good.mean_accepted > min_accepted, "the draft must be accepted often, or the rules are not exercised"
    assert p_good > ALPHA, (f"the engine's {shape} law is off: chi-square p = {p_good:.3g} "
                            f"(statistic {stat:.1f}, df {df})")
    assert pos_good > ALPHA, (f"the engine's {shape} per-position law is off: p = {pos_good:.3g} "
                              f"(statistic {pos_stat:.1f}, df {pos_df})")
    assert detectable <= TV, f"the {shape} run detects only a mean total variation of {detectable:.4f}, not {TV}"
    assert p_bad < ALPHA, f"resample-from-p was not caught on {shape}: p = {p_bad:.3g}"
    assert pos_bad < ALPHA, f"resample-from-p was not caught on {shape} by the per-position law: p = {pos_bad:.3g}"


@pytest.mark.parametrize("shape", [s if s in FAST else pytest.param(s, marks=pytest.mark.slow)
                                   for s in SHAPES if s not in EAGLE3_SHAPES])
def test_engine_emits_the_target_law(models, law, shape):
    check(models, law, shape, RUNS, REQUEST_TOKENS)


@pytest.mark.parametrize("shape", list(EAGLE3_SHAPES))
def test_engine_emits_the_target_law_with_an_eagle3_head(eagle3_models, eagle3_law, shape):
    check(eagle3_models, eagle3_law, shape, RUNS, REQUEST_TOKENS)


@pytest.mark.slow
@pytest.mark.parametrize("shape", [s for s in SHAPES if s not in EAGLE3_SHAPES])
def test_engine_emits_the_target_law_to_tv_0_02(models, law, shape):
    check(models, law, shape, RUNS_SLOW, LENGTH)


def test_power_of_the_design():
    """Against any deviation of total variation 0.02 with probability 0.9: the per-position law of
    the fast runs, and the whole law of the first ``LENGTH`` tokens in the slow runs (df up to 242)."""
    assert worst_case_detectable_tv(RUNS * REQUEST_TOKENS, (VOCAB - 1) * POSITIONS, ALPHA) <= TV
    assert worst_case_detectable_tv(RUNS_SLOW, VOCAB**LENGTH - 1, ALPHA) <= TV
    assert worst_case_detectable_tv(RUNS, 40, ALPHA) <= 0.15
