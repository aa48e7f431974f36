"""``export.features``: the manifest's feature section rebuilds the training env's builder, or says why not."""

from __future__ import annotations

import pytest

from draftrl.export.features import BUILDER, make_feature_builder
from draftrl.signals.features import feature_names

ENTRY = {"builder": BUILDER, "history": 4, "ema_decay": 0.8, "cost_decay": 0.9, "width": 1, "cost_table": None}


def test_the_manifest_rebuilds_the_builder_or_names_the_fix():
    assert list(make_feature_builder(ENTRY, feature_names(4)).names) == list(feature_names(4))
    with pytest.raises(ValueError, match="names the feature builder 'draftrl.envs.features.FeatureBuilder'.*export the"):
        make_feature_builder({**ENTRY, "builder": "draftrl.envs.features.FeatureBuilder"}, feature_names(4))
    with pytest.raises(ValueError, match="cannot drive an engine: analytic"):
        make_feature_builder({"reason": "analytic features."}, feature_names(4))
