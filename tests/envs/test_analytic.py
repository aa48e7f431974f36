"""draftrl/Analytic-v0 simulates the article's cost model (its closed form: tests/signals/test_speedup.py)."""

from __future__ import annotations

import math
import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest

import draftrl.envs  # noqa: F401  registers the env ids (gymnasium.register_envs idiom)
from draftrl.envs.analytic import FEATURE_NAMES, AnalyticEnv
from draftrl.signals.speedup import expected_speedup, expected_tokens

GRID = range(1, 17)  # the article's grid, depth 1..16


def one_round(env: gym.Env, depth_index: int, verify_index: int = 0) -> tuple[float, dict]:
    """Reward and info of the first round of a fresh episode."""
    env.reset(seed=0)
    _, reward, _, _, info = env.step(np.array([depth_index, verify_index]))
    return reward, info


def within_se(samples: np.ndarray, expected: float, k: float = 4.0) -> bool:
    se = samples.std(ddof=1) / math.sqrt(len(samples))
    return abs(samples.mean() - expected) <= k * se


# ----------------------------------------------------------------------------- the env, deterministic
def make_grid_env(**kwargs) -> gym.Env:
    kwargs = {"depths": tuple(range(17)), "stochastic": False, "reward": "throughput", **kwargs}
    return gym.make("draftrl/Analytic-v0", **kwargs)


def env_best_depth(env: gym.Env, depths=GRID) -> int:
    return max(depths, key=lambda d: one_round(env, env.unwrapped.depths.index(d))[0])


def test_env_reproduces_article_grid():
    env = make_grid_env(alpha=0.7, draft_cost=0.05)
    for depth in range(17):
        reward, info = one_round(env, depth)
        assert info["num_emitted"] == pytest.approx(expected_tokens(0.7, depth), abs=1e-12)
        assert reward == pytest.approx(expected_speedup(0.7, depth, 0.05), abs=1e-12)
    assert env_best_depth(env) == 6
    reward, info = one_round(env, 6)
    assert info["num_emitted"] == pytest.approx(3.058819, abs=1e-6)
    assert reward == pytest.approx(2.353, abs=1e-3)
    assert info["seconds"] == pytest.approx(1.3)
    assert (info["draft_seconds"], info["verify_seconds"]) == pytest.approx((0.3, 1.0))


def test_env_expensive_draft_and_costly_verification():
    env = make_grid_env(alpha=0.7, draft_cost=0.20)
    assert env_best_depth(env) == 3
    assert one_round(env, 3)[0] == pytest.approx(1.583, abs=1e-3)
    env = make_grid_env(alpha=0.7, draft_cost=0.05, verify_cost=lambda n: 3.0)
    assert one_round(env, 6)[0] == pytest.approx(0.927, abs=1e-3)
    env = make_grid_env(alpha=0.7, draft_cost=0.05, verify_cost={n: 3.0 for n in range(1, 17)})
    assert one_round(env, 6)[0] == pytest.approx(0.927, abs=1e-3)


def test_env_zero_acceptance_chooses_no_speculation():
    env = make_grid_env(alpha=0.0, draft_cost=0.05)
    assert env_best_depth(env, depths=range(17)) == 0
    reward, info = one_round(env, 0)
    assert reward == 1.0 and info["num_emitted"] == 1.0 and info["num_accepted"] == 0.0
    assert info["num_verified"] == 0 and info["draft_seconds"] == 0.0


def test_verify_size_caps_verified_tokens():
    env = gym.make(
        "draftrl/Analytic-v0", alpha=0.7, draft_cost=0.05, depths=(0, 6), verify_sizes=(0, 2, 9),
        verify_cost=lambda n: 1.0 + 0.1 * n, stochastic=False, reward="throughput",
    )
    assert env.action_space.nvec.tolist() == [2, 3]
    _, info = one_round(env, 1, 1)  # depth 6, verify 2: the 4 unverified drafts are paid and lost
    assert info["num_verified"] == 2
    assert info["num_emitted"] == pytest.approx(expected_tokens(0.7, 2))
    assert info["seconds"] == pytest.approx(1.2 + 0.3)
    for verify_index in (0, 2):  # 0 = all drafted; a cap above depth changes nothing
        _, info = one_round(env, 1, verify_index)
        assert info["num_verified"] == 6 and info["num_emitted"] == pytest.approx(expected_tokens(0.7, 6))
    _, info = one_round(env, 0, 2)  # no speculation verifies nothing and costs one target step
    assert info["num_verified"] == 0 and info["seconds"] == 1.0
    assert env.unwrapped.round_seconds(6, 2) == pytest.approx((0.3, 1.2))
    assert env.unwrapped.round_seconds(0, 9) == (0.0, 1.0)


# ----------------------------------------------------------------------------- stochastic acceptance
def sample_tokens(alpha: float, depth: int, num_rounds: int, seed: int = 1) -> np.ndarray:
    env = AnalyticEnv(alpha=alpha, depths=(depth,), max_new_tokens=10**9)
    env.reset(seed=seed)
    return np.array([env.step(np.array([0, 0]))[4]["num_emitted"] for _ in range(num_rounds)])


def test_stochastic_tokens_match_expectation_and_reject_a_wrong_formula():
    tokens = sample_tokens(0.7, 6, 40_000)
    assert tokens.min() == 1 and tokens.max() == 7
    assert within_se(tokens, expected_tokens(0.7, 6))
    # Negative control: an off-by-one exponent, (1 - alpha^(d+2)) / (1 - alpha) = 3.141, is rejected.
    assert not within_se(tokens, (1 - 0.7**8) / 0.3)
    # The whole distribution: P(all 6 drafts accepted) = alpha^6.
    assert within_se((tokens == 7).astype(float), 0.7**6)
    assert not within_se((tokens == 7).astype(float), 0.7**7)


# ----------------------------------------------------------------------------- API checks
@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"regimes": (0.9, 0.3), "regime_switch": 0.1, "verify_sizes": (0, 2, 4), "reward": "throughput"},
        {"alpha": 0.5, "stochastic": False, "max_new_tokens": 16},
    ],
)
def test_env_checkers_pass(kwargs):
    from gymnasium.utils.env_checker import check_env as gym_check_env
    from stable_baselines3.common.env_checker import check_env as sb3_check_env

    env = gym.make("draftrl/Analytic-v0", **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a checker warning is a failure
        gym_check_env(env.unwrapped, skip_render_check=True)
        sb3_check_env(env.unwrapped, warn=True)


def test_spaces_and_feature_names():
    env = gym.make("draftrl/Analytic-v0", alpha=0.7, draft_cost=0.05)
    assert env.spec.max_episode_steps == 1024
    assert env.unwrapped.depths == tuple(range(13)) and env.unwrapped.verify_sizes == (0,)
    assert env.action_space == gym.spaces.MultiDiscrete([13, 1])
    assert env.unwrapped.feature_names == FEATURE_NAMES
    assert env.observation_space.shape == (len(FEATURE_NAMES),)
    obs, _ = env.reset(seed=0)
    assert obs.dtype == np.float32 and obs in env.observation_space
    assert dict(zip(FEATURE_NAMES, obs))["progress"] == 0.0
    _, _, _, _, info = env.step(env.action_space.sample())
    assert {"num_emitted", "num_accepted", "seconds", "draft_seconds", "verify_seconds", "depth", "verify_size",
            "regime"} <= info.keys()


def test_import_registers_without_torch():
    code = "import sys, draftrl.envs, gymnasium; gymnasium.spec('draftrl/Analytic-v0'); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"alpha": 1.2}, "not a probability"),
        ({"alpha": 0.5, "regimes": (0.9, 0.3)}, "both given"),
        ({"depths": ()}, "empty"),
        ({"depths": (0, 2, 2)}, "repeats"),
        ({"verify_sizes": (-1,)}, "non-negative"),
        ({"verify_cost": {1: 1.0}, "depths": (0, 1, 2)}, r"lacks sizes \[2\]"),
        ({"verify_cost": lambda n: -1.0}, "verify_cost"),
        ({"regimes": (0.9, 0.3), "regime_switch": [[0.5, 0.6], [0.5, 0.5]]}, "row-stochastic"),
        ({"reward": "tokens"}, "reward mode"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
    ],
)
def test_constructor_errors_name_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AnalyticEnv(**kwargs)


# ----------------------------------------------------------------------------- seeding and episodes
def rollout(seed: int, num_steps: int = 60, **kwargs) -> list:
    env = gym.make("draftrl/Analytic-v0", regimes=(0.9, 0.3), regime_switch=0.1, **kwargs)
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    trajectory = [obs.tolist()]
    for _ in range(num_steps):
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        trajectory.append((obs.tolist(), reward, info["num_emitted"], info["regime"]))
        if terminated or truncated:
            obs, _ = env.reset()
            trajectory.append(obs.tolist())
    return trajectory


def test_seeding_reproduces_episodes():
    assert rollout(3) == rollout(3)
    assert rollout(3) != rollout(4)


def test_seed_restarts_the_running_throughput_estimate():
    env = gym.make("draftrl/Analytic-v0", alpha=0.9, max_new_tokens=32)

    def episode_return(seed: int | None) -> float:
        env.reset(seed=seed)
        total, terminated = 0.0, False
        while not terminated:
            _, reward, terminated, _, _ = env.step(np.array([6, 0]))
            total += reward
        return total

    first = episode_return(seed=0)
    second = episode_return(seed=None)  # rho has moved towards the first episode's throughput
    assert env.unwrapped.rho > 1.0 and second != first
    assert episode_return(seed=0) == first and env.unwrapped.rho == 1.0


def test_termination_clips_last_round_and_truncation_comes_from_register():
    env = gym.make("draftrl/Analytic-v0", alpha=0.9, max_new_tokens=50)
    env.reset(seed=0)
    total, terminated, steps = 0.0, False, 0
    while not terminated:
        obs, _, terminated, truncated, info = env.step(np.array([12, 0]))
        total += info["num_emitted"]
        steps += 1
        assert not truncated
    assert total == 50 and obs[FEATURE_NAMES.index("progress")] == 1.0
    assert info["num_accepted"] <= info["num_emitted"]
    env = gym.make("draftrl/Analytic-v0", alpha=0.9, max_episode_steps=3)
    env.reset(seed=0)
    results = [env.step(np.array([0, 0]))[2:4] for _ in range(3)]
    assert results == [(False, False), (False, False), (False, True)]


# ----------------------------------------------------------------------------- regimes and features
def test_regime_switching_changes_acceptance_and_confidence():
    env = AnalyticEnv(regimes=(0.9, 0.3), regime_switch=0.05, depths=(6,), max_new_tokens=10**9)
    obs, _ = env.reset(seed=0)
    accepted = {0: [], 1: []}
    confidence = {0: [], 1: []}
    switches = 0
    for _ in range(4000):
        confidence[env.regime].append(obs[FEATURE_NAMES.index("draft_confidence")])
        obs, _, _, _, info = env.step(np.array([0, 0]))
        accepted[info["regime"]].append(info["num_accepted"])
        switches += env.regime != info["regime"]
    assert 100 < switches < 300  # about 4000 * 0.05
    code, chat = np.array(accepted[0]), np.array(accepted[1])
    assert within_se(code, expected_tokens(0.9, 6) - 1) and within_se(chat, expected_tokens(0.3, 6) - 1)
    assert code.mean() > 4 * chat.mean()
    assert np.mean(confidence[0]) == pytest.approx(0.9, abs=0.02)
    assert np.mean(confidence[1]) == pytest.approx(0.3, abs=0.02)


def test_markov_matrix_and_forced_regime():
    env = AnalyticEnv(regimes=(0.9, 0.3), regime_switch=[[1.0, 0.0], [0.0, 1.0]], depths=(4,), signal_noise=0.0)
    obs, _ = env.reset(seed=0, options={"regime": 1})
    assert obs[FEATURE_NAMES.index("draft_confidence")] == pytest.approx(0.3)
    assert {env.step(np.array([0, 0]))[4]["regime"] for _ in range(50)} == {1}
    transition = AnalyticEnv(regimes=(0.9, 0.5, 0.3), regime_switch=0.1).transition
    np.testing.assert_allclose(transition, [[0.9, 0.05, 0.05], [0.05, 0.9, 0.05], [0.05, 0.05, 0.9]])


def test_acceptance_features_track_alpha():
    env = AnalyticEnv(alpha=0.7, depths=(6,), stochastic=False, signal_noise=0.0)
    env.reset(seed=0)
    for _ in range(20):
        obs, *_ = env.step(np.array([0, 0]))
    features = dict(zip(FEATURE_NAMES, obs))
    assert features["last_num_emitted"] == pytest.approx(expected_tokens(0.7, 6), rel=1e-6)
    assert features["window_accept_rate"] == pytest.approx(0.7, abs=0.01)  # smoothing fades with evidence
    assert features["ema_accept_rate"] == pytest.approx(0.7, abs=0.02)
    assert features["last_accept_rate"] < features["window_accept_rate"]  # one round: more smoothing
    assert features["draft_confidence"] == pytest.approx(0.7)


# ----------------------------------------------------------------------------- rewards
def episode(reward: str, depth: int, **kwargs) -> tuple[float, float, float, list[float]]:
    """(return, total tokens, total cost, rewards) of one deterministic fixed-depth episode."""
    env = make_grid_env(alpha=0.7, draft_cost=0.05, reward=reward, **kwargs)
    env.reset(seed=0)
    rewards, tokens, seconds, terminated = [], 0.0, 0.0, False
    while not terminated:
        _, r, terminated, truncated, info = env.step(np.array([depth, 0]))
        assert not truncated
        rewards.append(r)
        tokens += info["num_emitted"]
        seconds += info["seconds"]
    return sum(rewards), tokens, seconds, rewards


def test_both_reward_modes_pick_the_throughput_best_fixed_depth():
    depths = range(17)
    runs = {d: episode("ratio", d) for d in depths}
    throughput_best = max(depths, key=lambda d: runs[d][1] / runs[d][2])
    assert throughput_best == 6
    assert all(runs[d][1] == 256 for d in depths)
    assert max(depths, key=lambda d: runs[d][0]) == throughput_best  # episode return
    for d in depths:  # return = tokens - rho * cost with rho frozen at its initial 1.0
        assert runs[d][0] == pytest.approx(runs[d][1] - runs[d][2])
    for rho in (0.5, 4.0):  # any positive rho ranks fixed depths by total cost
        returns = {d: episode("ratio", d, rho=rho)[0] for d in depths}
        assert max(depths, key=returns.get) == throughput_best
    mean_throughput = {d: np.mean(episode("throughput", d)[3]) for d in depths}
    assert max(depths, key=mean_throughput.get) == throughput_best  # per-round mean


def test_throughput_reward_sum_favours_short_rounds():
    # Documented caveat: with a fixed token budget, the *sum* of per-round throughputs grows with
    # the number of rounds, so plain decoding (256 rounds of reward 1) beats the best depth.
    assert episode("throughput", 0)[0] == pytest.approx(256)
    assert episode("throughput", 6)[0] < 256


def regime_policy_run(code_depth: int, chat_depth: int) -> tuple[float, float]:
    """(ratio return, total tokens / total cost) of a policy that knows the regime, which alternates."""
    env = AnalyticEnv(regimes=(0.9, 0.3), regime_switch=[[0, 1], [1, 0]], stochastic=False)
    env.reset(seed=0, options={"regime": 0})
    ret, tokens, seconds, terminated = 0.0, 0.0, 0.0, False
    while not terminated:
        depth = (code_depth, chat_depth)[env.regime]
        _, reward, terminated, _, info = env.step(np.array([depth, 0]))
        ret, tokens, seconds = ret + reward, tokens + info["num_emitted"], seconds + info["seconds"]
    return ret, tokens / seconds


def test_ratio_reward_stays_consistent_across_regimes():
    policies = [(code, chat) for code in (10, 11, 12) for chat in range(5)]
    runs = {p: regime_policy_run(*p) for p in policies}
    assert max(policies, key=lambda p: runs[p][0]) == max(policies, key=lambda p: runs[p][1])


def test_per_regime_throughput_is_not_the_ratio_of_sums_optimum():
    # Rounds alternate between alpha 0.9 and 0.3 (c = 0.05). Per-round throughput is greedy per
    # regime (depth 2 at 0.3); total tokens / total time is higher with depth 1 there.
    def total_throughput(chat_depth: int) -> float:
        tokens = expected_tokens(0.9, 12) + expected_tokens(0.3, chat_depth)
        return tokens / (1 + 0.05 * 12 + 1 + 0.05 * chat_depth)

    assert max(range(13), key=lambda d: expected_speedup(0.3, d, 0.05)) == 2
    assert max(range(13), key=total_throughput) == 1


def test_ratio_reward_at_the_optimal_rate_is_best_per_round():
    rho_star = expected_speedup(0.7, 6, 0.05)
    env = make_grid_env(alpha=0.7, draft_cost=0.05, reward="ratio", rho=rho_star)
    assert env_best_depth(env, depths=range(17)) == 6
    assert one_round(env, 6)[0] == pytest.approx(0.0, abs=1e-12)


def test_running_rho_tracks_episode_throughput():
    env = make_grid_env(alpha=0.7, draft_cost=0.05, reward="ratio", rho_rate=0.5)
    env.reset(seed=0)
    for _ in range(30):
        terminated = False
        while not terminated:
            *_, terminated, _, _ = env.step(np.array([6, 0]))
        env.reset()
    _, tokens, seconds, _ = episode("ratio", 6)
    assert env.unwrapped.rho == pytest.approx(tokens / seconds, rel=1e-9)


# ----------------------------------------------------------------------------- SB3
def test_ppo_trains_on_the_env():
    from stable_baselines3 import PPO

    env = gym.make("draftrl/Analytic-v0", alpha=0.7, draft_cost=0.05, max_new_tokens=64)
    model = PPO("MlpPolicy", env, n_steps=64, batch_size=32, n_epochs=1, seed=0, device="cpu")
    model.learn(total_timesteps=128)
    action, _ = model.predict(env.reset(seed=0)[0], deterministic=True)
    assert env.action_space.contains(action)
