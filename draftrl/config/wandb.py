"""``WandbConfig``, the ``wandb:`` section of every command that logs, and the one way a step opens its run.

One pipeline, one group: every run a pipeline makes (``draftrl demo``'s calibrate, collect,
train, grid and eval; ``draftrl demo --engine vllm``'s calibrate, collect, train, dsd and sweep)
shares the project and the group, with ``job_type`` the step, and lands in ``FOLDER/wandb/``, so
``wandb sync FOLDER/wandb`` uploads them all. A standalone command is a pipeline of one step in
its ``--out``. ``FOLDER/wandb.json`` (:data:`draftrl.runs.WANDB_FILE`) records the group and each
step's run id: a step run again in the same folder (a resumed demo, ``draftrl train --resume``)
continues its own run (``resume="allow"``) instead of starting a second one, and a pipeline in
another folder, or the same folder after ``--overwrite``, gets another group.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from draftrl.config import WANDB_MODES


@dataclass
class WandbConfig:
    """Weights & Biases logging, offline by default (``wandb sync FOLDER/wandb`` uploads)."""

    mode: str = "offline"
    """offline | online | disabled; the WANDB_MODE environment variable wins"""
    project: str = "draftrl"
    """wandb project (--wandb-project)"""
    entity: str | None = None
    """wandb team or user; None = your default (--wandb-entity)"""
    group: str | None = None
    """the group of every run of the pipeline; None = the output folder's name and a short id, kept
    in FOLDER/wandb.json (--wandb-group)"""
    tags: list[str] = field(default_factory=list)
    """free-form run tags"""
    dir: str | None = None
    """the pipeline folder: offline runs go to DIR/wandb/, the group and run ids to DIR/wandb.json;
    None = the command's --out (the demos set their own --out for every step)"""

    def __post_init__(self) -> None:
        if self.mode not in WANDB_MODES:
            raise ValueError(f"wandb.mode={self.mode!r} must be one of {', '.join(WANDB_MODES)}.")
        if self.group is not None and not self.group.strip():
            raise ValueError("wandb.group='' is empty; give a name or leave it unset (null) for the folder's.")
        if self.group is not None and len(self.group) > 128:
            raise ValueError(f"wandb.group={self.group[:20]!r}... has {len(self.group)} characters; wandb allows 128.")


@dataclass
class WandbOnlyConfig:
    """A config of the ``wandb:`` section alone: how a command whose other sections are not one
    dataclass (``draftrl eval --engine vllm``) reads it (``load_config(..., partial=True)``)."""

    wandb: WandbConfig = field(default_factory=WandbConfig)


def wandb_mode(settings: WandbConfig) -> str:
    """``WANDB_MODE``, else the config's mode; ``offline`` becomes ``online`` inside a sweep agent
    (``WANDB_SWEEP_ID`` set): wandb agents cannot run offline runs (wandb/wandb#6234, #3002)."""
    mode = os.environ.get("WANDB_MODE") or settings.mode
    if mode == "offline" and os.environ.get("WANDB_SWEEP_ID"):
        return "online"
    return mode


def _state(folder: Path) -> dict[str, Any]:
    from draftrl.io import read_json
    from draftrl.runs import WANDB_FILE

    path = folder / WANDB_FILE
    return read_json(path, "wandb runs of this folder") if path.is_file() else {"group": None, "runs": {}}


def _save_state(folder: Path, state: dict[str, Any]) -> None:
    from draftrl.io import write_json
    from draftrl.runs import WANDB_FILE

    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / WANDB_FILE, state)


def pipeline(settings: WandbConfig, folder: str | Path) -> WandbConfig:
    """``settings`` for every step of a pipeline in ``folder``: ``dir`` = ``folder`` and ``group`` =
    the one given, else the one recorded in ``folder/wandb.json``, else ``<folder name>-<6 hex>``
    (recorded). Unchanged when wandb is disabled (nothing is written)."""
    if wandb_mode(settings) == "disabled":
        return settings
    root = Path(settings.dir or folder)
    state = _state(root)
    group = settings.group or state.get("group") or f"{root.resolve().name}-{secrets.token_hex(3)}"
    if state.get("group") != group:
        _save_state(root, {**state, "group": group})
    return replace(settings, dir=str(root), group=group)


def runs_dir(settings: WandbConfig, folder: str | Path) -> Path:
    """The folder whose ``wandb/`` receives the offline runs (``WANDB_DIR`` wins, as in wandb)."""
    return Path(os.environ.get("WANDB_DIR") or settings.dir or folder)


def sync_command(settings: WandbConfig, folder: str | Path) -> str | None:
    """``wandb sync FOLDER/wandb``: the one command that uploads the pipeline's offline runs (None
    when it logs online or not at all). Under a ``WANDB_DIR`` shared with other work it names the
    pipeline's own runs (``offline-run-*-<id>`` for every id ``FOLDER/wandb.json`` records)."""
    if wandb_mode(settings) != "offline":
        return None
    where = runs_dir(settings, folder) / "wandb"
    if not os.environ.get("WANDB_DIR"):
        return f"wandb sync {where}"
    ids = sorted(set(_state(Path(settings.dir or folder))["runs"].values()))
    return "wandb sync " + " ".join(f"{where}/offline-run-*-{run_id}" for run_id in ids) if ids else None


def start_run(settings: WandbConfig, folder: str | Path, *, job_type: str, name: str | None = None,
              config: dict[str, Any] | None = None, run_id: str | None = None, resume: bool = True) -> Any:
    """The wandb run of one step of the pipeline in ``settings.dir`` (else ``folder``), or None when
    wandb is disabled.

    :param folder: the step's own output folder (its run is keyed by it and ``job_type``).
    :param job_type: the step (``calibrate``, ``collect``, ``train``, ``grid``, ``eval``, ``dsd``, ``sweep``).
    :param name: the run's display name; default ``job_type``.
    :param run_id: the run's id (a training run's, from its ``run_state.json``); default the one
        recorded for this step in the pipeline's ``wandb.json``, else a new one (recorded first).
    :param resume: continue the recorded run (``resume="allow"``); False: let wandb choose the id
        (a sweep agent's run, whose id the agent sets).
    """
    mode = wandb_mode(settings)
    if mode == "disabled":
        return None
    import wandb

    settings = pipeline(settings, folder)
    root = Path(settings.dir)
    ids: dict[str, Any] = {}
    if resume:
        state = _state(root)
        key = f"{os.path.relpath(Path(folder).resolve(), root.resolve())}:{job_type}"
        run_id = run_id or state["runs"].get(key) or secrets.token_hex(4)
        if state["runs"].get(key) != run_id:
            _save_state(root, {**state, "runs": {**state["runs"], key: run_id}})
        ids = {"id": run_id, "resume": "allow"}
    directory = runs_dir(settings, root)
    directory.mkdir(parents=True, exist_ok=True)
    return wandb.init(
        project=settings.project,
        entity=settings.entity,
        group=settings.group,
        job_type=job_type,
        name=name or job_type,
        tags=list(settings.tags),
        mode=mode,
        dir=str(directory),
        config=config or {},
        reinit="create_new",  # the demos open one run per step in one process
        settings=wandb.Settings(silent=True),
        **ids,
    )


def exit_code(error: BaseException | None) -> int:
    """The exit code a run ends with: 0, 130 for Ctrl-C, else 1 (wandb shows a non-zero one as failed)."""
    if error is None:
        return 0
    return 130 if isinstance(error, KeyboardInterrupt) else 1


#: The exit code of a step whose exactness check failed (the one every draftrl command exits with).
EXACTNESS_FAILED = 3


@contextlib.contextmanager
def logged_run(settings: WandbConfig, folder: str | Path, *, code: int = 0, **kwargs: Any) -> Iterator[Any]:
    """:func:`start_run` as a context: when the block completes the run finishes with exit code
    ``code`` (:data:`EXACTNESS_FAILED` for a step that logs a failed check: wandb marks it failed),
    when it raises with :func:`exit_code` of the error before the error propagates. Yields None when
    wandb is disabled."""
    run = start_run(settings, folder, **kwargs)
    try:
        yield run
    except BaseException as err:
        if run is not None:
            run.finish(exit_code=exit_code(err))
        raise
    if run is not None:
        run.finish(exit_code=code)
