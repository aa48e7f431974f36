"""Bring your own target from the first command: ``draftrl demo --quick --target DIR`` on a CPU
stand-in of a user's model (``my_target``, conftest.py: a tiny random Llama saved with
``save_pretrained``, its own tokenizer and chat template) runs to the end in float32 with n-gram
drafts, saying once how to train a head;
asking for the shipped head explicitly is refused before any model loads; a copy of
``configs/demo_quick_cpu.yaml`` with the target edited reruns one step as the demo ran it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from draftrl.cli import main

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("one_thread")


def _demo_copy(target: Path, folder: Path) -> Path:
    """configs/demo_quick_cpu.yaml as a user copies it, the target edited (its drafter still sam:2)."""
    text = (ROOT / "configs" / "demo_quick_cpu.yaml").read_text()
    assert "\nenv:\n" in text
    copy = folder / "my_demo.yaml"
    copy.write_text(text.replace("\nenv:\n", f"\nenv:\n  target: {target}\n", 1))
    return copy


def _head_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "ships none for the target 'my-target'" in line]


def test_the_quick_demo_runs_to_the_end_on_a_target_without_a_head(my_target, tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--target", str(my_target), "--kernels", "stock", "--out", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert summary["exactness_passed"] is True  # float32: greedy token identity on every held-out request
    assert set(summary["steps"]) == {"model", "calibrate", "collect", "train", "grid", "eval"}
    (line,) = _head_lines(captured.err)  # said once, before the first step
    assert f"`draftrl distill --target {my_target} --out heads/my-target`" in line
    assert captured.err.index(line) < captured.err.index("[1/6] model")
    assert json.loads((out / "traces" / "trace.json").read_text())["config"]["drafter"] == "ngram:1:3:latest"

    # the same step again, from a copy of the demo's config with the target edited
    copy = _demo_copy(my_target, tmp_path)
    steps = tmp_path / "steps"
    assert main(["collect", "--config", str(copy), "--kernels", "stock", "--cost-table", str(out / "cost_table.json"),
                 "--out", str(steps / "traces"), "--json"]) == 0
    assert len(_head_lines(capsys.readouterr().err)) == 1
    demo = np.load(out / "traces" / "trace.npz")
    rerun = np.load(steps / "traces" / "trace.npz")
    assert sorted(demo.files) == sorted(rerun.files)
    for name in ("prompt_tokens", "continuation", "node_tokens", "node_parents", "cu_num_positions"):
        np.testing.assert_array_equal(demo[name], rerun[name], err_msg=name)
    assert main(["train", "--config", str(copy), "--kernels", "stock", "--traces", str(out / "traces"),
                 "--out", str(steps / "ppo_size"), "--json"]) == 0
    assert _train_config(steps / "ppo_size") == _train_config(out / "ppo_size")


def _train_config(run: Path) -> dict:
    """A run's config.json with its traces (stored relative to the run) as absolute paths."""
    config = json.loads((run / "config.json").read_text())
    for section in ("env", "depth_env"):
        config[section]["traces"] = str((run / config[section]["traces"]).resolve())
    return config


def test_asking_for_the_missing_head_is_refused_before_any_model_loads(my_target, tmp_path, capsys, monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the drafter was checked")

    monkeypatch.setattr("draftrl.models.load_model", no_loading)
    monkeypatch.setattr("draftrl.models.loading.load_model", no_loading)
    for command, drafter in (("demo", "sam:2"), ("grid", "eagle3"), ("eval", "sam:3"), ("calibrate", "eagle3"),
                             ("collect", "sam:2")):
        out = tmp_path / command
        assert main([command, "--target", str(my_target), "--drafter", drafter, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and _head_lines(err), err
        assert f"draftrl distill --target {my_target} --out heads/my-target" in err
        assert f"--drafter {drafter}:heads/my-target" in err
        assert not out.exists()
