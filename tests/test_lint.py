"""The lint step: ``ruff check`` with pyproject.toml's ``[tool.ruff]`` passes over the repository, so a
plain ``pytest`` lints too (README's test command also runs ``ruff check`` first, to fail fast)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    try:
        import ruff  # noqa: F401
    except ImportError:
        pytest.fail('ruff is not installed: pip install -e ".[dev]" (the dev extra brings it)')
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *args], cwd=cwd,
                          capture_output=True, text=True)


def test_the_repository_passes_ruff():
    result = _ruff()
    assert result.returncode == 0, (f"ruff check found problems (fix with ruff check --fix, or by hand):\n"
                                    f"{result.stdout}")


def test_the_same_check_rejects_an_unused_import_and_unsorted_imports(tmp_path):
    """Negative control: the configuration the repository passes does reject what it is meant to."""
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\nimport os\n\nprint(os.sep)\n")
    result = _ruff("--config", str(ROOT / "pyproject.toml"), str(bad), cwd=tmp_path)
    assert result.returncode == 1 and "F401" in result.stdout and "I001" in result.stdout, result.stdout
