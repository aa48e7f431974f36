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
    DIR/wandb/                       the offline wandb run (unless WANDB_DIR or wandb.dir point elsewhere)
    DIR/wandb.json                   the wandb group and run ids of the pipeline in DIR (``config.wandb``)

Training writes it (``draftrl.train``), ``PPOPolicy.load`` and ``draftrl.export`` read it.

A trace directory (``draftrl collect --out DIR``, read by ``draftrl.replay.traces``)::

    DIR/trace.json                   header: format, trace_id, config, hardware, prompts
    DIR/trace.npz                    the arrays (tokens, continuations, draft trees)
    DIR/cost_table.json              the cost table collected with them (same trace_id)
    DIR/.partial/                    finished prompts of an interrupted collection
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

POLICY_FILE = "policy.zip"
VECNORMALIZE_FILE = "vecnormalize.pkl"
MANIFEST_FILE = "policy.json"
CONFIG_FILE = "config.json"
STATE_FILE = "run_state.json"
SUMMARY_FILE = "train_summary.json"
CHECKPOINTS_DIR = "checkpoints"
LOGS_DIR = "logs"
CHECKPOINT_PREFIX = "ppo"
#: in a pipeline folder (a demo's, a command's --out): its wandb group and each step's run id
WANDB_FILE = "wandb.json"
HEADER_FILE = "trace.json"
ARRAYS_FILE = "trace.npz"
COST_TABLE_FILE = "cost_table.json"
#: finished prompts of an unfinished collection (``collect(..., partial_dir=DIR/PARTIAL_DIR)``)
PARTIAL_DIR = ".partial"
#: what a trace directory may hold; ``Traces.save`` refuses to replace a directory with anything else
TRACE_FILES = (HEADER_FILE, ARRAYS_FILE, COST_TABLE_FILE, PARTIAL_DIR)
#: what ``draftrl train`` may write in its run directory (every recipe; ``cotrain``'s phases and its two
#: policies included); anything else there is the user's (``draftrl.io.refuse_foreign``)
RUN_OUTPUTS = (CONFIG_FILE, STATE_FILE, POLICY_FILE, VECNORMALIZE_FILE, MANIFEST_FILE, SUMMARY_FILE, CHECKPOINTS_DIR,
               LOGS_DIR, "wandb", WANDB_FILE, "phases", "depth", "size")
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


def checkpoints(out: Path) -> list[tuple[Path, Path | None, int]]:
    """``(model_zip, vecnormalize_pkl or None, num_timesteps)`` of every checkpoint in ``out``, newest first."""
    found = []
    for path in (Path(out) / CHECKPOINTS_DIR).glob(f"{CHECKPOINT_PREFIX}_*_steps.zip"):
        match = re.fullmatch(rf"{CHECKPOINT_PREFIX}_(\d+)_steps\.zip", path.name)
        if match:
            found.append((int(match.group(1)), path))
    listed = []
    for steps, path in sorted(found, reverse=True):
        vecnorm = checkpoint_vecnormalize(path)
        listed.append((path, vecnorm if vecnorm.is_file() else None, steps))
    return listed


def stored_cost_table_path(directory: str | Path) -> Path | None:
    """``DIR/cost_table.json`` when it belongs to the traces in ``DIR`` (None when there is none).

    A table that ``collect`` stored carries the traces' ``trace_id``; one copied in by hand carries
    none and is accepted; one that names another collection is refused.
    """
    directory = Path(directory)
    path = directory / COST_TABLE_FILE
    if not path.is_file():
        return None
    try:
        table_id = json.loads(path.read_text()).get("trace_id")
        header_id = json.loads((directory / HEADER_FILE).read_text()).get("trace_id") if (
            directory / HEADER_FILE).is_file() else None
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as err:
        raise ValueError(f"{path} is not a valid JSON cost table ({err}); "
                         "write it with draftrl calibrate --json --out FILE.") from None
    if table_id is not None and table_id != header_id:
        raise ValueError(
            f"{path} belongs to another collection (trace_id {table_id}, the traces have {header_id}); "
            f"collect again with --cost-table FILE --overwrite, or delete the stale {path.name}."
        )
    return path


#: keys of a run's config whose string values are paths (at any depth: env.traces, env.eval.traces, ...)
PATH_KEYS = frozenset({"traces", "cost_table", "frozen_size_policy", "prompts", "recordings", "calibration"})


def _map_paths(value: Any, fn: Callable[[str], str], key: str | None = None) -> Any:
    if isinstance(value, dict):
        return {k: _map_paths(v, fn, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_map_paths(v, fn, key) for v in value]
    if key in PATH_KEYS and isinstance(value, str) and value:
        return fn(value)
    return value


def portable_config(config: dict[str, Any], run_dir: str | Path) -> dict[str, Any]:
    """``config`` (paths as given, relative to the working directory) with every path made
    relative to ``run_dir``: what ``config.json`` stores, so a run evaluates from anywhere and
    moves with the folder that holds it and its traces."""
    run_dir = Path(run_dir).resolve()
    return _map_paths(config, lambda p: os.path.relpath(Path(p).resolve(), run_dir))


def resolved_config(config: dict[str, Any], run_dir: str | Path) -> dict[str, Any]:
    """A run's saved ``config`` with every path absolute: a relative one is relative to ``run_dir``
    (the folder of ``config.json``). Runs saved before paths were stored that way hold them relative
    to where training ran; such a path is found from ``run_dir``'s parents or the working directory."""
    run_dir = Path(run_dir).resolve()

    def absolute(p: str) -> str:
        path = Path(p)
        if path.is_absolute():
            return str(path)
        candidates = [run_dir / path, *(parent / path for parent in run_dir.parents), path.resolve()]
        return str(next((c for c in candidates if c.exists()), candidates[0]).resolve())

    return _map_paths(config, absolute)


def read_run_config(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's ``config.json`` with absolute paths (:func:`resolved_config`), or None if absent."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        return None
    try:
        return resolved_config(json.loads(path.read_text()), run_dir)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}); restore it from the run directory.") from None
