"""Policies trained on a user's own models (the pipeline suite's float32 runs: the draft model padded
past the tokenizer, EAGLE-3 heads in the EAGLE / SpecForge layout (``.bin`` and ``.safetensors``) and
in the bare speculators layout) exported with ``draftrl export RUN --format vllm --out DIR``, each
bundle copied to another folder (the exported ones removed), and stock vLLM (CPU) started on each in a
fresh interpreter that never imports draftrl, run from the bundle folder as its lines say:

- float32 greedy output equals plain vLLM decoding of the same target, for every bundle;
- drafts are verified both ways, some accepted and some rejected (so equality is not trivial), for
  the draft model and for the one-token head (its drafts are the target's most written token);
- vLLM reads each head as draftrl trained with it: ``norm_before_residual`` as draftrl read it (the
  bare speculators head's bundle states false; control: vLLM's reader takes the original folder as true);
- the padded draft runs with ``use_heterogeneous_vocab`` over the tokenizer's 1,024 ids (vLLM logs its
  intersection; control: the same bundle without the flag is refused for its vocabulary sizes).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from byo_models import TOKENIZER_VOCAB, WORKLOAD, workload_prompts
from byo_steps import cli

from draftrl.decoding.vllm.engine import INSTALL_CPU, vllm_available

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not vllm_available(), reason=f"vllm is not installed ({INSTALL_CPU})")]

#: the drafter fixtures whose float32 policies are served; those whose drafts must be accepted sometimes
SERVED = ("my_draft", "my_eagle_head_bin", "my_eagle_head_safetensors", "my_speculators_head", "my_one_token_head")
ACCEPTED = ("my_draft", "my_one_token_head")

#: each bundle given, from its own folder, then plain vLLM of the same target, in one interpreter
SCRIPT = textwrap.dedent("""
    import json, os, sys
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig
    target, prompts, bare_head, folders = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4:]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
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
        draft = llm.llm_engine.vllm_config.speculative_config.draft_model_config.hf_config
        result[folder] = {"out": generate(llm), "norm_before_residual": getattr(draft, "norm_before_residual", None)}
        result[folder]["counts"] = {m.name: m.value for m in llm.get_metrics()
                                    if m.name.startswith("vllm:spec_decode_num") and hasattr(m, "value")}
    result["plain"] = generate(LLM(**common))
    result["bare_head"] = SpeculatorsConfig.from_pretrained(bare_head).norm_before_residual
    for folder in folders:  # the control, last: the padded draft's bundle without its flag
        os.chdir(folder)
        spec = json.load(open("vllm.json"))["speculative_config"]
        if spec.get("use_heterogeneous_vocab"):
            try:
                LLM(speculative_config={k: v for k, v in spec.items() if k != "use_heterogeneous_vocab"}, **common)
                result[folder]["refused"] = None
            except Exception as err:
                result[folder]["refused"] = str(err)
    result["draftrl"] = "draftrl" in sys.modules
    print("RESULT " + json.dumps(result))
""").replace("MAX_TOKENS", str(WORKLOAD["max_new_tokens"]))


def test_bundles_of_a_users_own_drafters_run_in_stock_vllm_after_being_copied(byo_pipeline, my_target,
                                                                               my_speculators_head, tmp_path):
    from transformers import AutoTokenizer

    from draftrl.drafters.eagle3 import head_config

    folders, pipelines = {}, {}
    for name in SERVED:
        pipelines[name] = p = byo_pipeline(name, "float32")
        exported = tmp_path / "exported" / name
        cli("export", p.run, "--format", "vllm", "--out", exported)
        folders[name] = tmp_path / "serving-host" / name
        shutil.copytree(exported, folders[name])
    shutil.rmtree(tmp_path / "exported")  # the copies stand alone
    prompts = [ids for _, ids in workload_prompts(AutoTokenizer.from_pretrained(my_target))]
    env = {**os.environ, "PYTHONPATH": "", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(my_target), json.dumps(prompts), str(my_speculators_head),
                           *(str(f) for f in folders.values())], capture_output=True, text=True, env=env, timeout=900,
                          cwd=tmp_path)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert not result["draftrl"]
    assert [len(out) for out in result["plain"]] == [WORKLOAD["max_new_tokens"]] * len(prompts)
    for name, folder in folders.items():
        got = result[str(folder)]
        assert got["out"] == result["plain"], name
        drafted = got["counts"]["vllm:spec_decode_num_draft_tokens"]
        accepted = got["counts"]["vllm:spec_decode_num_accepted_tokens"]
        assert 0 <= accepted < drafted, (name, got["counts"])  # every bundle drafts, and the target rejects some
        if name in ACCEPTED:
            assert accepted > 0, (name, got["counts"])  # drafts verified both ways: equality is not trivial
        if name == "my_draft":
            assert got["norm_before_residual"] is None
            assert "Target and draft model should have the same vocabulary size" in got["refused"]
        else:  # vLLM reads the head in the bundle as draftrl read the head it trained with
            assert got["norm_before_residual"] == head_config(pipelines[name].folder).norm_before_residual, name
    assert result[str(folders["my_speculators_head"])]["norm_before_residual"] is False
    assert result["bare_head"] is True  # the control: vLLM reads the folder the user brought the other way
    # the padded draft drafts over the tokenizer's ids (vLLM's VocabMapping says so in its log)
    assert f"intersection={TOKENIZER_VOCAB} " in done.stdout + done.stderr
