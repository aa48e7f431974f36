"""SpecDecode-v2 and SpecDecodeDepth-v2 on the real SmolLM2 engine (short: chat prompts, 8 tokens)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import draftrl.envs  # noqa: F401  registers the env ids (gymnasium.register_envs idiom)
from draftrl.config.env import EnvConfig
from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
from draftrl.decoding.generate import fixed_schedule, generate
from draftrl.decoding.stats import TokenStats
from draftrl.signals.actions import CONTINUE, STOP

SHORT = dict(languages=("en",), tasks=("chat",), limit_per_group=2, max_new_tokens=8, depths=(0, 1, 3))


@pytest.fixture(scope="module")
def model(shared_smollm2):
    import torch

    torch.set_num_threads(1)  # other tests and engineers share the CPU
    return shared_smollm2


def greedy_reference(model, env) -> list[int]:
    """The target's plain greedy continuation of the env's current prompt (depth 0 every round)."""
    engine = SpeculativeDecoder(model.model, None, EngineConfig(max_new_tokens=env.request.max_new_tokens),
                                eos_token_ids=sorted(env.engine.eos_token_ids))
    return generate(engine, env.request.prompt_ids, fixed_schedule(0)).token_ids


@pytest.fixture
def tiny_prompts(tmp_path):
    """Two few-token prompts without the chat template: checkers reset many times, prefill is cheap."""
    path = tmp_path / "tiny.jsonl"
    lines = [
        '{"id": "a", "language": "en", "task": "chat", "split": "tune", "prompt": "1, 2, 3, 1, 2,", '
        '"max_new_tokens": 4}',
        '{"id": "b", "language": "en", "task": "chat", "split": "tune", "prompt": "The sea is", "max_new_tokens": 4}',
    ]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_checkers_pass(model, tiny_prompts):
    config = EnvConfig(prompts=tiny_prompts, chat_template=False, depths=(0, 1, 3))
    for env_id in ("draftrl/SpecDecode-v2", "draftrl/SpecDecodeDepth-v2"):
        env = gym.make(env_id, config=config)
        gym_check_env(env.unwrapped)
        sb3_check_env(env.unwrapped)


def test_any_actions_keep_greedy_output_and_report_the_round(model):
    env = gym.make("draftrl/SpecDecode-v2", config=EnvConfig(**SHORT, width=2, verify_sizes=(0, 1, 2)))
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    tokens, done = [], False
    while not done:
        action = rng.integers(env.action_space.nvec)
        _, reward, done, truncated, info = env.step(action)
        tokens += info["token_ids"]
        assert info["num_emitted"] == len(info["token_ids"]) >= 1 and isinstance(info["token_stats"], TokenStats)
        assert info["depth"] == env.unwrapped.depths[action[0]]
        assert info["verify_size"] == env.unwrapped.verify_sizes[action[1]]
        assert info["seconds"] == pytest.approx(info["draft_seconds"] + info["verify_seconds"] + info["sample_seconds"])
        assert info["exactness_passed"] is True  # the monitor runs by default
        assert np.isfinite(reward) and not truncated
    assert tokens == greedy_reference(model, env.unwrapped)


def test_throughput_reward_and_monitor_flag(model):
    env = gym.make("draftrl/SpecDecode-v2", config=EnvConfig(**SHORT, reward="throughput", monitor=False))
    env.reset(seed=0)
    _, reward, _, _, info = env.step(np.array([2, 0]))
    assert reward == pytest.approx(info["num_emitted"] / info["seconds"])
    assert info["exactness_passed"] is None


def test_seed_reproduces_prompts_and_sampled_tokens(model):
    config = EnvConfig(**SHORT, temperature=0.8, top_k=20)

    def episode(seed):
        env = gym.make("draftrl/SpecDecode-v2", config=config)
        _, info = env.reset(seed=seed)
        tokens, done = [], False
        while not done:
            _, _, done, _, step_info = env.step(np.array([2, 0]))
            tokens += step_info["token_ids"]
        return info["prompt_id"], info["sampling_seed"], tokens

    first = episode(5)
    assert episode(5) == first
    assert episode(6)[1] != first[1]  # the control: the seed reaches the sampler, so a rerun could differ


def test_depth_env_keeps_greedy_output_and_shaping_adds_up(model):
    env = gym.make("draftrl/SpecDecodeDepth-v2", config=EnvConfig(**SHORT, rho=20.0, rho_rate=0.0, depth_shaping=True))
    env.reset(seed=1)
    rng = np.random.default_rng(1)
    tokens, round_reward, done = [], 0.0, False
    while not done:
        _, reward, done, _, info = env.step(int(rng.integers(2)))
        round_reward += reward
        if info["phase"] == "verify":
            tokens += info["token_ids"]
            assert round_reward == pytest.approx(info["num_emitted"] - 20.0 * info["seconds"], abs=1e-9)
            round_reward = 0.0
    assert tokens == greedy_reference(model, env.unwrapped)


def test_depth_env_continue_drafts_one_level(model):
    env = gym.make("draftrl/SpecDecodeDepth-v2", config=EnvConfig(**SHORT, drafter="layerskip:6"))
    obs, _ = env.reset(seed=0)
    names = env.unwrapped.feature_names
    assert obs[names.index("draft_top1_prob")] > 0  # a model drafter reports its confidence
    obs, reward, _, _, info = env.step(CONTINUE)
    assert info["phase"] == "draft" and obs[names.index("level")] == 1 and reward == 0.0
    assert obs[names.index("level_num_nodes")] == 1 and 0 < obs[names.index("level_best_prob")] <= 1
    _, _, _, _, info = env.step(STOP)
    assert info["phase"] == "verify" and info["depth"] == 1 and info["num_verified"] == 1


def test_vectorised_envs_share_one_model(model):
    from stable_baselines3.common.vec_env import DummyVecEnv

    config = EnvConfig(**{**SHORT, "max_new_tokens": 3})
    venv = DummyVecEnv([lambda: gym.make("draftrl/SpecDecode-v2", config=config) for _ in range(2)])
    first, second = (env.unwrapped for env in venv.envs)
    assert first.engine.target is second.engine.target is model.model  # one copy of the weights
    assert first.engine is not second.engine  # each env owns its request state and KV cache
    venv.seed(0)
    assert venv.reset().shape == (2, len(first.feature_names))
    _, rewards, _, infos = venv.step(np.array([[1, 0], [2, 0]]))
    assert rewards.shape == (2,) and all(info["num_emitted"] >= 1 for info in infos)
    sync = gym.vector.SyncVectorEnv([lambda: gym.make("draftrl/SpecDecode-v2", config=config) for _ in range(2)])
    obs, _ = sync.reset(seed=0)
    assert obs.shape == (2, len(first.feature_names))
    assert sync.envs[0].unwrapped.engine.target is model.model


def test_monitor_off_skips_the_token_statistics_and_monitor_on_needs_them(model):
    """``monitor=False`` (``--no-monitor``) builds an engine without per-token statistics (None in
    ``info``, the same tokens); ``monitor=True`` with such an engine is refused, naming the fix."""
    from draftrl.decoding.build import build_engine
    from draftrl.decoding.monitor import ExactnessMonitor

    off = EnvConfig(**SHORT, temperature=1.0, monitor=False)
    on = EnvConfig(**SHORT, temperature=1.0)
    engine, tokenizer = build_engine(off, model)
    assert not engine.config.token_stats and build_engine(on, model)[0].config.token_stats
    assert build_engine(off, model, token_stats=True)[0].config.token_stats  # a caller with its own monitor
    with pytest.raises(ValueError, match="EnvConfig.monitor=True needs.*token_stats=True"):
        engine.check(on)
    with pytest.raises(ValueError, match="token_stats is None.*token_stats=True"):
        ExactnessMonitor().update(None)
    streams = {}
    for name, config in (("off", off), ("on", on)):
        env = gym.make("draftrl/SpecDecode-v2", config=config)
        env.reset(seed=0, options={"prompt_id": env.unwrapped.workload.prompts[0].id})
        infos, done = [], False
        while not done:
            _, _, done, _, info = env.step(np.array([2, 0]))
            infos.append(info)
        streams[name] = infos
    assert all(i["token_stats"] is None and i["exactness_passed"] is None for i in streams["off"])
    assert all(isinstance(i["token_stats"], TokenStats) and i["exactness_passed"] for i in streams["on"])
    assert [i["token_ids"] for i in streams["off"]] == [i["token_ids"] for i in streams["on"]]


def test_a_temperature_mix_on_the_live_engine(model, tiny_prompts):
    """Issue 45: each episode samples with its class (the engine is started with it), greedy episodes of a mix
    keep greedy output, and the envs pass the checkers with a mix."""
    config = EnvConfig(prompts=tiny_prompts, chat_template=False, depths=(0, 1, 3), temperature_mix={0: 1, 1.0: 1})
    for env_id in ("draftrl/SpecDecode-v2", "draftrl/SpecDecodeDepth-v2"):
        gym_check_env(gym.make(env_id, config=config).unwrapped)
    env = gym.make("draftrl/SpecDecode-v2", config=config).unwrapped
    names = env.feature_names
    rng = np.random.default_rng(0)
    for label, temperature in (("T0", 0.0), ("T1", 1.0), ("T0", 0.0)):
        obs, info = env.reset(seed=1, options={"sampling": label, "prompt_id": "a"})
        assert info["sampling_class"] == label and env.engine.sampling.temperature == temperature
        assert obs[names.index("temperature")] == temperature
        tokens, done = [], False
        while not done:
            obs, _, done, _, info = env.step(rng.integers(env.action_space.nvec))
            tokens += info["token_ids"]
            assert env.observation_space.contains(obs) and info["exactness_passed"] is not False
        if temperature == 0:
            assert tokens == greedy_reference(model, env)
