"""``load_config``: defaults in code, then the file, then ``--set`` overrides, each value typed."""

from __future__ import annotations

from pathlib import Path

import pytest

from draftrl.config import RENAMED_CONFIGS, load_config
from draftrl.train.config import TrainConfig

ANALYTIC = Path(__file__).resolve().parents[2] / "configs" / "analytic_regimes.yaml"


def test_yaml_exponent_without_a_dot_is_a_float():
    """YAML 1.1 reads 1e-4 as a string; the config loader converts it for float fields."""
    assert load_config(TrainConfig, ANALYTIC, ["ppo.learning_rate=1e-4"]).ppo.learning_rate == 1e-4


def test_a_renamed_config_file_names_its_new_name(tmp_path):
    """``configs/serve_sim_cpu.yaml`` became ``serve_replay_cpu.yaml`` (one word, replay): the old name is
    refused naming the new one, which exists; another missing file gets the plain message (control)."""
    root = ANALYTIC.parents[1]
    for old, new in RENAMED_CONFIGS.items():
        assert not (root / "configs" / old).exists() and (root / new).is_file()
        with pytest.raises(FileNotFoundError, match=f"configs/{old} was renamed: pass {new}$"):
            load_config(TrainConfig, Path("configs") / old)
    with pytest.raises(FileNotFoundError, match="does not exist; pass a file from configs/"):
        load_config(TrainConfig, tmp_path / "serve_cpu.yaml")
