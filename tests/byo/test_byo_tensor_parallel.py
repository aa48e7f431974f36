"""``tensor_parallel_size=2`` on vLLM's CPU build (issue 47, item 1), with a user's own target: draftrl's
vLLM engine splits it over two worker processes (vLLM's multiprocessing executor; they talk over
gloo through a file and 127.0.0.1 only) with vLLM's own ngram speculation, and its float32 greedy
output equals plain decoding of the target on one worker; drafts were verified both ways.

Slow (two engines, the split one loads in 1-2 minutes on a busy 2-core machine): marked ``slow``
and ``vllm``. Run alone: ``pytest -m slow tests/byo/test_byo_tensor_parallel.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from byo_models import workload_prompts

from draftrl.decoding.vllm.engine import INSTALL_CPU, vllm_available

pytestmark = [pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.skipif(not vllm_available(), reason=f"vllm is not installed ({INSTALL_CPU})")]

TOKENS = 24

#: a file run by a fresh interpreter: vLLM's worker processes start by spawn, which re-imports the main module
SCRIPT = textwrap.dedent("""
    import json, sys
    from draftrl.decoding.vllm.engine import VLLMEngine, VLLMEngineConfig

    def run(engine, prompts, tokens):
        outputs = {}
        for i, ids in enumerate(prompts):
            engine.add_request(str(i), ids, tokens)
        while engine.has_unfinished_requests():
            for r in engine.step().requests:
                outputs.setdefault(r.request_id, []).extend(r.token_ids)
        return [outputs[str(i)] for i in range(len(prompts))]

    if __name__ == "__main__":
        target, prompts, tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
        common = dict(model=target, max_model_len=512, max_num_seqs=4)
        split = VLLMEngine(VLLMEngineConfig(method="ngram", num_speculative_tokens=3, tensor_parallel_size=2,
                                            **common))
        split_tokens, counts = run(split, prompts, tokens), split.spec_counts
        split.close()
        plain = VLLMEngine(VLLMEngineConfig(method="none", **common))
        print("RESULT " + json.dumps({"split": split_tokens, "plain": run(plain, prompts, tokens),
                                      "draft_tokens": counts.num_draft_tokens, "accepted": counts.num_accepted}))
""")


def test_two_tensor_parallel_workers_keep_greedy_output(my_target, tmp_path):
    from transformers import AutoTokenizer

    prompts = [ids for _, ids in workload_prompts(AutoTokenizer.from_pretrained(my_target))[:3]]
    script = tmp_path / "tp2.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "VLLM_HOST_IP": "127.0.0.1", "VLLM_LOOPBACK_IP": "127.0.0.1",
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, str(script), str(my_target), json.dumps(prompts), str(TOKENS)],
                          capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["split"] == result["plain"] and all(len(t) == TOKENS for t in result["plain"])
    assert 0 < result["accepted"] < result["draft_tokens"], result  # drafts accepted and rejected
