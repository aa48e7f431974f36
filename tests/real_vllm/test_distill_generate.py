"""``draftrl distill`` regenerates responses in vLLM (a child process, batched): in float32 they
are the target's own greedy continuations, as Hugging Face ``generate`` gives them, and a rerun
after the file was cut mid-line resumes without generating again what is whole."""

from __future__ import annotations

import torch

from draftrl.decoding.vllm.engine import model_path
from draftrl.distill.data import regenerate, select_prompts
from draftrl.models import load_model


def test_vllm_responses_are_the_targets_greedy_ones_and_resume(tmp_path):
    loaded = load_model("smollm2-135m")
    prompts = select_prompts(3, 0, seed=0)
    path = tmp_path / "samples.jsonl"
    samples = regenerate(loaded.model, loaded.tokenizer, prompts, 96, 12, 4, path,
                         vllm_model=model_path("smollm2-135m"))
    assert [s.id for s in samples] == [p[0] for p in prompts]
    for sample in samples:
        ids = torch.tensor([sample.prompt_ids])
        plain = loaded.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                                      pad_token_id=loaded.tokenizer.eos_token_id)[0, ids.shape[1]:].tolist()
        eos = loaded.tokenizer.eos_token_id
        assert sample.response_ids == (plain[: plain.index(eos) + 1] if eos in plain else plain)
    whole = path.read_text()
    path.write_text(whole + whole.splitlines()[0][:20])  # a line an interruption cut off
    again = regenerate(loaded.model, loaded.tokenizer, prompts, 96, 12, 4, path, vllm_model="/nonexistent")
    assert again == samples and path.read_text() == whole  # nothing left to generate: vLLM never started
