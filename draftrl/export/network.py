"""Export the policy network alone (no value head, no optimiser) to ONNX or TorchScript.

As in SB3's export guide, only ``model.policy``'s actor path is exported: features extractor ->
``mlp_extractor.forward_actor`` -> ``action_net``. The graph's input is the RAW observation: the
VecNormalize statistics are constants of the graph, which computes SB3's normalisation operation
for operation (``clip((obs - mean) / sqrt(var + epsilon), -clip_obs, clip_obs)`` in float64, then
float32), so the ``.onnx`` file runs on its own. The manifest keeps the statistics too (for
readers, and for exports made before the graph carried them: ``io.inputs[0].normalized``).

Outputs: ``logits_<head>`` ``[batch, nvec[i]]`` per action head, and ``action`` ``[batch, heads]``
int64 = argmax of each head's logits (the first maximum on ties, in torch and in ONNX ArgMax).
SB3's deterministic action is the argmax of each head's softmax probabilities: the same index
except where two logits are closer than float32 rounding of the softmax, which the export check
and the tests report.
"""

from __future__ import annotations

import copy
import importlib
import importlib.metadata
import platform
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import draftrl
from draftrl.deps import require
from draftrl.export.artifacts import TrainedPolicy, resolve
from draftrl.export.controller import OnnxRunner
from draftrl.export.features import features_entry
from draftrl.export.manifest import (
    ACTION_NAME,
    FORMAT,
    HEADS,
    INPUT_NAME,
    Normalization,
    logits_name,
    manifest_path,
    write_manifest,
)
from draftrl.export.torchscript import TorchScriptRunner
from draftrl.io import staged_files

#: ONNX opset of the exported graph (Gemm, Tanh, Split, ArgMax: all long supported).
OPSET = 17
#: Observations drawn from the policy's observation space for the export-time check.
CHECK_OBSERVATIONS = 4096


class PolicyNetwork(nn.Module):
    """SB3 actor path of an ``ActorCriticPolicy`` with discrete heads, VecNormalize in front.

    ``forward(observation [B, F] float32, raw) -> (*logits_per_head, action [B, H] int64)``.

    :param normalization: the training run's observation statistics, or None (no VecNormalize).
    """

    def __init__(self, policy: Any, nvec: list[int], normalization: Normalization | None = None):
        super().__init__()
        self.features_extractor = copy.deepcopy(getattr(policy, "pi_features_extractor", policy.features_extractor))
        self.mlp_extractor = copy.deepcopy(policy.mlp_extractor)
        self.action_net = copy.deepcopy(policy.action_net)
        self.nvec = [int(n) for n in nvec]
        self.normalizes = normalization is not None
        if normalization is not None:
            self.register_buffer("obs_mean", torch.as_tensor(normalization.mean, dtype=torch.float64))  # [F]
            self.register_buffer("obs_std", torch.as_tensor(normalization.std, dtype=torch.float64))  # [F]
            self.clip_obs = float(normalization.clip_obs)
        self.eval()

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.normalizes:  # SB3's VecNormalize.normalize_obs: float64, then float32 into the policy
            scaled = (observation.double() - self.obs_mean) / self.obs_std
            observation = torch.clamp(scaled, -self.clip_obs, self.clip_obs).float()
        features = self.features_extractor(observation)
        latent = self.mlp_extractor.forward_actor(features)
        logits = self.action_net(latent)  # [B, sum(nvec)]
        heads = torch.split(logits, self.nvec, dim=1)
        action = torch.stack([h.argmax(dim=1) for h in heads], dim=1)  # [B, H] int64
        return (*heads, action)


def load_sb3(trained: TrainedPolicy) -> tuple[Any, Any]:
    """(SB3 PPO model on the CPU, VecNormalize or None) as ``PPOPolicy.load`` reads them, checked
    against the run's config (a checkpoint pairs with its own statistics)."""
    from draftrl.policies import PPOPolicy

    policy = PPOPolicy.load(trained.model_path)
    if policy.obs_normalizer is None and ((trained.train_config or {}).get("ppo") or {}).get("normalize_obs"):
        raise FileNotFoundError(
            f"the run normalised observations (ppo.normalize_obs=true) but {trained.model_path.parent} holds no "
            "VecNormalize statistics for this model; export from the run directory that draftrl train wrote."
        )
    return policy.model, policy.obs_normalizer


def normalization_entry(normalizer: Any) -> dict[str, Any] | None:
    if normalizer is None or not getattr(normalizer, "norm_obs", False):
        return None
    rms = normalizer.obs_rms
    return {
        "mean": [float(x) for x in np.asarray(rms.mean, dtype=np.float64)],
        "var": [float(x) for x in np.asarray(rms.var, dtype=np.float64)],
        "clip_obs": float(normalizer.clip_obs),
        "epsilon": float(normalizer.epsilon),
        "count": float(rms.count),
    }


def action_nvec(model: Any) -> list[int]:
    from gymnasium import spaces

    space = model.action_space
    if isinstance(space, spaces.MultiDiscrete):
        return [int(n) for n in space.nvec]
    if isinstance(space, spaces.Discrete):
        return [int(space.n)]
    raise TypeError(f"draftrl policies act in Discrete or MultiDiscrete spaces, this one is {space}.")


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, Any]:
    import stable_baselines3

    return {
        "draftrl": getattr(draftrl, "__version__", None) or _version("draftrl"),
        "torch": torch.__version__,
        "stable_baselines3": stable_baselines3.__version__,
        "onnx": _version("onnx"),
        "onnxruntime": _version("onnxruntime"),
        "numpy": np.__version__,
        "python": platform.python_version(),
        "opset": OPSET,
    }


def build_manifest(trained: TrainedPolicy, model: Any, normalizer: Any, backend: str, file: Path) -> dict[str, Any]:
    kind = trained.kind
    if kind not in HEADS:
        raise ValueError(f"policy kind {kind!r} is unknown; draftrl exports {sorted(HEADS)} policies.")
    heads = HEADS[kind]
    nvec = action_nvec(model)
    if len(nvec) != len(heads):
        raise ValueError(f"a {kind!r} policy has {len(heads)} action heads, this model has nvec={nvec}.")
    names = trained.feature_names
    obs_dim = int(np.prod(model.observation_space.shape))
    if obs_dim != len(names):
        raise ValueError(f"the network reads {obs_dim} inputs but policy.json names {len(names)} features: {names}.")
    features = features_entry(trained.train_config, trained.env_id, names, trained.run_dir)
    evaluation = trained.evaluation()
    return {
        "format": FORMAT,
        "backend": backend,
        "file": file.name,
        "kind": kind,
        "env_id": trained.env_id,
        "feature_names": names,
        "normalization": normalization_entry(normalizer),
        "action": {
            "heads": list(heads),
            "nvec": nvec,
            "depths": trained.depths,
            "verify_sizes": trained.verify_sizes,
            "width": int(features.get("width") or 1),
            "continue_action": int(trained.policy_manifest.get("continue_action", 1)),
            "deterministic": "argmax of each head's logits (first maximum on ties); "
            "size policies: action = [depth index, verify_size index] into depths, verify_sizes",
        },
        "io": {
            "inputs": [{"name": INPUT_NAME, "shape": ["batch", len(names)], "dtype": "float32",
                        "normalized": False}],
            "outputs": [{"name": logits_name(h), "shape": ["batch", n], "dtype": "float32"}
                        for h, n in zip(heads, nvec)]
            + [{"name": ACTION_NAME, "shape": ["batch", len(heads)], "dtype": "int64"}],
        },
        "features": features,
        "train_config": trained.train_config,
        "policy_manifest": trained.policy_manifest,
        "source": {
            "policy": str(trained.model_path),
            "policy_sha256": trained.sha256(),
            "vecnormalize": str(trained.vecnormalize_path) if trained.vecnormalize_path else None,
            "run_dir": str(trained.run_dir),
            "checkpoint": trained.is_checkpoint,
        },
        "evaluation": None if evaluation is None else {
            k: evaluation.get(k) for k in ("throughput", "num_rounds", "mean_tokens_per_round", "depth_histogram",
                                           "verify_size_histogram", "episodes", "seed")
        },
        "versions": versions(),
        "check": None,
    }


def sample_observations(model: Any, num: int, seed: int = 0) -> np.ndarray:
    """``[num, F]`` float32 observations drawn uniformly from the policy's observation Box."""
    space = copy.deepcopy(model.observation_space)
    space.seed(seed)
    return np.stack([space.sample() for _ in range(num)]).astype(np.float32)


def sb3_logits(model: Any, normalized: np.ndarray) -> list[np.ndarray]:
    """SB3's own logits per head for normalised observations ``[B, F]`` (``policy.get_distribution``)."""
    with torch.no_grad():
        obs = torch.as_tensor(normalized, dtype=torch.float32)
        dist = model.policy.get_distribution(obs).distribution
        dists = dist if isinstance(dist, list) else [dist]
        return [d.logits.numpy() for d in dists]


def export(
    policy: str | Path,
    out: str | Path,
    backend: str = "onnx",
    *,
    check_observations: int = CHECK_OBSERVATIONS,
    seed: int = 0,
) -> tuple[Path, dict[str, Any]]:
    """Write the policy network to ``out`` (ONNX or TorchScript) and its manifest to ``out.json``.

    The export is checked before the manifest is written: on ``check_observations`` observations
    drawn from the policy's observation space and normalised as in training, the exported
    network's actions must equal SB3's ``predict(deterministic=True)`` (up to float32 ties).

    :return: (manifest path, manifest).
    :raises ImportError: when onnx or onnxruntime is missing (``pip install "draftrl[export]"``).
    """
    if backend not in ("onnx", "torchscript"):
        raise ValueError(f"backend={backend!r} must be 'onnx' or 'torchscript'.")
    if backend == "onnx":
        for module in ("onnx", "onnxruntime"):
            require(module)
    trained = resolve(policy)
    model, normalizer = load_sb3(trained)
    out = Path(out)
    manifest = build_manifest(trained, model, normalizer, backend, out)
    net = PolicyNetwork(model.policy, manifest["action"]["nvec"],
                        Normalization.from_manifest(manifest["normalization"]))
    example = torch.zeros(1, len(trained.feature_names), dtype=torch.float32)
    heads = manifest["action"]["heads"]
    output_names = [logits_name(h) for h in heads] + [ACTION_NAME]
    with staged_files(out.parent) as stage:  # a failed check leaves no network without its manifest
        staged = stage / out.name
        with torch.no_grad():
            if backend == "onnx":
                _export_onnx(net, example, staged, output_names)
            else:
                torch.jit.save(torch.jit.trace(net, example), str(staged))
        manifest["check"] = check_export(staged, manifest, model, check_observations, seed)
        if backend == "onnx":
            _embed_manifest(staged, manifest)
        write_manifest(staged, manifest)
    return manifest_path(out), manifest


def _embed_manifest(out: Path, manifest: dict[str, Any]) -> None:
    """Copy the manifest into the ONNX file's metadata (``draftrl.manifest``): the network stays
    self-describing if it travels without its JSON. The graph is not touched."""
    import json

    onnx = require("onnx")
    proto = onnx.load(str(out))
    del proto.metadata_props[:]
    for key, value in (("draftrl.format", FORMAT), ("draftrl.manifest", json.dumps(manifest))):
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(proto, str(out))


def _export_onnx(net: nn.Module, example: torch.Tensor, out: Path, output_names: list[str]) -> None:
    dynamic = {name: {0: "batch"} for name in [INPUT_NAME, *output_names]}
    kwargs = dict(input_names=[INPUT_NAME], output_names=output_names, opset_version=OPSET)
    try:  # the TorchScript-based exporter: no onnxscript needed, dynamic batch through dynamic_axes
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*legacy TorchScript-based ONNX")
            torch.onnx.export(net, (example,), str(out), dynamo=False, dynamic_axes=dynamic, **kwargs)
    except TypeError:  # a torch without the legacy exporter: the torch.export-based one (needs onnxscript)
        batch = torch.export.Dim("batch")
        torch.onnx.export(net, (example,), str(out), dynamic_shapes=({0: batch},), external_data=False, **kwargs)
    onnx = require("onnx")
    onnx.checker.check_model(onnx.load(str(out)))


def load_runner(path: str | Path, manifest: dict[str, Any], threads: int = 1) -> Any:
    """The runner for ``manifest["backend"]``: onnxruntime or TorchScript."""
    if manifest["backend"] == "onnx":
        return OnnxRunner(path, manifest, threads)
    if manifest["backend"] == "torchscript":
        return TorchScriptRunner(path, manifest, threads)
    raise ValueError(f"backend {manifest['backend']!r} is unknown; expected 'onnx' or 'torchscript'.")


def check_export(out: Path, manifest: dict[str, Any], model: Any, num: int, seed: int) -> dict[str, Any]:
    """Compare the exported file (raw observations in) with SB3 (normalised by the run's statistics)
    on ``num`` observations; raise on disagreement."""
    if num <= 0:
        return {"num_observations": 0}
    obs = sample_observations(model, num, seed)
    norm = Normalization.from_manifest(manifest["normalization"])
    x = norm(obs) if norm is not None else obs
    expected_logits = sb3_logits(model, x)
    expected_action, _ = model.predict(x, deterministic=True)
    expected_action = np.asarray(expected_action).reshape(num, -1)
    runner = load_runner(out, manifest)
    outputs = runner.run(obs)
    got_logits, got_action = outputs[:-1], outputs[-1]
    # SB3's logits are log-softmax normalised; compare after centring each head on its own max
    diffs = [
        float(np.max(np.abs((g - g.max(1, keepdims=True)) - (e - e.max(1, keepdims=True)))))
        for g, e in zip(got_logits, expected_logits)
    ]
    agree = got_action == expected_action  # [num, H]
    gaps = [_top2_gap(e) for e in expected_logits]  # [num] each
    ties = np.stack([gap < 1e-5 for gap in gaps], axis=1)
    unexplained = int(np.sum(~agree & ~ties))
    if unexplained:
        raise RuntimeError(
            f"the exported {manifest['backend']} network disagrees with SB3 on {unexplained} of {num} observations "
            f"beyond float32 ties (max |logit difference| {max(diffs):.3g}); please report this with the policy."
        )
    return {
        "num_observations": num,
        "source": "uniform samples of the policy's observation space, normalised as in training",
        "max_abs_logit_diff": max(diffs),
        "action_agreement": float(np.mean(np.all(agree, axis=1))),
        "num_float32_ties": int(np.sum(~agree)),
    }


def _top2_gap(logits: np.ndarray) -> np.ndarray:
    """``[B]`` difference between the largest and second-largest logit of each row (inf for one column)."""
    if logits.shape[1] < 2:
        return np.full(logits.shape[0], np.inf)
    top = np.sort(logits, axis=1)
    return top[:, -1] - top[:, -2]
