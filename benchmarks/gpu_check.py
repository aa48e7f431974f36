"""The GPU check (issue 40, item 7): draftrl on one GPU with no network, real shapes, in under 10 minutes.

A GPU machine lent for a check may hold torch and transformers but none of draftrl's other
dependencies, and cannot reach a network, so ``gpu_check.sh`` carries wheels (the RL stack, scipy,
matplotlib, pytest: it lists them) and no model weights: the models are random weights of real
shapes made on the GPU, so the timings are real and the acceptance is meaningless (a random draft's
tokens are rejected). Run it through the shell script, which installs the wheels the machine lacks
and sets the environment:

    bash benchmarks/gpu_check.sh --out $OUT                     # on the GPU machine
    bash benchmarks/gpu_check.sh --cpu --out runs/gpu_check_cpu  # the dry run: the same steps, tiny shapes, CPU

Steps, in order; each is timed (``# step NAME: ... s``) and recorded in ``OUT/results.json`` when it
ends, a failed step is recorded with its error and the next one runs (exit status 1 if any failed):

1. ``exactness_tests``: pytest on the CUDA tests (``tests/decoding/test_cuda_device.py``: the engine's
   law on tiny LMs with the resample-from-p control, and the bfloat16 argmax check and streaming
   monitor with their off-by-one and resample-from-p controls on cuBLAS's bf16 kernels) and
   ``tests/decoding/test_verification_device.py``; the SmolLM2 test is deselected (its weights come
   from PyPI). With ``--cpu`` the same command runs and the CUDA tests skip. ``OUT/exactness_tests.xml``.
2. ``models``: a target of Llama-3.1-8B's shape and a draft of Llama-3.2-1B's shape (:data:`SHAPES`),
   random weights made on the device in bfloat16, over one tokenizer of Llama 3's 128,256 ids (a
   byte-level BPE trained on draftrl's prompts, padded, with Llama 3's special ids and chat format);
   each saved with ``save_pretrained`` into ``--work`` (16 GB and 2.5 GB on a GPU) and loaded back
   from its folder as a user's own model is, once: every draftrl entry point below (grid, eval, the
   training envs) takes it by that folder's name from the process's shared copy.
3. ``syncs``: ``benchmarks/sync_counts.py``'s rows on the pair (host syncs per round as draftrl's
   ``SyncCounter`` recognises them and as ``torch.cuda.set_sync_debug_mode`` counts them, at
   temperatures 0 and 1, chains and trees, every depth); fails above the documented bounds
   (:data:`MAX_READS`, :data:`MAX_UPLOADS`, docs/architecture.md).
4. ``grid``: ``draftrl.eval.round.grid.run_grid`` in bfloat16 at temperature 0 with Hugging Face anchors;
   the low-precision verdict (agreement with plain decoding, divergences and their margins).
5. ``train``: ``draftrl.train.ppo_size.train`` (PPO) on ``draftrl/SpecDecode-v2``, the real engine,
   for :attr:`Sizes.train_rounds` rounds, then its evaluation against every fixed setting.
6. ``eval``: ``draftrl.eval.round.compare.run_eval`` on the held-out prompts: ``none``, ``best-grid``,
   ``heuristic`` and the trained policy, with the verdict. ``OUT/eval_report.md``.
7. ``multi_gpu`` (issue 47), when two or more GPUs are visible: (a) ``hf_split``: the grid of step 4 on
   the target split over two GPUs by ``env.device_map`` (an explicit per-layer map, :func:`layer_map`)
   with the draft on the second (``env.draft_device``), and its verdict; (b) ``vllm_tp2``: vLLM serving
   the target with ``tensor_parallel_size=2`` and vLLM's own ngram speculation (draftrl's proposer
   refuses tensor parallelism, docs/scale.md), greedy, against plain vLLM on one GPU and on two, each
   engine in a child process; the verdict by the rule of the dtype (bfloat16: a divergence is a
   near-tie of the target's logits, read from the Hugging Face target). (b) says it skipped, and why,
   where vLLM is not importable (the lent image holds none). On one GPU the step does not run and says
   why. The dry run (``--cpu``) runs (a) over the same map with both halves on the CPU, accelerate's
   hooks forced into every module (what a split over GPUs runs), and (b) skips. On a two-GPU machine
   within the 10 minutes: ``--steps models,multi_gpu``.

What comes back (7 files, within the device tool's 8): ``gpu_check.log`` (everything printed),
``results.json`` (the machine, every row, each step's status, seconds and details, the versions
used), ``exactness_tests.xml``, ``grid.json``, ``train_summary.json``, ``eval_results.json``,
``eval_report.md``. The models' folders and the runs go to ``--work`` (default a temporary folder,
removed at the end).

``--device-python DIR`` only builds the dry run's Python (:func:`make_device_python`); the shell
script's ``--cpu`` does that first.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from _bench import Bench, common_flags, fmt, parse_args

ROOT = Path(__file__).resolve().parents[1]
STEPS = ("exactness_tests", "models", "syncs", "grid", "train", "eval", "multi_gpu")
#: what the script writes in --out (``--overwrite`` removes these first)
OWNED = ("gpu_check.log", "exactness_tests.xml", "grid.json", "train_summary.json", "eval_results.json",
         "eval_report.md")
#: the pytest step: the CUDA tests and the device checks that run anywhere
EXACTNESS_TESTS = ("tests/decoding/test_cuda_device.py", "tests/decoding/test_verification_device.py")
#: needs SmolLM2-135M, which draftrl fetches from PyPI (no network on the GPU machine; its wheel is 89 MB)
DESELECTED = ("tests/decoding/test_cuda_device.py::test_smollm2_sampled_tree_rounds_on_cuda",)
#: what the GPU machine holds for certain: these distributions and what they require
ON_DEVICE = ("torch", "transformers", "pip")
#: host syncs a round may pay with a draft model (docs/architecture.md, "Host syncs per round")
MAX_READS, MAX_UPLOADS = 4, 6

#: Llama 3's tokenizer: 128,000 BPE ids, then 256 special ids
REGULAR_IDS, SPECIAL_IDS = 128_000, 256
#: Llama 3's special tokens at their ids (offset from 128,000); the others are reserved
SPECIALS = {0: "<|begin_of_text|>", 1: "<|end_of_text|>", 6: "<|start_header_id|>", 7: "<|end_header_id|>",
            8: "<|eom_id|>", 9: "<|eot_id|>"}
#: Llama 3's chat format (no system prompt)
CHAT_TEMPLATE = ("{{ '<|begin_of_text|>' }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
                 "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")


def _llama3(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, tied: bool,
            rope_factor: float) -> dict[str, Any]:
    """A ``LlamaConfig``'s arguments as Llama 3.x's config.json gives them."""
    return dict(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
                tie_word_embeddings=tied, vocab_size=REGULAR_IDS + SPECIAL_IDS, max_position_embeddings=131_072,
                rms_norm_eps=1e-5, hidden_act="silu", bos_token_id=REGULAR_IDS,
                eos_token_id=[128_001, 128_008, 128_009],
                rope_parameters={"rope_type": "llama3", "rope_theta": 500_000.0, "factor": rope_factor,
                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 8192})


#: the models per mode: Llama-3.1-8B's and Llama-3.2-1B's shapes on a GPU; on a CPU (--cpu) tiny ones
#: over the same tokenizer, so that every step runs the same code
SHAPES: dict[str, dict[str, dict[str, Any]]] = {
    "cuda": {"target": _llama3(4096, 14336, 32, 32, 8, tied=False, rope_factor=8.0),
             "draft": _llama3(2048, 8192, 16, 32, 8, tied=True, rope_factor=32.0)},
    "cpu": {"target": _llama3(64, 128, 4, 4, 2, tied=False, rope_factor=8.0),
            "draft": _llama3(32, 64, 2, 2, 1, tied=True, rope_factor=32.0)},
}
#: the models' folder names (the specs every step names them by)
NAMES = {"cuda": {"target": "llama-3.1-8b-shape-random", "draft": "llama-3.2-1b-shape-random"},
         "cpu": {"target": "llama-tiny-target-random", "draft": "llama-tiny-draft-random"}}


@dataclass
class Sizes:
    """How much each step does (per mode, :data:`SIZES`; ``--quick`` halves the work)."""

    languages: tuple[str, ...]
    tasks: tuple[str, ...]
    max_new_tokens: int
    """per request (every request runs to it: env.ignore_eos)"""
    grid_depths: tuple[int, ...]
    grid_repeats: int
    sync_depths: tuple[int, ...]
    sync_widths: tuple[int, ...]
    sync_rounds: int
    train_rounds: int
    """PPO timesteps: one real-engine round each"""
    n_steps: int
    """PPO rollout length (one update per n_steps rounds)"""
    train_depths: tuple[int, ...]
    eval_episodes: int
    """episodes per policy in the training run's own evaluation"""
    test_timeout: int
    """seconds the pytest step may take"""

    def quick(self) -> Sizes:
        return dataclasses.replace(self, max_new_tokens=max(4, self.max_new_tokens // 2), grid_repeats=1,
                                   train_rounds=max(self.n_steps, self.train_rounds // 2))


SIZES = {
    "cuda": Sizes(languages=("en", "zh"), tasks=("chat", "code_edit"), max_new_tokens=32, grid_depths=(0, 1, 2, 4),
                  grid_repeats=2, sync_depths=(1, 2, 4, 8), sync_widths=(1, 2), sync_rounds=6, train_rounds=384,
                  n_steps=128, train_depths=(0, 1, 2, 4), eval_episodes=2, test_timeout=300),
    "cpu": Sizes(languages=("en",), tasks=("chat", "code_edit"), max_new_tokens=8, grid_depths=(0, 1, 2),
                 grid_repeats=1, sync_depths=(1, 2), sync_widths=(1, 2), sync_rounds=3, train_rounds=128,
                 n_steps=64, train_depths=(0, 1, 2), eval_episodes=1, test_timeout=300),
}


class Tee:
    """``sys.stdout`` copied into a log file (opened once ``--out`` is known; what came before is kept)."""

    def __init__(self, stream):
        self.stream, self.file, self.buffer = stream, None, []

    def open(self, path: Path) -> None:
        self.file = open(path, "a", encoding="utf-8")
        self.file.write("".join(self.buffer))
        self.buffer = []

    def write(self, text: str) -> int:
        self.stream.write(text)
        if self.file is not None:
            self.file.write(text)
            self.file.flush()
        else:
            self.buffer.append(text)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


# ---------------------------------------------------------------------------------------------- models

def build_tokenizer():
    """Llama 3's id layout without its files: a byte-level BPE trained on draftrl's prompts (any text
    encodes: the 256 bytes are symbols), padded with filler tokens to 128,000 ids, then the 256 special
    ids with ``<|eot_id|>`` as EOS and Llama 3's chat format. Every id a random target emits decodes.
    Deterministic; about a second."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from draftrl.prompts import load_prompts

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=REGULAR_IDS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator([p.prompt for p in load_prompts()], trainer=trainer)
    state = json.loads(bpe.to_str())
    vocab = state["model"]["vocab"]
    for i in range(len(vocab), REGULAR_IDS):  # fillers: ids the prompts never produce (plain ASCII decodes as is)
        vocab[f"<|filler_{i}|>"] = i
    padded = Tokenizer.from_str(json.dumps(state))
    padded.add_special_tokens([AddedToken(SPECIALS.get(i, f"<|reserved_special_token_{i}|>"), special=True)
                               for i in range(SPECIAL_IDS)])  # in order: ids 128,000 ..
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=padded, bos_token=SPECIALS[0], eos_token=SPECIALS[9],
                                        pad_token=SPECIALS[1])
    assert [tokenizer.convert_tokens_to_ids(SPECIALS[i]) for i in SPECIALS] == [REGULAR_IDS + i for i in SPECIALS]
    assert len(tokenizer) == REGULAR_IDS + SPECIAL_IDS
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(shape: dict[str, Any], device: str, dtype: torch.dtype, seed: int):
    """A random-weight Llama of ``shape`` made on ``device`` in ``dtype`` (transformers' own init, std
    0.02), in eval mode with gradients off: no weights are read or written."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(LlamaConfig(**shape), dtype=dtype)
    model.eval()
    model.requires_grad_(False)
    return model


# ---------------------------------------------------------------------------------------------- steps

@dataclass
class Context:
    """What the steps share."""

    bench: Bench
    args: argparse.Namespace
    device: str
    mode: str
    sizes: Sizes
    work: Path
    out: Path
    dtype: str = "bfloat16"
    kernels: str = "stock"  # CPU few-token kernels: no timed probe (on a GPU every choice is the device's)
    target: Any = None
    draft: Any = None
    specs: dict[str, str] = dataclasses.field(default_factory=dict)
    policy_dir: Path | None = None
    grid_path: Path | None = None
    deadline: float = math.inf
    """``time.perf_counter()`` past which no step part starts (``--budget-s``)"""

    def env(self, **changes: Any) -> dict[str, Any]:
        """The ``env`` section every step shares: the pair, bfloat16, temperature 0, the workload."""
        s = self.sizes
        return {"target": self.specs["target"], "drafter": self.specs["draft"], "device": self.device,
                "dtype": self.dtype, "kernels": self.kernels, "languages": list(s.languages), "tasks": list(s.tasks),
                "limit_per_group": 1, "max_new_tokens": s.max_new_tokens, "ignore_eos": True, "temperature": 0.0,
                **changes}


def step_exactness_tests(ctx: Context) -> dict[str, Any]:
    """pytest on :data:`EXACTNESS_TESTS` in a child process (its output streamed), junit XML in --out."""
    xml = ctx.out / "exactness_tests.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "slow or not slow", "-rfEs",
               f"--junitxml={xml}", *EXACTNESS_TESTS, *(f"--deselect={d}" for d in DESELECTED)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    ctx.bench.note("$ " + " ".join(command[1:]))
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    timer = threading.Timer(ctx.sizes.test_timeout, proc.kill)
    timer.start()
    try:
        for line in proc.stdout:
            print("  | " + line.rstrip(), flush=True)
        code = proc.wait()
    finally:
        timer.cancel()
    cases = []
    if xml.is_file():
        for case in ET.parse(xml).getroot().iter("testcase"):
            outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
            cases.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                          "seconds": float(case.get("time") or 0)})
    counts = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failure", "error", "skipped")}
    ctx.bench.row({}, {"passed": counts["passed"], "failed": counts["failure"] + counts["error"],
                       "skipped": counts["skipped"]}, step="exactness_tests", exit_code=code)
    result = {"command": " ".join(command[1:]), "exit_code": code, "deselected": list(DESELECTED),
              "counts": counts, "tests": cases}
    if code != 0:
        raise StepFailed(f"pytest exited {code}" + (" (killed at the step's timeout)" if code < 0 else ""), result)
    return result


def step_models(ctx: Context) -> dict[str, Any]:
    """The tokenizer, then the target and the draft: each made with random weights on the device,
    saved with ``save_pretrained`` and loaded back from its folder, each phase timed."""
    from draftrl.models import shared_model  # the process's copy every entry point below looks up first

    t0 = time.perf_counter()
    tokenizer = build_tokenizer()
    out: dict[str, Any] = {"tokenizer": {"ids": len(tokenizer), "seconds": time.perf_counter() - t0}}
    dtype = getattr(torch, ctx.dtype)
    for role, seed in (("target", 0), ("draft", 1)):
        t0 = time.perf_counter()
        model = build_model(SHAPES[ctx.mode][role], ctx.device, dtype, seed)
        params = sum(p.numel() for p in model.parameters())
        if ctx.device.startswith("cuda"):
            torch.cuda.synchronize()
        built = time.perf_counter() - t0
        folder = ctx.work / "models" / NAMES[ctx.mode][role]
        t0 = time.perf_counter()
        model.save_pretrained(folder)  # what a user's own model is: a folder
        tokenizer.save_pretrained(folder)
        saved = time.perf_counter() - t0
        del model  # before the load: two copies of the 8B target would hold 32 GB
        if ctx.device.startswith("cuda"):
            torch.cuda.empty_cache()
        t0 = time.perf_counter()
        loaded = shared_model(str(folder), ctx.dtype, ctx.device, ctx.kernels)
        if ctx.device.startswith("cuda"):
            torch.cuda.synchronize()
        load = time.perf_counter() - t0
        setattr(ctx, role, loaded)
        ctx.specs[role] = str(folder)
        size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
        out[role] = {"spec": str(folder), "params": params, "folder_gb": size / 1e9, "build_s": built,
                     "save_s": saved, "load_s": load,
                     "shape": {k: v for k, v in SHAPES[ctx.mode][role].items() if k != "rope_parameters"}}
        ctx.bench.row({}, {"params_billion": params / 1e9, "folder_gb": size / 1e9, "build_s": built,
                           "save_s": saved, "load_s": load},
                      step="models", model=role, name=folder.name, dtype=ctx.dtype, device=ctx.device)
    if ctx.device.startswith("cuda"):
        out["gpu_memory_allocated_gb"] = torch.cuda.memory_allocated() / 2**30
    return out


def step_syncs(ctx: Context) -> dict[str, Any]:
    """``sync_counts.measure`` on the pair at temperatures 0 and 1; over the bounds is a failure."""
    from sync_counts import measure

    s = ctx.sizes
    rows = measure(ctx.bench, ctx.target, target=ctx.specs["target"], drafter=ctx.specs["draft"], device=ctx.device,
                   dtype=ctx.dtype, temperatures=[0.0, 1.0], widths=list(s.sync_widths), depths=list(s.sync_depths),
                   rounds=s.sync_rounds, repeats=1, kernels=ctx.kernels)
    table = [{**r["context"], **r["values"], **r["ratios"]} for r in rows]
    for r in table:  # the context's long folder names: the summary says them once
        r.pop("target", None), r.pop("drafter", None)
    growth = {}
    for key in ("reads_max", "uploads_max", "cuda_syncs_max"):
        for temperature in (0.0, 1.0):
            for width in s.sync_widths:
                by_depth = {r["depth"]: r[key] for r in table
                            if r["temperature"] == temperature and r["width"] == width}
                if None not in by_depth.values():
                    growth[f"{key}@T{temperature:g}_w{width}"] = by_depth
    over = [r for r in table if r["reads_max"] > MAX_READS or r["uploads_max"] > MAX_UPLOADS]
    result = {"rows": table, "by_depth": growth, "bounds": {"reads": MAX_READS, "uploads": MAX_UPLOADS},
              "grows_with_depth": sorted(k for k, v in growth.items() if v[max(v)] > v[min(v)])}
    ctx.bench.note("syncs by depth: " + "  ".join(f"{k}={'/'.join(fmt(v[d]) for d in sorted(v))}"
                                                 for k, v in growth.items()))
    if over:
        raise StepFailed(f"{len(over)} setting(s) pay more host syncs per round than the documented "
                         f"{MAX_READS} reads / {MAX_UPLOADS} uploads", result)
    return result


def _eval_config(ctx: Context, env: dict[str, Any] | None = None, **sections: Any):
    from draftrl.config import from_dict
    from draftrl.eval.round.config import EvalConfig

    return from_dict(EvalConfig, {"env": ctx.env(split=None, shuffle=False, depths=list(ctx.sizes.grid_depths),
                                                 **(env or {})),
                                  "wandb": {"mode": "disabled"}, **sections})


def _verdict(ctx: Context, verdict: dict) -> None:
    from draftrl.eval.agreement import verdict_lines

    for line in verdict_lines(verdict):
        ctx.bench.note(line)


def step_grid(ctx: Context) -> dict[str, Any]:
    """``run_grid`` on the tune prompts; rows per cell, then the bfloat16 verdict."""
    from draftrl.eval.agreement import AgreementViolation
    from draftrl.eval.round.grid import GRID_FILE, run_grid

    config = _eval_config(ctx, grid={"depths": list(ctx.sizes.grid_depths), "repeats": ctx.sizes.grid_repeats},
                          eval={"anchor_gammas": [4]})
    folder = ctx.work / "grid"
    error = None
    try:
        run_grid(config, folder, target=ctx.target)
    except AgreementViolation as err:  # written first; reported below with the verdict
        error = err
    result = json.loads((folder / GRID_FILE).read_text())
    shutil.copyfile(folder / GRID_FILE, ctx.out / "grid.json")
    ctx.grid_path = folder / GRID_FILE
    for name, cell in result["cells"].items():
        ctx.bench.row({"speedup_vs_none": cell["speedup_vs_none"], "speedup_vs_hf": cell.get("speedup_vs_hf")},
                      {"tok_s": cell["tokens_per_second"], "ms_per_token": 1e3 / cell["tokens_per_second"],
                       "tokens_per_round": cell["mean_tokens_per_round"], "noise": cell["noise"]},
                      step="grid", cell=name, prompts=len(result["prompts"]), repeats=result["repeats"])
    anchors = (result.get("anchors") or {}).get("methods") or {}
    for label, anchor in anchors.items():
        ctx.bench.row({}, {"tok_s": anchor["tokens_per_second"]}, step="grid", anchor=label)
    identity = result["exactness"]["greedy_identity"]
    _verdict(ctx, identity)
    summary = {"best": result["best"], "cells": {k: {key: v.get(key) for key in ("speedup_vs_none", "speedup_vs_hf",
                                                                                  "tokens_per_second",
                                                                                  "mean_tokens_per_round", "noise")}
                                                  for k, v in result["cells"].items()},
               "anchors": {k: v["tokens_per_second"] for k, v in anchors.items()},
               "greedy_identity": {k: v for k, v in identity.items() if k != "divergences"},
               "divergences": identity.get("divergences", [])[:10], "wall_seconds": result["wall_seconds"]}
    if error is not None:
        raise StepFailed(str(error), summary)
    return summary


def step_train(ctx: Context) -> dict[str, Any]:
    """PPO (``ppo_size.train``) on ``draftrl/SpecDecode-v2`` with the pair, then its own evaluation."""
    from draftrl.config import from_dict
    from draftrl.train import ppo_size
    from draftrl.train.config import TrainConfig

    s = ctx.sizes
    env = ctx.env(id="draftrl/SpecDecode-v2", split="tune", depths=list(s.train_depths), eval={"split": "heldout"})
    cfg = from_dict(TrainConfig, {
        "env": env, "total_timesteps": s.train_rounds, "checkpoint_every": s.train_rounds,
        "ppo": {"n_envs": 1, "n_steps": s.n_steps, "batch_size": s.n_steps // 2, "n_epochs": 4},
        "eval_episodes": s.eval_episodes, "baselines": ["heuristic"], "progress_bar": False,
        "wandb": {"mode": "disabled"}})
    folder = ctx.work / "train"
    t0 = time.perf_counter()
    summary = ppo_size.train(cfg, folder)
    seconds = time.perf_counter() - t0
    shutil.copyfile(folder / "train_summary.json", ctx.out / "train_summary.json")
    ctx.policy_dir = folder
    training_s = summary["wall_seconds"]["training"]
    ctx.bench.row({}, {"rounds": summary["num_timesteps"], "rounds_per_s": summary["num_timesteps"] / training_s,
                       "training_s": training_s, "evaluation_s": summary["wall_seconds"]["evaluation"]},
                  step="train", env="draftrl/SpecDecode-v2", n_steps=s.n_steps)
    table = summary["evaluation"]["table"]
    for name, row in table.items():
        ctx.bench.row({"vs_best_fixed": row.get("ratio_to_best_fixed")}, {"throughput": row["throughput"]},
                      step="train_eval", policy=name, episodes=summary["evaluation"]["episodes"])
    return {"num_timesteps": summary["num_timesteps"], "wall_seconds": summary["wall_seconds"], "seconds": seconds,
            "best_fixed": summary["evaluation"]["best_fixed"], "table": table}


def step_eval(ctx: Context) -> dict[str, Any]:
    """``run_eval`` on the held-out prompts: none, best-grid (with the grid), heuristic, the PPO policy."""
    from draftrl.eval.round.compare import REPORT_FILE, RESULTS_FILE, run_eval

    policies = ["none", "heuristic"]
    if ctx.grid_path is not None:
        policies.append("best-grid")
    if ctx.policy_dir is not None:
        policies.append(f"ppo:{ctx.policy_dir}")
    config = _eval_config(ctx, eval={"policies": policies, "anchor_gammas": [4]})
    folder = ctx.work / "eval"
    error = None
    try:
        run_eval(config, folder, grid_path=ctx.grid_path, target=ctx.target)
    except Exception as err:  # an exactness failure: results.json is written first
        if not (folder / RESULTS_FILE).is_file():
            raise
        error = err
    result = json.loads((folder / RESULTS_FILE).read_text())
    shutil.copyfile(folder / RESULTS_FILE, ctx.out / "eval_results.json")
    if (folder / REPORT_FILE).is_file():
        shutil.copyfile(folder / REPORT_FILE, ctx.out / "eval_report.md")
    for label, p in result["policies"].items():
        ctx.bench.row({"speedup_vs_none": p.get("speedup_vs_none"), "speedup_vs_hf": p.get("speedup_vs_hf")},
                      {"tok_s": p["tokens_per_second"], "tokens_per_round": p["mean_tokens_per_round"]},
                      step="eval", policy=label if not label.startswith("ppo:") else "ppo")
    exactness = result["exactness"]
    _verdict(ctx, exactness["greedy_identity"])
    summary = {"policies": {k: {key: v.get(key) for key in ("speedup_vs_none", "speedup_vs_hf", "tokens_per_second",
                                                             "mean_tokens_per_round")}
                            for k, v in result["policies"].items()},
               "exactness": {"passed": exactness["passed"],
                             "greedy_identity": {k: v for k, v in exactness["greedy_identity"].items()
                                                 if k != "divergences"},
                             "hf_reference": {k: v for k, v in exactness["hf_reference"].items() if k != "divergences"},
                             "failure": exactness.get("failure")},
               "wall_seconds": result["wall_seconds"]}
    if error is not None:
        raise StepFailed(f"{type(error).__name__}: {error}", summary)
    return summary


def layer_map(layers: int, devices: tuple[str, str]) -> dict[str, str]:
    """A Llama's modules over two devices, one entry per layer: the embeddings, the rotary embedding and
    the first half of the layers on the first; the rest, the final norm and ``lm_head`` on the second."""
    first, second = devices
    return {"model.embed_tokens": first, "model.rotary_emb": first,
            **{f"model.layers.{i}": first if i < layers // 2 else second for i in range(layers)},
            "model.norm": second, "lm_head": second}


def step_multi_gpu(ctx: Context) -> dict[str, Any]:
    """The target over two devices: the HF engine split by ``env.device_map``, then vLLM with
    ``tensor_parallel_size=2`` (module docstring, step 7)."""
    gpus = torch.cuda.device_count() if ctx.mode == "cuda" else 0
    devices = ("cuda:0", "cuda:1") if ctx.mode == "cuda" else ("cpu", "cpu")
    hf = _hf_split(ctx, devices)
    vllm = _vllm_tp2(ctx)
    result = {"gpus": gpus, "devices": list(devices), "hf_split": hf, "vllm_tp2": vllm}
    failed = [name for name, part in (("hf_split", hf), ("vllm_tp2", vllm)) if part["status"] == "failed"]
    if failed:
        raise StepFailed(f"{', '.join(failed)}: " + "; ".join(result[n]["error"] for n in failed), result)
    return result


def _hf_split(ctx: Context, devices: tuple[str, str]) -> dict[str, Any]:
    """``run_grid`` (step 4's cells, one repeat, no anchors) on the target split by :func:`layer_map`
    over ``devices``, the draft's weights on the second; its verdict, and where the weights went."""
    from draftrl.decoding.build import load_target
    from draftrl.eval.agreement import AgreementViolation
    from draftrl.eval.round.grid import GRID_FILE, run_grid
    from draftrl.models.placement import model_devices

    mapping = layer_map(SHAPES[ctx.mode]["target"]["num_hidden_layers"], devices)
    config = _eval_config(ctx, env={"device": devices[0], "device_map": mapping, "draft_device": devices[1]},
                          grid={"depths": list(ctx.sizes.grid_depths), "repeats": 1}, eval={"anchors": False})
    split = load_target(config.env, shared=False)  # its own copy, freed at the end of the step
    if ctx.mode == "cpu":  # one device: transformers attaches no hooks; force them, as a split over GPUs runs them
        from accelerate import dispatch_model

        dispatch_model(split.model, device_map=mapping, main_device=devices[0], force_hooks=True)
    placed = {"weights_on": [str(d) for d in model_devices(split.model)],
              "hooked_modules": sum(hasattr(m, "_hf_hook") for m in split.model.modules())}
    if placed["hooked_modules"] == 0 or (ctx.mode == "cuda" and len(placed["weights_on"]) < 2):
        return {"status": "failed", "error": f"the map did not split the target: {placed}", **placed}
    folder = ctx.work / "grid_split"
    error = None
    try:
        run_grid(config, folder, target=split)
    except AgreementViolation as err:  # written first; reported with the verdict
        error = err
    result = json.loads((folder / GRID_FILE).read_text())
    one_device = json.loads(ctx.grid_path.read_text())["cells"] if ctx.grid_path is not None else {}
    for name, cell in result["cells"].items():
        same = one_device.get(name)
        ctx.bench.row({"speedup_vs_none": cell["speedup_vs_none"],
                       "split_vs_one_device": cell["tokens_per_second"] / same["tokens_per_second"] if same else None},
                      {"tok_s": cell["tokens_per_second"], "tokens_per_round": cell["mean_tokens_per_round"]},
                      step="multi_gpu", engine="hf_split", cell=name, devices="+".join(devices))
    identity = result["exactness"]["greedy_identity"]
    _verdict(ctx, identity)
    del split
    if ctx.mode == "cuda":
        torch.cuda.empty_cache()
    return {"status": "failed" if error else "passed", **({"error": str(error)} if error else {}), **placed,
            "device_map": mapping, "draft_device": devices[1], "best": result["best"],
            "cells": {k: {key: v.get(key) for key in ("speedup_vs_none", "tokens_per_second", "mean_tokens_per_round")}
                      for k, v in result["cells"].items()},
            "greedy_identity": {k: v for k, v in identity.items() if k != "divergences"},
            "divergences": identity.get("divergences", [])[:10]}


#: one vLLM engine in a child process (its workers and GPU memory end with it): greedy token ids as JSON
VLLM_CHILD = """
import json, sys
from vllm import LLM, SamplingParams
a = json.loads(sys.argv[1])
llm = LLM(model=a["model"], tensor_parallel_size=a["tp"], dtype=a["dtype"], gpu_memory_utilization=0.4, seed=0,
          max_model_len=a["max_model_len"], speculative_config=a["spec"])
outs = llm.generate([{"prompt_token_ids": ids} for ids in a["prompts"]],
                    SamplingParams(temperature=0.0, max_tokens=a["max_tokens"], ignore_eos=True))
print("TOKENS " + json.dumps([list(o.outputs[0].token_ids) for o in outs]))
"""
#: vLLM's own n-gram speculation (draftrl's proposer refuses tensor parallelism)
VLLM_NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def _vllm_tp2(ctx: Context) -> dict[str, Any]:
    """vLLM on the target's folder: plain on one GPU, plain and ngram-speculative on two; each compared
    with plain on one GPU under the dtype's rule (margins from the Hugging Face target)."""
    if importlib.util.find_spec("vllm") is None:
        return {"status": "skipped", "why": f"vLLM is not importable in {sys.executable} (the lent GPU image "
                                            "holds none; its CPU build's tensor parallelism is checked in "
                                            "tests/byo/test_byo_tensor_parallel.py)"}
    if ctx.mode == "cpu":
        return {"status": "skipped", "why": "the dry run: vLLM's tensor parallelism here needs two GPUs"}
    from draftrl.decoding.workload import encode
    from draftrl.eval.agreement import GreedyAgreement
    from draftrl.prompts import load_prompts

    s = ctx.sizes
    prompts = [p for p in load_prompts() if p.language in s.languages and p.task in s.tasks][:4]
    ids = [list(encode(ctx.target.tokenizer, p.prompt, True)) for p in prompts]
    runs: dict[str, Any] = {}
    for name, tp, spec in (("plain_tp1", 1, None), ("plain_tp2", 2, None), ("ngram_tp2", 2, VLLM_NGRAM)):
        left = ctx.deadline - time.perf_counter()
        if left < 60:
            return {"status": "skipped", "why": f"budget: {left:.0f} s left before {name}", "runs": runs}
        arg = json.dumps({"model": ctx.specs["target"], "tp": tp, "dtype": ctx.dtype, "spec": spec, "prompts": ids,
                          "max_tokens": s.max_new_tokens, "max_model_len": 4096})
        t0 = time.perf_counter()
        try:
            done = subprocess.run([sys.executable, "-c", VLLM_CHILD, arg], capture_output=True, text=True,
                                  timeout=left + 60)
        except subprocess.TimeoutExpired:
            return {"status": "failed", "error": f"{name} ran past the budget", "runs": runs}
        line = next((x for x in done.stdout.splitlines() if x.startswith("TOKENS ")), None)
        if done.returncode != 0 or line is None:
            tail = (done.stderr or done.stdout)[-1500:]
            print(tail, flush=True)
            return {"status": "failed", "error": f"{name} exited {done.returncode}", "runs": runs, "stderr": tail}
        runs[name] = {"tokens": json.loads(line[len("TOKENS "):]), "seconds": time.perf_counter() - t0}
        ctx.bench.row({}, {"seconds": runs[name]["seconds"]}, step="multi_gpu", engine="vllm", run=name, tp=tp)
    agreement = GreedyAgreement(ctx.target.model, ctx.dtype, raise_at_once=False, tokenizer=ctx.target.tokenizer)
    for name in ("plain_tp2", "ngram_tp2"):
        for prompt, prompt_ids, ref, out in zip(prompts, ids, runs["plain_tp1"]["tokens"], runs[name]["tokens"]):
            agreement.compare(name, prompt.id, prompt_ids, ref, out, what=f"vLLM {name} vs plain_tp1")
    verdict = agreement.verdict()
    _verdict(ctx, verdict)
    return {"status": "passed" if verdict["passed"] else "failed",
            **({} if verdict["passed"] else {"error": "a divergence beyond rounding (verdict)"}),
            "speculative_config": VLLM_NGRAM, "seconds": {k: v["seconds"] for k, v in runs.items()},
            "greedy_identity": verdict}


STEP_FUNCTIONS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "exactness_tests": step_exactness_tests, "models": step_models, "syncs": step_syncs, "grid": step_grid,
    "train": step_train, "eval": step_eval, "multi_gpu": step_multi_gpu}
#: steps that need the models
NEEDS_MODELS = ("syncs", "grid", "train", "eval", "multi_gpu")


class StepFailed(RuntimeError):
    """A step ran to its end and found a failure; ``details`` is what it measured."""

    def __init__(self, message: str, details: dict[str, Any]):
        super().__init__(message)
        self.details = details


def why_not_here(name: str, mode: str) -> str | None:
    """Why step ``name`` does not apply to this machine (recorded as not run, no failure), or None."""
    gpus = torch.cuda.device_count() if mode == "cuda" else 0
    if name == "multi_gpu" and mode == "cuda" and gpus < 2:
        return f"{gpus} GPU visible; the multi-GPU step needs two (CUDA_VISIBLE_DEVICES may hide some)"
    return None


# ---------------------------------------------------------------------------------------------- main

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[common_flags()])
    parser.add_argument("--cpu", action="store_true",
                        help="the dry run: every step with tiny shapes on the CPU (the CUDA tests skip)")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, of: {', '.join(STEPS)}")
    parser.add_argument("--work", default=None, help="folder for the models' folders and the runs "
                                                     "(default: a fresh temporary folder)")
    parser.add_argument("--budget-s", type=float, default=540.0,
                        help="a step that would start after this many seconds is skipped (the machine's 10 minutes)")
    parser.add_argument("--train-rounds", type=int, default=None, help="PPO timesteps (real-engine rounds)")
    parser.add_argument("--device-python", metavar="DIR", default=None,
                        help="only build, in DIR, a Python holding what the GPU machine holds (torch, transformers, "
                             "pip and their requirements, linked from this one), then exit: gpu_check.sh --cpu runs "
                             "the dry run in it")
    parser.add_argument("--carried", nargs="*", default=[], metavar="DIST",
                        help="with --device-python: the carried distributions; each one that has no wheel in .whl/ "
                             "installable here is linked too")
    args = parse_args(parser)
    if args.device_python is not None:
        made = make_device_python(Path(args.device_python), args.carried, ROOT / ".whl")
        print(f"# device python: {Path(args.device_python) / 'bin' / 'python'} holds {', '.join(made['linked'])}")
        if made["carried_linked"]:
            print(f"# linked from {sys.executable}, not installed from .whl/: {', '.join(made['carried_linked'])}")
        if made["carried_absent"]:
            print(f"# carried but neither in {sys.executable} nor in .whl/: {', '.join(made['carried_absent'])}")
        return
    if args.carried:
        raise SystemExit(f"--carried {' '.join(args.carried)}: only with --device-python DIR.")
    tee = Tee(sys.stdout)
    sys.stdout = tee
    steps = [s for s in args.steps.split(",") if s]
    unknown = sorted(set(steps) - set(STEPS))
    if unknown:
        raise SystemExit(f"--steps {args.steps!r}: unknown step(s) {unknown}; choose from {', '.join(STEPS)}.")
    if not args.cpu and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here; pass --cpu for the dry run with tiny shapes on the CPU.")
    mode = "cpu" if args.cpu else "cuda"
    device = "cpu" if args.cpu else "cuda"
    bench = Bench(args, __file__, owned=OWNED, device=device, needs_out=True)
    tee.open(bench.out / "gpu_check.log")
    sizes = SIZES[mode].quick() if args.quick else SIZES[mode]
    if args.train_rounds is not None:
        if args.train_rounds < sizes.n_steps:
            raise SystemExit(f"--train-rounds {args.train_rounds} is below one PPO rollout ({sizes.n_steps}); "
                             f"pass at least {sizes.n_steps}.")
        sizes = dataclasses.replace(sizes, train_rounds=args.train_rounds)
    if args.work and Path(args.work).is_dir() and any(Path(args.work).iterdir()):
        raise SystemExit(f"--work {args.work}: the folder is not empty (it would mix two runs' models); "
                         "name a new one.")
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="gpu_check_"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    ctx = Context(bench, args, device, mode, sizes, work, bench.out, deadline=started + args.budget_s)
    bench.note(f"gpu check: mode={mode}  steps={','.join(steps)}  work={work}  sizes={dataclasses.asdict(sizes)}")
    records: dict[str, dict[str, Any]] = {}

    def save() -> None:
        passed = all(r["status"] in ("passed", "not run") for r in records.values())
        bench.save(mode=mode, sizes=dataclasses.asdict(sizes), steps=records, versions=versions(),
                   wall_seconds=time.perf_counter() - started, passed=passed)

    for name in STEPS:
        if name not in steps:
            records[name] = {"status": "not run", "why": "not in --steps"}
            continue
        why = why_not_here(name, mode)  # before the budget: a step that cannot run here fails nothing
        if why is not None:
            records[name] = {"status": "not run", "why": why}
            bench.note(f"step {name}: not run ({why})")
            continue
        elapsed = time.perf_counter() - started
        if elapsed > args.budget_s:
            records[name] = {"status": "skipped",
                             "why": f"budget: {elapsed:.0f} s spent of --budget-s {args.budget_s:g}"}
            bench.note(f"step {name}: skipped ({records[name]['why']})")
            continue
        if name in NEEDS_MODELS and ctx.target is None:
            records[name] = {"status": "skipped", "why": "no models (step models did not run or failed)"}
            bench.note(f"step {name}: skipped ({records[name]['why']})")
            continue
        bench.note(f"step {name} ...")
        t0 = time.perf_counter()
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        try:
            details, status, error = STEP_FUNCTIONS[name](ctx), "passed", None
        except StepFailed as err:
            details, status, error = err.details, "failed", str(err)
        except Exception as err:
            details, status, error = ({"traceback": traceback.format_exc(limit=8)}, "failed",
                                      f"{type(err).__name__}: {err}")
            print(details["traceback"], flush=True)
        seconds = time.perf_counter() - t0
        records[name] = {"status": status, "seconds": seconds, **({"error": error} if error else {}), **details}
        if device == "cuda":
            records[name]["gpu_peak_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
        bench.note(f"step {name}: {seconds:.1f} s  {status.upper()}" + (f"  ({error})" if error else ""))
        save()
    wall = time.perf_counter() - started
    failed = [n for n, r in records.items() if r["status"] in ("failed", "skipped")]
    bench.row({}, {"steps_passed": sum(r["status"] == "passed" for r in records.values()), "steps": len(records),
                   "wall_s": wall}, check="FAILED" if failed else "PASSED", failed=",".join(failed) or "-",
              mode=mode, device=device)
    save()
    if not args.work:  # the models' folders (16 GB on a GPU) and the runs: what counts is in --out
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(1 if failed else 0)


def versions() -> dict[str, str | None]:
    """The versions of torch, transformers and the carried distributions (``gpu_check.sh`` names
    them in ``$GPU_CHECK_WHEELS``) that this run imported from."""
    from importlib import metadata

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    carried = [spec.split("==")[0] for spec in os.environ.get("GPU_CHECK_WHEELS", "").split()]
    return {name: version(name) for name in ("torch", "transformers", *carried)}


# ---------------------------------------------------------------------------------------------- the dry run's Python

def requirement_closure(roots: list[str]) -> list[str]:
    """``roots`` and every distribution they require here (extras and other platforms' markers left
    out), as installed in this Python; a requirement not installed here is refused."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: dict[str, str] = {}
    todo = list(roots)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise SystemExit(f"{name} is required by {', '.join(roots)} but not installed in {sys.executable}; "
                             "build the dry run's Python from one that holds it.") from None
        seen[name] = dist.metadata["Name"]
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return sorted(seen.values(), key=str.lower)


def make_device_python(folder: Path, carried: list[str], wheels: Path) -> dict[str, list[str]]:
    """A virtual environment in ``folder`` holding what the GPU machine is sure to hold and no more:
    :data:`ON_DEVICE` and their requirements, linked from this Python. The dry run runs in it, so an
    import of anything else fails there as it would on the GPU machine. Each ``carried`` distribution
    that has no wheel in ``wheels`` installable here (scipy's is built for the GPU machine's Python)
    is linked too, with what it requires as installed here; ``gpu_check.sh`` installs the others from
    their wheels, as on the GPU machine. Returns the linked distributions, the carried ones linked and
    the carried ones neither installed here nor in ``wheels``."""
    import venv
    from importlib import metadata

    from packaging.tags import sys_tags
    from packaging.utils import canonicalize_name, parse_wheel_filename

    if folder.exists() and any(folder.iterdir()):
        raise SystemExit(f"--device-python {folder}: the folder is not empty; name a new one.")
    here = set(sys_tags())
    installable = {canonicalize_name(name) for name, _, _, tags in map(parse_wheel_filename,
                                                                      (w.name for w in wheels.glob("*.whl")))
                   if tags & here}

    def installed(name: str) -> bool:
        try:
            return metadata.distribution(name) is not None
        except metadata.PackageNotFoundError:
            return False

    wanting = [name for name in carried if canonicalize_name(name) not in installable]
    link = [name for name in wanting if installed(name)]
    venv.EnvBuilder(symlinks=True, with_pip=False).create(folder)
    site = folder / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    names = requirement_closure([*ON_DEVICE, *link])
    for name in names:
        dist = metadata.distribution(name)
        if dist.files is None:
            raise SystemExit(f"{name} in {sys.executable} lists no files (no RECORD); reinstall it with pip.")
        for top in sorted({f.parts[0] for f in dist.files if f.parts[0] not in ("..", "__pycache__")}):
            source, dest = Path(dist.locate_file(top)), site / top
            if source.exists() and not dest.exists():
                dest.symlink_to(source)
    return {"linked": names, "carried_linked": link, "carried_absent": [n for n in wanting if n not in link]}


if __name__ == "__main__":
    main()
