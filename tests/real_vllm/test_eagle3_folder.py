"""A saved EAGLE-3 head loads in stock vLLM (``method: eagle3``) with no draftrl code, and float32
greedy output with it equals vLLM's without speculation at concurrency 1 and 4, in stock vLLM and
through ``draftrl eval --engine vllm``'s ``eagle3:K`` (the ``eagle3_head`` fixture: a built head
whose drafts are accepted only where the target writes a newline, or a trained one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from draftrl.decoding.vllm.engine import model_path

#: runs in a fresh interpreter that never imports draftrl: only vllm and the folder
SCRIPT = textwrap.dedent("""
    import json, os, sys
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams
    target, head, k, prompts = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    def run(**spec):
        llm = LLM(model=target, dtype="float32", enforce_eager=True, max_model_len=512, seed=0,
                  disable_log_stats=False, **spec)
        def generate(batch):
            outputs = llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
            return [list(o.outputs[0].token_ids) for o in outputs]
        out = {"1": [generate([p])[0] for p in prompts], str(len(prompts)): generate(prompts)}
        counts = {m.name: m.value for m in llm.get_metrics() if m.name.startswith("vllm:spec_decode_num")
                  and hasattr(m, "value")}
        del llm
        return out, counts
    plain, _ = run()
    drafted, counts = run(speculative_config={"method": "eagle3", "model": head, "num_speculative_tokens": k})
    print("RESULT " + json.dumps({"plain": plain, "drafted": drafted, "counts": counts,
                                  "draftrl": "draftrl" in sys.modules}))
""")


def test_a_saved_head_runs_in_stock_vllm_and_keeps_greedy_output(tmp_path, mixed_prompts, eagle3_head):
    """Four prompts (en, it, zh, es), alone (concurrency 1) and together (concurrency 4)."""
    prompts = [ids for _, ids in mixed_prompts]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": ""}
    done = subprocess.run([sys.executable, "-c", SCRIPT, model_path("smollm2-135m"), eagle3_head, "3",
                           json.dumps(prompts)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert not result["draftrl"]
    assert set(result["drafted"]) == {"1", "4"}
    for level in ("1", "4"):
        assert result["drafted"][level] == result["plain"][level], f"concurrency {level}"
    counts = result["counts"]
    assert counts["vllm:spec_decode_num_drafts"] > 0  # the head drafted: speculation was not switched off
    assert 0 < counts["vllm:spec_decode_num_accepted_tokens"] < counts["vllm:spec_decode_num_draft_tokens"]


def test_the_serving_eval_runs_eagle3_k_and_checks_its_greedy_identity(tmp_path, eagle3_head):
    """``vllm-eagle3:2`` as its own engine, its head named by the run's drafter ``eagle3:DIR``, at
    concurrency 1 and 4, on four requests (four languages):
    every token equals ``none``'s, and vLLM's own counts give its acceptance length."""
    from draftrl.config.serve import ServeConfig
    from draftrl.eval.serve.compare import run_eval

    config = ServeConfig(split="heldout", shuffle=False, seed=0, tasks=("code_edit",), max_new_tokens=12,
                         drafter=f"eagle3:{eagle3_head}")
    results = run_eval(tmp_path / "serve", policies="none,vllm-eagle3:2", concurrency=[1, 4], config=config)
    assert results["exactness"]["passed"] and not results["exactness"]["greedy_identity"]["mismatches"]
    assert results["engines"]["vllm-eagle3:2"]["head"] == eagle3_head
    for level in ("1", "4"):
        table = results["concurrency"][level]["policies"]
        assert {r for r in table["none"]["per_language"]} == {"en", "es", "it", "zh"}
        assert table["vllm-eagle3:2"]["greedy_identical_requests"] == 4
        counts = table["vllm-eagle3:2"]["spec_decoding"]
        assert counts["num_drafts"] > 0 and counts["num_draft_tokens"] == 2 * counts["num_drafts"]
        assert counts["acceptance_length"] == 1 + counts["num_accepted"] / counts["num_drafts"]
        assert table["none"]["spec_decoding"]["num_drafts"] == 0
        assert table["vllm-eagle3:2"]["decode_step_seconds"] > 0


def test_vllm_reads_a_bare_speculators_head_as_draftrl_does_through_vllm_head(tmp_path, monkeypatch):
    """vLLM 0.32's own speculators reader, on a head whose config leaves out ``norm_before_residual``:
    True on the user's folder (the control: vLLM would draft with the other layer), False, draftrl's
    reading, on the folder ``draftrl eval --engine vllm``'s ``vllm-eagle3:K`` gives it (:func:`vllm_head`)."""
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    from draftrl.decoding.vllm.engine import vllm_head
    from draftrl.drafters.eagle3 import random_head
    from draftrl.models.fetch import fetch_model

    monkeypatch.setenv("DRAFTRL_CACHE", str(tmp_path / "cache"))
    bare = random_head(fetch_model("smollm2-135m", quiet=True), 16).save_pretrained(tmp_path / "bare")
    data = json.loads((bare / "config.json").read_text())
    data.pop("norm_before_residual")
    (bare / "config.json").write_text(json.dumps(data))
    assert SpeculatorsConfig.from_pretrained(str(bare)).norm_before_residual is True
    assert SpeculatorsConfig.from_pretrained(vllm_head(str(bare))).norm_before_residual is False
