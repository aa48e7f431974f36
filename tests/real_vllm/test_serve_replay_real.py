"""``ServeReplay-v1`` against real vLLM: recordings from vLLM without speculation, then the same
episodes in ``ServeVLLM-v1`` and in the replay give the same tokens and the same schedule
(tokens, drafts verified, accepted and proposed, running and waiting, step by step); the cost
model refits on a fresh tiny calibration."""

from __future__ import annotations

import numpy as np
import pytest

from draftrl.config.serve import ServeConfig
from draftrl.decoding.vllm.engine import VLLMEngineConfig, shared_engine
from draftrl.envs.serve_vllm import ServeVLLMEnv
from draftrl.replay.recordings import record_workload
from draftrl.replay.serve_calibrate import StepCostModel, calibrate, decode_table

CONFIG = ServeConfig(split="heldout", languages=("en", "it", "zh", "es"), tasks=("code_edit", "summarize"),
                     max_new_tokens=24, concurrency=4, shuffle=False)
KEYS = ("num_emitted", "num_verified", "num_accepted", "num_proposed", "running", "waiting", "depth", "budget")


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
def test_the_replay_follows_real_vllm_step_by_step(recordings, vllm_tokenizer, action):
    real = ServeVLLMEnv(CONFIG, tokenizer=vllm_tokenizer)
    replay = ServeVLLMEnv(CONFIG, engine="replay", recordings=recordings, calibration=StepCostModel(0.05, 0.002, 0.001))
    real_steps, real_tokens = episode(real, action)
    replay_steps, replay_tokens = episode(replay, action)
    recorded = {r.prompt.id: r.token_ids[:CONFIG.max_new_tokens] for r in recordings.requests}
    assert replay_tokens == real_tokens == recorded
    assert replay_steps == real_steps


def test_cost_model_refits_on_a_fresh_tiny_calibration():
    engine = shared_engine(VLLMEngineConfig(method="draftrl"))
    result = calibrate(engine, batch_sizes=(1, 4), depths=(0, 4), steps=4, warmup=1, prefill_lens=(64,),
                       prefill_batch_sizes=(1,), rounds=2)
    model = StepCostModel.from_calibration(result)
    assert (model.base, model.per_seq, model.per_token, model.per_prefill_token) == pytest.approx(
        (result["fit"]["base"], result["fit"]["per_seq"], result["fit"]["per_token"],
         result["fit"]["per_prefill_token"]))
    decode = [p for p in result["points"] if p["kind"] == "decode"]
    assert {(p["num_seqs"], p["depth"]) for p in decode} == {(1, 0), (1, 4), (4, 0), (4, 4)}
    assert all(p["samples"] == 4 for p in result["points"])
    table = decode_table(result["points"])
    for p in decode:  # the model reproduces each measured cell's median
        tokens, secs = table[p["num_seqs"]]
        assert (model.mean(p["num_seqs"], p["tokens_verified"])
                == pytest.approx(secs[tokens.index(p["tokens_verified"])]))
    spread = [s - model.mean(p["num_seqs"], p["tokens_verified"]) for p in decode for s in p["seconds"]]
    assert model.residual_std == pytest.approx(np.std(spread), rel=1e-6)
    assert result["fit"]["prefill_calibrated"] and model.per_prefill_token > 0  # a prompt token costs something
    assert model.mean(4, 20) > model.mean(1, 1) > 0  # more sequences and tokens cost more, here too
