"""A training run across sessions: open or resume ``DIR``, its state, versions and wall time.

The files are those of ``draftrl.runs``; ``--resume`` continues a run from ``run_state.json``
and its newest checkpoint with the same run id (and the same config, but for what a resumed run
may change).
"""

from __future__ import annotations

import importlib.metadata
import platform
import secrets
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

import draftrl
from draftrl.config import to_dict
from draftrl.io import plain, read_json, write_json
from draftrl.runs import CONFIG_FILE, POLICY_FILE, STATE_FILE, VECNORMALIZE_FILE, portable_config, resolved_config
from draftrl.train.config import TrainConfig


def versions() -> dict[str, str]:
    """Versions that decide whether a result reproduces."""
    import stable_baselines3
    import torch

    return {
        "draftrl": getattr(draftrl, "__version__", None) or importlib.metadata.version("draftrl"),
        "torch": torch.__version__,
        "stable_baselines3": stable_baselines3.__version__,
        "gymnasium": gym.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
    }


def new_run_state(cfg: TrainConfig) -> dict[str, Any]:
    return {
        "run_id": secrets.token_hex(4),
        "recipe": cfg.recipe,
        "seed": cfg.seed,
        "num_timesteps": 0,
        "wall_seconds": 0.0,
        "sessions": 0,
        "completed": False,
    }


def open_run(cfg: TrainConfig, out: Path, resume: bool) -> dict[str, Any]:
    """Create ``out`` for a fresh run, or load its state for ``--resume``; returns the run state.

    A fresh run refuses a directory that already holds one; a resumed run refuses a config that
    differs from the saved one except for ``total_timesteps``, ``finetune_real_timesteps``,
    ``eval_*``, ``progress_bar`` and ``wandb`` (extending a run or changing how it is watched).
    """
    state_path, config_path = out / STATE_FILE, out / CONFIG_FILE
    if resume:
        if not state_path.is_file():
            raise FileNotFoundError(f"{state_path} does not exist; nothing to resume (drop --resume to start a run).")
        saved = read_json(config_path, "run config")
        current = portable_config(plain(to_dict(cfg)), out)
        changed = _changed_keys(resolved_config(saved, out), resolved_config(current, out))
        if changed:
            raise ValueError(
                f"--resume with a different config: {', '.join(changed)} changed since the run started; "
                "resume with the same --config/--set, or start a new --out."
            )
        state = read_json(state_path, "run state")
        state["sessions"] += 1
        return state
    if state_path.exists():
        raise ValueError(f"{out} already holds a run; pass --resume to continue it or choose another --out.")
    out.mkdir(parents=True, exist_ok=True)
    write_json(config_path, portable_config(plain(to_dict(cfg)), out))  # paths relative to the run directory
    state = new_run_state(cfg)
    state["sessions"] = 1
    write_json(state_path, state)
    return state


_RESUMABLE = ("total_timesteps", "finetune_real_timesteps", "eval_episodes", "eval_seed", "progress_bar", "wandb",
              "baselines")


def _changed_keys(saved: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    changed = []
    for key in sorted(set(saved) | set(current)):
        if not prefix and key in _RESUMABLE:
            continue
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            changed += _changed_keys(a, b, f"{prefix}{key}.")
        elif a != b:
            changed.append(f"{prefix}{key}")
    return changed


def save_policy(model: Any, out: Path) -> None:
    """``policy.zip`` and (when training normalised observations) ``vecnormalize.pkl`` in ``out``."""
    model.save(out / POLICY_FILE)
    normalizer = model.get_vec_normalize_env()
    if normalizer is not None:
        normalizer.save(str(out / VECNORMALIZE_FILE))


class Stopwatch:
    """Wall time of a run across sessions: ``elapsed()`` = earlier sessions + this one."""

    def __init__(self, earlier: float = 0.0):
        self.earlier = earlier
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return self.earlier + time.perf_counter() - self.start
