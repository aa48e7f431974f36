"""``export.features``: the manifest's feature section rebuilds the training env's builder, or says why not."""

from __future__ import annotations

import pytest

from draftrl.export.features import BUILDER, make_feature_builder
from draftrl.signals.features import feature_names

ENTRY = {"builder": BUILDER, "history": 4, "ema_decay": 0.8, "cost_decay": 0.9, "width": 1, "cost_table": None}


def test_the_manifest_rebuilds_the_builder_or_names_the_fix():
    assert list(make_feature_builder(ENTRY, feature_names(4)).names) == list(feature_names(4))
    with pytest.raises(ValueError,
                       match="names the feature builder 'draftrl.envs.features.FeatureBuilder'.*export the"):
        make_feature_builder({**ENTRY, "builder": "draftrl.envs.features.FeatureBuilder"}, feature_names(4))
    with pytest.raises(ValueError, match="cannot drive an engine: analytic"):
        make_feature_builder({"reason": "analytic features."}, feature_names(4))


def test_the_builder_is_read_from_the_recorded_feature_names():
    """Which builder made a policy's observation follows from the names it recorded, for every env
    kind: the engine's (size and depth policies), the serving one's, none for the analytic model's."""
    import gymnasium as gym

    import draftrl.envs  # noqa: F401  registers the draftrl/* ids
    from draftrl.export.features import SERVING_BUILDER, feature_builder
    from draftrl.signals.serving import FEATURE_NAMES

    analytic = list(gym.make("draftrl/Analytic-v0").unwrapped.feature_names)
    assert feature_builder(list(feature_names(4))) == BUILDER
    assert feature_builder(list(feature_names(2)) + ["level"]) == BUILDER
    assert feature_builder(list(FEATURE_NAMES)) == SERVING_BUILDER
    assert feature_builder(analytic) is None
    assert feature_builder(list(feature_names(4))[4:]) is None  # the draft features first, or no engine builds it


def test_the_saved_env_section_is_the_typed_one_as_data():
    """``env_section`` (export reads a run's section without the train layer) applies ``eval`` as
    ``TrainEnvConfig.evaluation`` does: a nested section key by key, any other key whole (a
    ``verify_cost`` mapping is replaced, not merged); and it looks in the train layer's sections."""
    from pathlib import Path

    from draftrl.config import load_config, to_dict
    from draftrl.export.features import TRAIN_ENV_SECTIONS, env_section
    from draftrl.train.config import TrainConfig
    from draftrl.train.env_config import ENV_SECTIONS

    assert TRAIN_ENV_SECTIONS == tuple(ENV_SECTIONS)
    configs = Path(__file__).resolve().parents[2] / "configs"
    analytic = ["env.id=draftrl/Analytic-v0", "env.analytic={verify_cost: {1: 1.1, 2: 1.3}, alpha: 0.6}",
                "env.eval={analytic: {verify_cost: {1: 1.2}}}"]
    for cfg in (load_config(TrainConfig, configs / "cpu_default.yaml"),
                load_config(TrainConfig, configs / "serve_replay_cpu.yaml"),
                load_config(TrainConfig, None, analytic)):
        saved = to_dict(cfg)
        for key in TRAIN_ENV_SECTIONS:
            spec = getattr(cfg, key)
            expected = {k: v for k, v in to_dict(spec.evaluation()).items() if k != "eval"}
            if key == "env" or spec.id != cfg.env.id:  # a later section with env's id reads as env's
                assert env_section(saved, spec.id, evaluation=True) == expected
                assert env_section(saved, spec.id) == {k: v for k, v in to_dict(spec).items() if k != "eval"}
    assert env_section(saved, "draftrl/Analytic-v0", evaluation=True)["analytic"]["verify_cost"] == {1: 1.2}
    assert env_section(saved, "draftrl/Analytic-v0", evaluation=True)["analytic"]["alpha"] == 0.6
    assert env_section(None, "draftrl/SpecDecode-v2") == {"id": "draftrl/SpecDecode-v2"}
