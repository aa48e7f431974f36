"""Issue 46's last bullet: a batch policy trained on a temperature mix (``ServeReplay-v1`` over synthetic
recordings with greedy, T=0.7 and T=1.0 classes, 8192 PPO steps) exported with ``draftrl export
--format vllm`` serves in stock ``vllm serve`` (CPU, 127.0.0.1, started from the bundle's ``serve``
line) under an ``openai``-client load with per-request temperatures: every request completes, the
greedy requests equal vLLM's without speculation (float32), and the controller's per-step log
(``DRAFTRL_CONTROL_LOG``) shows the batch's temperatures reaching the policy and its decisions
differing between all-greedy and all-T1 batches. The load itself: ``tools/serve_openai_mix.py``
(whose functions this test runs). Slow: training, export and a server start take minutes here."""

from __future__ import annotations

import importlib.util
import json
import shlex
from pathlib import Path

import numpy as np
import pytest

from draftrl.cli import main

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TOKENS = 24
MIX = "{0: 0.3, 0.7: 0.4, 1.0: 0.3}"


def _tool():
    spec = importlib.util.spec_from_file_location("serve_openai_mix", ROOT / "tools" / "serve_openai_mix.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def mix_bundle(tmp_path_factory) -> Path:
    from serve_recordings import synthetic_calibration, synthetic_mix_recordings

    from draftrl.config import load_config
    from draftrl.io import write_json
    from draftrl.train import ppo_size
    from draftrl.train.config import TrainConfig

    base = tmp_path_factory.mktemp("serve_mix")
    synthetic_mix_recordings(12, 2, seed=0).save(base / "tune")
    write_json(base / "costs.json", synthetic_calibration((0.03, 0.002, 0.0006), sd=0.002))
    cfg = load_config(TrainConfig, ROOT / "configs" / "serve_replay_cpu.yaml", [
        f"env.serve.recordings={base / 'tune'}", f"env.serve.calibration={base / 'costs.json'}",
        f"env.eval.serve.recordings={base / 'tune'}", "env.serve.num_requests=6", "env.serve.max_new_tokens=40",
        f"env.serve.temperature_mix={MIX}", "env.serve.depths=[0,2,4,8]", "env.serve.budgets=[0,4,16,128]",
        "total_timesteps=8192", "ppo.n_envs=1", "ppo.n_steps=256", "ppo.batch_size=64", "ppo.n_epochs=4",
        "eval_episodes=1", "baselines=[]", "progress_bar=false", "checkpoint_every=8192",
    ])
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "disabled")
        ppo_size.train(cfg, base / "run")
    assert main(["export", str(base / "run"), "--format", "vllm", "--out", str(base / "bundle")]) == 0
    return base / "bundle"


def _plain(prompts: list[list[int]]) -> dict[int, list[int]]:
    from draftrl.decoding.vllm.engine import VLLMEngineConfig, shared_engine

    engine = shared_engine(VLLMEngineConfig(method="none"))  # the engine tests/real_vllm share
    for i, ids in enumerate(prompts):
        engine.add_request(str(i), ids, TOKENS)
    out: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for r in engine.step().requests:
            out.setdefault(r.request_id, []).extend(r.token_ids)
    return {i: out[str(i)] for i in range(len(prompts))}


def _replay_depths(policy, concurrency: int = 4) -> tuple[float, float]:
    """The policy's mean depth over a replay episode on the mix, asked about each observation with the
    sampling entries of an all-greedy and of an all-T1 batch."""
    from serve_recordings import COST, synthetic_mix_recordings

    from draftrl.config.serve import ServeConfig
    from draftrl.envs.serve_vllm import ServeVLLMEnv

    env = ServeVLLMEnv(ServeConfig(temperature_mix={0: 0.3, 0.7: 0.4, 1.0: 0.3}, max_new_tokens=40,
                                   concurrency=concurrency, num_requests=12, depths=(0, 2, 4, 8),
                                   budgets=(0, 4, 16, 128)),
                       engine="replay", recordings=synthetic_mix_recordings(12, 2, seed=0), calibration=COST)
    obs, _ = env.reset(seed=0)
    seen, done = [obs], False
    while not done:
        depth, budget = (int(v) for v in policy.act(obs))
        obs, _, done, truncated, _ = env.step(np.array([env.depths.index(depth), env.budgets.index(budget)]))
        done = done or truncated
        seen.append(obs)
    names = [policy.feature_names.index(n) for n in ("greedy_share", "temperature_mean", "temperature_max")]
    depths = []
    for entries in ((1.0, 0.0, 0.0), (0.0, 1.0, 1.0)):
        swapped = np.stack(seen).astype(np.float32)
        swapped[:, names] = entries
        depths.append(float(np.mean([policy.act(o)[0] for o in swapped])))
    return depths[0], depths[1]


def test_a_policy_trained_on_the_mix_serves_mixed_temperatures_in_vllm_serve(mix_bundle, mixed_prompts, tmp_path):
    from draftrl.decoding.vllm.engine import model_path
    from draftrl.export.controller import PolicyController
    from draftrl.export.vllm_control import LOG_ENV

    tool = _tool()
    bundle = json.loads((mix_bundle / "vllm.json").read_text())
    words = shlex.split(bundle["serve"])  # the line a user runs: its environment and speculative config
    assert "DRAFTRL_PROPOSER_CONFIG=proposer.json" in words
    assert json.loads(words[words.index("--speculative-config") + 1]) == bundle["speculative_config"]
    assert bundle["proposer"]["controller"] == "draftrl.export.vllm_control:BatchPolicyControl"
    model = model_path("smollm2-135m")
    command, env = tool.serve_command(bundle, model, tool.free_port())
    assert env == bundle["env"] and "127.0.0.1" in command
    prompts = [ids for _, ids in mixed_prompts]
    log = tmp_path / "control.jsonl"
    replies = {}
    with tool.server(command, {**env, LOG_ENV: str(log)}, mix_bundle, tmp_path / "serve.log") as base:
        for name, requests in tool.phases(len(prompts)).items():
            replies[name] = tool.run_load(base, model, prompts, requests, TOKENS)
    report = tool.check(replies, _plain(prompts), TOKENS)
    lines = tool.read_log(log)
    decided = tool.decisions(lines, PolicyController(mix_bundle / bundle["policy"]))
    print("openai mix:", json.dumps({"check": report, "decisions": decided}))
    assert report["complete"] == report["requests"] == 3 * len(prompts)
    assert report["greedy_identical"] == report["greedy"] == len(prompts) + 2  # the mixed phase has 2 greedy
    # the batch's temperatures reached the controller, as vLLM's batch holds them, and its observation
    assert {t for line in lines for t in line["temperatures"]} == {0.0, 0.7, 1.0}
    greedy, hot = decided["greedy"], decided["hot"]
    assert greedy["steps"] > 3 and hot["steps"] > 3
    assert greedy["observed_temperature_max"] < 0.5 < hot["observed_temperature_max"]
    assert sum(line["proposed"] for line in lines) > 0  # identity was checked on drafts too
    # the policy decides differently for an all-greedy and an all-T1 batch: on the same observations
    # (sampling entries swapped) and in the steps the server ran
    assert decided["counterfactual"]["differ"] > 0.5
    assert (greedy["depth_cap"], greedy["budget"]) != (hot["depth_cap"], hot["budget"])
    # and the same way as in the replay: deeper (or shallower) for a greedy batch than for a T1 batch
    replay_greedy, replay_hot = _replay_depths(PolicyController(mix_bundle / bundle["policy"]))
    print(f"replay depth greedy / T1: {replay_greedy:.2f} / {replay_hot:.2f}; vllm serve: "
          f"{greedy['depth_cap']:.2f} / {hot['depth_cap']:.2f}")
    assert replay_greedy != replay_hot
    assert np.sign(replay_greedy - replay_hot) == np.sign(greedy["depth_cap"] - hot["depth_cap"])
