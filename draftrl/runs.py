"""The layout of a training run directory (``draftrl train --out DIR``), spelled once.

::

    DIR/config.json                  the resolved TrainConfig
    DIR/run_state.json               run id, steps, wall time, sessions (``--resume`` reads it)
    DIR/policy.zip                   the SB3 PPO model
    DIR/vecnormalize.pkl             VecNormalize statistics (when training normalised observations)
    DIR/policy.json                  the policy manifest: kind, env id, grids, feature names
    DIR/train_summary.json           config, seeds, versions, wall time, the final evaluation
    DIR/checkpoints/ppo_<steps>_steps.zip, ppo_vecnormalize_<steps>_steps.pkl
                                     taken at rollout boundaries (SB3's CheckpointCallback names)
    DIR/logs/progress_<start>.csv    SB3's training curves, one file per session
    DIR/wandb/                       the offline wandb run (unless WANDB_DIR points elsewhere)

Training writes it (``draftrl.train``), ``PPOPolicy.load`` and ``draftrl.export`` read it.
"""

from __future__ import annotations

import re
from pathlib import Path

POLICY_FILE = "policy.zip"
VECNORMALIZE_FILE = "vecnormalize.pkl"
MANIFEST_FILE = "policy.json"
CONFIG_FILE = "config.json"
STATE_FILE = "run_state.json"
SUMMARY_FILE = "train_summary.json"
CHECKPOINTS_DIR = "checkpoints"
LOGS_DIR = "logs"
CHECKPOINT_PREFIX = "ppo"
_CHECKPOINT = re.compile(r"(?P<prefix>.+)_(?P<steps>\d+)_steps\.zip")


def checkpoint_vecnormalize(model_zip: Path) -> Path | None:
    """The VecNormalize file SB3 saves with checkpoint ``model_zip`` (None if not a checkpoint name)."""
    match = _CHECKPOINT.fullmatch(model_zip.name)
    if match is None:
        return None
    return model_zip.with_name(f"{match['prefix']}_vecnormalize_{match['steps']}_steps.pkl")


def is_checkpoint(model_zip: Path) -> bool:
    """Whether ``model_zip`` is a checkpoint inside a run directory's ``checkpoints/``."""
    return model_zip.parent.name == CHECKPOINTS_DIR and _CHECKPOINT.fullmatch(model_zip.name) is not None


def policy_files(path: str | Path) -> tuple[Path, Path, Path]:
    """``(model zip, its VecNormalize file, policy.json)`` for a run directory, its ``policy.zip``
    or a checkpoint zip (paired with the statistics saved *with it*, never the final ones)."""
    path = Path(path)
    model = path if path.suffix == ".zip" and not path.is_dir() else path / POLICY_FILE
    if is_checkpoint(model):
        return model, checkpoint_vecnormalize(model), model.parent.parent / MANIFEST_FILE
    return model, model.with_name(VECNORMALIZE_FILE), model.parent / MANIFEST_FILE


def run_dir_of(model_zip: Path) -> Path:
    """The run directory a model zip belongs to (its folder, or the folder above ``checkpoints/``)."""
    return model_zip.parent.parent if is_checkpoint(model_zip) else model_zip.parent


def latest_checkpoint(out: Path) -> tuple[Path, Path | None, int] | None:
    """``(model_zip, vecnormalize_pkl or None, num_timesteps)`` of the newest checkpoint in ``out``, or None."""
    found = []
    for path in (Path(out) / CHECKPOINTS_DIR).glob(f"{CHECKPOINT_PREFIX}_*_steps.zip"):
        match = re.fullmatch(rf"{CHECKPOINT_PREFIX}_(\d+)_steps\.zip", path.name)
        if match:
            found.append((int(match.group(1)), path))
    if not found:
        return None
    steps, path = max(found)
    vecnorm = checkpoint_vecnormalize(path)
    return path, (vecnorm if vecnorm.is_file() else None), steps
