"""Engine-level exactness with power: the real SpeculativeDecoder on tiny synthetic models.

Target and draft are :class:`tiny_lm.TinyLM` attention models (vocabulary of 3, fixed random
weights; the draft's output weights carry extra noise so that it is often rejected). A request
emits ``LENGTH`` = 5 tokens after a fixed prompt, so a depth-4 round can emit all of them (four
accepted and a bonus). The exact law of the 5 emitted tokens (243 sequences) is enumerated from the
target's own conditionals; thousands of independent requests through ``SpeculativeDecoder`` must
follow it (chi-square, false alarm ``ALPHA`` per test), and the engine with the known-wrong
``resample-from-p`` sampler must be rejected by the same check.

Power: against a deviation of any shape, the chi-square test with n requests detects (probability
0.9) a total variation of ``worst_case_detectable_tv(n, df, ALPHA)``: about 0.15 for the fast runs
below (``RUNS``) and 0.02 for the ``slow`` runs (``RUNS_SLOW``). Deviations concentrated on a few sequences,
like those of real sampler bugs, are detected far below these bounds.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_lm import TinyLM, chisquare_law, draft_of, sequence_law, worst_case_detectable_tv

from draftrl.decoding.drafters import ModelDrafter
from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
from draftrl.decoding.sampling import SamplingParams

VOCAB = 3
PROMPT = [0, 1, 2]
LENGTH = 5  # emitted tokens per request: one depth-4 round can emit them all
DEPTHS = (4, 2, 3, 1)  # first round at depth 4, then cycling: every depth up to 4 occurs
ALPHA = 1e-4  # probability that a correct engine fails one test
RUNS = 1000  # requests of the correct engine per fast test
CONTROL_RUNS = 300  # requests of the wrong engine: it misses by far more than the correct one may
RUNS_SLOW = 82_000  # the correct engine in the slow tests: any total variation of 0.02 is detected
NOISE = 0.7  # the draft's extra output noise: 0.6-0.9 accepted draft tokens per round
TEMPERATURE = 1.0

#: (sampled drafter, width, verify_size)
SHAPES = {
    "chain": (True, 1, None),
    "deterministic-tree": (False, 2, None),
    "sampled-tree": (True, 2, None),
    "sampled-tree-verify-4": (True, 2, 4),  # the target verifies whole sibling groups, 4 nodes at most
}
FAST = ["chain", "deterministic-tree", "sampled-tree"]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/decoding/conftest.py


@pytest.fixture(scope="module")
def models():
    target = TinyLM(VOCAB, seed=0)
    return target, draft_of(target, noise=NOISE, seed=1)


@pytest.fixture(scope="module")
def law(models):
    return sequence_law(models[0], PROMPT, LENGTH, SamplingParams(temperature=TEMPERATURE))


def run_requests(models, shape: str, sampler: str, runs: int, seed: int = 0) -> tuple[list[tuple[int, ...]], float]:
    """``runs`` independent requests through the real engine; returns the emitted sequences and
    the mean number of accepted draft tokens per round."""
    target, draft = models
    sampled, width, verify_size = SHAPES[shape]
    config = EngineConfig(max_new_tokens=LENGTH, temperature=TEMPERATURE, seed=seed, sampler=sampler)
    engine = SpeculativeDecoder(target, ModelDrafter(draft, sampled=sampled), config)
    out, accepted, rounds = [], 0, 0
    for _ in range(runs):
        engine.start(PROMPT)
        while not engine.finished:
            result = engine.round(DEPTHS[rounds % len(DEPTHS)] if engine.output_ids else DEPTHS[0], verify_size, width)
            accepted += result.num_accepted
            rounds += 1
        out.append(tuple(engine.output_ids))
    return out, accepted / rounds


def empirical_tv(samples: list[tuple[int, ...]], law: dict[tuple[int, ...], float]) -> float:
    keys, counts = np.unique(np.array(samples), axis=0, return_counts=True)
    freq = {tuple(k): c / len(samples) for k, c in zip(keys.tolist(), counts)}
    return 0.5 * sum(abs(freq.get(k, 0.0) - law.get(k, 0.0)) for k in set(freq) | set(law))


def check(models, law, shape: str, runs: int) -> None:
    good, mean_accepted = run_requests(models, shape, "correct", runs)
    p_good, stat, df = chisquare_law(good, law)
    bad, _ = run_requests(models, shape, "resample-from-p", CONTROL_RUNS, seed=1)
    p_bad, stat_bad, df_bad = chisquare_law(bad, law)
    detectable = worst_case_detectable_tv(runs, df, ALPHA)
    print(
        f"\n{shape}: n={runs} df={df} accepted/round={mean_accepted:.2f} p(correct)={p_good:.3g} "
        f"tv(correct)={empirical_tv(good, law):.4f} p(resample-from-p)={p_bad:.3g} "
        f"tv(resample-from-p)={empirical_tv(bad, law):.4f} worst-case detectable tv={detectable:.3f}"
    )
    assert mean_accepted > 0.4, "the draft must be accepted often, or the rules are not exercised"
    assert p_good > ALPHA, f"the engine's {shape} law is off: chi-square p = {p_good:.3g} (statistic {stat:.1f}, df {df})"
    assert p_bad < ALPHA, f"resample-from-p was not caught on {shape}: p = {p_bad:.3g}"


@pytest.mark.parametrize("shape", [s if s in FAST else pytest.param(s, marks=pytest.mark.slow) for s in SHAPES])
def test_engine_emits_the_target_law(models, law, shape):
    check(models, law, shape, RUNS)


@pytest.mark.slow
@pytest.mark.parametrize("shape", list(SHAPES))
def test_engine_emits_the_target_law_to_tv_0_02(models, law, shape):
    check(models, law, shape, RUNS_SLOW)


def test_power_of_the_design():
    """The slow runs detect any total variation of 0.02 with probability 0.9 (df up to 242)."""
    assert worst_case_detectable_tv(RUNS_SLOW, VOCAB**LENGTH - 1, ALPHA) <= 0.02
    assert worst_case_detectable_tv(RUNS, 40, ALPHA) <= 0.15
