"""A serving-env policy (``ServeReplay-v1``, the ``serve_run`` fixture) exported with ``draftrl export
--format vllm`` starts real vLLM from its bundle alone: draftrl's proposer, whose controller
``BatchPolicyControl`` builds the env's observation every step, applies the policy's (depth,
budget), and the float32 greedy outputs equal vLLM's without speculation."""

from __future__ import annotations

import json

import numpy as np

from draftrl.cli import main

#: in-process vLLM engines started here, alive until the process ends (see test_vllm_bundle.py)
_KEPT: list = []


def test_exported_serving_policy_runs_in_vllm(serve_run, mixed_prompts, tmp_path, monkeypatch):
    from draftrl.decoding.vllm.engine import VLLMEngineConfig, model_path, set_cpu_defaults, shared_engine
    from draftrl.signals.serving import ServingFeatures

    out = tmp_path / "bundle"
    assert main(["export", str(serve_run), "--format", "vllm", "--out", str(out), "--check-observations", "64"]) == 0
    bundle = json.loads((out / "vllm.json").read_text())
    spec = bundle["speculative_config"]
    assert spec["model"] == "draftrl.decoding.vllm.proposer.DraftrlProposer"
    assert json.loads((out / "proposer.json").read_text())["controller"] == \
        "draftrl.export.vllm_control:BatchPolicyControl"
    for key, value in bundle["env"].items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(out)  # the bundle's lines run from its folder: its paths are relative to it
    set_cpu_defaults(VLLMEngineConfig())
    from vllm import LLM, SamplingParams

    llm = LLM(model=model_path("smollm2-135m"), dtype="float32", enforce_eager=True, max_model_len=1024,
              max_num_seqs=4, seed=0, speculative_config=spec)
    _KEPT.append(llm)  # destroying an in-process engine breaks the other engines of the session
    proposer = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner.drafter
    assert type(proposer).__name__ == "DraftrlProposer" and type(proposer.controller).__name__ == "BatchPolicyControl"
    proposer.history, proposer.controller.observations = [], []
    prompts = [{"prompt_token_ids": ids} for _, ids in mixed_prompts]
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=32), use_tqdm=False)
    got = [list(o.outputs[0].token_ids) for o in outputs]

    plain = shared_engine(VLLMEngineConfig(method="none"))  # the engine tests/real_vllm share
    for i, (_, ids) in enumerate(mixed_prompts):
        plain.add_request(str(i), ids, 32)
    expected: dict[str, list[int]] = {}
    while plain.has_unfinished_requests():
        for r in plain.step().requests:
            expected.setdefault(r.request_id, []).extend(r.token_ids)
    assert got == [expected[str(i)] for i in range(len(prompts))]

    obs = np.stack(proposer.controller.observations)  # one per engine step, in the env's bounds
    assert len(obs) == len(proposer.history) > 8 and np.all(np.isfinite(obs))
    assert np.all(obs >= ServingFeatures.low) and np.all(obs <= ServingFeatures.high)
    assert obs[1:, 0].max() > 0  # requests running after the first step
    for record in proposer.history:  # the policy's action bounded every step's drafts
        assert record.action.depth in (0, 2, 8) and record.action.budget in (0, 4, 128)
        assert (int(record.admitted.sum()) <= record.action.budget
                and record.admitted.max(initial=0) <= record.action.depth)
    assert sum(int(r.admitted.sum()) for r in proposer.history) > 0  # identity was checked on drafts too
