"""``benchmarks/gpu_check.sh``'s dry run, so that the GPU check cannot rot while no GPU runs it.

The dry run runs every step of the GPU check (the CUDA tests, random-weight models saved and loaded,
host-sync counts, the bf16 grid, PPO on the real engine, the evaluation, the multi-GPU step's split
target over a per-layer map with both halves on the CPU) with tiny shapes on the CPU, in a Python
that holds only what the GPU machine is sure to hold plus the carried wheels: an import that the
wheel list misses fails it. The negative control: that Python, built without the
carried wheels, cannot import what they carry.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
STEPS = ("exactness_tests", "models", "syncs", "grid", "train", "eval", "multi_gpu")


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "PYTHON": sys.executable, "DRAFTRL_SITE": str(tmp_path / "site"), "OMP_NUM_THREADS": "1",
            "TMPDIR": str(tmp_path)}


def test_the_dry_run_runs_every_step_in_a_python_holding_what_the_gpu_machine_holds(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(SCRIPT), "--cpu", "--out", str(out)], cwd=ROOT, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "# device python: " in done.stdout
    result = json.loads((out / "results.json").read_text())
    assert result["passed"] and result["mode"] == "cpu"
    assert {name: step["status"] for name, step in result["steps"].items()} == dict.fromkeys(STEPS, "passed")
    steps = result["steps"]
    tests = steps["exactness_tests"]["counts"]
    assert tests["passed"] >= 5 and tests["failure"] == tests["error"] == 0  # the device-agnostic checks ran
    assert steps["models"]["target"]["folder_gb"] > 0 and steps["models"]["tokenizer"]["ids"] == 128_256
    sizes = result["sizes"]
    assert len(steps["syncs"]["rows"]) == 2 * len(sizes["sync_widths"]) * len(sizes["sync_depths"])
    assert set(steps["grid"]["cells"]) == {f"d{d}_v0_w1" for d in sizes["grid_depths"]}
    assert steps["grid"]["greedy_identity"]["passed"] and steps["grid"]["greedy_identity"]["num_violations"] == 0
    assert steps["train"]["num_timesteps"] >= sizes["train_rounds"]
    assert set(steps["eval"]["policies"]) == {"none", "heuristic", "best-grid", "ppo"}
    assert steps["eval"]["exactness"]["passed"]
    split = steps["multi_gpu"]["hf_split"]  # the dry variant: the per-layer map over cpu, accelerate's hooks forced
    assert split["status"] == "passed" and split["hooked_modules"] > 0 and split["weights_on"] == ["cpu"]
    assert split["device_map"]["model.layers.0"] == split["device_map"]["lm_head"] == split["draft_device"] == "cpu"
    assert set(split["cells"]) == set(steps["grid"]["cells"]) and split["greedy_identity"]["passed"]
    assert split["greedy_identity"]["comparisons"] > 0 and split["greedy_identity"]["num_violations"] == 0
    vllm = steps["multi_gpu"]["vllm_tp2"]
    assert vllm["status"] == "skipped" and "vLLM is not importable" in vllm["why"]
    used = ("torch", "transformers", "gymnasium", "stable-baselines3", "scipy", "matplotlib", "pytest")
    assert all(result["versions"][name] for name in used), result["versions"]
    assert {p.name for p in out.iterdir()} == {"results.json", "gpu_check.log", "exactness_tests.xml", "grid.json",
                                              "train_summary.json", "eval_results.json", "eval_report.md"}
    assert not list(tmp_path.glob("gpu_check_*")), "the dry run's Python and work folder are left behind"


def test_the_dry_runs_python_lacks_what_the_carried_wheels_bring(tmp_path):
    """Built without the carried distributions, the dry run's Python imports torch and transformers
    but neither gymnasium nor scipy: a wheel missing from the list fails the dry run."""
    python = tmp_path / "python"
    made = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--device-python", str(python)], cwd=ROOT,
                          env={**_env(tmp_path), "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=120)
    assert made.returncode == 0, made.stderr[-2000:]
    probe = ("import importlib.util as u, torch, transformers\n"
             "print(*(u.find_spec(m) is not None for m in ('gymnasium', 'stable_baselines3', 'scipy', 'matplotlib',"
             " 'pytest', 'wandb')))")
    done = subprocess.run([str(python / "bin" / "python"), "-c", probe], cwd=tmp_path, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False"] * 6


def test_the_multi_gpu_step_does_not_run_on_one_gpu_and_says_why(monkeypatch):
    """Checked before the time guard, so one GPU or a spent budget never fails the check through it."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import gpu_check
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert gpu_check.why_not_here("multi_gpu", "cuda").startswith("1 GPU visible; the multi-GPU step needs two")
    assert gpu_check.why_not_here("grid", "cuda") is None and gpu_check.why_not_here("multi_gpu", "cpu") is None
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert gpu_check.why_not_here("multi_gpu", "cuda") is None
    mapping = gpu_check.layer_map(4, ("cuda:0", "cuda:1"))
    assert [mapping[f"model.layers.{i}"] for i in range(4)] == ["cuda:0", "cuda:0", "cuda:1", "cuda:1"]
    assert mapping["model.embed_tokens"] == "cuda:0" and mapping["lm_head"] == mapping["model.norm"] == "cuda:1"


def test_the_vllm_half_compares_engines_under_the_dtype_rule(monkeypatch, tmp_path):
    """``_vllm_tp2`` with its engines' child processes replaced by canned greedy outputs: identical
    outputs pass; a token changed in the ngram run is a divergence whose target margin (a bfloat16
    random model, no near-tie) makes it a violation, so the part fails."""
    import subprocess as sp
    from types import SimpleNamespace

    import torch

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import gpu_check

    tokenizer = gpu_check.build_tokenizer()
    model = gpu_check.build_model(gpu_check.SHAPES["cpu"]["target"], "cpu", torch.bfloat16, 0)
    notes: list[str] = []
    ctx = SimpleNamespace(mode="cuda", dtype="bfloat16", sizes=gpu_check.SIZES["cpu"], deadline=float("inf"),
                          specs={"target": str(tmp_path)}, target=SimpleNamespace(model=model, tokenizer=tokenizer),
                          bench=SimpleNamespace(row=lambda *a, **k: None, note=notes.append))
    monkeypatch.setattr(gpu_check.importlib.util, "find_spec", lambda name: object())

    def engines(changed: int | None):
        def run(command, **kwargs):
            arg = json.loads(command[-1])
            tokens = [[5 + i, 6, 7, 8] for i in range(len(arg["prompts"]))]
            if changed is not None and arg["spec"] is not None:
                tokens[0][2] = changed
            return sp.CompletedProcess(command, 0, stdout="log line\nTOKENS " + json.dumps(tokens), stderr="")
        return run

    monkeypatch.setattr(gpu_check.subprocess, "run", engines(None))
    same = gpu_check._vllm_tp2(ctx)
    assert same["status"] == "passed" and same["greedy_identity"]["identical"] == same["greedy_identity"]["comparisons"]
    assert same["greedy_identity"]["per_setting"].keys() == {"plain_tp2", "ngram_tp2"}
    monkeypatch.setattr(gpu_check.subprocess, "run", engines(90_000))
    changed = gpu_check._vllm_tp2(ctx)
    divergence = changed["greedy_identity"]["divergences"][0]
    assert changed["status"] == "failed" and divergence["setting"] == "ngram_tp2" and divergence["position"] == 2
    assert not divergence["near_tie"] and any("VIOLATION" in line for line in notes)
