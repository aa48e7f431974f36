"""The workload's temperature mix: its spellings, its checks, and the draw every request makes."""

import numpy as np
import pytest

from draftrl.config import from_dict, to_dict
from draftrl.config.env import EnvConfig
from draftrl.config.serve import ServeConfig
from draftrl.config.workload import SamplingClass, parse_temperature_mix


def test_mapping_and_list_spellings_mean_the_same_mix():
    short = from_dict(EnvConfig, {"temperature_mix": {0: 0.3, 0.7: 0.4, 1.0: 0.3}})
    long = from_dict(EnvConfig, {"temperature_mix": [{"temperature": 0, "weight": 3}, {"temperature": 0.7, "weight": 4},
                                                     {"temperature": 1.0, "weight": 3}]})
    assert short.temperature_mix == long.temperature_mix
    assert [c.label for c in short.sampling_classes] == ["T0", "T0.7", "T1"]
    assert sum(c.weight for c in short.sampling_classes) == pytest.approx(1.0)
    assert short.mixed and not EnvConfig().mixed


def test_mix_survives_the_resolved_config_round_trip():
    config = from_dict(ServeConfig, {"temperature_mix": [{"temperature": 0.7, "top_p": 0.8, "top_k": 20}]})
    assert from_dict(ServeConfig, to_dict(config)) == config
    assert config.sampling_classes[0].label == "T0.7:k20:p0.8"
    assert config.sampling_classes[0].params().top_k == 20


def test_no_mix_is_one_class_and_draws_nothing():
    config = EnvConfig(temperature=0.7, top_p=0.9)
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state
    assert config.draw_sampling(rng) == SamplingClass(0.7, 0, 0.9)
    assert rng.bit_generator.state == state  # greedy and single-class runs keep their seeded streams


def test_draws_follow_the_weights():
    config = EnvConfig(temperature_mix={0: 0.3, 0.7: 0.4, 1.0: 0.3})
    rng = np.random.default_rng(1)
    n = 20000
    counts = {}
    for _ in range(n):
        label = config.draw_sampling(rng).label
        counts[label] = counts.get(label, 0) + 1
    for cls in config.sampling_classes:  # within 4 standard errors of each share
        se = np.sqrt(cls.weight * (1 - cls.weight) / n)
        assert abs(counts[cls.label] / n - cls.weight) < 4 * se


@pytest.mark.parametrize("mix, message", [
    ({}, "non-empty"),
    ([{"temp": 1}], "unknown keys"),
    ({0.7: 1, "0.7": 2}, "more than once"),
    ({-1: 1}, "temperature"),
    ([{"temperature": 1, "top_p": 0}], "top_p"),
    ({1.0: 0}, "weight"),
])
def test_bad_mixes_are_refused_naming_the_fix(mix, message):
    with pytest.raises(ValueError, match=message):
        parse_temperature_mix(mix)


def test_mix_beside_a_temperature_is_refused():
    with pytest.raises(ValueError, match="both set"):
        EnvConfig(temperature=0.7, temperature_mix={0: 1})
