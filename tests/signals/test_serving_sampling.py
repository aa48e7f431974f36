"""The serving observation sees the batch's sampling (v1, issue 46): its three entries, the replay's
batch feeding them, and what the earlier ids and exported policies now say."""

from __future__ import annotations

import numpy as np
import pytest
from serve_recordings import COST, TOKENS, synthetic_recordings

from draftrl.config.serve import ServeConfig
from draftrl.envs.ids import find, make_kwargs
from draftrl.export.features import check_serving_names
from draftrl.replay.recordings import Recording, Recordings
from draftrl.signals.serving import FEATURE_NAMES, FEATURE_NAMES_V0, ServingFeatures

SHARE, MEAN, TOP = (FEATURE_NAMES.index(n) for n in ("greedy_share", "temperature_mean", "temperature_max"))


def test_sampling_entries_of_a_batch():
    features = ServingFeatures(16, 1024, 8, 64, 0.9)
    obs = features.observation(0, np.array([0.5, 0.6, 0.7, 0.8]), np.zeros(4, dtype=np.int64),
                               np.array([0.0, 0.7, 1.0, 0.0]))
    assert obs.shape == (23,)
    assert (obs[SHARE], obs[MEAN], obs[TOP]) == pytest.approx((0.5, 0.425, 1.0))
    greedy = features.observation(0, np.array([0.5]), np.zeros(1, dtype=np.int64))  # no temperatures: greedy
    assert (greedy[SHARE], greedy[MEAN], greedy[TOP]) == (1.0, 0.0, 0.0)
    empty = features.observation(0, np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0))
    assert (empty[SHARE], empty[MEAN], empty[TOP]) == (0.0, 0.0, 0.0)
    hot = features.observation(0, np.array([0.5]), np.zeros(1, dtype=np.int64), np.array([3.0]))
    assert hot[TOP] == 2.0  # clipped to the table's bound
    with pytest.raises(ValueError, match="2 temperatures for 1 requests"):
        features.observation(0, np.array([0.5]), np.zeros(1, dtype=np.int64), np.array([0.0, 1.0]))


def test_the_replay_env_observes_its_batchs_sampling():
    from draftrl.envs.serve_vllm import ServeVLLMEnv

    base = synthetic_recordings(8)
    hot = [Recording(r.prompt, r.prompt_ids, r.max_new_tokens, r.token_ids, r.lookahead, 1.0, 0, 1.0, 0, 1)
           for r in base.requests]
    recs = Recordings(base.requests + hot, base.meta)
    env = ServeVLLMEnv(ServeConfig(temperature_mix={0: 0.5, 1.0: 0.5}, max_new_tokens=TOKENS, concurrency=6,
                                   num_requests=24), engine="replay", recordings=recs, calibration=COST)
    obs, _ = env.reset(seed=0)
    seen = [obs]
    done = False
    while not done:
        obs, _, done, _, _ = env.step(np.array([4, 7]))
        seen.append(obs)
        rows = len(env.engine.request_signals()[0])
        # the entries read the requests the last step drafted for, each at its own class
        temps = env.engine.request_temperatures()
        assert len(temps) == rows and set(temps.tolist()) <= {0.0, 1.0}
        if rows:
            assert obs[SHARE] == pytest.approx(np.mean(temps == 0)) and obs[TOP] == temps.max()
    seen = np.stack(seen)
    assert ((seen[:, SHARE] > 0) & (seen[:, SHARE] < 1)).any() and seen[:, TOP].max() == 1.0
    assert env.observation_space.contains(seen[-1])


def test_the_v0_ids_are_refused_naming_v1():
    for old, new in (("draftrl/ServeVLLM-v0", "draftrl/ServeVLLM-v1"),
                     ("draftrl/ServeReplay-v0", "draftrl/ServeReplay-v1")):
        with pytest.raises(ValueError, match=f"is retired: .*sampling.*use '{new}'") as err:
            find(old)
        assert "\n" not in str(err.value)
        with pytest.raises(ValueError, match=f"env.id='{old}' is retired"):
            make_kwargs({"id": old, "serve": {}})
    assert find("draftrl/ServeReplay-v1")["kwargs"] == {"engine": "replay"}
    import gymnasium as gym

    import draftrl.envs  # noqa: F401  (registers the ids)

    with pytest.raises(gym.error.DeprecatedEnv, match="ServeReplay-v1"):  # gymnasium names the new version itself
        gym.make("draftrl/ServeReplay-v0")


def test_a_policy_reading_the_v0_observation_is_refused_naming_the_fix():
    assert len(FEATURE_NAMES_V0) == 20 and FEATURE_NAMES[:20] == FEATURE_NAMES_V0
    with pytest.raises(ValueError, match=r"20-entry observation .* train the policy again on draftrl/ServeReplay-v1"):
        check_serving_names(FEATURE_NAMES_V0)
    with pytest.raises(ValueError, match="another draftrl version"):
        check_serving_names(FEATURE_NAMES[:21])
    check_serving_names(FEATURE_NAMES)
