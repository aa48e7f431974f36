"""``EnvConfig``, the env section of every decoding command: loading, overrides and the values it refuses."""

from __future__ import annotations

import pytest

from draftrl.config.env import EnvConfig, load_env_config


def test_bad_config_keys_name_the_fix(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("env:\n  verify_size: [0]\n")
    with pytest.raises(ValueError, match="unknown config key 'env.verify_size'; did you mean 'env.verify_sizes'"):
        load_env_config(str(path))
    with pytest.raises(ValueError, match="must look like env.key=value"):
        load_env_config(None, ["depths=[0]"])
    with pytest.raises(ValueError, match="repeats a value"):
        EnvConfig(depths=(0, 1, 1))
    with pytest.raises(ValueError, match="reward='speed' is unknown"):
        EnvConfig(reward="speed")
    with pytest.raises(ValueError, match="depth_shaping=true needs reward=ratio"):
        EnvConfig(reward="throughput", depth_shaping=True)


def test_tiny_cpu_config_loads():
    config = load_env_config("configs/tiny_cpu.yaml", ["env.max_new_tokens=16"])
    assert config.target == "smollm2-135m" and config.drafter == "ngram" and 0 in config.depths
    assert config.max_new_tokens == 16 and config.languages == ("en",)
