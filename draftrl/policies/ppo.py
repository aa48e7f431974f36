"""A trained SB3 PPO policy behind the ``Policy`` interface.

A saved policy is a directory with three files (``draftrl train`` writes them):

- ``policy.zip``: the SB3 ``PPO`` model (``PPO.save``);
- ``vecnormalize.pkl``: SB3 ``VecNormalize`` observation statistics, when training normalised
  observations (absent otherwise);
- ``policy.json``: the manifest: ``kind`` (``"size"``: ``MultiDiscrete([len(depths),
  len(verify_sizes)])`` actions; ``"depth"``: ``Discrete(2)`` CONTINUE/STOP), ``env_id``,
  ``depths``, ``verify_sizes``, ``feature_names`` (the order the network reads), and for depth
  policies ``continue_action`` (the ``Discrete(2)`` action meaning CONTINUE).

``PPOPolicy`` gathers the network's inputs by feature name from whatever order the env uses, so a
policy keeps working when an env adds or reorders features; a missing feature is an error. The
network runs on the CPU (SB3's advice for MLP policies), wherever the models run.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from draftrl.policies.base import CONTINUE, STOP, Policy, env_grids
from draftrl.runs import MANIFEST_FILE, policy_files

KINDS = ("size", "depth")


def write_manifest(
    directory: str | Path,
    *,
    kind: str,
    env_id: str,
    depths: Sequence[int],
    verify_sizes: Sequence[int],
    feature_names: Sequence[str],
    continue_action: int = 1,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``policy.json`` next to ``policy.zip``; returns its path."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} must be one of {KINDS}.")
    manifest = {
        "kind": kind,
        "env_id": env_id,
        "depths": [int(d) for d in depths],
        "verify_sizes": [int(v) for v in verify_sizes],
        "feature_names": list(feature_names),
        "continue_action": int(continue_action),
        **(extra or {}),
    }
    path = Path(directory) / MANIFEST_FILE
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    return path


class PPOPolicy(Policy):
    """A loaded PPO model acting deterministically (the mode of its action distribution).

    Build it with ``PPOPolicy.load(path, env)``.

    :param model: the SB3 ``PPO`` model.
    :param manifest: the saved manifest (see the module docstring).
    :param feature_names: the feature order of the observations ``act`` will receive.
    :param obs_normalizer: the SB3 ``VecNormalize`` holding observation statistics, or None.
    """

    def __init__(
        self,
        model: Any,
        manifest: dict[str, Any],
        feature_names: Sequence[str] | None = None,
        obs_normalizer: Any = None,
        name: str = "ppo",
    ):
        names = tuple(manifest["feature_names"]) if feature_names is None else tuple(feature_names)
        super().__init__(manifest["depths"], manifest["verify_sizes"], names)
        self.model = model
        self.manifest = manifest
        self.kind = manifest["kind"]
        self.trained_feature_names = tuple(manifest["feature_names"])
        missing = [f for f in self.trained_feature_names if not self.has_feature(f)]
        if missing:
            raise ValueError(
                f"the policy reads features {missing} that the env does not provide; it was trained on "
                f"{manifest.get('env_id')} with features {list(self.trained_feature_names)}."
            )
        self._gather = np.array([self.require_feature(f) for f in self.trained_feature_names])
        self.obs_normalizer = obs_normalizer
        if obs_normalizer is not None:
            obs_normalizer.training = False
        self.continue_action = int(manifest.get("continue_action", 1))
        self.name = name

    @classmethod
    def load(
        cls, path: str | Path, env: Any = None, name: str = "ppo", feature_names: Sequence[str] | None = None
    ) -> PPOPolicy:
        """Load a saved policy (a run directory, its ``policy.zip`` or a checkpoint zip, with the
        statistics saved with it), checked against ``env``'s grids.

        :param env: the env it will act on (grids checked, features gathered by name).
        :param feature_names: instead of ``env``: the feature order of the observations it will
            receive, without a grid check (a frozen size policy inside a depth env).
        :raises FileNotFoundError: when ``policy.zip`` or ``policy.json`` is missing.
        :raises ValueError: when ``env``'s depths or verify sizes differ from the policy's.
        """
        from stable_baselines3 import PPO

        model_path, vecnorm_path, manifest_path = policy_files(path)
        for required in (model_path, manifest_path):
            if not required.is_file():
                raise FileNotFoundError(f"{required} does not exist; point at a directory written by draftrl train.")
        manifest = json.loads(manifest_path.read_text())
        model = PPO.load(model_path, device="cpu")
        normalizer = None
        if vecnorm_path.is_file():
            with vecnorm_path.open("rb") as f:
                normalizer = pickle.load(f)  # VecNormalize without its venv: only the statistics are used
        if env is not None:
            depths, verify_sizes, feature_names = env_grids(env)
            if list(depths) != manifest["depths"] or list(verify_sizes) != manifest["verify_sizes"]:
                raise ValueError(
                    f"the policy was trained for depths={manifest['depths']}, verify_sizes={manifest['verify_sizes']} "
                    f"but the env offers depths={list(depths)}, verify_sizes={list(verify_sizes)}; "
                    "make the env with the training grids."
                )
        return cls(model, manifest, feature_names, normalizer, name=name)

    def network_input(self, observation: np.ndarray) -> np.ndarray:
        """The (normalised) observation in training feature order, ``[len(trained_feature_names)]`` float32."""
        x = np.asarray(observation, dtype=np.float32).reshape(-1)[self._gather]
        if self.obs_normalizer is not None:
            x = self.obs_normalizer.normalize_obs(x)
        return np.asarray(x, dtype=np.float32)

    def _predict(self, observation: np.ndarray) -> np.ndarray:
        action, _ = self.model.policy.predict(self.network_input(observation), deterministic=True)
        return np.asarray(action).reshape(-1)

    def act(self, observation: np.ndarray) -> tuple[int, int]:
        if self.kind != "size":
            raise ValueError(f"this PPO policy is a {self.kind!r} policy; use act_step() on a step-level env.")
        return self.from_action(self._predict(observation))

    def act_step(self, observation: np.ndarray) -> int:
        if self.kind != "depth":
            raise ValueError(f"this PPO policy is a {self.kind!r} policy; use act() on a round-level env.")
        return CONTINUE if int(self._predict(observation)[0]) == self.continue_action else STOP
