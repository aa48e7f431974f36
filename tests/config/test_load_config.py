"""``load_config``: defaults in code, then the file, then ``--set`` overrides, each value typed."""

from __future__ import annotations

from pathlib import Path

from draftrl.config import load_config
from draftrl.train.config import TrainConfig

ANALYTIC = Path(__file__).resolve().parents[2] / "configs" / "analytic_regimes.yaml"


def test_yaml_exponent_without_a_dot_is_a_float():
    """YAML 1.1 reads 1e-4 as a string; the config loader converts it for float fields."""
    assert load_config(TrainConfig, ANALYTIC, ["ppo.learning_rate=1e-4"]).ppo.learning_rate == 1e-4
