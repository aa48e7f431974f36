"""The manifest written beside every exported policy file: ``FILE.json`` (e.g. ``policy.onnx.json``).

Everything a runtime needs besides the network, and everything a reader needs to trust it::

    format            "draftrl-policy-export/1"
    backend           "onnx" | "torchscript"
    file              the network file's name (same directory)
    kind              "size" (MultiDiscrete [depth, verify_size]) | "depth" (Discrete(2) CONTINUE/STOP)
    env_id            the training env
    feature_names     the observation entries, in the order the network reads them
    normalization     {"mean", "var", "clip_obs", "epsilon"} of SB3's VecNormalize, or null:
                      x = clip((obs - mean) / sqrt(var + epsilon), -clip_obs, clip_obs) in float64,
                      then cast to float32 (SB3's own order of operations); the exported graph
                      computes it itself (``io.inputs[0].normalized`` is false), the entry is kept
                      for readers and for runtimes of older exports (``normalized`` true)
    action            {"heads": [...], "nvec": [...], "depths", "verify_sizes", "width",
                       "continue_action", "deterministic": how an action is chosen}
    io                {"inputs": [...], "outputs": [...]}: names, shapes ("batch" = any), dtypes
    features          the training env's observation settings (``draftrl.export.features``)
    train_config      the resolved TrainConfig of the run
    policy_manifest   the run's policy.json
    source            paths and sha256 of the policy zip, the VecNormalize file, the summary
    evaluation        the run's final evaluation of the policy (depth histogram, ...), or null
    versions          draftrl, torch, stable_baselines3, onnx, onnxruntime, numpy, python, opset
    check             export-time comparison with SB3 (observations, max |logit difference|, agreement)

ONNX exports also carry this manifest in their metadata (key ``draftrl.manifest``). Only json and
numpy are imported here: the runtime controller reads manifests too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "draftrl-policy-export/1"
#: ONNX / TorchScript input: the RAW observation, ``[batch, len(feature_names)]`` float32 (the graph
#: normalises it; exports whose manifest says ``normalized: true`` take the normalised one).
INPUT_NAME = "observation"
#: Output: the deterministic action, ``[batch, len(heads)]`` int64 (indices into the grids).
ACTION_NAME = "action"
#: Action heads by policy kind; output ``logits_<head>`` is ``[batch, nvec[i]]`` float32.
HEADS = {"size": ("depth", "verify_size"), "depth": ("continue",)}


def manifest_path(file: str | Path) -> Path:
    """``FILE.json`` beside ``FILE``."""
    file = Path(file)
    return file.with_name(file.name + ".json")


def logits_name(head: str) -> str:
    return f"logits_{head}"


def write_manifest(file: str | Path, manifest: dict[str, Any]) -> Path:
    """Write ``FILE.json`` atomically (refusing NaN: a manifest is read by other programs)."""
    from draftrl.io import atomic_write_text

    return atomic_write_text(manifest_path(file), json.dumps(manifest, indent=2, allow_nan=False) + "\n")


def read_manifest(file: str | Path) -> dict[str, Any]:
    """The manifest of an exported file (``FILE.json``).

    :raises FileNotFoundError: when the file or its manifest is missing.
    :raises ValueError: when the manifest has another format, or the policy reads the observation of a
        retired env id (before issue 45: train and export it again).
    """
    file = Path(file)
    path = manifest_path(file)
    if not file.is_file():
        raise FileNotFoundError(f"{file} does not exist; write it with `draftrl export DIR/policy.zip --out {file}`.")
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist; `draftrl export` writes it beside {file.name} (the network alone cannot be used: "
            "it needs the feature order, normalisation and grids)."
        )
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}); re-export the policy with draftrl export.") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        manifest = manifest if isinstance(manifest, dict) else {}
        raise ValueError(f"{path} has format {manifest.get('format')!r}, expected {FORMAT!r}; re-export the policy.")
    check_fields(manifest, path)
    from draftrl.signals.features import stale_features_message  # numpy only

    stale = stale_features_message(manifest["feature_names"], f"the policy exported to {file}")
    if stale is not None:
        raise ValueError(stale)
    return manifest


#: what a runtime reads from a manifest: top-level keys, and the keys of ``action``
REQUIRED = ("backend", "kind", "feature_names", "normalization", "action", "io")
REQUIRED_ACTION = ("heads", "nvec", "depths", "verify_sizes")


def check_fields(manifest: dict[str, Any], where: str | Path) -> None:
    """Raise one ``ValueError`` line naming the first field a runtime needs that is missing."""
    missing = [k for k in REQUIRED if k not in manifest]
    if not missing and isinstance(manifest["action"], dict):
        missing = [f"action.{k}" for k in REQUIRED_ACTION if k not in manifest["action"]]
    elif not missing:
        missing = ["action"]
    if missing:
        raise ValueError(f"the manifest {where} lacks or mangles {missing[0]!r}; re-export the policy with "
                         "draftrl export.")


@dataclass(frozen=True)
class Normalization:
    """SB3 ``VecNormalize`` observation normalisation, reproduced operation for operation."""

    mean: np.ndarray
    """[F] float64"""
    std: np.ndarray
    """[F] float64: sqrt(var + epsilon), computed once"""
    clip_obs: float

    @classmethod
    def from_manifest(cls, entry: dict[str, Any] | None) -> Normalization | None:
        if entry is None:
            return None
        mean = np.asarray(entry["mean"], dtype=np.float64)
        var = np.asarray(entry["var"], dtype=np.float64)
        return cls(mean=mean, std=np.sqrt(var + float(entry["epsilon"])), clip_obs=float(entry["clip_obs"]))

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """``[..., F]`` observations (any float dtype) -> normalised float32, as SB3 computes them."""
        return np.clip((obs - self.mean) / self.std, -self.clip_obs, self.clip_obs).astype(np.float32)
