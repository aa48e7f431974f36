"""Baseline policies behave as specified, on scripted rounds and on draftrl/Analytic-v0."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import draftrl.envs  # noqa: F401  registers the env ids (gymnasium.register_envs idiom)
from draftrl.envs.analytic import FEATURE_NAMES
from draftrl.policies import (
    CONTINUE,
    STOP,
    ConfidenceThreshold,
    Fixed,
    HFHeuristic,
    LookAhead,
    UCBBandit,
    evaluate_policy,
    paired_difference,
)
from draftrl.signals.speedup import expected_speedup

REGIMES = {"regimes": (0.9, 0.2), "draft_cost": 0.1, "signal_noise": 0.15, "regime_switch": 0.1}


def grid(depths=tuple(range(13)), verify_sizes=(0,)):
    return {"depths": depths, "verify_sizes": verify_sizes, "feature_names": FEATURE_NAMES}


def round_info(depth: int, accepted: int) -> dict:
    return {"num_emitted": accepted + 1, "num_accepted": accepted, "num_verified": depth, "seconds": 1.0,
            "depth": depth}


# ----------------------------------------------------------------------------- Fixed
def test_fixed_grid_covers_every_setting_and_validates():
    env = gym.make("draftrl/Analytic-v0", depths=(0, 2, 4), verify_sizes=(0, 1))
    settings = [p.act(np.zeros(6)) for p in Fixed.grid(env)]
    assert settings == [(d, v) for d in (0, 2, 4) for v in (0, 1)]
    with pytest.raises(ValueError, match="not on the env's grid"):
        Fixed(**grid(), depth=13)


# ----------------------------------------------------------------------------- HFHeuristic
def test_hf_heuristic_schedule_plus_two_minus_one_floor_one():
    policy = HFHeuristic(**grid(depths=tuple(range(31))))
    obs = np.zeros(6, dtype=np.float32)
    assert policy.act(obs) == (20, 0)  # transformers' num_assistant_tokens default
    depths = []
    for accepted_all in (True, True, False, False, True):
        depth, _ = policy.act(obs)
        policy.observe(round_info(depth, depth if accepted_all else 0))
        depths.append(policy.act(obs)[0])
    assert depths == [22, 24, 23, 22, 24]
    for _ in range(40):  # rejections all the way down: the floor is 1
        depth, _ = policy.act(obs)
        policy.observe(round_info(depth, depth - 1))
    assert policy.act(obs)[0] == 1
    policy.observe(round_info(1, 0))
    assert policy.act(obs)[0] == 1
    policy.observe(round_info(1, 1))
    assert policy.act(obs)[0] == 3


def test_hf_heuristic_caps_at_grid_and_snaps_down():
    policy = HFHeuristic(**grid(depths=(0, 1, 4, 8)))
    obs = np.zeros(6, dtype=np.float32)
    assert policy.act(obs)[0] == 8  # 20 capped at the grid's maximum
    policy.observe(round_info(8, 3))  # 8 -> 7, snapped to 4
    assert policy.schedule == 7 and policy.act(obs)[0] == 4
    policy.observe(round_info(4, 4))  # 7 + 2 = 9, capped at 8
    assert policy.act(obs)[0] == 8
    # nothing verified: no change
    policy.observe({"num_emitted": 1, "num_accepted": 0, "num_verified": 0, "seconds": 1.0})
    assert policy.schedule == 8


def test_hf_heuristic_counts_verified_not_drafted():
    """With verify_size capping the chain, "all accepted" means all *verified* drafts passed."""
    policy = HFHeuristic(**grid(depths=tuple(range(31))), initial_depth=5)
    policy.observe({"num_emitted": 3, "num_accepted": 2, "num_verified": 2, "depth": 5, "seconds": 1.0})
    assert policy.schedule == 7


# ----------------------------------------------------------------------------- ConfidenceThreshold
def test_the_serving_proposers_follow_the_same_heuristic_schedule():
    """One +2 / -1 rule (decoding.schedule): the policy's per-round schedule and a serving request's
    per-step depth under the proposers' ``heuristic`` controller move together on the same
    (accepted, proposed) history."""
    from draftrl.decoding.vllm.control import HeuristicRule, StepView

    policy = HFHeuristic(**grid(depths=tuple(range(31))), initial_depth=5)
    rule, memory = HeuristicRule(initial_depth=5.0), {}
    for accepted, proposed in ((5, 5), (7, 7), (2, 9), (0, 8), (0, 0), (3, 3), (0, 1), (0, 1), (0, 1), (0, 1)):
        policy.observe({"num_verified": proposed, "num_accepted": accepted})
        step = StepView([0], ["r"], [False], [64], np.array([accepted + 1]), np.array([proposed]), np.array([accepted]),
                        0, 0, 30, [memory])
        assert rule.decide(step).depths == [int(policy.schedule)] and policy.schedule == memory["heuristic_depth"]
    assert policy.schedule == 5.0  # 5 +2 +2 -1 -1 (no evidence) +2 -1 -1 -1 -1


def test_confidence_threshold_round_level_depth():
    policy = ConfidenceThreshold(**grid(), threshold=0.35)
    conf = FEATURE_NAMES.index("draft_confidence")
    obs = np.zeros(6, dtype=np.float32)
    for c, depth in ((0.9, 9), (0.2, 0), (1.0, 12), (0.5, 1), (0.0, 0)):  # largest d with c**d > 0.35
        obs[conf] = c
        assert policy.act(obs) == (depth, 0)


def test_confidence_threshold_reads_the_feature_by_name():
    names = tuple(reversed(FEATURE_NAMES))
    policy = ConfidenceThreshold(depths=range(13), verify_sizes=(0,), feature_names=names)
    obs = np.zeros(6, dtype=np.float32)
    obs[names.index("draft_confidence")] = 0.9
    assert policy.act(obs)[0] == 9
    with pytest.raises(ValueError, match="draft_confidence"):
        ConfidenceThreshold(depths=range(13), verify_sizes=(0,), feature_names=("a", "b"))


STEP_NAMES = FEATURE_NAMES + ("level",)


def step_obs(confidence: float, level: int) -> np.ndarray:
    obs = np.zeros(len(STEP_NAMES), dtype=np.float32)
    obs[STEP_NAMES.index("draft_confidence")] = confidence
    obs[STEP_NAMES.index("level")] = level
    return obs


def test_confidence_threshold_step_level_drafts_the_round_depth():
    """On a step-level env it continues while c ** (level + 1) > threshold: the same rule as act()."""
    policy = ConfidenceThreshold(depths=range(13), verify_sizes=(0,), feature_names=STEP_NAMES, threshold=0.5)
    decisions = [policy.act_step(step_obs(0.9, level)) for level in range(8)]
    assert decisions == [CONTINUE] * 6 + [STOP] * 2  # 0.9**6 = 0.53 > 0.5 > 0.9**7
    assert policy.act_step(step_obs(0.2, 0)) == STOP  # a new round with low confidence: no speculation


def test_round_policies_play_their_depth_level_by_level():
    fixed = Fixed(depths=range(13), verify_sizes=(0,), feature_names=STEP_NAMES, depth=3)
    assert [fixed.act_step(step_obs(0.5, level)) for level in range(5)] == [CONTINUE] * 3 + [STOP] * 2
    hf = HFHeuristic(depths=range(13), verify_sizes=(0,), feature_names=STEP_NAMES, initial_depth=2)
    assert [hf.act_step(step_obs(0.5, level)) for level in range(3)] == [CONTINUE, CONTINUE, STOP]
    hf.observe(round_info(2, 2))  # all accepted: the next round drafts 4
    assert [hf.act_step(step_obs(0.5, level)) for level in range(5)] == [CONTINUE] * 4 + [STOP]
    with pytest.raises(ValueError, match="'level'"):
        Fixed(**grid(), depth=3).act_step(np.zeros(6, dtype=np.float32))


# ----------------------------------------------------------------------------- UCBBandit
def test_ucb_bandit_converges_to_best_arm_on_stationary_env():
    depths = (0, 1, 3, 6, 12)
    env = gym.make("draftrl/Analytic-v0", alpha=0.7, draft_cost=0.05, depths=depths)
    best = max(depths, key=lambda d: expected_speedup(0.7, d, 0.05))
    assert best == 6  # the article's grid (docs/design.md); the runner-up, depth 3, is 6% slower
    bandit = UCBBandit.for_env(env)
    evaluate_policy(bandit, env, episodes=30, seed=0)  # ~2,500 rounds, statistics persist
    assert bandit.best_arm() == (best, 0)
    pulls = dict(zip(bandit.arms, bandit.num_pulls))
    assert pulls[(best, 0)] == max(pulls.values())
    assert pulls[(best, 0)] > 0.5 * sum(pulls.values())
    values = dict(zip(bandit.arms, bandit.values()))
    assert values[(6, 0)] == pytest.approx(expected_speedup(0.7, 6, 0.05), rel=0.05)


def test_ucb_bandit_tries_every_arm_first_and_forgets():
    bandit = UCBBandit(**grid(depths=(0, 2, 4)))
    obs = np.zeros(6, dtype=np.float32)
    played = []
    for _ in range(3):
        arm = bandit.act(obs)
        played.append(arm)
        bandit.observe({"num_emitted": 1.0 + arm[0], "seconds": 1.0, "num_accepted": arm[0]})
    assert played == [(0, 0), (2, 0), (4, 0)]
    assert bandit.act(obs) == (4, 0)  # no residual variance yet: greedy on the best value
    bandit.forget()
    assert bandit.num_pulls.sum() == 0 and bandit.act(obs) == (0, 0)


# ----------------------------------------------------------------------------- LookAhead
def test_lookahead_single_regime_is_the_article_best_depth():
    env = gym.make("draftrl/Analytic-v0", alpha=0.7, draft_cost=0.05, depths=tuple(range(17)))
    lookahead = LookAhead.for_env(env)
    assert lookahead.regime_actions == [(6, 0)]
    assert lookahead.rho == pytest.approx(2.353, abs=1e-3)


def test_lookahead_uses_the_env_hook_when_present():
    env = gym.make("draftrl/Analytic-v0", depths=(0, 2, 4))
    env.unwrapped.lookahead_action = lambda: np.array([2, 0])
    assert LookAhead.for_env(env).act(np.zeros(6)) == (4, 0)


def test_lookahead_needs_hidden_state():
    class Bare(gym.Env):
        depths, verify_sizes, feature_names = (0, 1), (0,), ("x",)

    with pytest.raises(TypeError, match="lookahead_action"):
        LookAhead.for_env(Bare())


def baseline_results(env: gym.Env, episodes: int, seed: int) -> dict:
    policies = Fixed.grid(env) + [
        HFHeuristic.for_env(env),
        ConfidenceThreshold.for_env(env),
        UCBBandit.for_env(env),
        LookAhead.for_env(env),
    ]
    return {p.name: evaluate_policy(p, env, episodes, seed) for p in policies}


def test_lookahead_beats_every_policy_on_expected_value_env():
    """stochastic=False: every policy sees the same regime path, so the comparison is exact."""
    env = gym.make("draftrl/Analytic-v0", **REGIMES, stochastic=False)
    results = baseline_results(env, episodes=20, seed=3)
    lookahead = results.pop("lookahead")["throughput"]
    for name, res in results.items():
        assert lookahead >= res["throughput"], name


def test_lookahead_beats_every_policy_on_stochastic_env():
    env = gym.make("draftrl/Analytic-v0", **REGIMES)
    results = baseline_results(env, episodes=60, seed=11)
    lookahead = results.pop("lookahead")
    for name, res in results.items():
        diff = paired_difference(lookahead["episode_throughputs"], res["episode_throughputs"])
        assert diff["mean"] > -2 * diff["se"], (name, diff)  # never significantly worse
        assert lookahead["throughput"] >= 0.97 * res["throughput"], name
    best_fixed = max((r for n, r in results.items() if n.startswith("fixed")), key=lambda r: r["throughput"])
    diff = paired_difference(lookahead["episode_throughputs"], best_fixed["episode_throughputs"])
    assert diff["mean"] > 3 * diff["se"]  # and clearly better than grid search on this workload
