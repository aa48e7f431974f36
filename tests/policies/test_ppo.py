"""``PPOPolicy.load``: a saved policy is loaded only with the files it was trained with."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from draftrl.policies import PPOPolicy


def test_policy_load_checks_normaliser_and_grid(analytic_run, tmp_path):
    """PPOPolicy.load (eval, demo, --resume's evaluation) refuses a run without its normaliser."""
    d = Path(shutil.copytree(analytic_run, tmp_path / "run"))
    PPOPolicy.load(d)
    (d / "vecnormalize.pkl").unlink()
    with pytest.raises(FileNotFoundError, match="normalised observations"):
        PPOPolicy.load(d)
