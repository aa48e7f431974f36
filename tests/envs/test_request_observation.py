"""Issue 45 items 2 and 3 on the scripted engine and the replay: the observation's request and target
entries, their unknown fallback, the per-episode sampling draw, and the retired ids and policies."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from scripted_costs import scripted_target_features
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import draftrl.envs  # noqa: F401  registers the env ids
from draftrl.config import load_config
from draftrl.config.env import EnvConfig
from draftrl.envs.ids import RETIRED, find
from draftrl.envs.spec_decode import SpecDecodeEnv
from draftrl.envs.spec_decode_depth import SpecDecodeDepthEnv
from draftrl.signals.actions import CONTINUE, STOP
from draftrl.signals.features import REQUEST_FEATURES, TARGET_FEATURES, TARGET_UNKNOWN, feature_names
from draftrl.train.config import TrainConfig

SMALL = dict(languages=("en",), tasks=("chat",), limit_per_group=3, max_new_tokens=12, depths=(0, 1, 2, 4),
             monitor=False)
MIX = {0: 0.3, 0.7: 0.5, 1.0: 0.2}


def make_env(scripted, depth=False, target=True, **overrides):
    engine, tokenizer = scripted(target=target)
    cls = SpecDecodeDepthEnv if depth else SpecDecodeEnv
    return cls(EnvConfig(**{**SMALL, **overrides}), engine=engine, tokenizer=tokenizer)


def entries(env, obs, names):
    return [float(obs[env.feature_names.index(name)]) for name in names]


# ----------------------------------------------------------------------------- the entries' values
def test_target_entries_are_the_last_rounds_target_features(scripted):
    env = make_env(scripted, max_new_tokens=40)
    obs, _ = env.reset(seed=0)
    assert entries(env, obs, TARGET_FEATURES) == list(TARGET_UNKNOWN)  # before any round: unknown
    for i, depth in enumerate((4, 0, 2, 4, 1)):
        obs, _, _, _, info = env.step(np.array([env.depths.index(depth), 0]))
        want = scripted_target_features(i, info["num_accepted"])
        assert info["target_features"] == want
        assert entries(env, obs, TARGET_FEATURES) == pytest.approx([want[n] for n in TARGET_FEATURES], abs=1e-7)
    obs, _ = env.reset()  # a new request forgets them
    assert entries(env, obs, TARGET_FEATURES) == list(TARGET_UNKNOWN)


def test_an_engine_without_target_features_reads_unknown(scripted):
    env = make_env(scripted, target=False)
    obs, _ = env.reset(seed=0)
    done = False
    while not done:
        assert entries(env, obs, TARGET_FEATURES) == [0.0, 0.0, 0.0]
        obs, _, done, _, info = env.step(np.array([env.depths.index(2), 0]))
        assert info["target_features"] == {}


def test_depth_env_draft_steps_keep_the_last_rounds_target_features(scripted):
    env = make_env(scripted, depth=True, max_new_tokens=40)
    obs, _ = env.reset(seed=0)
    assert entries(env, obs, TARGET_FEATURES) == list(TARGET_UNKNOWN)
    assert env.feature_names[-3:] == ("level", "level_best_prob", "level_num_nodes")
    want = dict(zip(TARGET_FEATURES, TARGET_UNKNOWN))
    for i in range(3):  # round i: two draft levels, then verify
        obs, *_ = env.step(CONTINUE)  # drafting this round: still the last round's target entries
        assert entries(env, obs, TARGET_FEATURES) == pytest.approx([want[n] for n in TARGET_FEATURES], abs=1e-7)
        obs, *_ = env.step(CONTINUE)
        obs, _, _, _, info = env.step(STOP)
        want = scripted_target_features(i, info["num_accepted"])
        assert entries(env, obs, TARGET_FEATURES) == pytest.approx([want[n] for n in TARGET_FEATURES], abs=1e-7)


@pytest.mark.parametrize("sampling, want", [
    (dict(), [0.0, 1.0, 1.0]),  # greedy, top-k and top-p off
    (dict(temperature=0.7, top_k=20, top_p=0.9), [0.7, 0.2, 0.9]),
    (dict(temperature=1.0, top_k=500), [1.0, 1.0, 1.0]),  # top-k saturates at 100
    (dict(temperature=3.0, top_k=1), [2.0, 0.01, 1.0]),  # the temperature's bound is 2
])
def test_request_entries_are_the_requests_sampling(scripted, sampling, want):
    engine, tokenizer = scripted(temperature=sampling.get("temperature", 0.0))
    engine.config.top_k, engine.config.top_p = sampling.get("top_k", 0), sampling.get("top_p", 1.0)
    env = SpecDecodeEnv(EnvConfig(**SMALL, **sampling), engine=engine, tokenizer=tokenizer)
    obs, info = env.reset(seed=0)
    assert entries(env, obs, REQUEST_FEATURES) == pytest.approx(want, abs=1e-7)
    assert env.observation_space.contains(obs)
    obs, *_ = env.step(np.array([2, 0]))
    assert entries(env, obs, REQUEST_FEATURES) == pytest.approx(want, abs=1e-7)  # fixed for the episode
    assert engine.samplings == [None]  # no mix: the engine keeps its own config's sampling


def test_feature_names_end_with_the_request_and_target_groups():
    names = feature_names(4)
    assert names[:25] == feature_names(4)[:25] and len(names) == 31
    assert names[25:] == REQUEST_FEATURES + TARGET_FEATURES


# ----------------------------------------------------------------------------- the mix, drawn per episode
def test_each_episode_draws_its_class_by_the_weights(scripted):
    env = make_env(scripted, temperature_mix=MIX, max_new_tokens=2)
    n = 1500
    counts: dict[str, int] = {}
    env.reset(seed=0)
    for _ in range(n):
        obs, info = env.reset()
        label = info["sampling_class"]
        counts[label] = counts.get(label, 0) + 1
        sampling = env.engine.samplings[-1]  # what the engine was started with
        assert (sampling.temperature, sampling.top_k, sampling.top_p) == (info["temperature"], info["top_k"],
                                                                          info["top_p"])
        assert entries(env, obs, REQUEST_FEATURES)[0] == pytest.approx(info["temperature"])
    for cls in env.config.sampling_classes:  # within 4 standard errors of each weight
        se = np.sqrt(cls.weight * (1 - cls.weight) / n)
        assert abs(counts[cls.label] / n - cls.weight) < 4 * se, counts


def test_reset_options_pick_a_class(scripted):
    env = make_env(scripted, temperature_mix=[{"temperature": 0.7, "top_p": 0.9, "weight": 1},
                                              {"temperature": 0, "weight": 1}])
    env.reset(seed=0)
    for _ in range(5):
        obs, info = env.reset(options={"sampling": "T0.7:p0.9"})
        assert (info["sampling_class"], info["temperature"], info["top_k"], info["top_p"]) == ("T0.7:p0.9", 0.7, 0,
                                                                                              0.9)
        assert entries(env, obs, REQUEST_FEATURES) == pytest.approx([0.7, 1.0, 0.9])
    _, info = env.reset(options={"sampling": "T0", "prompt_index": 1})  # with a prompt option too
    assert info["sampling_class"] == "T0" and info["prompt_id"] == env.workload.prompts[1].id
    with pytest.raises(ValueError, match=r"sampling='T1' is not a class of this env's workload; use one of "
                                         r"T0\.7:p0\.9, T0"):
        env.reset(options={"sampling": "T1"})


def test_a_single_class_keeps_the_seeded_streams(scripted):
    """A workload of one class draws nothing: prompts and sampling seeds equal the run without a mix."""
    def run(**overrides):
        env = make_env(scripted, **overrides)
        infos = [env.reset(seed=3)[1]] + [env.reset()[1] for _ in range(6)]
        return [(i["prompt_id"], i["sampling_seed"]) for i in infos], {i["sampling_class"] for i in infos}

    plain, labels = run()
    assert labels == {"T0"}
    assert run(temperature_mix={0: 1.0}) == (plain, {"T0"})
    mixed, labels = run(temperature_mix=MIX)
    # the first pass's prompt order is drawn at the seeded reset, before any class (later passes reshuffle
    # from the stream the draws moved on)
    assert [p for p, _ in mixed[:3]] == [p for p, _ in plain[:3]]
    assert len(labels) > 1


def test_a_mixed_config_passes_the_live_engines_check(scripted):
    engine, tokenizer = scripted(temperature=0.0)
    env = SpecDecodeEnv(EnvConfig(**SMALL, temperature_mix=MIX), engine=engine, tokenizer=tokenizer)
    assert env.config.mixed
    engine, tokenizer = scripted(temperature=0.7)  # without a mix the comparison still refuses
    with pytest.raises(ValueError, match="engine temperature=0.7 differs"):
        SpecDecodeEnv(EnvConfig(**SMALL), engine=engine, tokenizer=tokenizer)


def test_checkers_pass_on_mixed_scripted_envs(scripted):
    for depth in (False, True):
        env = make_env(scripted, depth=depth, temperature_mix=MIX)
        gym_check_env(env)
    sb3_check_env(make_env(scripted, temperature_mix=MIX))


# ----------------------------------------------------------------------------- the replay
def greedy_mix():
    """Classes that differ in top-k/top-p only, all greedy: the greedy traces replay every one."""
    return [{"temperature": 0, "weight": 1}, {"temperature": 0, "top_k": 20, "weight": 1}]


def test_replay_with_a_greedy_mix_passes_the_checkers(tiny_traces, tmp_path):
    from cost_tables import synthetic_table

    config = dict(depths=(0, 1), max_new_tokens=None, temperature_mix=greedy_mix())
    env = gym.make("draftrl/TraceReplay-v1", traces=tiny_traces(), cost_table=synthetic_table(), config=config)
    gym_check_env(env.unwrapped)
    obs, info = env.reset(seed=0, options={"sampling": "T0:k20"})
    assert entries(env.unwrapped, obs, REQUEST_FEATURES) == pytest.approx([0.0, 0.2, 1.0])
    assert entries(env.unwrapped, obs, TARGET_FEATURES) == list(TARGET_UNKNOWN)  # greedy traces record none
    depth = gym.make("draftrl/TraceReplayDepth-v1", traces=tiny_traces(), cost_table=synthetic_table(), config=config)
    gym_check_env(depth.unwrapped)


def test_greedy_traces_refuse_a_sampled_mix(tiny_traces):
    from cost_tables import synthetic_table

    with pytest.raises(ValueError, match=r"asks for sampling T0\.7 but the traces hold T0; record it"):
        gym.make("draftrl/TraceReplay-v1", traces=tiny_traces(), cost_table=synthetic_table(),
                 config=dict(depths=(0, 1), temperature_mix={0: 1, 0.7: 1}))


# ----------------------------------------------------------------------------- retired ids and policies
@pytest.mark.parametrize("old", sorted(RETIRED))
def test_retired_ids_are_refused_naming_the_new_one(old):
    new = RETIRED[old][0]
    with pytest.raises(gym.error.DeprecatedEnv, match=f"Please use `{new}` instead"):
        gym.make(old)
    with pytest.raises(ValueError, match=f"env.id={old!r} is retired: .*; use {new!r}"):
        find(old)
    with pytest.raises(ValueError, match=f"use {new!r}"):
        load_config(TrainConfig, None, [f"env.id={old}"])


def _v0_names() -> list[str]:
    return [n for n in feature_names(4) if n not in REQUEST_FEATURES + TARGET_FEATURES]


@pytest.mark.parametrize("env_id, names, message", [
    ("draftrl/TraceReplay-v0", feature_names(4), r"env_id='draftrl/TraceReplay-v0' is retired.*TraceReplay-v1"),
    ("tests/Custom-v0", _v0_names(), r"before issue 45.*draftrl/TraceReplay-v1"),
])
def test_policies_of_the_old_observation_are_refused(tmp_path, env_id, names, message):
    from draftrl.policies.ppo import read_policy_manifest, write_manifest

    write_manifest(tmp_path, kind="size", env_id=env_id, depths=[0, 1], verify_sizes=[0], feature_names=names)
    with pytest.raises(ValueError, match=message):
        read_policy_manifest(tmp_path / "policy.json")
    write_manifest(tmp_path, kind="size", env_id="draftrl/TraceReplay-v1", depths=[0, 1], verify_sizes=[0],
                   feature_names=feature_names(4))
    assert read_policy_manifest(tmp_path / "policy.json")["env_id"] == "draftrl/TraceReplay-v1"  # control


def test_exports_of_the_old_observation_are_refused(tmp_path):
    from draftrl.export.manifest import FORMAT, read_manifest

    file = tmp_path / "policy.onnx"
    file.write_bytes(b"")
    manifest = {"format": FORMAT, "backend": "onnx", "kind": "size", "feature_names": _v0_names(),
                "normalization": None, "io": {},
                "action": {"heads": ["depth"], "nvec": [2], "depths": [0, 1], "verify_sizes": [0]}}
    (tmp_path / "policy.onnx.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"before issue 45, .*; train it again with draftrl train"):
        read_manifest(file)
    (tmp_path / "policy.onnx.json").write_text(json.dumps({**manifest, "feature_names": list(feature_names(4))}))
    assert read_manifest(file)["kind"] == "size"  # control


# ----------------------------------------------------------------------------- the engines' side of the contract
def test_engines_take_the_requests_sampling_at_start(tiny_traces):
    """``start(sampling=...)`` sets the request's sampling (``engine.sampling``); None goes back to the config's."""
    import sys
    from pathlib import Path

    from cost_tables import synthetic_table

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "decoding"))
    from tiny_lm import TinyLM

    from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
    from draftrl.models.distribution import SamplingParams
    from draftrl.replay.round_engine import TraceRoundEngine

    engine = SpeculativeDecoder(TinyLM(6), None, EngineConfig(max_new_tokens=3))
    warm = SamplingParams(temperature=0.7, top_k=3)
    engine.start([1, 2], seed=0, sampling=warm)
    assert engine.sampling == warm and engine.round(0).num_emitted == 1
    engine.start([1, 2], seed=0)
    assert engine.sampling == EngineConfig().sampling

    config = EnvConfig(depths=(0, 1), max_new_tokens=None, temperature_mix=greedy_mix())
    replay = TraceRoundEngine(tiny_traces(), config, synthetic_table())
    prompt = replay.workload(config).request(0).prompt_ids
    replay.config.max_new_tokens = 2
    replay.start(prompt, sampling=SamplingParams(temperature=0.0, top_k=20))
    assert replay.sampling.top_k == 20
    with pytest.raises(ValueError, match="the traces hold T0, not temperature=0.7 top_k=3 top_p=1; record it"):
        replay.start(prompt, sampling=warm)


# ----------------------------------------------------------------------------- one policy across temperatures
def test_one_ppo_policy_learns_each_temperatures_depth(scripted, tmp_path, monkeypatch):
    """``draftrl train`` (``ppo_size``) on a mix where drafts are always accepted at T=0 and never at T=1
    (the scripted engine's ``accepts_at``): the best depth is 4 at T=0 and 0 at T=1, so no fixed setting
    is best for the mix. The policy reads the request's temperature and matches each class's best fixed
    setting, which beats the mix's best fixed one. (Observations are not normalised: the scripted engine's
    cost features are nearly constant, and ``VecNormalize`` blows their tiny variance up into noise that
    kept PPO at depth 4 for both classes in 8,192 steps; unnormalised, 4,096 steps learn both.)"""
    from draftrl.envs.ids import register_id
    from draftrl.policies.ppo import PPOPolicy
    from draftrl.train import ppo_size

    def make(config=None, **kwargs):
        engine, tokenizer = scripted(accepts_at={0.0: (4,), 1.0: (0,)})
        return SpecDecodeEnv(config, engine=engine, tokenizer=tokenizer, **kwargs)

    register_id(id="tests/ScriptedMix-v0", entry_point=make, max_episode_steps=1024, section="env")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    cfg = load_config(TrainConfig, None, [
        "env.id=tests/ScriptedMix-v0", "env.temperature_mix={0: 1, 1.0: 1}", "env.languages=[en]",
        "env.tasks=[chat]", "env.limit_per_group=3", "env.max_new_tokens=16", "env.depths=[0,1,2,4]",
        "env.monitor=false", "total_timesteps=4096", "ppo.n_envs=1", "ppo.n_steps=256", "ppo.batch_size=64",
        "ppo.normalize_obs=false", "eval_episodes=12", "baselines=[]", "progress_bar=false", "checkpoint_every=4096"])
    evaluation = ppo_size.train(cfg, tmp_path / "run")["evaluation"]
    split = evaluation["per_sampling"]
    assert split["T0"]["best_fixed"] == "fixed(d=4,v=0)" and split["T1"]["best_fixed"] == "fixed(d=0,v=0)"
    for part in split.values():
        assert part["table"]["ppo"]["ratio_to_best_fixed"] > 0.95, split
    assert evaluation["table"]["ppo"]["ratio_to_best_fixed"] > 1.05, evaluation["table"]

    env = make(EnvConfig(**SMALL, temperature_mix={0: 1, 1.0: 1}))
    policy = PPOPolicy.load(tmp_path / "run", env)
    depths = {label: policy.act(env.reset(seed=0, options={"sampling": label})[0])[0] for label in ("T0", "T1")}
    assert depths == {"T0": 4, "T1": 0}
