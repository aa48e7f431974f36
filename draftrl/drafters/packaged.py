"""EAGLE-3 heads that ship with draftrl, one folder per known target (``heads/<target>/``).

Each was trained by draftrl's own ``draftrl distill``; its ``README.md`` (the model card) records
the command, the data manifest and the seed, so it can be rebuilt from them. ``--drafter eagle3``
with no path picks the head of the target in use.

Whether a head ships for a target is decided from the target's name alone (:func:`missing_head`),
before any model loads: a command whose drafter needs a shipped head that does not exist says so
in one line, with the ``draftrl distill`` command that trains one, and either stops or, where the
drafter was a default, drafts by n-gram lookup instead (:data:`FALLBACK_DRAFTER`).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from draftrl.models import model_name

HEADS_DIR = Path(__file__).parent / "heads"
#: What a default drafter that needs a missing head drafts with instead: the n-gram lookup that
#: ``sam:N`` itself drafts with on a match (``registry._sam``).
FALLBACK_DRAFTER = "ngram:1:3:latest"


def packaged_heads() -> list[str]:
    """The known targets a head ships for."""
    return sorted(p.name for p in HEADS_DIR.iterdir() if (p / "config.json").is_file()) if HEADS_DIR.is_dir() else []


def packaged_head(target: str) -> Path:
    """The folder of the head shipped for ``target`` (a known model name)."""
    folder = HEADS_DIR / target
    if not (folder / "config.json").is_file():
        shipped = ", ".join(packaged_heads()) or "none"
        raise ValueError(f"draftrl ships no EAGLE-3 head for the target {target!r} (it ships heads for: {shipped}); "
                         "train one with draftrl distill --target TARGET --out DIR and pass --drafter eagle3:DIR")
    return folder


def resolve_head(head: str | None, target: str) -> str:
    """``head`` when given, else the folder of the head shipped for ``target``."""
    return head or str(packaged_head(target))


def needs_shipped_head(drafter: str) -> bool:
    """``eagle3`` or ``sam:N`` without a head folder: the drafter takes the head shipped for the target."""
    kind, *args = drafter.split(":")
    return (kind == "eagle3" and not args) or (kind == "sam" and len(args) == 1)


def _head_folder(target: str) -> str:
    """Where :func:`distill_command` writes the head: ``heads/`` and the target's last name."""
    return f"heads/{Path(model_name(target)).name}"


def distill_command(target: str) -> str:
    """The ``draftrl distill`` command that trains a head for ``target`` (as the user spelled it)."""
    return f"draftrl distill --target {shlex.quote(target)} --out {shlex.quote(_head_folder(target))}"


def missing_head(drafter: str, target: str) -> str | None:
    """None when ``drafter`` needs no shipped head or one ships for ``target``; else one line saying
    which is missing, with the command that trains it and the drafter spec that then uses it.
    Reads the target's name only (:func:`~draftrl.models.model_name`): no model loads."""
    if not needs_shipped_head(drafter):
        return None
    name = model_name(target)
    if (HEADS_DIR / name / "config.json").is_file():
        return None
    shipped = ", ".join(packaged_heads()) or "none"
    return (f"drafter {drafter} needs an EAGLE-3 head and draftrl ships none for the target {name!r} (only for: "
            f"{shipped}); train one with `{distill_command(target)}` and draft with "
            f"--drafter {shlex.quote(f'{drafter}:{_head_folder(target)}')}")
