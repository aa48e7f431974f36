"""``ServeReplay-v0`` against real vLLM: recordings from vLLM without speculation, then the same
episodes in ``ServeVLLM-v0`` and in the simulator give the same tokens and the same schedule
(tokens, drafts verified, accepted and proposed, running and waiting, step by step); the cost
model refits on a fresh tiny calibration."""

from __future__ import annotations

import numpy as np
import pytest

from draftrl.decoding.vllm.calibrate import StepCostModel, calibrate
from draftrl.decoding.vllm.engine import VLLMEngineConfig, shared_engine
from draftrl.envs.serve import ServeVLLMEnv
from draftrl.config.serve import ServeConfig
from draftrl.envs.serve_replay import ServeReplayEnv
from draftrl.envs.serve_sim import record_workload

CONFIG = ServeConfig(split="heldout", languages=("en", "it", "zh", "es"), tasks=("code_edit", "summarize"),
                     max_new_tokens=24, concurrency=4, shuffle=False)
KEYS = ("tokens", "num_drafted", "num_accepted", "num_proposed", "running", "waiting", "depth", "budget")


@pytest.fixture(scope="module")
def recordings(vllm_tokenizer):
    plain = shared_engine(VLLMEngineConfig(method="none"))
    return record_workload(CONFIG, engine=plain, tokenizer=vllm_tokenizer)


def episode(env, action):
    env.reset(seed=0)
    steps = []
    while True:
        _, _, terminated, _, info = env.step(np.array(action))
        steps.append({k: info[k] for k in KEYS})
        if terminated:
            return steps, {r.prompt_id: r.token_ids for r in info["requests"]}


@pytest.mark.parametrize("action", [(4, 7), (6, 2), (5, 0)])  # depth 4 unlimited; depth 6 budget 4; budget 0
def test_simulator_replays_real_vllm_step_by_step(recordings, vllm_tokenizer, action):
    real = ServeVLLMEnv(CONFIG, tokenizer=vllm_tokenizer)
    sim = ServeReplayEnv(recordings, StepCostModel(0.05, 0.002, 0.001), CONFIG)
    real_steps, real_tokens = episode(real, action)
    sim_steps, sim_tokens = episode(sim, action)
    assert sim_tokens == real_tokens == {r.prompt.id: r.token_ids[:CONFIG.max_new_tokens] for r in recordings.requests}
    assert sim_steps == real_steps


def test_cost_model_refits_on_a_fresh_tiny_calibration():
    engine = shared_engine(VLLMEngineConfig(method="draftrl"))
    result = calibrate(engine, batch_sizes=(1, 4), depths=(0, 4), steps=4, warmup=1)
    model = StepCostModel.from_calibration(result)
    assert (model.base, model.per_seq, model.per_token) == pytest.approx(
        (result["fit"]["base"], result["fit"]["per_seq"], result["fit"]["per_token"]))
    samples = [(p["num_seqs"], p["tokens_verified"], s) for p in result["points"] for s in p["seconds"]]
    predicted = [model.mean(b, t) for b, t, _ in samples]
    assert sum(predicted) == pytest.approx(sum(s for _, _, s in samples), rel=1e-6)  # least squares with an intercept
    assert model.residual_std == pytest.approx(np.std([s - p for (_, _, s), p in zip(samples, predicted)]), rel=1e-6)
    assert model.mean(4, 20) > model.mean(1, 1) > 0  # more sequences and tokens cost more, here too
