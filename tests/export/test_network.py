"""The exported networks choose SB3's actions: ONNX (onnxruntime) and TorchScript against
``model.predict(obs, deterministic=True)`` after SB3's own VecNormalize, on >= 10,000 observations
recorded by rolling out the training envs; plus the manifest and the artifact resolution."""

from __future__ import annotations

import json
import pickle
import shutil

import gymnasium as gym
import numpy as np
import pytest

import draftrl.envs  # noqa: F401  registers the env ids (gymnasium.register_envs idiom)
from draftrl.cli import main
from draftrl.export.artifacts import resolve
from draftrl.export.controller import PolicyController
from draftrl.export.manifest import FORMAT, manifest_path, read_manifest
from draftrl.export.network import export, load_sb3, sb3_logits
from draftrl.export.torchscript import TorchScriptController

NUM_OBSERVATIONS = 10_000


def record(env: gym.Env, controller, num: int, seed: int = 0, explore: float = 0.5) -> np.ndarray:
    """``[num, F]`` observations of episodes where each round follows the policy or, with
    probability ``explore``, a random action (so the states leave the policy's own path)."""
    rng = np.random.default_rng(seed)
    env.action_space.seed(seed)
    out: list[np.ndarray] = []
    episode = 0
    while len(out) < num:
        obs, _ = env.reset(seed=seed + episode)
        episode += 1
        done = False
        while not done and len(out) < num:
            out.append(obs)
            action = env.action_space.sample() if rng.random() < explore else controller.act_indices(obs)[0]
            obs, _, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
    return np.stack(out).astype(np.float32)


def assert_same_actions(run, runtime, observations: np.ndarray) -> dict[str, float]:
    """Every action equals SB3's, except where SB3's two best logits tie in float32 (reported)."""
    model, normalizer = load_sb3(resolve(run))
    x = normalizer.normalize_obs(observations)  # SB3's own normalisation
    np.testing.assert_array_equal(runtime.normalize(observations), x)  # bit for bit the same inputs
    expected, _ = model.predict(x, deterministic=True)
    got = runtime.act_indices(observations)
    assert got.shape == expected.shape == (len(observations), 2)
    logits = sb3_logits(model, x)
    sorted_logits = [np.sort(head, axis=1) for head in logits]
    gaps = np.stack([s[:, -1] - s[:, -2] if s.shape[1] > 1 else np.full(len(s), np.inf) for s in sorted_logits], 1)
    differ = got != expected
    assert not np.any(differ & (gaps >= 1e-5)), f"{int(np.sum(differ))} actions differ from SB3 beyond float32 ties"
    ours = runtime.logits(observations)
    for head, theirs in zip(runtime.heads, logits):
        mine = ours[head]
        centred = (mine - mine.max(1, keepdims=True)) - (theirs - theirs.max(1, keepdims=True))
        assert np.max(np.abs(centred)) < 1e-4, head
    for obs, action in zip(observations[:500], expected[:500]):  # the single-observation path too
        assert runtime.act(obs) == (runtime.depths[action[0]], runtime.verify_sizes[action[1]])
    return {"observations": len(observations), "differ": int(np.sum(differ)),
            "distinct_depths": len(np.unique(expected[:, 0]))}


@pytest.fixture(scope="module")
def analytic_observations(analytic_run, analytic_exports) -> np.ndarray:
    kwargs = resolve(analytic_run).train_config["env"]["analytic"]
    env = gym.make("draftrl/Analytic-v0", **{k: v for k, v in kwargs.items() if v is not None})
    return record(env, PolicyController(analytic_exports["onnx"]), NUM_OBSERVATIONS)


@pytest.fixture(scope="module")
def replay_observations(replay_run, replay_traces, replay_exports) -> np.ndarray:
    env = gym.make("draftrl/TraceReplay-v1", traces=str(replay_traces), cost_noise=0.2)
    return record(env, PolicyController(replay_exports["onnx"]), NUM_OBSERVATIONS)


@pytest.mark.parametrize("backend", ["onnx", "torchscript"])
def test_analytic_policy_matches_sb3_on_10k_recorded_observations(backend, analytic_run, analytic_exports,
                                                                  analytic_observations):
    runtime = (PolicyController if backend == "onnx" else TorchScriptController)(analytic_exports[backend])
    report = assert_same_actions(analytic_run, runtime, analytic_observations)
    print(backend, report)
    assert report["observations"] >= NUM_OBSERVATIONS
    assert report["distinct_depths"] >= 2, report  # the states exercise more than one decision


@pytest.mark.parametrize("backend", ["onnx", "torchscript"])
def test_replay_policy_matches_sb3_on_10k_recorded_observations(backend, replay_run, replay_exports,
                                                                replay_observations):
    runtime = (PolicyController if backend == "onnx" else TorchScriptController)(replay_exports[backend])
    report = assert_same_actions(replay_run, runtime, replay_observations)
    print(backend, report)
    assert report["observations"] >= NUM_OBSERVATIONS


def test_manifest_describes_the_policy(analytic_run, analytic_exports):
    manifest = read_manifest(analytic_exports["onnx"])
    trained = resolve(analytic_run)
    assert manifest["format"] == FORMAT and manifest["backend"] == "onnx" and manifest["file"] == "policy.onnx"
    assert manifest["kind"] == "size" and manifest["env_id"] == "draftrl/Analytic-v0"
    assert manifest["feature_names"] == trained.feature_names
    with trained.vecnormalize_path.open("rb") as f:
        stats = pickle.load(f)
    norm = manifest["normalization"]
    np.testing.assert_array_equal(norm["mean"], stats.obs_rms.mean)  # exact float64 round trip
    np.testing.assert_array_equal(norm["var"], stats.obs_rms.var)
    assert norm["clip_obs"] == stats.clip_obs and norm["epsilon"] == stats.epsilon
    action = manifest["action"]
    assert action["depths"] == list(range(13)) and action["verify_sizes"] == [0] and action["nvec"] == [13, 1]
    assert action["heads"] == ["depth", "verify_size"] and action["width"] == 1
    assert [i["name"] for i in manifest["io"]["inputs"]] == ["observation"]
    assert [o["name"] for o in manifest["io"]["outputs"]] == ["logits_depth", "logits_verify_size", "action"]
    assert manifest["train_config"] == json.loads((analytic_run / "config.json").read_text())
    assert manifest["train_config"]["env"]["analytic"]["regimes"] == [0.9, 0.2]
    assert set(manifest["versions"]) >= {"draftrl", "torch", "stable_baselines3", "onnx", "onnxruntime", "opset"}
    assert manifest["source"]["policy_sha256"] == trained.sha256()
    assert manifest["check"]["action_agreement"] == 1.0 and manifest["check"]["num_observations"] == 512
    assert manifest["evaluation"]["depth_histogram"]
    assert manifest["features"]["builder"] is None  # analytic features: no engine can build them
    import onnxruntime

    embedded = onnxruntime.InferenceSession(str(analytic_exports["onnx"])).get_modelmeta().custom_metadata_map
    assert json.loads(embedded["draftrl.manifest"]) == manifest  # the network carries its manifest too


def test_replay_manifest_carries_the_feature_builder(replay_exports, replay_traces):
    features = read_manifest(replay_exports["onnx"])["features"]
    assert features["builder"] == "draftrl.signals.features.FeatureBuilder"
    assert features["history"] == 4 and features["drafter"] == "ngram" and features["width"] == 1
    assert features["cost_table"]["verify"]["seconds"][0][0] == 0.02  # the training cost table, embedded
    assert str(replay_traces) in features["source"]


def test_checkpoint_exports_with_its_own_statistics(analytic_run, tmp_path):
    checkpoint = analytic_run / "checkpoints" / "ppo_1024_steps.zip"
    trained = resolve(checkpoint)
    assert trained.is_checkpoint and trained.summary is None
    assert trained.vecnormalize_path.name == "ppo_vecnormalize_1024_steps.pkl"
    _, manifest = export(checkpoint, tmp_path / "ckpt.onnx", check_observations=256)
    with trained.vecnormalize_path.open("rb") as f:
        np.testing.assert_array_equal(manifest["normalization"]["mean"], pickle.load(f).obs_rms.mean)
    assert manifest["source"]["checkpoint"] is True and manifest["evaluation"] is None


def test_resolution_errors_name_the_fix(analytic_run, tmp_path):
    with pytest.raises(FileNotFoundError, match="draftrl train"):
        resolve(tmp_path / "nowhere")
    partial = tmp_path / "partial"
    shutil.copytree(analytic_run, partial)
    (partial / "vecnormalize.pkl").unlink()
    with pytest.raises(FileNotFoundError, match="normalize_obs"):
        export(partial, tmp_path / "x.onnx")
    (partial / "policy.json").unlink()
    with pytest.raises(FileNotFoundError, match="policy.json"):
        resolve(partial / "policy.zip")
    (tmp_path / "orphan.onnx").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="orphan.onnx.json"):
        read_manifest(tmp_path / "orphan.onnx")


def test_cli_export_writes_network_and_manifest(analytic_run, tmp_path, capsys):
    out = tmp_path / "cli" / "policy.onnx"
    assert main(["export", str(analytic_run / "policy.zip"), "--format", "onnx", "--out", str(out),
                 "--check-observations", "256"]) == 0
    assert out.is_file() and manifest_path(out).is_file()
    assert "agreement_with_sb3=1.0000" in capsys.readouterr().out
    assert main(["export", str(analytic_run), "--format", "torchscript", "--out", str(tmp_path / "p.pt"),
                 "--check-observations", "0"]) == 0
    assert read_manifest(tmp_path / "p.pt")["backend"] == "torchscript"
