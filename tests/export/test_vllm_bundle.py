"""``draftrl export --format vllm --out DIR`` starts real vLLM: the exported policy drafts inside
vLLM's ``LLM(...)``, the outputs equal vLLM's without speculation (float32 greedy), drafts get
accepted, and a policy that is not a size policy is refused."""

from __future__ import annotations

import json

import pytest

from draftrl.cli import main
from draftrl.decoding.vllm.engine import INSTALL_CPU, vllm_available

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not vllm_available(), reason=f"vllm is not installed ({INSTALL_CPU})")]


#: in-process vLLM engines started by these tests, alive until the process ends (see below)
_KEPT: list = []


def test_exported_policy_runs_in_vllm(replay_run, tmp_path, monkeypatch):
    from draftrl.decoding.vllm.engine import VLLMEngineConfig, model_path, set_cpu_defaults, shared_engine

    out = tmp_path / "bundle"
    assert main(["export", str(replay_run), "--format", "vllm", "--out", str(out), "--check-observations", "64"]) == 0
    bundle = json.loads((out / "vllm.json").read_text())
    assert {p.name for p in out.iterdir()} >= {"policy.onnx", "policy.onnx.json", "proposer.json", "vllm.json"}
    spec = bundle["speculative_config"]
    assert spec["method"] == "custom_class" and spec["model"] == "draftrl.decoding.vllm.proposer.DraftrlProposer"
    assert json.loads((out / "proposer.json").read_text())["controller"] == \
        "draftrl.export.vllm_control:RequestPolicyControl"

    # start vLLM the way a user would: the environment variable and LLM(...) from the bundle alone
    for key, value in bundle["env"].items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(out)  # the bundle's lines run from its folder: its paths are relative to it
    set_cpu_defaults(VLLMEngineConfig())
    from vllm import LLM, SamplingParams

    prompts = [{"prompt_token_ids": list(range(300, 340)) * 3}, {"prompt_token_ids": [1, 2, 3, 4, 5, 6] * 8}]
    llm = LLM(model=model_path("smollm2-135m"), dtype="float32", enforce_eager=True, max_model_len=512,
              max_num_seqs=4, seed=0, speculative_config=spec)
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)
    got = [list(o.outputs[0].token_ids) for o in outputs]
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    proposer = runner.drafter
    assert type(proposer).__name__ == "DraftrlProposer" and type(proposer.controller).__name__ == "RequestPolicyControl"
    assert proposer.controller.policy.path.name == "policy.onnx"

    plain = shared_engine(VLLMEngineConfig(method="none"))  # the engine tests/real_vllm share
    for i, p in enumerate(prompts):
        plain.add_request(str(i), p["prompt_token_ids"], 24)
    expected: dict[str, list[int]] = {}
    while plain.has_unfinished_requests():
        for r in plain.step().requests:
            expected.setdefault(r.request_id, []).extend(r.token_ids)
    assert got == [expected["0"], expected["1"]]
    assert proposer.step > 0 and sum(r.acceptance.num_accepted for r in proposer.requests.values()) > 0
    # Keep this LLM for the session: destroying an in-process vLLM engine tears down vLLM's
    # process-global parallel groups, and the next step of any other engine (the shared ones of
    # tests/real_vllm) then fails with "pipeline model parallel group is not initialized".
    _KEPT.append(llm)
