"""Sampled traces replay exactly in law (issue 45): at temperature 0.7 and 1.0 the replay's rounds have
the live engine's law, and replaying the greedy continuation at T > 0 is rejected by the same test.

The target is a one-layer Llama whose attention and MLP write nothing, so its next-token law is a Markov
chain over 16 tokens chosen in its weights (``tests/markov_target.py``): "the next token in the cycle" with a
logit margin of 3 over Gaussian noise, so that at T = 0.7 and 1.0 an n-gram draft of the cycle is
accepted often but far from always (first-round acceptance about 0.6 and 0.45). The drafter is the
n-gram lookup at width 2 (trees: the earliest match's path and the vote's alternatives, distinct
siblings, one-hot q). A forward costs about a millisecond, so thousands of live rounds fit in seconds.

Live: ``EPISODES`` requests per prompt, each with its own sampling seed, every round of one fixed
(depth, verify_size). Replay: the same number of recorded continuations per prompt (``collect(...,
num_continuations=EPISODES)``), each walked once with the same action. Every episode gives two
statistics, independent across episodes (so a chi-square homogeneity test is valid; rounds within an
episode are not independent): the first round's accepted length and the number of rounds to the budget.
Each (temperature, action, statistic) is one ``scipy.stats.chi2_contingency`` test on a live x replay
table (sparse cells merged), at ``ALPHA / number of tests`` (Bonferroni: the whole family falsely
rejects with probability <= ALPHA = 0.01).

Power (computed by :func:`detectable_shift`, printed by the test; the worst case P = 0.5): with 2 x 100
episodes a side and 8 tests (alpha 0.00125 each), a shift of P(the first round accepts nothing) by 0.25
(the rest of the histogram scaled in proportion; 0.23 for the two-category depth-1 histogram) is detected
with probability 0.9. The slow version (2 x 600 a side, 3 actions, 12 tests) detects 0.105. The negative
control (the greedy continuation walked at T > 0: its rounds are one fixed episode per prompt) is
rejected at p < 1e-4 in every test; in the slow version so is replaying T = 1.0 continuations against
the live engine at T = 0.7 (a subtler error: a continuation of the wrong law). The fast test runs in
about 30 s on a busy CPU.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from choice_traces import costs
from markov_target import NumberTokenizer, markov_target, write_prompts
from scipy import stats

from draftrl.config.env import EnvConfig
from draftrl.config.workload import SamplingClass
from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
from draftrl.drafters.ngram import NgramDrafter
from draftrl.replay.round_engine import TraceRoundEngine
from draftrl.replay.traces import collect

pytestmark = pytest.mark.usefixtures("one_thread")

BUDGET = 8
WIDTH = 2
ALPHA = 0.01
PROMPTS = ([*range(16), *range(8)], [*range(8, 16), *range(16), 3, 4])


def config_at(prompts: str, temperature: float) -> EnvConfig:
    return EnvConfig(prompts=prompts, split="tune", languages=("en",), tasks=("chat",), max_new_tokens=BUDGET,
                     chat_template=False, ignore_eos=True, drafter="ngram:1:3", depths=(0, 1, 3), width=WIDTH,
                     verify_sizes=(0, 2), temperature=temperature, seed=0)


def engine(target, temperature: float = 0.0) -> SpeculativeDecoder:
    return SpeculativeDecoder(target, NgramDrafter(1, 3), EngineConfig(max_new_tokens=BUDGET, temperature=temperature,
                                                                       token_stats=False))


def episode_stats(play) -> tuple[int, int]:
    """(first round's accepted length, rounds to the budget) of one request: ``play()`` runs a round."""
    first, rounds, done = None, 0, False
    while not done:
        accepted, done = play()
        first = accepted if first is None else first
        rounds += 1
    return first, rounds


def live_episodes(target, temperature, action, episodes, seed0=10_000) -> np.ndarray:
    """[len(PROMPTS) * episodes, 2] statistics of live requests, each with its own sampling seed."""
    live = engine(target, temperature)
    depth, verify_size = action
    out = []
    for prompt in PROMPTS:
        for s in range(episodes):
            live.start(prompt, seed=seed0 + s)

            def play():
                rnd = live.round(depth, verify_size or None, WIDTH)
                return rnd.num_accepted, rnd.finished

            out.append(episode_stats(play))
    return np.array(out)


def replay_episodes(traces, config, action, sampling) -> np.ndarray:
    """[recordings, 2] statistics of the replay, each recorded continuation walked once."""
    replay = TraceRoundEngine(traces, config, costs(1e-4))
    depth, verify_size = action
    out = []
    for prompt in PROMPTS:
        for k in range(traces.num_continuations[traces.class_index(sampling)]):
            replay.config.max_new_tokens = BUDGET
            replay.start(prompt, seed=k, sampling=sampling)

            def play():
                rnd = replay.round(depth, verify_size or None, WIDTH)
                return rnd.num_accepted, rnd.finished

            out.append(episode_stats(play))
    return np.array(out)


def same_law_p(a: np.ndarray, b: np.ndarray) -> float:
    """p-value of the chi-square homogeneity test of two samples of a discrete statistic; categories with an
    expected count under 5 are merged into their neighbour (from the top)."""
    values = np.union1d(a, b)
    table = np.array([[np.sum(x == v) for v in values] for x in (a, b)], dtype=float)
    while table.shape[1] > 1:
        expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
        small = np.flatnonzero(expected.min(0) < 5)
        if not len(small):
            break
        j = small[-1]
        k = j - 1 if j > 0 else 1
        table[:, k] += table[:, j]
        table = np.delete(table, j, axis=1)
    if table.shape[1] < 2:
        return 1.0
    return float(stats.chi2_contingency(table, correction=False).pvalue)


def detectable_shift(n1: int, n2: int, p0: float, df: int, alpha: float, power: float = 0.9) -> float:
    """The smallest shift of P(category 0) (the rest scaled in proportion) that a 2 x (df + 1) chi-square
    homogeneity test at ``alpha`` rejects with probability ``power``: its noncentrality is
    n1 n2 / (n1 + n2) * delta^2 / (p0 (1 - p0))."""
    critical = stats.chi2.ppf(1 - alpha, df)
    lo, hi = 0.0, 400.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if stats.ncx2.sf(critical, df, mid) < power else (lo, mid)
    return math.sqrt(hi * p0 * (1 - p0) * (n1 + n2) / (n1 * n2))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """(target, prompts file, {temperature: traces}) with ``EPISODES`` continuations per prompt and temperature."""
    target = markov_target()
    prompts = write_prompts(tmp_path_factory.mktemp("law"), PROMPTS, BUDGET)

    def record(temperature: float, episodes: int):
        config = config_at(prompts, temperature)
        return collect(config, engine(target), NumberTokenizer(), num_continuations=episodes)

    return target, prompts, record


def law_check(recorded, temperatures, actions, episodes):
    """Every (temperature, action, statistic): the replay's law equals the live engine's; returns the p-values
    and the greedy control's."""
    target, prompts, record = recorded
    num_tests = len(temperatures) * len(actions) * 2
    alpha = ALPHA / num_tests
    shift = detectable_shift(len(PROMPTS) * episodes, len(PROMPTS) * episodes, 0.5, 3, alpha)
    print(f"{num_tests} tests at alpha {alpha:.2g} each, {len(PROMPTS) * episodes} episodes a side: a shift of "
          f"{shift:.3f} in P(first round accepts nothing) is detected with power 0.9")
    greedy = record(0.0, episodes)
    assert greedy.num_continuations == (1,)  # greedy decoding is deterministic: one recording
    results = {}
    for temperature in temperatures:
        traces = record(temperature, episodes)
        sampling = SamplingClass(temperature)
        config = config_at(prompts, temperature)
        # the control: the greedy continuation walked as if it were a sample at this temperature
        relabelled = dataclasses.replace(greedy, classes=(sampling,),
                                         meta={**greedy.meta, "config": traces.meta["config"]})
        for action in actions:
            live = live_episodes(target, temperature, action, episodes)
            replay = replay_episodes(traces, config, action, sampling)
            control = replay_episodes(relabelled, config, action, sampling)
            assert len(control) == len(PROMPTS)  # one continuation per prompt: the same episode every time
            control = np.repeat(control, episodes, axis=0)
            names = ("first accepted", "rounds")
            for column, name in enumerate(names):
                p = same_law_p(live[:, column], replay[:, column])
                p_control = same_law_p(live[:, column], control[:, column])
                results[(temperature, action, name)] = (p, p_control)
                hist = {"live": np.bincount(live[:, column]).tolist(),
                        "replay": np.bincount(replay[:, column]).tolist()}
                assert p >= alpha, (temperature, action, name, p, hist)
                assert p_control < alpha, (temperature, action, name, p_control)
            assert 0.2 < np.mean(live[:, 0] > 0) < 0.95  # neither degenerate: drafts are accepted, not always
            print(f"T={temperature} action={action}: first-round P(accepted >= 1) live {np.mean(live[:, 0] > 0):.3f} "
                  f"replay {np.mean(replay[:, 0] > 0):.3f}; mean rounds live {live[:, 1].mean():.2f} replay "
                  f"{replay[:, 1].mean():.2f}; p = {[round(results[(temperature, action, n)][0], 3) for n in names]}")
    return results


def test_sampled_replay_has_the_live_engines_law(recorded):
    results = law_check(recorded, (0.7, 1.0), ((1, 0), (3, 2)), episodes=100)
    assert max(p for _, p in results.values()) < 1e-4  # the greedy control is rejected far past alpha


@pytest.mark.slow
def test_sampled_replay_has_the_live_engines_law_bigger(recorded):
    target, prompts, record = recorded
    law_check(recorded, (0.7, 1.0), ((1, 0), (3, 0), (3, 2)), episodes=600)
    # a subtler wrong replay: continuations of T = 1.0 walked against the live engine at T = 0.7
    wrong = record(1.0, 600)
    live = live_episodes(target, 0.7, (3, 0), 600)
    replay = replay_episodes(dataclasses.replace(wrong, classes=(SamplingClass(0.7),)), config_at(prompts, 0.7),
                             (3, 0), SamplingClass(0.7))
    assert same_law_p(live[:, 0], replay[:, 0]) < ALPHA / 12
