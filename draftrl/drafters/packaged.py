"""EAGLE-3 heads that ship with draftrl, one folder per known target (``heads/<target>/``).

Each was trained by draftrl's own ``draftrl distill``; its ``README.md`` (the model card) records
the command, the data manifest and the seed, so it can be rebuilt from them. ``--drafter eagle3``
with no path picks the head of the target in use.
"""

from __future__ import annotations

from pathlib import Path

HEADS_DIR = Path(__file__).parent / "heads"


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
