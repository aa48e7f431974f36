"""Policies trained with a user's own EAGLE-3 head and draft model (tests/tiny_byo.py: a tiny
random Llama target with SmolLM2's tokenizer, a speculators-format head, a 2-layer draft model)
exported with ``draftrl export RUN --format vllm --out DIR``, each bundle copied to another
folder, and stock vLLM started on it in a fresh interpreter that never imports draftrl, run from
the bundle folder as its lines say: float32 greedy output equals plain vLLM decoding of the same
target, with drafts verified, some accepted and some rejected (so equality is not trivial)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

from draftrl.cli import main
from tiny_byo import byo_models, draft_run, head_run, training_prompts  # noqa: F401  (session fixtures)

TOKENS = 24

#: each bundle given, from its own folder, then plain vLLM of the same target, in one interpreter
SCRIPT = textwrap.dedent("""
    import json, os, sys
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams
    target, prompts, folders = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3:]
    params = SamplingParams(temperature=0.0, max_tokens=%d, ignore_eos=True)
    common = dict(model=target, dtype="float32", enforce_eager=True, max_model_len=512, seed=0,
                  disable_log_stats=False)
    def generate(llm):
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outputs]
    result, kept = {}, []  # every LLM kept alive: one destroyed tears down the parallel state the others step on
    for folder in folders:
        os.chdir(folder)  # the bundle's lines run from its folder: its paths are relative to it
        bundle = json.load(open("vllm.json"))
        llm = LLM(speculative_config=bundle["speculative_config"], **{**common, **bundle["engine_args"]})
        kept.append(llm)
        counts = lambda: {m.name: m.value for m in llm.get_metrics()
                          if m.name.startswith("vllm:spec_decode_num") and hasattr(m, "value")}
        result[folder] = {"out": generate(llm), "counts": counts()}
    result["plain"] = generate(LLM(**common))
    result["draftrl"] = "draftrl" in sys.modules
    print("RESULT " + json.dumps(result))
""" % TOKENS)


def test_head_and_draft_model_bundles_run_in_stock_vllm_after_being_copied(head_run, draft_run, byo_models, tmp_path):
    from transformers import AutoTokenizer

    folders = {}
    for name, run, method in (("head", head_run, "eagle3"), ("draft", draft_run, "draft_model")):
        exported = tmp_path / "exported" / name
        assert main(["export", str(run), "--format", "vllm", "--out", str(exported)]) == 0
        assert json.loads((exported / "vllm.json").read_text())["speculative_config"]["method"] == method
        folders[name] = tmp_path / "serving-host" / name
        shutil.copytree(exported, folders[name])
    shutil.rmtree(tmp_path / "exported")  # the copies stand alone
    prompts = training_prompts(AutoTokenizer.from_pretrained(byo_models["target"]))
    env = {**os.environ, "PYTHONPATH": "", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(byo_models["target"]), json.dumps(prompts),
                           *(str(f) for f in folders.values())], capture_output=True, text=True, env=env, timeout=900,
                          cwd=tmp_path)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert not result["draftrl"]
    for name, folder in folders.items():
        got = result[str(folder)]
        assert got["out"] == result["plain"], name
        drafted = got["counts"]["vllm:spec_decode_num_draft_tokens"]
        accepted = got["counts"]["vllm:spec_decode_num_accepted_tokens"]
        assert 0 < accepted < drafted, (name, got["counts"])  # drafts verified both ways: equality is not trivial
