"""Every trained policy exports to a vLLM bundle that works wherever it is copied
(``draftrl export RUN --format vllm --out DIR``). An n-gram policy goes to draftrl's proposer, found
through a path relative to the bundle (here). Policies trained with a user's own EAGLE-3 head or draft
model go to stock vLLM (``eagle3`` / ``draft_model``) with their K table and the drafter copied in:
tests/byo/test_byo_export.py checks those bundles and tests/byo/test_byo_vllm.py starts them in real vLLM."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from draftrl.cli import main


def _export(run: Path, out: Path, *extra: str) -> dict:
    assert main(["export", str(run), "--format", "vllm", "--out", str(out), *extra]) == 0
    return json.loads((out / "vllm.json").read_text())


def test_an_ngram_policy_bundle_finds_its_policy_wherever_it_is_copied(replay_run, tmp_path, monkeypatch):
    """draftrl's proposer reads proposer.json through a path relative to where vLLM runs (the bundle
    folder) and the policy relative to proposer.json: a copied bundle runs as the original."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from scripted_vllm import fake_vllm_config

    from draftrl.decoding.vllm.proposer import DraftrlProposer
    from draftrl.export.vllm_control import REQUEST_POLICY, RequestPolicyControl

    out = tmp_path / "bundle"
    bundle = _export(replay_run, out, "--check-observations", "16")
    assert bundle["route"] == "policy" and bundle["target"] == "smollm2-135m"
    assert bundle["env"] == {"DRAFTRL_PROPOSER_CONFIG": "proposer.json"}
    assert json.loads((out / "proposer.json").read_text())["controller"] == REQUEST_POLICY
    assert str(tmp_path) not in json.dumps({k: bundle[k] for k in ("env", "python", "serve", "speculative_config")})
    moved = tmp_path / "host" / "srv"
    shutil.copytree(out, moved)
    shutil.rmtree(out)  # nothing may still point at the original
    monkeypatch.setenv("DRAFTRL_PROPOSER_CONFIG", "proposer.json")
    monkeypatch.chdir(moved)
    proposer = DraftrlProposer(fake_vllm_config(bundle["speculative_config"]["num_speculative_tokens"]))
    assert isinstance(proposer.controller, RequestPolicyControl)
    assert proposer.controller.policy.path == moved / "policy.onnx"
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError):  # run from elsewhere, the relative path names no file
        DraftrlProposer(fake_vllm_config(4))
