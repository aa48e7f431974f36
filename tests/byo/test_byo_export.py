"""A policy trained with a user's own EAGLE-3 head or draft model exports to a vLLM bundle that works
wherever it is copied (``draftrl export RUN --format vllm --out DIR``): stock vLLM (``eagle3`` /
``draft_model``) with its K table and the drafter copied in, the run's own target named, the K table
from the run's measured costs (a run without them is refused, ``--format sglang`` too). The runs are
the pipeline suite's float32 ones (``byo_pipeline``: the bare speculators-layout head and the padded
draft model); tests/byo/test_byo_vllm.py starts their bundles in stock vLLM."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from draftrl.cli import main


def _export(run: Path, out: Path, *extra: str) -> dict:
    assert main(["export", str(run), "--format", "vllm", "--out", str(out), *extra]) == 0
    return json.loads((out / "vllm.json").read_text())


def _same_files(a: Path, b: Path, but: tuple[str, ...] = ()) -> bool:
    names = sorted(p.name for p in a.iterdir())
    return names == sorted(p.name for p in b.iterdir()) and all((a / n).read_bytes() == (b / n).read_bytes()
                                                                 for n in names if n not in but)


def _check_stock(bundle: dict, out: Path, run: Path, method: str, drafter: Path, target: Path,
                 extra: dict | None = None) -> None:
    derivation = bundle["derivation"]
    spec = bundle["speculative_config"]
    assert bundle["route"] == "stock" and bundle["target"] == str(target) and bundle["env"] == {}
    assert spec == {"method": method, "model": "./drafter", "num_speculative_tokens": derivation["k1"],
                    "num_speculative_tokens_per_batch_size": derivation["depth_by_batch"], **(extra or {})}
    assert derivation["k1"] >= 1 and derivation["cost_model"]["source"].startswith("cost table")
    table = spec["num_speculative_tokens_per_batch_size"]
    assert table[0][:2] == [1, table[0][1]] and table[0][2] == derivation["k1"]
    assert all(k1 >= k2 for (_, _, k1), (_, _, k2) in zip(table, table[1:]))  # never deeper with more requests
    assert sorted(p.name for p in out.iterdir()) == ["drafter", "vllm.json"]
    assert _same_files(out / "drafter", drafter, but=("config.json",))
    # the lines run from the bundle folder: nothing in them points outside it
    for key in ("python", "serve"):
        assert str(run.parent) not in bundle[key] and str(drafter.parent) not in bundle[key]
    assert bundle["serve"].startswith("cd BUNDLE_DIR && vllm serve MODEL_DIR --gpu-memory-utilization 0.9 ")


def test_a_head_policy_exports_to_stock_eagle3_with_its_head(byo_pipeline, tmp_path):
    p = byo_pipeline("my_speculators_head", "float32")
    out = tmp_path / "bundle"
    bundle = _export(p.run, out)
    _check_stock(bundle, out, p.run, "eagle3", p.folder, p.target)
    assert bundle["drafter"] == f"eagle3:{p.folder}"
    given = json.loads((p.folder / "config.json").read_text())
    assert json.loads((out / "drafter" / "config.json").read_text()) == {**given, "norm_before_residual": False}
    moved = tmp_path / "elsewhere" / "bundle"  # copied to the serving host as it is
    shutil.copytree(out, moved)
    assert (moved / bundle["speculative_config"]["model"] / "config.json").is_file()


def test_a_draft_model_policy_exports_to_stock_draft_model(byo_pipeline, tmp_path):
    p = byo_pipeline("my_draft", "float32")
    out = tmp_path / "bundle"
    bundle = _export(p.run, out, "--gpu-memory-utilization", "0.3")
    assert bundle["engine_args"] == {"gpu_memory_utilization": 0.3}
    bundle["serve"] = bundle["serve"].replace("0.3", "0.9")
    # 1,088 draft rows vs the target's 1,024: vLLM's draft_model takes the pair with use_heterogeneous_vocab
    _check_stock(bundle, out, p.run, "draft_model", p.folder, p.target, {"use_heterogeneous_vocab": True})
    assert _same_files(out / "drafter", p.folder)  # the draft's weights and config as they are
    assert any(note.startswith("use_heterogeneous_vocab:") for note in bundle["notes"])
    assert main(["export", str(p.run), "--format", "vllm", "--out", str(out)]) == 2  # no silent replacement
    assert main(["export", str(p.run), "--format", "vllm", "--out", str(out), "--overwrite"]) == 0
    assert _same_files(out / "drafter", p.folder)


def test_draft_vocab_options_follow_the_two_configs(my_target, my_draft, tmp_path, monkeypatch):
    """The flag is written exactly when the two vocab_size differ (an unpadded copy of the draft needs none);
    a config that cannot be read here (a hub id out of reach) leaves the flag out with a note naming it."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    from draftrl.export.engine_config import VOCAB_NOTE, draft_vocab_options

    assert draft_vocab_options(str(my_target), my_draft) == ({"use_heterogeneous_vocab": True}, VOCAB_NOTE)
    unpadded = tmp_path / "unpadded"
    model = LlamaForCausalLM.from_pretrained(my_draft)
    model.resize_token_embeddings(len(AutoTokenizer.from_pretrained(my_draft)))
    model.save_pretrained(unpadded)
    assert draft_vocab_options(str(my_target), unpadded) == ({}, None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    options, note = draft_vocab_options(str(my_target), "someone/uncached-draft")
    assert options == {} and "were not compared" in note and '"use_heterogeneous_vocab": true' in note


def test_the_static_config_carries_the_flag_too(byo_pipeline, tmp_path):
    """--format vllm --out FILE.json (no bundle): the same speculative_config keys for the padded draft."""
    p = byo_pipeline("my_draft", "float32")
    static = tmp_path / "static.json"
    assert main(["export", str(p.run), "--format", "vllm", "--out", str(static)]) == 0
    written = json.loads(static.read_text())
    assert written["speculative_config"]["use_heterogeneous_vocab"] is True
    assert written["speculative_config"]["model"] == str(p.folder)
    assert any(note.startswith("use_heterogeneous_vocab:") for note in written["notes"])


def test_a_run_without_measured_costs_is_refused_and_a_measured_table_is_taken(byo_pipeline, tmp_path, capsys):
    """The K table's batch scaling needs step costs; no default stands in for them (vllm and sglang)."""
    run = byo_pipeline("my_speculators_head", "float32").run
    config = json.loads((run / "config.json").read_text())
    stored = run / config["env"]["traces"] / "cost_table.json"  # the run's config: relative to the run
    kept = tmp_path / "cost_table.json"
    shutil.move(stored, kept)
    try:
        for fmt, out in (("vllm", tmp_path / "bundle"), ("vllm", tmp_path / "static.json"),
                         ("sglang", tmp_path / "sglang.json")):
            assert main(["export", str(run), "--format", fmt, "--out", str(out)]) == 2
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1 and "has no measured costs" in err and "draftrl calibrate" in err
            assert "--cost-table costs.json" in err and not out.exists()
        bundle = _export(run, tmp_path / "measured", "--cost-table", str(kept))
        assert bundle["derivation"]["cost_model"]["source"].startswith(str(kept))
        assert main(["export", str(run), "--format", "sglang", "--out", str(tmp_path / "s.json"),
                     "--cost-table", str(kept)]) == 0
    finally:
        shutil.move(kept, stored)


def test_the_bundle_names_the_runs_own_target(byo_pipeline, tmp_path, capsys):
    p = byo_pipeline("my_speculators_head", "float32")
    assert main(["export", str(p.run), "--format", "vllm", "--out", str(tmp_path / "b"), "--target",
                 "smollm2-135m"]) == 2
    assert f"differs from the target the policy was trained for ({p.target})" in capsys.readouterr().err
    assert main(["export", str(p.run), "--format", "onnx", "--out", str(tmp_path / "p.onnx"), "--target", "x"]) == 2
    assert "--target is read by --format vllm with a bundle folder only" in capsys.readouterr().err
    static = tmp_path / "static.json"
    assert main(["export", str(p.run), "--format", "vllm", "--out", str(static)]) == 0
    assert json.loads(static.read_text())["target"] == str(p.target)


def test_rule_bundles_state_the_heads_norm_before_residual_too(my_target, my_speculators_head, my_eagle_head_bin,
                                                                tmp_path):
    """A head rule (draftrl's proposer, with stock eagle3 as its route_a) and a stock rule copy the head as a
    trained policy's bundle does: a bare speculators head gets the key vLLM would read otherwise; a head whose
    config means the same to both (the EAGLE layout) is copied byte for byte."""
    for rule in ("fixed:2", "vllm-eagle3:1-1:3,2-16:1"):
        for head, pinned in ((my_speculators_head, True), (my_eagle_head_bin, False)):
            out = tmp_path / f"{rule.partition(':')[0]}-{head.name}"
            bundle = _export(rule, out, "--drafter", f"eagle3:{head}", "--target", str(my_target))
            given = json.loads((head / "config.json").read_text())
            written = json.loads((out / "drafter" / "config.json").read_text())
            assert written == ({**given, "norm_before_residual": False} if pinned else given)
            assert _same_files(out / "drafter", head, but=("config.json",) if pinned else ())
            assert any("norm_before_residual=false written" in n for n in bundle["notes"]) is pinned
