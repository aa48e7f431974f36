"""Depth recipes on the step-level analytic env (``tests/AnalyticDepth-v0``, see conftest.py):
the ppo_depth smoke test, FrozenDepthEnv, co-training's phases and resume, step-level evaluation."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

import draftrl.envs  # noqa: F401  registers the env ids (gymnasium.register_envs idiom)
from draftrl.config import load_config
from draftrl.policies import Fixed, PPOPolicy, evaluate_policy, paired_difference
from draftrl.train import cotrain, ppo_depth
from draftrl.train.config import TrainConfig
from draftrl.train.cotrain import FrozenDepthEnv

REGIMES = {"regimes": [0.9, 0.2], "regime_switch": 0.1, "draft_cost": 0.1, "signal_noise": 0.15}


@pytest.fixture(autouse=True)
def _no_wandb(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")


def depth_config(recipe: str, *overrides: str) -> TrainConfig:
    cfg = load_config(
        TrainConfig,
        None,
        [
            f"recipe={recipe}",
            "depth_env.id=tests/AnalyticDepth-v0",
            "total_timesteps=512",
            "ppo.n_steps=64",
            "checkpoint_every=256",
            "eval_episodes=3",
            "baselines=[heuristic, threshold]",
            "progress_bar=false",
            f"depth_env.analytic={json.dumps(REGIMES)}",
            *overrides,
        ],
    )
    return cfg


def test_step_level_evaluation_counts_rounds_not_draft_steps():
    env = gym.make("tests/AnalyticDepth-v0", alpha=0.7, draft_cost=0.05, stochastic=False, max_new_tokens=64)
    res = evaluate_policy(Fixed.for_env(env, depth=6), env, episodes=2, seed=0)
    assert res["depth_histogram"] == {6: res["num_rounds"]}
    assert sum(res["episode_tokens"]) == 128
    round_env = gym.make("draftrl/Analytic-v0", alpha=0.7, draft_cost=0.05, stochastic=False, max_new_tokens=64)
    same = evaluate_policy(Fixed.for_env(round_env, depth=6), round_env, episodes=2, seed=0)
    assert res["throughput"] == pytest.approx(same["throughput"])


def test_ppo_depth_smoke(tmp_path):
    summary = ppo_depth.train(depth_config("ppo_depth"), tmp_path)
    manifest = json.loads((tmp_path / "policy.json").read_text())
    assert manifest["kind"] == "depth" and manifest["feature_names"][-1] == "level"
    assert summary["num_timesteps"] == 512
    table = summary["evaluation"]["table"]
    assert {"ppo", "fixed(d=0)", "fixed(d=12)", "heuristic", "threshold(t=0.35)"} <= set(table)
    env = gym.make("tests/AnalyticDepth-v0", **REGIMES)
    policy = PPOPolicy.load(tmp_path, env)
    assert policy.act_step(env.reset(seed=0)[0]) in (True, False)
    with pytest.raises(ValueError, match="'depth' policy"):
        policy.act(env.reset(seed=0)[0])


def test_frozen_depth_env_plays_one_round_per_step():
    inner = gym.make("tests/AnalyticDepth-v0", alpha=0.7, draft_cost=0.05, stochastic=False,
                     depths=tuple(range(9)), verify_sizes=(0, 2))
    env = FrozenDepthEnv(inner, Fixed.for_env(inner, depth=6))
    assert env.feature_names == inner.unwrapped.feature_names[:-1] and env.depths == (8,)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (6,) and env.observation_space.contains(obs)
    _, reward, _, _, info = env.step(np.array([0, 0]))  # verify everything drafted
    assert (info["depth"], info["num_verified"], info["phase"]) == (6, 6, "verify")
    _, _, _, _, info = env.step(np.array([0, 1]))  # verify 2 of the 6 drafted
    assert (info["depth"], info["num_verified"], info["verify_size"]) == (6, 2, 2)


def test_cotrain_alternates_and_resumes(tmp_path):
    from stable_baselines3.common.callbacks import BaseCallback

    class StopInSecondRound(BaseCallback):
        def _on_step(self) -> bool:
            return not (self.model.num_timesteps >= 300 and (tmp_path / "phases" / "1_size" / "policy.zip").exists())

    cfg = depth_config("cotrain", "cotrain_rounds=2", "total_timesteps=512")
    assert cotrain.train(cfg, tmp_path, callbacks=[StopInSecondRound()]) is None
    assert (tmp_path / "phases" / "1_depth" / "policy.zip").is_file()
    assert not (tmp_path / "phases" / "2_depth" / "policy.zip").exists()
    run_id = json.loads((tmp_path / "run_state.json").read_text())["run_id"]
    summary = cotrain.train(cfg, tmp_path, resume=True)
    assert summary["run_id"] == run_id and summary["sessions"] == 2
    for phase in ("1_depth", "1_size", "2_depth", "2_size"):
        assert json.loads((tmp_path / "phases" / phase / "policy.json").read_text())["num_timesteps"] == 512
    assert json.loads((tmp_path / "size" / "policy.json").read_text())["kind"] == "size"
    assert json.loads((tmp_path / "depth" / "policy.json").read_text())["kind"] == "depth"
    assert "ppo" in summary["evaluation"]["table"]


@pytest.mark.slow
def test_ppo_depth_beats_every_fixed_depth(tmp_path):
    """The depth policy learns the regime rule level by level (about 2 minutes of CPU).

    Harder than the size policy's task: a round's reward arrives up to 13 steps after its first
    decision, so it needs twice the steps and more evaluation episodes to resolve its margin.
    """
    cfg = depth_config("ppo_depth", "total_timesteps=61440", "ppo.n_steps=256", "eval_episodes=120",
                       "checkpoint_every=20000")
    summary = ppo_depth.train(cfg, tmp_path)
    results = summary["evaluation"]["results"]
    for name, res in results.items():
        if name.startswith("fixed"):
            diff = paired_difference(results["ppo"]["episode_throughputs"], res["episode_throughputs"])
            assert diff["mean"] > 3 * diff["se"], (name, diff)
