"""Files draftrl writes: atomically (temporary file, then rename), JSON made plain.

An interrupted run never leaves half a file behind: writers go through
``atomic_write_bytes``, which writes beside the target and renames over it. JSON values are
made plain first: numpy scalars and arrays become numbers and lists, non-finite floats ``null``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np


def plain(value: Any) -> Any:
    """``value`` with numpy types, tuples and non-finite floats made JSON-safe (NaN/inf -> None)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


@contextmanager
def staged_files(folder: str | Path) -> Iterator[Path]:
    """A staging folder beside ``folder``: what the block writes there moves into ``folder`` only if
    the block succeeds, so a command that refuses half-way (a check that fails after the first
    file was written) leaves nothing behind. Files already in ``folder`` are kept, except those
    the block wrote again."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{folder.name}.staging-", dir=folder.parent))
    try:
        yield stage
        folder.mkdir(parents=True, exist_ok=True)
        for item in sorted(stage.iterdir()):
            os.replace(item, folder / item.name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def atomic_write_text(path: str | Path, text: str) -> Path:
    """``atomic_write_bytes`` for UTF-8 text."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, data: Any) -> Path:
    """``data`` made plain, as indented UTF-8 JSON, written atomically."""
    return atomic_write_text(path, json.dumps(plain(data), indent=1, ensure_ascii=False) + "\n")


def read_json(path: str | Path, what: str) -> Any:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path} does not exist")
    return json.loads(path.read_text())


def foreign_files(out: str | Path, owned: tuple[str, ...]) -> list[str]:
    """Names in folder ``out`` that match none of ``owned`` (names or globs, e.g. ``*.png``), sorted;
    [] when ``out`` is not a folder."""
    out = Path(out)
    if not out.is_dir():
        return []
    mine = {p for pattern in owned for p in out.glob(pattern)}
    return sorted(p.name for p in out.iterdir() if p not in mine)


def refuse_foreign(out: str | Path, owned: tuple[str, ...], *, overwrite: bool, command: str) -> None:
    """Refuse an ``--out`` folder holding files ``draftrl command`` does not write (``owned``: its
    names or globs) unless ``overwrite``; with it they stay, and the command writes beside them.

    Every command that writes a folder calls this (or :func:`prepare_out`) before any compute, so
    a user's own files never end up mixed with, or mistaken for, a command's outputs. One line
    names the files and the fix."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; pass a directory.")
    foreign = foreign_files(out, owned)
    if foreign and not overwrite:
        raise ValueError(f"--out {out} already holds files draftrl {command} did not write ({', '.join(foreign[:4])}"
                         f"{', ...' if len(foreign) > 4 else ''}); pass --overwrite to write beside them (they are "
                         "kept), or choose another --out.")


def prepare_out(out: str | Path, owned: tuple[str, ...], *, overwrite: bool, command: str) -> Path:
    """Check an output directory before any compute; returns it, created and writable.

    ``owned`` names (or globs, e.g. ``*.png``) what ``command`` writes there. A directory that
    already holds some of them, or holds anything else (:func:`refuse_foreign`), is refused unless
    ``overwrite``; with it the command's own earlier outputs are removed first (no stale plot
    survives beside new results) and anything else is left alone. One line names the problem and the fix.
    """
    import shutil

    out = Path(out)
    earlier = sorted({p for pattern in owned for p in out.glob(pattern)}) if out.is_dir() else []
    if earlier and not overwrite:  # named first: replacing them is what --overwrite would do
        raise ValueError(f"--out {out} already holds the outputs of an earlier {command} "
                         f"({', '.join(p.name for p in earlier[:4])}); pass --overwrite to replace them, "
                         "or choose another --out.")
    refuse_foreign(out, owned, overwrite=overwrite, command=command)
    for p in earlier:
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".write-check-"):
            pass
    except OSError as err:
        raise ValueError(f"--out {out} is not writable ({err.strerror or type(err).__name__}); "
                         "choose another --out.") from None
    return out
