"""The user's commands on the bring-your-own stand-ins (imported by ``conftest.py`` and the tests):
the copied demo config every step reads, and each step run through the real CLI."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import yaml
from byo_models import WORKLOAD

ROOT = Path(__file__).resolve().parents[2]
#: the drafter fixtures the pipeline suite runs, in float32 and bfloat16
DRAFTERS = ("my_draft", "my_eagle_head_bin", "my_eagle_head_safetensors", "my_speculators_head")
DTYPES = ("float32", "bfloat16")


def drafter_spec(name: str, folder: Path) -> str:
    """``--drafter``'s value for the drafter fixture ``name``: a draft model's folder, else ``eagle3:DIR``."""
    return str(folder) if name == "my_draft" else f"eagle3:{folder}"


def byo_config(out: Path, target: Path, drafter: str, dtype: str) -> Path:
    """``configs/demo_quick_cpu.yaml`` as a user copies it for their own models (docs/own-model.md, "Rerun one demo
    step"): the target, drafter and dtype edited, shrunk to seconds (:data:`byo_models.WORKLOAD`; depths
    1-3, so every trained policy drafts and its vLLM bundle speculates; a three-cell grid; 256 PPO steps).
    Every step's command reads it. Greedy: these checks are float32 identity and the bfloat16 agreement rate
    on the user's models (the demo's temperature mix is tested on the shipped model and in test_demo_byo)."""
    data = yaml.safe_load((ROOT / "configs" / "demo_quick_cpu.yaml").read_text())
    data["env"]["temperature_mix"] = None  # null: the demo's default mix would apply where the key is absent
    data["env"].update(target=str(target), drafter=drafter, dtype=dtype, depths=[1, 2, 3], **WORKLOAD)
    data["grid"].update(depths=[0, 2, 3], warmup=False)
    data["eval"].update(policies=["none", "best-grid"], anchors=False)
    data["calibrate"] = {"num_tokens": [1, 2, 4], "contexts": [64], "widths": [1], "levels": 3, "repeats": 1}
    data["train"] = {"recipes": ["ppo_size"], "total_timesteps": 256, "eval_episodes": 1,
                     "overrides": ["ppo.n_envs=1", "ppo.n_steps=64", "ppo.batch_size=64", "checkpoint_every=256",
                                   "baselines=[]"]}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """One (drafter, dtype) pipeline's files (``byo_pipeline``)."""

    drafter: str
    """the drafter fixture's name"""
    folder: Path
    """the drafter's folder"""
    dtype: str
    target: Path
    config: Path
    """the copied demo config every command reads"""
    cost_table: Path
    """draftrl calibrate --out"""
    traces: Path
    """draftrl collect --out"""
    run: Path
    """draftrl train --out"""
    grid: Path
    """draftrl grid --out"""


@contextlib.contextmanager
def byo_settings() -> Iterator[None]:
    """``DRAFTRL_KERNELS=stock`` (the kernel probe is pointless on models this small, and its plan, keyed
    by the folder's name, would stay in the user's cache), wandb disabled, one torch thread (these models
    are too small to gain from two, and a busy 2-core machine stalls OpenMP's spinning threads); all
    restored on exit."""
    import pytest
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("DRAFTRL_KERNELS", "stock")
            mp.setenv("WANDB_MODE", "disabled")
            yield
    finally:
        torch.set_num_threads(threads)


def cli(*argv: str) -> None:
    """``draftrl ARGV`` in this process under :func:`byo_settings`; it must run to the end."""
    from draftrl.cli import main

    with byo_settings():
        code = main([str(a) for a in argv])
    assert code == 0, f"draftrl {' '.join(str(a) for a in argv)} exited {code}"
