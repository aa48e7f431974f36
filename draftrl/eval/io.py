"""JSON files of the evaluation: numpy scalars and arrays become plain numbers and lists."""

from __future__ import annotations

import json
import math
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


def write_json(path: str | Path, data: Any) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plain(data), indent=1, ensure_ascii=False) + "\n")
    return path


def read_json(path: str | Path, what: str) -> Any:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path} does not exist")
    return json.loads(path.read_text())
