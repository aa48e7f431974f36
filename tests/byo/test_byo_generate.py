"""The bring-your-own folders are what a user brings (a target with its tokenizer, a draft padded past
it, heads in both published layouts), and ``draftrl generate --target DIR --drafter ...`` runs on
each: in float32 with greedy output identical to plain decoding, in bfloat16 to the end (near-ties
may legitimately flip a bfloat16 greedy token, so only the run is checked here)."""

from __future__ import annotations

import json

import pytest
import torch
from byo_models import DRAFT_PADDING, TOKENIZER_VOCAB

from draftrl.cli import main
from draftrl.drafters.eagle3 import check_head_fits, head_config
from draftrl.models import load_model, shared_vocab

PROMPT = "Scrivi una funzione Python che inverte una lista."
DRAFTERS = ["my_draft", "my_eagle_head_bin", "my_eagle_head_safetensors", "my_speculators_head"]


def spec(request, name: str) -> str:
    folder = request.getfixturevalue(name)
    return str(folder) if name == "my_draft" else f"eagle3:{folder}"


def generate(capsys, target, drafter: str, *extra: str) -> dict:
    code = main(["generate", "--target", str(target), "--drafter", drafter, "--prompt", PROMPT, "--chat",
                 "--max-new-tokens", "24", "--ignore-eos", "--json", *extra])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out.strip().splitlines()[-1])


def test_the_folders_are_what_a_user_brings(my_target, my_draft, my_eagle_head_bin, my_eagle_head_safetensors,
                                            my_speculators_head):
    target, draft = load_model(str(my_target)), load_model(str(my_draft))
    assert len(target.tokenizer) == target.model.config.vocab_size == TOKENIZER_VOCAB
    assert target.tokenizer.chat_template and target.tokenizer.eos_token == "<|im_end|>"
    assert draft.model.config.vocab_size == TOKENIZER_VOCAB + DRAFT_PADDING and len(draft.model.model.layers) == 2
    vocab = shared_vocab(target.tokenizer, draft.tokenizer, target.model, draft.model)
    assert (vocab.num_target_logits, vocab.num_draft_logits, vocab.num_shared) == (1024, 1088, 1024)
    assert {p.name for p in my_eagle_head_bin.iterdir()} == {"config.json", "pytorch_model.bin"}
    assert "d2t" not in torch.load(my_eagle_head_bin / "pytorch_model.bin", weights_only=True)
    assert {p.name for p in my_eagle_head_safetensors.iterdir()} == {"config.json", "model.safetensors"}
    for folder in (my_eagle_head_bin, my_eagle_head_safetensors):
        assert json.loads((folder / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle3"]
    bare = json.loads((my_speculators_head / "config.json").read_text())
    assert bare["speculators_model_type"] == "eagle3"
    assert not {"eagle_aux_hidden_state_layer_ids", "norm_before_residual", "target_hidden_size"} & set(bare)
    for folder in (my_eagle_head_bin, my_eagle_head_safetensors, my_speculators_head):
        assert check_head_fits(head_config(folder), target.model).aux_layers == (2, 4, 5)


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_generate_in_float32_keeps_greedy_output(request, capsys, my_target, drafter):
    plain = generate(capsys, my_target, "none", "--depth", "0")
    for width in ("1", "2"):
        out = generate(capsys, my_target, spec(request, drafter), "--depth", "3", "--width", width)
        assert out["token_ids"] == plain["token_ids"] and len(out["token_ids"]) == 24
        if drafter == "my_draft":  # the draft is the target's first layers: accepted often
            assert out["mean_tokens_per_round"] > 1.2


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_generate_in_bfloat16_runs(request, capsys, my_target, drafter):
    for extra in (["--temperature", "0"], ["--temperature", "1", "--draft-sampling", "--seed", "3"]):
        out = generate(capsys, my_target, spec(request, drafter), "--dtype", "bfloat16", "--depth", "3",
                       "--width", "2", *extra)
        assert len(out["token_ids"]) == 24 and out["rounds"] >= 1
