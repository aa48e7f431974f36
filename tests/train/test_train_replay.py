"""PPO on recorded traces of the CPU default (SmolLM2-135M + n-gram drafter): it beats the best
fixed setting on held-out prompts it never saw.

Slow (``pytest -m slow``): recording the two trace sets decodes ~64 prompts with the real model
(a few minutes on an idle 2-core CPU). Seconds come from a fixed, plausible CPU cost table rather
than a calibration, so the comparison is reproducible; the tokens of every round are the real
engine's (TraceReplay-v1 is tested against it in tests/envs).
"""

from __future__ import annotations

import pytest

import draftrl.envs  # noqa: F401  registers the env ids (gymnasium.register_envs idiom)
from draftrl.config import load_config
from draftrl.policies import paired_difference
from draftrl.train import ppo_size
from draftrl.train.config import TrainConfig

pytestmark = pytest.mark.slow

#: The CPU default's workload, shrunk: every language and task, 2 prompts each, 48 tokens.
WORKLOAD = dict(limit_per_group=2, max_new_tokens=48, seed=0)


def cost_table():
    """SmolLM2-135M-like CPU costs: verifying n tokens costs ~1 + 0.07 (n - 1) plain steps."""
    from draftrl.signals.costs import CostTable

    return CostTable(
        num_tokens=[1, 2, 4, 8, 16], context_lens=[64, 512, 1024],
        verify_seconds=[[0.020, 0.021, 0.024, 0.030, 0.045], [0.025, 0.026, 0.030, 0.037, 0.055],
                        [0.030, 0.032, 0.036, 0.045, 0.066]],
        draft_widths=[1, 2, 4], draft_level_seconds=[1e-4, 1.5e-4, 2e-4], draft_base_seconds=2e-4,
        sample_base_seconds=1e-3, sample_token_seconds=2e-4, noise=0.05,
    )


@pytest.fixture(scope="module")
def cpu_traces(smollm2, tmp_path_factory):
    """{"tune": dir, "heldout": dir}: greedy traces of the CPU default on both prompt splits."""
    import torch

    from draftrl.config.env import EnvConfig
    from draftrl.decoding.build import build_engine
    from draftrl.replay.traces import collect

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("cpu_traces")
    dirs = {}
    for split in ("tune", "heldout"):
        config = EnvConfig(**WORKLOAD, split=split)
        engine, tokenizer = build_engine(config, smollm2)
        dirs[split] = collect(config, engine, tokenizer).save(root / split)
        cost_table().save(root / split / "cost_table.json")
    return dirs


def test_ppo_on_traces_beats_best_fixed_on_heldout_prompts(cpu_traces, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    cfg = load_config(
        TrainConfig,
        None,
        ["total_timesteps=40960", "eval_episodes=96", "progress_bar=false", "baselines=[heuristic, bandit]",
         f"env.traces={cpu_traces['tune']}", "env.cost_noise=0.05",
         f"env.eval={{traces: {cpu_traces['heldout']}, cost_noise: 0.0}}",
         *(f"env.{k}={v}" for k, v in WORKLOAD.items())],
    )
    assert cfg.env.id == "draftrl/TraceReplay-v1"  # the default env
    summary = ppo_size.train(cfg, tmp_path)
    evaluation = summary["evaluation"]
    results = evaluation["results"]
    assert evaluation["env"]["traces"] == str(cpu_traces["heldout"])  # prompts PPO never saw
    best = results[evaluation["best_fixed"]]
    diff = paired_difference(results["ppo"]["episode_throughputs"], best["episode_throughputs"])
    assert results["ppo"]["throughput"] > best["throughput"]
    assert diff["mean"] > 3 * diff["se"], (evaluation["best_fixed"], diff)
