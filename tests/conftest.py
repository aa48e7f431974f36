"""Shared fixtures.

- ``smollm2``: the real embedded default model (fetched from PyPI once);
- ``analytic_run``: PPO on the analytic regime workload (``configs/analytic_regimes.yaml`` shrunk to
  2,048 steps, seconds on CPU): 6 features, 13 depths, VecNormalize on; ``analytic_exports``: it
  exported to ONNX and TorchScript. Used by the export, policy and CLI tests;
- ``serve_run``: PPO on ``draftrl/ServeReplay-v1`` (``configs/serve_replay_cpu.yaml`` shrunk to 256
  steps over synthetic recordings and costs, seconds on CPU): the serving env's 20 features,
  depths 0/2/8, budgets 0/4/128. Used by the export tests and the real-vLLM export test;
- ``tiny_traces``: makes a one-prompt ``Traces`` small enough to save and load.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M-Instruct target as a ``LoadedModel`` (CPU, float32, fast_linear on)."""
    from draftrl.models import load_model

    torch.manual_seed(0)
    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def analytic_run(tmp_path_factory) -> Path:
    from draftrl.config import load_config
    from draftrl.train import ppo_size
    from draftrl.train.config import TrainConfig

    out = tmp_path_factory.mktemp("analytic") / "run"
    cfg = load_config(TrainConfig, ROOT / "configs" / "analytic_regimes.yaml", [
        "total_timesteps=2048", "ppo.n_steps=64", "checkpoint_every=1024", "eval_episodes=3",
        "baselines=[]", "progress_bar=false",
    ])
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "disabled")
        ppo_size.train(cfg, out)
    return out


@pytest.fixture(scope="session")
def serve_run(tmp_path_factory) -> Path:
    from serve_recordings import synthetic_calibration, synthetic_recordings

    from draftrl.config import load_config
    from draftrl.io import write_json
    from draftrl.train import ppo_size
    from draftrl.train.config import TrainConfig

    base = tmp_path_factory.mktemp("serve")
    synthetic_recordings(12, seed=0).save(base / "tune")
    write_json(base / "costs.json", synthetic_calibration((0.03, 0.002, 0.0006), sd=0.002))
    cfg = load_config(TrainConfig, ROOT / "configs" / "serve_replay_cpu.yaml", [
        f"env.serve.recordings={base / 'tune'}", f"env.serve.calibration={base / 'costs.json'}",
        f"env.eval.serve.recordings={base / 'tune'}", "env.serve.num_requests=6", "env.serve.max_new_tokens=40",
        "env.serve.depths=[0,2,8]", "env.serve.budgets=[0,4,128]", "total_timesteps=256", "ppo.n_envs=1",
        "ppo.n_steps=128", "ppo.batch_size=64", "ppo.n_epochs=1", "eval_episodes=1", "baselines=[]",
        "progress_bar=false", "checkpoint_every=256",
    ])
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "disabled")
        ppo_size.train(cfg, base / "run")
    return base / "run"


def export_run(run: Path, directory: Path) -> dict[str, Path]:
    """``run``'s policy as ``{"onnx": policy.onnx, "torchscript": policy.pt}`` in ``directory``."""
    from draftrl.export.network import export

    files = {"onnx": directory / "policy.onnx", "torchscript": directory / "policy.pt"}
    for backend, file in files.items():
        export(run, file, backend, check_observations=512)
    return files


@pytest.fixture(scope="session")
def export_policy():
    """:func:`export_run`, for the fixtures of other folders."""
    return export_run


@pytest.fixture(scope="session")
def analytic_exports(analytic_run, tmp_path_factory) -> dict[str, Path]:
    return export_run(analytic_run, tmp_path_factory.mktemp("analytic_export"))


@pytest.fixture
def tiny_traces():
    """``tiny_traces(token=7)``: one prompt, two positions, a one-node chain per position."""
    from draftrl.prompts import Prompt
    from draftrl.replay.traces import Traces

    def make(token: int = 7) -> Traces:
        return Traces(
            prompts=[Prompt("en-chat-000", "en", "chat", "tune", "hi", 2)], budgets=[2], stop_reasons=["length"],
            prompt_tokens=np.array([1, 2, 3]), cu_num_prompt_tokens=np.array([0, 3]),
            continuation=np.array([token, 8]), cu_num_positions=np.array([0, 2]),
            draft_features=np.zeros((2, 3)), cu_num_nodes=np.array([0, 1, 1]),
            node_tokens=np.array([token]), node_parents=np.array([-1]), node_depths=np.array([1]),
            node_scores=np.array([0.5]), max_depth=1, width=1,
            meta={"config": {}, "target": "smollm2-135m", "drafter": "ngram"},
        )

    return make


@pytest.fixture(scope="module")
def one_thread():
    """Statistical tests run thousands of small ops: one intra-op thread is faster, and much faster
    on a busy machine. Modules opt in with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
