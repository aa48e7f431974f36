"""``configs/serve_replay_cpu.yaml``: PPO trains on ``draftrl/ServeReplay-v1`` through the ordinary
recipe, is evaluated against every fixed (depth cap, budget), the per-request heuristic and the
greedy one-step lookahead, and loads back onto the replay's (= ServeVLLM-v1's) spaces.

Synthetic recordings and a synthetic calibration file stand for the vLLM ones (tests/envs checks
the replay itself; tests/real_vllm checks it against vLLM), so this runs in seconds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from serve_recordings import synthetic_calibration, synthetic_recordings

from draftrl.config import load_config
from draftrl.io import write_json
from draftrl.policies import PPOPolicy
from draftrl.train import ppo_size
from draftrl.train.config import TrainConfig
from draftrl.train.envs import make_env

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "serve_replay_cpu.yaml"


@pytest.fixture(autouse=True)
def _no_wandb(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")


def test_ppo_trains_on_the_serving_replay_and_meets_its_baselines(tmp_path):
    synthetic_recordings(12, seed=0).save(tmp_path / "tune")
    synthetic_recordings(6, seed=1).save(tmp_path / "heldout")
    write_json(tmp_path / "costs.json", synthetic_calibration((0.03, 0.002, 0.0006), sd=0.002))
    cfg = load_config(TrainConfig, CONFIG, [
        f"env.serve.recordings={tmp_path / 'tune'}", f"env.serve.calibration={tmp_path / 'costs.json'}",
        f"env.eval.serve.recordings={tmp_path / 'heldout'}", "env.serve.num_requests=6",
        "env.serve.max_new_tokens=40", "env.serve.depths=[0,2,8]", "env.serve.budgets=[0,4,128]",
        "total_timesteps=512", "ppo.n_envs=2", "ppo.n_steps=128",
        "ppo.batch_size=64", "ppo.n_epochs=2", "eval_episodes=2", "progress_bar=false", "checkpoint_every=512",
    ])
    summary = ppo_size.train(cfg, tmp_path / "run")
    assert summary["selection"]["best"] == 512  # the recipe keeps its best checkpoint (here the only one)
    table = summary["evaluation"]["table"]
    env = make_env(cfg.env, evaluation=True)
    grid = {f"fixed(d={d},v={b})" for d in env.unwrapped.depths for b in env.unwrapped.budgets}
    assert grid | {"ppo", "heuristic", "lookahead", "bandit"} == set(table)
    assert table["fixed(d=0,v=0)"]["throughput"] == pytest.approx(table["fixed(d=8,v=0)"]["throughput"])
    assert table["lookahead"]["throughput"] >= 0.97 * table["fixed(d=8,v=128)"]["throughput"]
    policy = PPOPolicy.load(tmp_path / "run", env)
    obs, _ = env.reset(seed=0)
    depth, budget = policy.act(obs)
    assert depth in env.unwrapped.depths and budget in env.unwrapped.budgets
    assert np.array_equal(policy.to_action(depth, budget), [env.unwrapped.depths.index(depth),
                                                            env.unwrapped.budgets.index(budget)])
