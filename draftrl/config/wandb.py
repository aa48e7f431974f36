"""``WandbConfig``: the ``wandb:`` section of every command that logs (train, grid, eval, demo)."""

from __future__ import annotations

from dataclasses import dataclass, field

from draftrl.config import WANDB_MODES


@dataclass
class WandbConfig:
    """Weights & Biases logging, offline by default (``wandb sync DIR/wandb/offline-run-*`` uploads)."""

    mode: str = "offline"
    """offline | online | disabled; the WANDB_MODE environment variable wins"""
    project: str = "draftrl"
    """wandb project"""
    entity: str | None = None
    """wandb team or user; None = your default"""
    group: str | None = None
    """groups runs in the UI; None = the command's default (grid/eval: the command and the output directory)"""
    tags: list[str] = field(default_factory=list)
    """free-form run tags"""

    def __post_init__(self) -> None:
        if self.mode not in WANDB_MODES:
            raise ValueError(f"wandb.mode={self.mode!r} must be one of {', '.join(WANDB_MODES)}.")
