"""``gym.make("draftrl/...")`` in a fresh interpreter that never imports draftrl.

gymnasium >= 1.0 has no plugin entry points (``gymnasium.envs.registration._find_spec`` only
imports a ``module:`` prefix), so an installed draftrl ships ``draftrl_gym.pth``: at start-up it
puts a finder on ``sys.meta_path`` that registers the ids of ``draftrl.envs.ids`` right after
``gymnasium.envs.registration`` loads. The fast tests run the repository's ``.pth`` through
``site.addsitedir`` (what ``site`` does at start-up for site-packages); two more build the
package with the installed setuptools and install it the two ways users do, each in a temporary
directory: a wheel (``pip install --target``) and an editable install (``pip install -e`` in a
virtual environment, as CI installs), a few seconds each.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from draftrl.envs.ids import ENVS

ROOT = Path(__file__).resolve().parents[2]

#: Imports the site dir's .pth files, then makes an env by its bare id; prints one JSON line.
MAKE = (
    "import json, site, sys\n"
    "{site}\n"
    "start = sorted(m for m in ('gymnasium', 'draftrl', 'torch') if m in sys.modules)\n"
    "import gymnasium as gym\n"
    "at_gym_import = sorted(m for m in sys.modules if m == 'draftrl' or m.startswith('draftrl.'))\n"
    "ids = sorted(i for i in gym.registry if i.startswith('draftrl/'))\n"
    "env = gym.make('draftrl/Analytic-v0', alpha=0.7, max_new_tokens=8)\n"
    "obs, info = env.reset(seed=0)\n"
    "import draftrl, draftrl.envs\n"
    "print(json.dumps({{'start': start, 'at_gym_import': at_gym_import, 'ids': ids, 'obs': len(obs),\n"
    "                  'torch': 'torch' in sys.modules, 'draftrl': draftrl.__file__}}))\n"
)


def _run(code: str, *, python: str = sys.executable, pythonpath: str | None = None, cwd: Path) -> dict:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root")}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    # -W error::UserWarning: registering an id twice (gymnasium's "Overriding environment ...") fails the run
    result = subprocess.run([python, "-W", "error::UserWarning", "-c", code], capture_output=True, text=True, cwd=cwd, env=env,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _expect(report: dict, draftrl_root: Path) -> None:
    assert report["start"] == []  # the .pth imported neither gymnasium nor draftrl nor torch
    assert report["at_gym_import"] == []  # ids registered without importing draftrl
    assert report["ids"] == sorted(e["id"] for e in ENVS)
    assert report["obs"] == 6 and report["torch"] is False  # made through its entry-point string
    assert Path(report["draftrl"]).resolve().is_relative_to(draftrl_root.resolve())


def test_the_pth_hook_registers_the_ids_when_gymnasium_loads(tmp_path):
    shutil.copy(ROOT / "draftrl_gym.pth", tmp_path)
    report = _run(MAKE.format(site=f"site.addsitedir({str(tmp_path)!r})"), pythonpath=str(ROOT), cwd=tmp_path)
    _expect(report, ROOT / "draftrl")


def test_without_the_hook_the_bare_id_is_unknown(tmp_path):
    """Negative control: the same interpreter without the .pth cannot make the bare id."""
    if "draftrl_gym.pth" in {p.name for d in _site_dirs() for p in Path(d).glob("*.pth")}:
        pytest.skip("an installed draftrl_gym.pth registers the ids in every interpreter here")
    code = ("import gymnasium as gym\n"
            "try:\n    gym.make('draftrl/Analytic-v0')\nexcept gym.error.Error as err:\n    print(type(err).__name__)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "PYTHONNOUSERSITE": "1"},
                            timeout=120)
    assert result.stdout.strip() in ("NameNotFound", "NamespaceNotFound"), result.stderr[-2000:]


def _site_dirs() -> list[str]:
    import site

    return [d for d in site.getsitepackages() if Path(d).is_dir()]


def test_import_draftrl_envs_registers_the_hooks_ids():
    """One id list (draftrl.envs.ids) for both registrations; after the hook, ``import draftrl.envs``
    registers nothing again (the hook test runs it under -W error::UserWarning)."""
    import importlib

    import gymnasium as gym

    importlib.import_module("draftrl.envs")  # registers

    assert sorted(i for i in gym.registry if i.startswith("draftrl/")) == sorted(e["id"] for e in ENVS)
    for kwargs in ENVS:
        assert gym.spec(kwargs["id"]).entry_point == kwargs["entry_point"]


def _copy_project(dest: Path) -> Path:
    """What the build reads (metadata, the hook, the package), without build outputs or caches."""
    dest.mkdir(parents=True)
    for name in ("pyproject.toml", "setup.py", "README.md", "_draftrl_gym.py", "draftrl_gym.pth"):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(ROOT / "draftrl", dest / "draftrl", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def _needs_setuptools() -> None:
    setuptools = pytest.importorskip("setuptools")  # the build backend (offline: --no-build-isolation)
    if int(setuptools.__version__.split(".")[0]) < 64:
        pytest.skip(f"setuptools {setuptools.__version__} has no PEP 660 editable installs (>= 64)")


def _pip(python: str, *args: str, cwd: Path) -> None:
    result = subprocess.run([python, "-m", "pip", "--disable-pip-version-check", "--no-input", *args],
                            capture_output=True, text=True, cwd=cwd, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]


def test_a_wheel_install_registers_the_ids(tmp_path):
    """``pip install --target``: the wheel holds the .pth and the hook at its root."""
    _needs_setuptools()
    src = _copy_project(tmp_path / "src")
    _pip(sys.executable, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src),
         cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("draftrl-*.whl")
    target = tmp_path / "target"
    _pip(sys.executable, "install", "--no-deps", "--target", str(target), str(wheel), cwd=tmp_path)
    assert (target / "draftrl_gym.pth").is_file() and (target / "_draftrl_gym.py").is_file()
    report = _run(MAKE.format(site=f"site.addsitedir({str(target)!r})"), cwd=tmp_path)
    _expect(report, target / "draftrl")


def test_an_editable_install_registers_the_ids(tmp_path):
    """``pip install -e`` (PEP 660, setuptools) in a virtual environment: the .pth is in its site-packages."""
    _needs_setuptools()
    src = _copy_project(tmp_path / "src")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True,
                   timeout=300)
    python = str(venv / "bin" / "python")
    _pip(python, "install", "--no-deps", "--no-build-isolation", "-e", str(src), cwd=tmp_path)
    report = _run(MAKE.format(site=""), python=python, cwd=tmp_path)
    _expect(report, src / "draftrl")
