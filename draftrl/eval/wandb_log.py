"""Weights & Biases runs for the grid and the evaluation (offline by default).

``WANDB_MODE`` in the environment wins over the config's ``wandb.mode``; with ``disabled`` no
wandb code runs at all (tests set it). Offline runs land in ``DIR/wandb/``; ``wandb sync
DIR/wandb/offline-run-*`` uploads them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from draftrl.config.wandb import WandbConfig


def wandb_mode(settings: WandbConfig) -> str:
    """``WANDB_MODE``, else the config's mode; ``offline`` becomes ``online`` inside a sweep agent
    (``WANDB_SWEEP_ID`` set): wandb agents cannot run offline runs (wandb/wandb#6234, #3002)."""
    mode = os.environ.get("WANDB_MODE") or settings.mode
    if mode == "offline" and os.environ.get("WANDB_SWEEP_ID"):
        return "online"
    return mode


def start_run(settings: WandbConfig, out: Path, *, name: str, group: str, job_type: str,
              config: dict[str, Any] | None = None) -> Any:
    """A new wandb run, or None when wandb is disabled."""
    mode = wandb_mode(settings)
    if mode == "disabled":
        return None
    import wandb

    out.mkdir(parents=True, exist_ok=True)
    return wandb.init(
        project=settings.project,
        entity=settings.entity,
        group=group,
        tags=list(settings.tags),
        job_type=job_type,
        name=name,
        mode=mode,
        dir=os.environ.get("WANDB_DIR", str(out)),
        config=config or {},
        reinit="create_new",
        settings=wandb.Settings(silent=True),  # one run per grid cell: keep the terminal readable
    )


def log_table(run: Any, key: str, columns: list[str], rows: list[list[Any]]) -> None:
    """Log a ``wandb.Table`` (and keep it in the run summary)."""
    if run is None:
        return
    import wandb

    run.log({key: wandb.Table(columns=columns, data=rows)})


def log_images(run: Any, images: dict[str, Path]) -> None:
    if run is None:
        return
    import wandb

    run.log({key: wandb.Image(str(path)) for key, path in images.items() if Path(path).is_file()})
