"""A small policy trained on real traces for the export tests, once per session in seconds
(the analytic one, ``analytic_run``, is in tests/conftest.py: other packages' tests use it too).

- ``replay_run``: PPO on ``TraceReplay-v1`` over greedy traces of the real SmolLM2 + n-gram
  drafter (2 prompts, 24 tokens, depths 0/1/2/4, a hand-made cost table): the 31
  ``FeatureBuilder`` features, so it can drive draftrl's engine and transformers.

It is exported to ONNX and TorchScript (``replay_exports``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from draftrl.config import from_dict
from draftrl.train import ppo_size
from draftrl.train.config import TrainConfig

REPLAY_WORKLOAD = dict(languages=("en",), tasks=("code_edit",), limit_per_group=2, max_new_tokens=24,
                       depths=(0, 1, 2, 4), seed=0)


def cost_table():
    from draftrl.signals.costs import CostTable

    return CostTable(
        num_tokens=[1, 2, 4, 8, 16], context_lens=[64, 512],
        verify_seconds=[[0.02, 0.021, 0.024, 0.03, 0.045], [0.025, 0.026, 0.03, 0.037, 0.055]],
        draft_widths=[1, 2, 4], draft_level_seconds=[1e-4, 1.5e-4, 2e-4], draft_base_seconds=2e-4,
        sample_base_seconds=1e-3, sample_token_seconds=2e-4, noise=0.05,
    )


@pytest.fixture(scope="session")
def replay_config():
    """The EnvConfig the replay traces were recorded with (the policy's features' settings)."""
    from draftrl.config.env import EnvConfig

    return EnvConfig(**REPLAY_WORKLOAD)


@pytest.fixture(scope="session")
def shared_target(smollm2):
    """The session's SmolLM2, registered as the envs' per-process shared copy."""
    from draftrl.models import loading

    # key of shared_model(spec, dtype, device, kernels)
    loading._SHARED[("smollm2-135m", "float32", "cpu", None)] = smollm2
    return smollm2


@pytest.fixture(scope="session")
def replay_traces(shared_target, replay_config, tmp_path_factory) -> Path:
    import torch

    from draftrl.decoding.build import build_engine
    from draftrl.replay.traces import collect

    torch.set_num_threads(1)
    config = replay_config
    engine, tokenizer = build_engine(config, shared_target)
    directory = tmp_path_factory.mktemp("traces")
    collect(config, engine, tokenizer).save(directory)
    cost_table().save(directory / "cost_table.json")
    return directory


@pytest.fixture(scope="session")
def replay_run(replay_traces, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("replay") / "run"
    cfg = from_dict(TrainConfig, {
        "env": {"id": "draftrl/TraceReplay-v1", "traces": str(replay_traces), **REPLAY_WORKLOAD},
        "total_timesteps": 768, "ppo": {"n_steps": 64, "batch_size": 64}, "checkpoint_every": 256,
        "eval_episodes": 2, "baselines": [], "progress_bar": False,
    })
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "disabled")
        ppo_size.train(cfg, out)
    return out


@pytest.fixture(scope="session")
def replay_exports(replay_run, export_policy, tmp_path_factory) -> dict[str, Path]:
    return export_policy(replay_run, tmp_path_factory.mktemp("replay_export"))
