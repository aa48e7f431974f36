"""``ExportedPolicy``: what every runtime of an exported policy shares (numpy only).

Input checks (shape, finite values), normalisation, feature order, grids and action decoding, read
from the manifest; the network is run by a *runner* with ``run(x) -> [*logits per head, action]``
and ``run_action(x)``, where ``x`` is the graph's input (raw observations for graphs that
normalise, else normalised ones):
onnxruntime (``draftrl.export.controller``) or TorchScript (``draftrl.export.torchscript``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from draftrl.export.manifest import Normalization


class ExportedPolicy:
    """What every runtime shares: input checks, feature order, grids, action decoding."""

    def __init__(self, path: str | Path, runner: Any, manifest: dict[str, Any]):
        self.path = Path(path)
        self.manifest = manifest
        self.runner = runner
        try:
            self.kind: str = manifest["kind"]
            self.feature_names: tuple[str, ...] = tuple(manifest["feature_names"])
            self.normalization = Normalization.from_manifest(manifest["normalization"])
            inputs = manifest["io"]["inputs"]
            action = manifest["action"]
            self.heads: tuple[str, ...] = tuple(action["heads"])
            self.depths: tuple[int, ...] = tuple(int(d) for d in action["depths"])
            self.verify_sizes: tuple[int, ...] = tuple(int(v) for v in action["verify_sizes"])
            nvec = [int(n) for n in action["nvec"]]
        except (KeyError, TypeError) as err:
            raise ValueError(f"the manifest of {path} lacks or mangles {err}; re-export the policy with draftrl "
                             "export.") from None
        self.num_features = len(self.feature_names)
        #: the graph normalises raw observations itself (exports since the graph carries the statistics)
        self.graph_normalizes = not inputs[0].get("normalized", True)
        expected = [len(self.depths), len(self.verify_sizes)] if self.kind == "size" else [2]
        if nvec != expected or len(self.heads) != len(nvec):
            raise ValueError(
                f"the manifest of {path} lists depths={list(self.depths)}, verify_sizes={list(self.verify_sizes)} "
                f"but the network outputs {nvec}; re-export the policy with draftrl export."
            )
        self.width = int(action.get("width", 1))
        self.continue_action = int(action.get("continue_action", 1))
        self._depth_values = np.asarray(self.depths, dtype=np.int64)
        self._verify_values = np.asarray(self.verify_sizes, dtype=np.int64)
        self._index = {name: i for i, name in enumerate(self.feature_names)}

    # ------------------------------------------------------------------ inputs
    def observation(self, features: Mapping[str, float]) -> np.ndarray:
        """A ``[F]`` float32 observation from ``{feature name: value}``; every feature must be given."""
        missing = [n for n in self.feature_names if n not in features]
        if missing:
            raise ValueError(f"features {missing} are missing; the policy reads {list(self.feature_names)}.")
        return np.asarray([features[n] for n in self.feature_names], dtype=np.float32)

    def _checked(self, obs: np.ndarray) -> np.ndarray:
        obs = np.asarray(obs)
        if obs.ndim != 2 or obs.shape[1] != self.num_features:
            raise ValueError(
                f"observations have shape {obs.shape}, expected [batch, {self.num_features}] with features "
                f"{list(self.feature_names)}."
            )
        bad = ~np.isfinite(obs)
        if bad.any():
            names = sorted({self.feature_names[j] for j in np.nonzero(bad)[1]})
            raise ValueError(f"observation features {names} are not finite (NaN or inf); the policy cannot act on "
                             "them: fix the feature values the caller passes.")
        return obs

    def normalize(self, obs: np.ndarray) -> np.ndarray:
        """``[B, F]`` raw observations -> the network's float32 input (SB3's VecNormalize, if trained with it),
        computed in numpy from the manifest (the graph computes the same when ``graph_normalizes``)."""
        obs = self._checked(obs)
        if self.normalization is None:
            return obs.astype(np.float32, copy=False)
        return self.normalization(obs)

    def graph_input(self, obs: np.ndarray) -> np.ndarray:
        """What the exported graph takes for raw observations ``[B, F]``: them (checked), or their
        normalisation for exports whose graph does not normalise."""
        if self.graph_normalizes:
            return self._checked(obs).astype(np.float32, copy=False)
        return self.normalize(obs)

    # ------------------------------------------------------------------ outputs
    def logits(self, obs: np.ndarray) -> dict[str, np.ndarray]:
        """``{head: [B, nvec] logits}`` for raw observations ``[F]`` or ``[B, F]``."""
        outputs = self.runner.run(self.graph_input(np.atleast_2d(obs)))
        return {head: out for head, out in zip(self.heads, outputs[:-1])}

    def act_indices(self, obs: np.ndarray) -> np.ndarray:
        """``[B, heads]`` int64 action indices for raw observations ``[F]`` or ``[B, F]``."""
        return np.asarray(self.runner.run_action(self.graph_input(np.atleast_2d(obs))), dtype=np.int64)

    def act(self, obs: np.ndarray) -> tuple[int, int]:
        """This round's ``(depth, verify_size)`` for one raw observation ``[F]``."""
        if self.kind != "size":
            raise ValueError(f"this is a {self.kind!r} policy; use act_step() after each draft level.")
        a = self.act_indices(np.asarray(obs).reshape(1, -1))[0]
        return self.depths[a[0]], self.verify_sizes[a[1]]

    def act_batch(self, obs: np.ndarray) -> np.ndarray:
        """``[B, 2]`` int64 ``(depth, verify_size)`` values for raw observations ``[B, F]``."""
        if self.kind != "size":
            raise ValueError(f"this is a {self.kind!r} policy; use act_step() after each draft level.")
        a = self.act_indices(obs)
        return np.stack([self._depth_values[a[:, 0]], self._verify_values[a[:, 1]]], axis=1)

    def act_step(self, obs: np.ndarray) -> int:
        """Step-level policies: 1 = draft one more level (CONTINUE), 0 = verify now (STOP), the depth envs' actions."""
        if self.kind != "depth":
            raise ValueError(f"this is a {self.kind!r} policy; use act() once per round.")
        return int(int(self.act_indices(np.asarray(obs).reshape(1, -1))[0, 0]) == self.continue_action)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r}, kind={self.kind!r}, features={len(self.feature_names)})"
