"""The Hugging Face engine behind the serving interface: exact under any cap/budget, budget kept,
and the serving env runs on it unchanged."""

from __future__ import annotations

import numpy as np

from draftrl.decoding.admission import StepAction
from draftrl.decoding.batch import HFBatchEngine
from draftrl.decoding.interface import ServingEngine

PROMPTS = {
    "code": "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "it": "Il gatto dorme sul divano. Il gatto dorme sul letto. Il gatto dorme",
    "en": "one two three four five one two three four five one two",
}


def run(engine, tokenizer, action, tokens=16):
    for rid, text in PROMPTS.items():
        engine.add_request(rid, tokenizer(text, add_special_tokens=False)["input_ids"], tokens)
    outputs, steps = {}, []
    while engine.has_unfinished_requests():
        step = engine.step(action)
        steps.append(step)
        for r in step.requests:
            outputs.setdefault(r.request_id, []).extend(r.token_ids)
    return outputs, steps


def test_hf_batch_engine_is_exact_and_keeps_the_budget(smollm2):
    engine = HFBatchEngine(smollm2, max_depth=6, max_num_seqs=2, eos_token_ids=tuple(smollm2.eos_token_ids))
    assert isinstance(engine, ServingEngine) and engine.action_lag == 0
    plain, plain_steps = run(engine, smollm2.tokenizer, StepAction(0))
    assert all(s.num_verified == 0 for s in plain_steps)
    assert all(len(r.token_ids) == 1 for s in plain_steps for r in s.requests)
    drafted, steps = run(engine, smollm2.tokenizer, StepAction(6, 3))
    assert drafted == plain
    assert max(s.num_verified for s in steps) == 3 and all(s.num_verified <= 3 for s in steps)
    assert sum(s.num_accepted for s in steps) > 0
    assert max(s.num_running for s in steps) <= 2


def test_serving_env_runs_on_the_hf_engine(smollm2):
    from draftrl.envs.serve_vllm import ServeVLLMEnv

    engine = HFBatchEngine(smollm2, max_depth=8, max_num_seqs=4, eos_token_ids=tuple(smollm2.eos_token_ids))
    env = ServeVLLMEnv(engine=engine, tokenizer=smollm2.tokenizer, num_requests=3, max_new_tokens=8, concurrency=2,
                       split="heldout", languages=("en",), seed=0, temperature_mix={0: 0.5, 1.0: 0.5})
    obs, _ = env.reset()
    assert obs.shape == (23,) and env.action_lag == 0
    done, info, hottest = False, {}, []
    while not done:
        obs, reward, done, truncated, info = env.step(np.array([4, 3]))
        assert env.observation_space.contains(obs)
        assert info["num_verified"] <= 8
        hottest.append(obs[env.feature_names.index("temperature_max")])
    # the batch's sampling entries follow the requests' own temperatures (a mix: each drew its own)
    drawn = {r.sampling.temperature for r in info["requests"]}
    assert max(hottest) == max(drawn) and len(engine.request_temperatures()) == len(engine.request_signals()[0])
    assert [len(r.token_ids) for r in info["requests"]] == [8, 8, 8] or all(r.finished for r in info["requests"])
