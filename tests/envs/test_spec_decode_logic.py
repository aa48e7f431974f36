"""Env logic on a scripted engine and synthetic tables: features, rewards, shaping, config errors.

No model runs here; ``test_spec_decode_real.py`` and ``test_spec_decode_replay.py`` cover the real engine.
"""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from cost_tables import synthetic_table
from gymnasium.utils.env_checker import check_env as gym_check_env
from scripted_costs import PER_LEVEL, PER_NODE, PLAIN_STEP
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import draftrl.envs  # noqa: F401  registers the env ids (gymnasium.register_envs idiom)
from draftrl.config.env import EnvConfig
from draftrl.envs.spec_decode import SpecDecodeEnv
from draftrl.envs.spec_decode_depth import SpecDecodeDepthEnv
from draftrl.signals.actions import CONTINUE, STOP
from draftrl.signals.features import feature_names
from draftrl.signals.rewards import RewardModel

SMALL = dict(languages=("en",), tasks=("chat",), limit_per_group=3, max_new_tokens=12, depths=(0, 1, 2, 4))

#: The observation layout is an interface (policies, ONNX exports): changing it means a new version
#: (issue 45 appended the request and target groups: SpecDecode-v2 / TraceReplay-v1).
EXPECTED_NAMES = (
    "draft_top1_prob", "draft_entropy", "ngram_match_len", "ngram_num_matches",
    "last_tokens_1", "last_tokens_2", "last_tokens_3", "last_tokens_4", "ema_tokens",
    "accept_rate_1", "accept_rate_2", "accept_rate_3", "accept_rate_4",
    "context_len", "generated_len", "remaining_len",
    "verify_cost_1", "verify_cost_2", "verify_cost_4", "verify_cost_8", "verify_cost_16", "verify_cost_32",
    "verify_cost_64", "draft_cost_round", "draft_cost_level",
    "temperature", "top_k", "top_p", "target_top1_prob", "target_entropy", "accepted_mean_p",
)
INFO_KEYS = {
    "num_emitted", "num_accepted", "seconds", "draft_seconds", "verify_seconds", "sample_seconds", "depth",
    "verify_size",
    "num_proposed", "num_verified", "verified_depth", "token_ids", "token_stats", "exactness_passed",
    "stop_reason", "prompt_id", "target_features",
}


def make_env(scripted, depth=False, **overrides):
    engine, tokenizer = scripted(accepts=overrides.pop("accepts", (2, 0, 4, 1)))
    config = EnvConfig(**{**SMALL, "monitor": False, **overrides})
    cls = SpecDecodeDepthEnv if depth else SpecDecodeEnv
    return cls(config, engine=engine, tokenizer=tokenizer)


# ----------------------------------------------------------------------------- observation layout
def test_feature_names_are_stable(scripted):
    assert feature_names(4) == EXPECTED_NAMES
    env = make_env(scripted)
    assert env.feature_names == EXPECTED_NAMES
    assert env.observation_space.shape == (len(EXPECTED_NAMES),)
    depth_env = make_env(scripted, depth=True)
    assert depth_env.feature_names == EXPECTED_NAMES + ("level", "level_best_prob", "level_num_nodes")


def test_history_features_follow_the_rounds(scripted):
    env = make_env(scripted, accepts=(2, 0, 4), max_new_tokens=40)
    obs, _ = env.reset(seed=0)
    idx = {name: i for i, name in enumerate(env.feature_names)}
    assert obs[idx["ngram_match_len"]] == 2.0 and obs[idx["last_tokens_1"]] == 0.0
    assert obs[idx["accept_rate_1"]] == 0.5 and obs[idx["remaining_len"]] == 1.0
    depth4 = np.array([env.depths.index(4), 0])
    for _ in range(3):
        obs, *_ = env.step(depth4)
    # rounds emitted 3, 1, 5 tokens: most recent first
    assert obs[idx["last_tokens_1"]] == 5 and obs[idx["last_tokens_2"]] == 1 and obs[idx["last_tokens_3"]] == 3
    # position 1: trials 3, successes 2 (discounted 0.8 per round): (0.64 + 0 + 1 + 0.5) / (0.64 + 0.8 + 1 + 1)
    assert obs[idx["accept_rate_1"]] == pytest.approx((0.64 + 1 + 0.5) / (0.64 + 0.8 + 1 + 1), rel=1e-6)
    # ema of tokens, bias corrected: (0.64 * 3 + 0.8 * 1 + 5) / (0.64 + 0.8 + 1)
    assert obs[idx["ema_tokens"]] == pytest.approx((0.64 * 3 + 0.8 + 5) / 2.44, rel=1e-6)
    assert obs[idx["generated_len"]] == pytest.approx(9 / 40)
    # verify costs relative to the plain step: 4 verified nodes cost (0.010 + 0.004) / 0.010
    assert obs[idx["verify_cost_4"]] == pytest.approx((PLAIN_STEP + 4 * PER_NODE) / (PLAIN_STEP + 4 * PER_NODE))
    env.step(np.array([0, 0]))  # a plain step: now the AR unit is measured
    obs, *_ = env.step(depth4)
    assert obs[idx["verify_cost_4"]] == pytest.approx((PLAIN_STEP + 4 * PER_NODE) / PLAIN_STEP, rel=1e-5)
    assert obs[idx["draft_cost_level"]] == pytest.approx(PER_LEVEL / PLAIN_STEP, rel=1e-5)


# ----------------------------------------------------------------------------- rewards
def test_ratio_reward_episode_sum_is_tokens_minus_rho_time(scripted):
    env = make_env(scripted, reward="ratio", rho=50.0, rho_rate=0.5)
    env.reset(seed=0)
    rewards, tokens, seconds, done = [], 0, 0.0, False
    while not done:
        _, reward, done, _, info = env.step(env.action_space.sample())
        rewards.append(reward)
        tokens += info["num_emitted"]
        seconds += info["seconds"]
    assert tokens == 12
    assert sum(rewards) == pytest.approx(tokens - 50.0 * seconds)
    env.reset()  # rho moves half way to the episode's tokens/s
    assert env.rewards.rho == pytest.approx(50.0 + 0.5 * (tokens / seconds - 50.0))
    env.reset(seed=0)  # a seeded reset restarts it
    assert env.rewards.rho == 50.0


def test_throughput_reward_is_tokens_per_second(scripted):
    env = make_env(scripted, reward="throughput")
    env.reset(seed=0)
    _, reward, _, _, info = env.step(np.array([3, 0]))
    assert reward == pytest.approx(info["num_emitted"] / info["seconds"])
    assert info["num_emitted"] == 3 and info["seconds"] == pytest.approx(PLAIN_STEP + 4 * PER_NODE + 4 * PER_LEVEL)


def test_rho_estimated_from_the_cost_table_or_first_round():
    table = synthetic_table()
    model = RewardModel("ratio", rho_prior=lambda: 1.0 / table.ar_step(544))
    model.start_episode()
    assert model.rho == pytest.approx(1 / 0.03)
    lazy = RewardModel("ratio")
    lazy.start_episode()
    assert lazy(2, 0.1) == 0.0 and lazy.rho == pytest.approx(20.0)


def test_depth_env_shaping_sums_to_the_round_reward(scripted):
    plain = make_env(scripted, depth=True, rho=30.0, rho_rate=0.0)
    shaped = make_env(scripted, depth=True, rho=30.0, rho_rate=0.0, depth_shaping=True)
    totals = []
    for env in (plain, shaped):
        env.reset(seed=1)
        actions = [CONTINUE, CONTINUE, STOP, STOP, CONTINUE, CONTINUE, CONTINUE, CONTINUE]
        total, step_rewards, done, i = 0.0, [], False, 0
        while not done:
            _, reward, done, _, info = env.step(actions[i % len(actions)])
            step_rewards.append((info["phase"], reward))
            total += reward
            i += 1
        totals.append((total, step_rewards))
    assert totals[0][0] == pytest.approx(totals[1][0])
    assert all(r == 0.0 for phase, r in totals[0][1] if phase == "draft")
    assert all(r == pytest.approx(-30.0 * PER_LEVEL) for phase, r in totals[1][1] if phase == "draft")


def test_depth_env_steps_levels_and_stops_at_the_limit(scripted):
    env = make_env(scripted, depth=True, accepts=(4,))
    obs, _ = env.reset(seed=0)
    level = env.feature_names.index("level")
    assert obs[level] == 0
    for expected in (1, 2, 3):
        obs, reward, _, _, info = env.step(CONTINUE)
        assert info["phase"] == "draft" and obs[level] == expected and reward == 0.0
    obs, _, _, _, info = env.step(CONTINUE)  # level 4 = max(depths): verified in the same step
    assert info["phase"] == "verify" and info["depth"] == 4 and info["num_emitted"] == 5 and obs[level] == 0
    _, _, _, _, info = env.step(STOP)  # STOP before any level: a plain step
    assert info["depth"] == 0 and info["num_verified"] == 0 and info["num_emitted"] == 1


def test_size_policy_picks_the_verification_size(scripted):
    engine, tokenizer = scripted(accepts=(4,))
    seen = []
    env = SpecDecodeDepthEnv(EnvConfig(**SMALL, monitor=False), engine=engine, tokenizer=tokenizer,
                             size_policy=lambda obs, tree: seen.append(len(tree)) or 2)
    env.reset(seed=0)
    env.step(CONTINUE)
    env.step(CONTINUE)
    env.step(CONTINUE)
    _, _, _, _, info = env.step(STOP)
    assert seen == [3] and info["num_verified"] == 2 and info["verify_size"] == 2


# ----------------------------------------------------------------------------- episodes and seeding
def test_info_keys_and_termination(scripted):
    env = make_env(scripted)
    _, reset_info = env.reset(seed=0)
    assert {"prompt_id", "language", "task", "max_new_tokens", "sampling_seed"} <= set(reset_info)
    done, steps = False, 0
    while not done:
        _, _, done, truncated, info = env.step(env.action_space.sample())
        assert set(info) == INFO_KEYS and not truncated
        steps += 1
    assert info["stop_reason"] == "length" and steps >= 3
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.array([0, 0]))


def test_seed_fixes_prompt_order_and_sampling_seeds(scripted):
    def run(seed):
        env = make_env(scripted)
        ids = [env.reset(seed=seed)[1]["prompt_id"]] + [env.reset()[1]["prompt_id"] for _ in range(5)]
        return ids, env.engine.seeds

    assert run(3) == run(3)
    assert run(3) != run(4)
    ids, _ = run(3)
    assert sorted(ids[:3]) == sorted(set(ids[:3])) and set(ids[:3]) == set(ids[3:])  # passes over all 3 prompts


def test_reset_options_pick_a_prompt(scripted):
    env = make_env(scripted)
    first = env.workload.prompts[1].id
    assert env.reset(options={"prompt_id": first})[1]["prompt_id"] == first
    assert env.reset(options={"prompt_index": 2})[1]["prompt_id"] == env.workload.prompts[2].id
    with pytest.raises(ValueError, match="prompt_index or prompt_id"):
        env.reset(options={"prompt": 1})


def test_checkers_pass_on_the_scripted_engine(scripted):
    env = make_env(scripted)
    gym_check_env(env)
    sb3_check_env(env)
    gym_check_env(make_env(scripted, depth=True))


# ----------------------------------------------------------------------------- configuration errors
def test_bad_env_arguments_name_the_fix(tmp_path):
    with pytest.raises(ValueError, match="did you mean 'depths'"):
        gym.make("draftrl/SpecDecode-v2", depth=(0, 1))
    with pytest.raises(ValueError, match="no prompt matches"):
        from draftrl.decoding.workload import select_prompts

        select_prompts(EnvConfig(prompts=str(_one_prompt_file(tmp_path)), tasks=("chat",), split=None))


def _one_prompt_file(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "x", "language": "en", "task": "code_edit", "split": "tune", "prompt": "hi", '
                    '"max_new_tokens": 8}\n')
    return path


def test_engine_that_contradicts_the_config_is_refused(scripted):
    engine, tokenizer = scripted(temperature=0.7)
    with pytest.raises(ValueError, match="engine temperature=0.7 differs from EnvConfig.temperature=0.0"):
        SpecDecodeEnv(EnvConfig(**SMALL), engine=engine, tokenizer=tokenizer)
    engine, _ = scripted()
    with pytest.raises(ValueError, match="tokenizer"):
        SpecDecodeEnv(EnvConfig(**SMALL), engine=engine)


def test_import_stays_light():
    code = ("import sys, gymnasium as gym, draftrl.envs; gym.spec('draftrl/TraceReplay-v1'); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
