"""``ppo.vec_env: subproc``: the training envs in SB3's ``SubprocVecEnv`` learn exactly what ``dummy`` learns.

Env ``i`` is seeded ``seed + i`` in both, and each env's episodes depend only on its seed, so the same
config gives the same rollouts, the same logged episode statistics and the same weights, bit for bit.
The negative control (another seed) shows that the comparison can fail. Runs on synthetic serving
recordings (``ServeReplay-v1``, a replay: no model), on an analytic id that only this process
registered (the subprocesses register it again) and through co-training's two policies.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from serve_recordings import synthetic_calibration, synthetic_recordings
from stable_baselines3 import PPO

from draftrl.config import load_config
from draftrl.envs.ids import holds_model, register_id
from draftrl.io import write_json
from draftrl.runs import LOGS_DIR
from draftrl.train import cotrain, ppo_size
from draftrl.train.config import TrainConfig

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "serve_replay_cpu.yaml"


@pytest.fixture(autouse=True)
def _no_wandb(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")


@pytest.fixture(scope="module")
def serving(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("serving")
    synthetic_recordings(8, seed=0).save(base / "tune")
    write_json(base / "costs.json", synthetic_calibration((0.03, 0.002, 0.0006), sd=0.002))
    return base


def serve_config(base: Path, *overrides: str) -> TrainConfig:
    return load_config(TrainConfig, CONFIG, [
        f"env.serve.recordings={base / 'tune'}", f"env.serve.calibration={base / 'costs.json'}",
        f"env.eval.serve.recordings={base / 'tune'}", "env.serve.num_requests=4", "env.serve.max_new_tokens=24",
        "env.serve.depths=[0,2,8]", "env.serve.budgets=[0,4,128]", "total_timesteps=256", "ppo.n_envs=2",
        "ppo.n_steps=64", "ppo.batch_size=64", "ppo.n_epochs=2", "eval_episodes=1", "baselines=[]",
        "keep=last", "progress_bar=false", "checkpoint_every=256", *overrides,
    ])


def weights(run: Path) -> np.ndarray:
    model = PPO.load(run / "policy.zip", device="cpu")
    return np.concatenate([p.detach().numpy().ravel() for p in model.policy.parameters()])


def logged(run: Path) -> list[dict[str, str]]:
    """Every rollout's logged statistics but the clock's (``time/*``)."""
    with next((run / LOGS_DIR).glob("progress_*.csv")).open() as f:
        return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in csv.DictReader(f)]


def test_subproc_trains_on_the_serving_replay_exactly_as_dummy(serving, tmp_path):
    runs = {}
    for name, overrides in (("dummy", ()), ("subproc", ("ppo.vec_env=subproc",)),
                            ("other_seed", ("ppo.vec_env=subproc", "seed=1"))):
        summary = ppo_size.train(serve_config(serving, *overrides), tmp_path / name)
        runs[name] = (weights(tmp_path / name), logged(tmp_path / name), summary["evaluation"]["table"]["ppo"])
    dummy, subproc, other = runs["dummy"], runs["subproc"], runs["other_seed"]
    assert np.array_equal(dummy[0], subproc[0])
    assert dummy[1] == subproc[1] and any("rollout/episode_throughput" in row for row in dummy[1])
    assert dummy[2] == subproc[2]
    assert not np.array_equal(dummy[0], other[0]) and dummy[1] != other[1]  # negative control: it can fail


def test_subproc_registers_a_run_time_id_in_its_processes(tmp_path):
    """An id registered in a function (not at an import a subprocess repeats) exists only in this
    process's registry; the subprocesses register it again from its ``register_id`` arguments."""
    register_id(id="tests/SubprocAnalytic-v0", entry_point="draftrl.envs.analytic:AnalyticEnv",
                max_episode_steps=1024, section="analytic")
    for name in ("dummy", "subproc"):
        cfg = load_config(TrainConfig, None, [
            "env.id=tests/SubprocAnalytic-v0", "total_timesteps=256", "ppo.n_envs=2", "ppo.n_steps=64",
            "checkpoint_every=256", "eval_episodes=1", "baselines=[]", "progress_bar=false",
            f"env.analytic={json.dumps({'regimes': [0.9, 0.2], 'regime_switch': 0.1, 'draft_cost': 0.1})}",
            f"ppo.vec_env={name}"])
        ppo_size.train(cfg, tmp_path / name)
    assert np.array_equal(weights(tmp_path / "dummy"), weights(tmp_path / "subproc"))


def test_subproc_cotrains_exactly_as_dummy(tmp_path):
    """Co-training's size phase wraps each env in ``FrozenDepthEnv`` around the frozen depth policy: the
    wrapper (a closure holding the policy's folder) travels to the subprocesses and plays the same rounds."""
    analytic = json.dumps({"regimes": [0.9, 0.2], "regime_switch": 0.1, "draft_cost": 0.1, "signal_noise": 0.15})
    for name in ("dummy", "subproc"):
        cotrain.train(load_config(TrainConfig, None, [
            "recipe=cotrain", "depth_env.id=tests/AnalyticDepth-v0", "cotrain_rounds=1", "total_timesteps=256",
            "ppo.n_envs=2", "ppo.n_steps=64", "checkpoint_every=256", "eval_episodes=1", "baselines=[]",
            "progress_bar=false", f"depth_env.analytic={analytic}", f"ppo.vec_env={name}"]), tmp_path / name)
    for policy in ("depth", "size"):
        assert np.array_equal(weights(tmp_path / "dummy" / policy), weights(tmp_path / "subproc" / policy)), policy


def test_vec_env_is_checked():
    with pytest.raises(ValueError, match=r"ppo.vec_env='threads' is unknown; choose one of dummy, subproc"):
        load_config(TrainConfig, None, ["ppo.vec_env=threads"])
    with pytest.raises(ValueError, match=r"env.id='draftrl/SpecDecode-v2': that env holds a model"):
        load_config(TrainConfig, None, ["ppo.vec_env=subproc", "env.id=draftrl/SpecDecode-v2"])
    with pytest.raises(ValueError, match=r"depth_env.id='draftrl/SpecDecodeDepth-v2'.*ppo.vec_env=dummy"):
        load_config(TrainConfig, None, ["ppo.vec_env=subproc", "recipe=ppo_depth",
                                        "depth_env.id=draftrl/SpecDecodeDepth-v2"])
    with pytest.raises(ValueError, match=r"finetune_env.id='draftrl/SpecDecode-v2'"):  # the live fine-tuning phase
        load_config(TrainConfig, None, ["ppo.vec_env=subproc", "finetune_real_timesteps=256"])
    for overrides in ([], ["env.id=draftrl/Analytic-v0"], ["recipe=cotrain"]):  # replay and analytic ids: allowed
        assert load_config(TrainConfig, None, ["ppo.vec_env=subproc", *overrides]).ppo.vec_env == "subproc"


def test_the_live_ids_hold_a_model():
    live = {"draftrl/SpecDecode-v2", "draftrl/SpecDecodeDepth-v2", "draftrl/ServeVLLM-v1"}
    replay = {"draftrl/TraceReplay-v1", "draftrl/TraceReplayDepth-v1", "draftrl/ServeReplay-v1", "draftrl/Analytic-v0"}
    assert {i: holds_model(i) for i in live | replay} == {i: i in live for i in live | replay}
