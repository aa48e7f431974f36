"""Exactness on a temperature mix inside real vLLM (issue 46): one batch serves greedy requests and
requests sampled at T = 1 and 1.5, each with its own ``SamplingParams``; greedy requests emit plain
vLLM's tokens under speculation, the T = 1 streams pass the streaming monitor routed by class
(``ClassStreamChecks``), and the same monitor rejects the T = 1.5 streams read as T = 1 (the
wrong-sampler control: a request checked against another class's p)."""

from __future__ import annotations

import numpy as np

from draftrl.config.serve import ServeConfig
from draftrl.config.workload import SamplingClass
from draftrl.decoding.monitor import MonitorConfig
from draftrl.decoding.vllm.engine import VLLMEngineConfig
from draftrl.envs.serve_vllm import ServeVLLMEnv
from draftrl.eval.exactness import ClassStreamChecks

CONFIG = ServeConfig(split="heldout", shuffle=False, seed=3, max_new_tokens=48, concurrency=8, num_requests=24,
                     temperature_mix={0: 1.0, 1.0: 1.0, 1.5: 1.0})


def _episode(env, action):
    env.reset(seed=3)
    steps = []
    while True:
        *_, done, _, info = env.step(np.array(action))
        steps.append(info["request_steps"])
        if done:
            return steps, info["requests"]


def test_a_mixed_batch_is_exact_per_class(vllm_tokenizer):
    env = ServeVLLMEnv(CONFIG, tokenizer=vllm_tokenizer)
    spec_steps, spec_requests = _episode(env, (4, 7))  # depth 4, no budget
    _, plain_requests = _episode(env, (0, 0))  # no speculation, the same requests, classes and seeds
    classes = [r.sampling.label for r in spec_requests]
    assert {"T0", "T1", "T1.5"} <= set(classes) and classes == [r.sampling.label for r in plain_requests]
    greedy = [(a.token_ids, b.token_ids) for a, b in zip(spec_requests, plain_requests) if a.sampling.greedy]
    assert greedy and all(a == b for a, b in greedy)  # float32: greedy identity beside sampled neighbours
    assert sum(s.num_verified for step in spec_steps for s in step) > 0  # it speculated
    by_id = {r.request_id: r.sampling for r in spec_requests}
    max_logprobs = VLLMEngineConfig().max_logprobs
    exact = ClassStreamChecks((SamplingClass(1.0),), max_logprobs, MonitorConfig(min_tokens=100))
    wrong = ClassStreamChecks((SamplingClass(1.0),), max_logprobs, MonitorConfig(min_tokens=100))
    hot_as_one = {k: SamplingClass(1.0) if v.temperature == 1.5 else None for k, v in by_id.items()}
    for step in spec_steps:
        exact.observe(step, by_id)
        wrong.observe(step, {k: v for k, v in hot_as_one.items() if v is not None})
    verdict, control = exact.verdicts()["T1"], wrong.verdicts()["T1"]
    print(f"T1: {verdict['verdict']} on {verdict['num_informative']} tokens; T1.5 read as T1: {control['verdict']} "
          f"({control['num_informative']} tokens)")
    assert verdict["verdict"] == "passed" and verdict["num_informative"] >= 200
    assert control["verdict"] == "failed"
