"""draftrl's proposer inside real vLLM reads each request's sampling from vLLM's persistent batch
(issue 46): the driver's runner, and ``propose``'s caller (the route under ``vllm serve``, where no
driver attaches the runner); the engine reports the same temperatures beside its request signals."""

from __future__ import annotations

import numpy as np

from draftrl.decoding.admission import StepAction
from draftrl.decoding.vllm.engine import VLLMEngineConfig, shared_engine

SAMPLING = {"greedy": (0.0, 0, 1.0), "warm": (0.7, 20, 1.0), "hot": (1.0, 0, 0.9)}


def _run(engine, mixed_prompts) -> list:
    proposer = engine.proposer
    proposer.history = []
    (pid, ids), *_ = mixed_prompts
    for name, (t, k, p) in SAMPLING.items():
        engine.add_request(name, ids, 12, temperature=t, top_k=k, top_p=p, seed=7 if t else None)
    names = {internal: name for name, internal in engine._internal.items()}  # vLLM keys requests its own way
    temperatures = []
    while engine.has_unfinished_requests():
        engine.step(StepAction(4, None))
        temps = engine.request_temperatures()
        assert temps is not None and len(temps) == len(engine.request_signals()[0])
        temperatures.append(temps)
    history, proposer.history = proposer.history, None
    return history, temperatures, names


def test_the_proposer_reads_each_requests_sampling_from_vllms_batch(mixed_prompts):
    engine = shared_engine(VLLMEngineConfig(method="draftrl"))
    history, temperatures, names = _run(engine, mixed_prompts)
    seen = {}
    for record in history:
        for key, temp in zip(record.keys, record.temperature):
            seen.setdefault(names.get(key, key), set()).add(round(float(temp), 6))  # vLLM keeps float32
    assert seen == {"greedy": {0.0}, "warm": {0.7}, "hot": {1.0}}
    assert any(len(t) == 3 and sorted(np.round(t, 6).tolist()) == [0.0, 0.7, 1.0] for t in temperatures)
    # without the driver's runner (as under vllm serve): read through propose's caller, vLLM's runner
    runner, engine.proposer.runner = engine.proposer.runner, None
    try:
        history, _, _ = _run(engine, mixed_prompts)
    finally:
        engine.proposer.runner = runner
    full = [r for r in history if len(r.keys) == 3]
    assert full and all(sorted(np.round(r.temperature, 6).tolist()) == [0.0, 0.7, 1.0] for r in full)
