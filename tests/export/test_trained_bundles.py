"""Every trained policy exports to a vLLM bundle that works wherever it is copied
(``draftrl export RUN --format vllm --out DIR``): a policy trained with an EAGLE-3 head or a draft
model goes to stock vLLM (``eagle3`` / ``draft_model``) with its K table and the drafter copied in;
an n-gram policy to draftrl's proposer, found through a path relative to the bundle. Each bundle
names the run's own target; the K table comes from the run's measured costs and a run without
them is refused (and ``--format sglang`` too). Real vLLM starts these bundles in
tests/real_vllm/test_trained_bundles_real.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from draftrl.cli import main
from tiny_byo import byo_models, draft_run, head_run  # noqa: F401  (session fixtures)


def _export(run: Path, out: Path, *extra: str) -> dict:
    assert main(["export", str(run), "--format", "vllm", "--out", str(out), *extra]) == 0
    return json.loads((out / "vllm.json").read_text())


def _same_files(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.iterdir())
    return names == sorted(p.name for p in b.iterdir()) and all((a / n).read_bytes() == (b / n).read_bytes()
                                                                 for n in names)


def _check_stock(bundle: dict, out: Path, run: Path, method: str, drafter: Path, target: Path) -> None:
    derivation = bundle["derivation"]
    spec = bundle["speculative_config"]
    assert bundle["route"] == "stock" and bundle["target"] == str(target) and bundle["env"] == {}
    assert spec == {"method": method, "model": "./drafter", "num_speculative_tokens": derivation["k1"],
                    "num_speculative_tokens_per_batch_size": derivation["depth_by_batch"]}
    assert derivation["k1"] >= 1 and derivation["cost_model"]["source"].startswith("cost table")
    table = spec["num_speculative_tokens_per_batch_size"]
    assert table[0][:2] == [1, table[0][1]] and table[0][2] == derivation["k1"]
    assert all(k1 >= k2 for (_, _, k1), (_, _, k2) in zip(table, table[1:]))  # never deeper with more requests
    assert sorted(p.name for p in out.iterdir()) == ["drafter", "vllm.json"] and _same_files(out / "drafter", drafter)
    # the lines run from the bundle folder: nothing in them points outside it
    for key in ("python", "serve"):
        assert str(run.parent) not in bundle[key] and str(drafter.parent) not in bundle[key]
    assert bundle["serve"].startswith("cd BUNDLE_DIR && vllm serve MODEL_DIR --gpu-memory-utilization 0.9 ")


def test_a_head_policy_exports_to_stock_eagle3_with_its_head(head_run, byo_models, tmp_path):
    out = tmp_path / "bundle"
    bundle = _export(head_run, out)
    _check_stock(bundle, out, head_run, "eagle3", byo_models["head"], byo_models["target"])
    assert bundle["drafter"] == f"eagle3:{byo_models['head']}"
    moved = tmp_path / "elsewhere" / "bundle"  # copied to the serving host as it is
    shutil.copytree(out, moved)
    assert (moved / bundle["speculative_config"]["model"] / "config.json").is_file()


def test_a_draft_model_policy_exports_to_stock_draft_model(draft_run, byo_models, tmp_path):
    out = tmp_path / "bundle"
    bundle = _export(draft_run, out, "--gpu-memory-utilization", "0.3")
    assert bundle["engine_args"] == {"gpu_memory_utilization": 0.3}
    bundle["serve"] = bundle["serve"].replace("0.3", "0.9")
    _check_stock(bundle, out, draft_run, "draft_model", byo_models["draft"], byo_models["target"])
    assert main(["export", str(draft_run), "--format", "vllm", "--out", str(out)]) == 2  # no silent replacement
    assert main(["export", str(draft_run), "--format", "vllm", "--out", str(out), "--overwrite"]) == 0
    assert _same_files(out / "drafter", byo_models["draft"])


def test_a_run_without_measured_costs_is_refused_and_a_measured_table_is_taken(head_run, tmp_path, capsys):
    """The K table's batch scaling needs step costs; no default stands in for them (vllm and sglang)."""
    config = json.loads((head_run / "config.json").read_text())
    stored = head_run / config["env"]["traces"] / "cost_table.json"  # the run's config: relative to the run
    kept = tmp_path / "cost_table.json"
    shutil.move(stored, kept)
    try:
        for fmt, out in (("vllm", tmp_path / "bundle"), ("vllm", tmp_path / "static.json"),
                         ("sglang", tmp_path / "sglang.json")):
            assert main(["export", str(head_run), "--format", fmt, "--out", str(out)]) == 2
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1 and "has no measured costs" in err and "draftrl calibrate" in err
            assert "--cost-table costs.json" in err and not out.exists()
        bundle = _export(head_run, tmp_path / "measured", "--cost-table", str(kept))
        assert bundle["derivation"]["cost_model"]["source"].startswith(str(kept))
        assert main(["export", str(head_run), "--format", "sglang", "--out", str(tmp_path / "s.json"),
                     "--cost-table", str(kept)]) == 0
    finally:
        shutil.move(kept, stored)


def test_the_bundle_names_the_runs_own_target(head_run, byo_models, tmp_path, capsys):
    assert main(["export", str(head_run), "--format", "vllm", "--out", str(tmp_path / "b"), "--target",
                 "smollm2-135m"]) == 2
    assert f"differs from the target the policy was trained for ({byo_models['target']})" in capsys.readouterr().err
    assert main(["export", str(head_run), "--format", "onnx", "--out", str(tmp_path / "p.onnx"), "--target", "x"]) == 2
    assert "--target is read by --format vllm with a bundle folder only" in capsys.readouterr().err
    static = tmp_path / "static.json"
    assert main(["export", str(head_run), "--format", "vllm", "--out", str(static)]) == 0
    assert json.loads(static.read_text())["target"] == str(byo_models["target"])


def test_an_ngram_policy_bundle_finds_its_policy_wherever_it_is_copied(replay_run, tmp_path, monkeypatch):
    """draftrl's proposer reads proposer.json through a path relative to where vLLM runs (the bundle
    folder) and the policy relative to proposer.json: a copied bundle runs as the original."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from scripted_vllm import fake_vllm_config

    from draftrl.export.vllm_proposer import PolicyProposer

    out = tmp_path / "bundle"
    bundle = _export(replay_run, out, "--check-observations", "16")
    assert bundle["route"] == "policy" and bundle["target"] == "smollm2-135m"
    assert bundle["env"] == {"DRAFTRL_PROPOSER_CONFIG": "proposer.json"}
    assert str(tmp_path) not in json.dumps({k: bundle[k] for k in ("env", "python", "serve", "speculative_config")})
    moved = tmp_path / "host" / "srv"
    shutil.copytree(out, moved)
    shutil.rmtree(out)  # nothing may still point at the original
    monkeypatch.setenv("DRAFTRL_PROPOSER_CONFIG", "proposer.json")
    monkeypatch.chdir(moved)
    proposer = PolicyProposer(fake_vllm_config(bundle["speculative_config"]["num_speculative_tokens"]))
    assert proposer.core is not None and proposer.core.controller.path == moved / "policy.onnx"
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError):  # run from elsewhere, the relative path names no file
        PolicyProposer(fake_vllm_config(4))
