"""A saved EAGLE-3 head loads in stock vLLM (``method: eagle3``) with no draftrl code, and float32
greedy output with it equals vLLM's without speculation (a random head: the drafts are almost all
rejected, so this checks the folder and the exact verification, not acceptance)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import torch
from transformers import AutoConfig

from draftrl.decoding.vllm.engine import model_path
from draftrl.drafters.eagle3 import Eagle3Config, Eagle3Head

#: runs in a fresh interpreter that never imports draftrl: only vllm and the folder
SCRIPT = textwrap.dedent("""
    import json, os, sys
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams
    target, head, k, prompts = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    inputs = [{"prompt_token_ids": p} for p in prompts]
    def run(**spec):
        llm = LLM(model=target, dtype="float32", enforce_eager=True, max_model_len=512, seed=0, **spec)
        out = [list(o.outputs[0].token_ids) for o in llm.generate(inputs, params, use_tqdm=False)]
        del llm
        return out
    plain = run()
    drafted = run(speculative_config={"method": "eagle3", "model": head, "num_speculative_tokens": k})
    print("RESULT " + json.dumps({"plain": plain, "drafted": drafted, "draftrl": "draftrl" in sys.modules}))
""")


def test_a_saved_head_runs_in_stock_vllm_and_keeps_greedy_output(tmp_path, mixed_prompts):
    target = model_path("smollm2-135m")
    torch.manual_seed(0)
    head = Eagle3Head(Eagle3Config.for_target(AutoConfig.from_pretrained(target), 1024, verifier=target))
    head.set_draft_vocab(torch.arange(1024))
    head.save_pretrained(tmp_path / "head", speculative_tokens=3)
    prompts = [ids for _, ids in mixed_prompts]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": ""}
    done = subprocess.run([sys.executable, "-c", SCRIPT, target, str(tmp_path / "head"), "3", json.dumps(prompts)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert not result["draftrl"]
    assert result["drafted"] == result["plain"]
