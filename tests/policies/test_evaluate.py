"""evaluate_policy: seeded, paired episodes and the statistics every report uses."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest

import draftrl.envs  # noqa: F401  registers the env ids (gymnasium.register_envs idiom)
from draftrl.policies import Fixed, HFHeuristic, Policy, compare, evaluate_policy, paired_difference
from draftrl.signals.speedup import expected_speedup


def test_same_seed_same_episodes():
    env = gym.make("draftrl/Analytic-v0", regimes=(0.9, 0.2), regime_switch=0.1)
    policy = Fixed.for_env(env, depth=4)
    a = evaluate_policy(policy, env, episodes=5, seed=42)
    b = evaluate_policy(policy, env, episodes=5, seed=42)
    c = evaluate_policy(policy, env, episodes=5, seed=43)
    assert a == b
    assert a["episode_throughputs"] != c["episode_throughputs"]
    assert a["episode_throughputs"][1:] == c["episode_throughputs"][:-1]  # episode i uses seed + i


def test_totals_and_histograms():
    env = gym.make("draftrl/Analytic-v0", alpha=0.7, draft_cost=0.05, stochastic=False, max_new_tokens=64)
    res = evaluate_policy(Fixed.for_env(env, depth=6), env, episodes=3, seed=0)
    assert res["throughput"] == pytest.approx(sum(res["episode_tokens"]) / sum(res["episode_seconds"]))
    assert sum(res["episode_tokens"]) == 3 * 64
    assert res["depth_histogram"] == {6: res["num_rounds"]}
    assert res["verify_size_histogram"] == {0: res["num_rounds"]}
    assert res["mean_tokens_per_round"] == pytest.approx(3 * 64 / res["num_rounds"])
    # expected-value rounds: every full round runs at the analytic speedup; the last is clipped
    assert res["throughput"] == pytest.approx(expected_speedup(0.7, 6, 0.05), rel=0.05)


def test_stateful_policies_are_reset_and_observe_every_round():
    class Counting(Policy):
        name = "counting"

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.resets = self.observed = self.acts = 0

        def reset(self):
            self.resets += 1

        def observe(self, info):
            assert {"num_emitted", "num_accepted", "seconds", "draft_seconds", "verify_seconds"} <= set(info)
            self.observed += 1

        def act(self, observation):
            self.acts += 1
            return 2, 0

    env = gym.make("draftrl/Analytic-v0", max_new_tokens=32)
    policy = Counting.for_env(env)
    res = evaluate_policy(policy, env, episodes=4, seed=0)
    assert policy.resets == 4 and policy.acts == policy.observed == res["num_rounds"]


def test_hooks_see_every_episode_and_round_once_after_the_policy():
    """``on_reset`` gets each episode's reset info, ``on_round`` each round's info after the policy
    observed it, and the rounds they see are the ones the totals count."""
    class Observing(Policy):
        name = "observing"
        observed = 0

        def observe(self, info):
            self.observed += 1

        def act(self, observation):
            return 3, 0

    env = gym.make("draftrl/Analytic-v0", max_new_tokens=40)
    policy = Observing.for_env(env)
    resets, rounds = [], []
    res = evaluate_policy(policy, env, episodes=3, seed=5, on_reset=resets.append,
                          on_round=lambda info: rounds.append((policy.observed, info["num_emitted"])))
    assert len(resets) == 3 and all(isinstance(info, dict) for info in resets)
    assert [n for n, _ in rounds] == list(range(1, res["num_rounds"] + 1))  # after observe, once per round
    assert sum(e for _, e in rounds) == sum(res["episode_tokens"]) == 3 * 40


def test_unseeded_episodes_are_one_episode_only():
    env = gym.make("draftrl/Analytic-v0", max_new_tokens=16)
    assert evaluate_policy(Fixed.for_env(env), env, episodes=1, seed=None)["episodes"] == 1
    with pytest.raises(ValueError, match="seed=None with episodes=2"):
        evaluate_policy(Fixed.for_env(env), env, episodes=2, seed=None)


def test_hf_heuristic_histogram_spreads_over_depths():
    env = gym.make("draftrl/Analytic-v0", regimes=(0.9, 0.2), regime_switch=0.1)
    res = evaluate_policy(HFHeuristic.for_env(env), env, episodes=3, seed=0)
    assert len(res["depth_histogram"]) > 3 and sum(res["depth_histogram"].values()) == res["num_rounds"]


def test_paired_difference():
    diff = paired_difference([2.0, 3.0, 4.0], [1.0, 1.0, 1.0])
    assert diff["mean"] == pytest.approx(2.0)
    assert diff["se"] == pytest.approx(1.0 / math.sqrt(3))
    assert paired_difference([1.0, 1.0], [1.0, 1.0])["z"] == 0.0
    with pytest.raises(ValueError, match="at least 2"):
        paired_difference([1.0], [2.0])


def test_compare_against_reference():
    env = gym.make("draftrl/Analytic-v0", alpha=0.7, draft_cost=0.05)
    results = {p.name: evaluate_policy(p, env, 4, 0) for p in Fixed.grid(env)[:3]}
    table = compare(results, "fixed(d=0,v=0)")
    assert table["fixed(d=0,v=0)"]["ratio"] == 1.0 and table["fixed(d=0,v=0)"]["throughput"] == 1.0
    assert table["fixed(d=2,v=0)"]["ratio"] > 1.0 and "diff_se" in table["fixed(d=2,v=0)"]


def test_episodes_must_be_positive():
    env = gym.make("draftrl/Analytic-v0")
    with pytest.raises(ValueError, match="episodes"):
        evaluate_policy(Fixed.for_env(env), env, episodes=0)


def test_to_action_round_trip():
    env = gym.make("draftrl/Analytic-v0", depths=(0, 3, 5), verify_sizes=(0, 2))
    policy = Fixed.for_env(env)
    action = policy.to_action(5, 2)
    assert env.action_space.contains(action) and list(action) == [2, 1]
    assert policy.from_action(action) == (5, 2)
    assert np.array_equal(policy.to_action(*policy.from_action([1, 0])), [1, 0])
