"""The EAGLE-3 head draftrl ships for SmolLM2-135M: a speculators folder with its card and data
manifest, picked by ``--drafter eagle3`` (and inside ``sam:N``), drafting what the target accepts
often, with greedy output identical to the target's; a target without one is refused naming the fix."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
from draftrl.drafters.eagle3 import Eagle3Drafter
from draftrl.drafters.mixed import MixedDrafter
from draftrl.drafters.packaged import packaged_head, packaged_heads
from draftrl.drafters.registry import build_drafter
from draftrl.models.chat import user_message_ids
from draftrl.models.distribution import SamplingParams, generator_for
from draftrl.prompts import load_prompts

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_shipped_folder_carries_its_card_and_data():
    assert "smollm2-135m" in packaged_heads()
    folder = packaged_head("smollm2-135m")
    config = json.loads((folder / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"
    assert config["speculators_config"]["verifier"]["name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    weights = load_file(str(folder / "model.safetensors"))
    assert weights["lm_head.weight"].dtype == torch.float16 and "embed_tokens.weight" not in weights
    card = (folder / "README.md").read_text()
    assert "draftrl distill" in card and "Measured acceptance" in card
    manifest = json.loads((folder / "distill_manifest.json").read_text())
    assert manifest["heldout_used_for_training"] is False and manifest["samples"] > 0


def test_eagle3_alone_drafts_with_the_shipped_head_and_keeps_greedy_output(smollm2):
    prompt = next(p for p in load_prompts(split="heldout") if p.language == "en" and p.task == "chat")
    ids = user_message_ids(smollm2.tokenizer, prompt.prompt)
    plain = smollm2.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                   max_new_tokens=48, do_sample=False, pad_token_id=smollm2.tokenizer.eos_token_id)
    for spec, kind in (("eagle3", Eagle3Drafter), ("sam:2", MixedDrafter)):
        drafter = build_drafter(spec, smollm2)
        assert isinstance(drafter, kind)
        engine = SpeculativeDecoder(smollm2.model, drafter, EngineConfig(max_new_tokens=48), smollm2.eos_token_ids)
        engine.start(ids)
        proposed = accepted = 0
        while not engine.finished:
            result = engine.round(1)  # first-position acceptance: about 0.33 measured, ~0 for an untrained head
            proposed, accepted = proposed + result.num_proposed, accepted + result.num_accepted
        drafter.close()
        assert engine.output_ids == plain[0, len(ids):].tolist()[: len(engine.output_ids)]
        assert accepted / proposed > 0.15, f"{spec}: the shipped head is accepted {accepted}/{proposed} only"


def test_a_target_without_a_shipped_head_is_refused_naming_distill():
    with pytest.raises(ValueError, match="ships no EAGLE-3 head for the target 'tiny'.*draftrl distill"):
        packaged_head("tiny")


def test_whether_a_head_ships_is_read_from_the_target_name_alone(tmp_path, monkeypatch):
    """No model loads: a folder counts by its own name (as LoadedModel.name), a known name as itself."""
    from draftrl.drafters.packaged import missing_head, needs_shipped_head

    def no_loading(*args, **kwargs):
        raise AssertionError("missing_head loaded a model")

    monkeypatch.setattr("draftrl.models.loading.load_model", no_loading)
    assert [needs_shipped_head(s) for s in ("eagle3", "sam:2", "eagle3:DIR", "sam:2:DIR", "ngram", "self")] == [
        True, True, False, False, False, False]
    for drafter in ("sam:2", "eagle3"):
        assert missing_head(drafter, "smollm2-135m") is None
        (tmp_path / "smollm2-135m").mkdir(exist_ok=True)  # a folder of that name: the shipped head is its name's
        assert missing_head(drafter, str(tmp_path / "smollm2-135m")) is None
        (tmp_path / "my-target").mkdir(exist_ok=True)
        line = missing_head(drafter, str(tmp_path / "my-target"))
        assert line is not None and "\n" not in line
        assert f"`draftrl distill --target {tmp_path / 'my-target'} --out heads/my-target`" in line
        assert f"--drafter {drafter}:heads/my-target" in line and "'my-target'" in line
    assert missing_head("sam:2:heads/mine", "org/model") is None and missing_head("ngram", "org/model") is None
    hub = missing_head("eagle3", "org/model")
    assert "'org/model'" in hub and "--out heads/model`" in hub


def test_the_shipped_head_rewritten_in_the_eagle_layout_drafts_the_same(smollm2, tmp_path):
    """The shipped head written as an EAGLE / SpecForge folder (``LlamaForCausalLMEagle3``,
    ``pytorch_model.bin``, float16 as shipped) loads as ``eagle3:DIR`` with the same weights and,
    after prefixes of a real continuation, the same root logits (bitwise) and the same tree."""
    shipped = build_drafter("eagle3", smollm2)
    shipped.head.save_pretrained(tmp_path, layout="eagle", weights="bin", dtype=torch.float16)
    assert {p.name for p in tmp_path.iterdir()} == {"config.json", "pytorch_model.bin"}
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and "speculators_model_type" not in config
    assert (config["norm_before_residual"] is True
            and config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27])
    rewritten = build_drafter(f"eagle3:{tmp_path}", smollm2)
    mine, theirs = shipped.head.state_dict(), rewritten.head.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    prompt = next(p for p in load_prompts(split="heldout") if p.language == "it")
    ids = user_message_ids(smollm2.tokenizer, prompt.prompt)
    with torch.no_grad():
        sequence = smollm2.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                          max_new_tokens=12, do_sample=False,
                                          pad_token_id=smollm2.tokenizer.eos_token_id)[0].tolist()
        smollm2.model(torch.tensor([sequence]))  # both drafters' hooks read this one forward
    for drafter in (shipped, rewritten):
        drafter.reset(sequence)
        drafter.keep_target_rows(list(range(len(sequence))))
    for end in range(len(sequence), len(ids) - 1, -3):  # longest first: a rewind only forgets
        history = sequence[:end]
        for drafter in (shipped, rewritten):
            drafter.rewind(len(history))
        assert torch.equal(shipped.root(history)[0], rewritten.root(history)[0])
        trees = [d.propose(history, 3, 2, SamplingParams(), generator_for("cpu", 0)) for d in (shipped, rewritten)]
        assert trees[0].tokens == trees[1].tokens and trees[0].scores == trees[1].scores
    shipped.close()
    rewritten.close()
