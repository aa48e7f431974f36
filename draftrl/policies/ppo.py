"""A trained SB3 PPO policy behind the ``Policy`` interface.

A saved policy is a directory with three files (``draftrl train`` writes them):

- ``policy.zip``: the SB3 ``PPO`` model (``PPO.save``);
- ``vecnormalize.pkl``: SB3 ``VecNormalize`` observation statistics, when training normalised
  observations (absent otherwise);
- ``policy.json``: the manifest: ``kind`` (``"size"``: ``MultiDiscrete([len(depths),
  len(verify_sizes)])`` actions; ``"depth"``: ``Discrete(2)`` CONTINUE/STOP), ``env_id``,
  ``depths``, ``verify_sizes``, ``feature_names`` (the order the network reads), and for depth
  policies ``continue_action`` (the ``Discrete(2)`` action meaning CONTINUE), and ``files``: the
  sha256 of ``policy.zip`` and ``vecnormalize.pkl`` (null when training did not write it).

The three files are checked together on every load (``load_checked``): a missing or foreign
normaliser, a grid that does not match the network's output size, a feature list that does not
match its input size, a missing manifest field, or a policy trained on a retired env id (its
observation changed: ``draftrl.envs.ids.RETIRED``, issue 45) is a one-line error naming the file and
the fix.

``PPOPolicy`` gathers the network's inputs by feature name from whatever order the env uses, so a
policy keeps working when an env adds or reorders features; a missing feature is an error. The
network runs on the CPU (SB3's advice for MLP policies), wherever the models run.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from draftrl.envs.ids import retired_message
from draftrl.policies.base import CONTINUE, STOP, Policy, env_grids
from draftrl.runs import CONFIG_FILE, MANIFEST_FILE, POLICY_FILE, VECNORMALIZE_FILE, policy_files
from draftrl.signals.features import stale_features_message

KINDS = ("size", "depth")
#: manifest fields every reader needs
REQUIRED_FIELDS = ("kind", "depths", "verify_sizes", "feature_names")


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
    """Write ``policy.json`` next to ``policy.zip`` (after it and ``vecnormalize.pkl``); returns its path.

    The manifest records the sha256 of both files, so a reader notices a model or normaliser
    from another run (or a missing normaliser)."""
    from draftrl.io import write_json

    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} must be one of {KINDS}.")
    directory = Path(directory)
    manifest = {
        "kind": kind,
        "env_id": env_id,
        "depths": [int(d) for d in depths],
        "verify_sizes": [int(v) for v in verify_sizes],
        "feature_names": list(feature_names),
        "continue_action": int(continue_action),
        **(extra or {}),
        "files": {name: _sha256(directory / name) if (directory / name).is_file() else None
                  for name in (POLICY_FILE, VECNORMALIZE_FILE)},
    }
    return write_json(directory / MANIFEST_FILE, manifest)


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def read_policy_manifest(path: str | Path) -> dict[str, Any]:
    """``policy.json`` with its required fields checked (one-line errors naming the file and the fix)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; point at a directory written by draftrl train.")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}); restore it from the run or train again.") from None
    if not isinstance(manifest, dict):
        raise ValueError(f"{path} must hold a JSON object; restore it from the run or train again.")
    missing = [k for k in REQUIRED_FIELDS if k not in manifest]
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}; restore it from the run directory draftrl train wrote.")
    if manifest["kind"] not in KINDS:
        raise ValueError(f"{path} has kind={manifest['kind']!r}; expected one of {KINDS}. Restore it from the run.")
    retired = retired_message(str(manifest.get("env_id")), f"{path}: env_id")
    if retired is not None:
        raise ValueError(retired)
    stale = stale_features_message(manifest["feature_names"], f"the policy of {path}")
    if stale is not None:
        raise ValueError(stale)
    return manifest


def check_policy_files(manifest: dict[str, Any], manifest_path: Path, model_path: Path,
                       vecnorm_path: Path | None, *, run_config: dict[str, Any] | None = None) -> None:
    """Refuse a model or normaliser that does not belong to ``manifest``, or a missing normaliser.

    :param vecnorm_path: the normaliser saved with this model (None: none found beside it).
    :param run_config: the run's ``config.json`` (consulted for manifests without ``files``).
    :raises FileNotFoundError: a normaliser the run wrote is missing.
    :raises ValueError: a file's sha256 differs from the one the manifest recorded.
    """
    files = manifest.get("files")
    is_final = model_path.name == POLICY_FILE and model_path.parent == manifest_path.parent
    if files is not None:
        normalised = files.get(VECNORMALIZE_FILE) is not None
    else:  # a manifest written before ``files``: the run's config says whether it normalised
        normalised = bool(((run_config or {}).get("ppo") or {}).get("normalize_obs"))
    if normalised and vecnorm_path is None:
        expected = manifest_path.parent / VECNORMALIZE_FILE if is_final else model_path
        raise FileNotFoundError(
            f"the policy was trained on normalised observations (ppo.normalize_obs) but no VecNormalize statistics "
            f"lie beside {expected} "
            f"({VECNORMALIZE_FILE} for policy.zip, ppo_vecnormalize_<steps>_steps.pkl for a checkpoint); restore it "
            "from the run directory or train again."
        )
    if files is None or not is_final:  # checkpoints are not in the manifest
        return
    for name, path in ((POLICY_FILE, model_path), (VECNORMALIZE_FILE, vecnorm_path)):
        recorded = files.get(name)
        if recorded is None and path is not None and name == VECNORMALIZE_FILE:
            raise ValueError(f"{path} does not belong to this policy ({manifest_path.name} records no normaliser); "
                             f"delete it or restore the run's files together.")
        if recorded is not None and path is not None and _sha256(path) != recorded:
            raise ValueError(f"{path} does not match {manifest_path} (sha256 differs: changed, truncated or from "
                             "another run); restore policy.zip, vecnormalize.pkl and policy.json from one run "
                             "directory.")


def load_sb3_model(path: Path) -> Any:
    """``PPO.load(path)`` on the CPU, with a damaged file reported in one line."""
    from stable_baselines3 import PPO

    try:
        return PPO.load(path, device="cpu")
    except Exception as err:  # zipfile.BadZipFile, EOFError, KeyError, pickle/torch errors: all mean "damaged"
        raise ValueError(f"{path} is not a readable SB3 PPO model ({type(err).__name__}: {err}); restore it "
                         "from the run directory or train again.") from None


def load_normalizer_file(path: Path) -> Any:
    """SB3 ``VecNormalize`` statistics pickled without their venv, with a damaged file reported in one line."""
    try:
        with Path(path).open("rb") as f:
            normalizer = pickle.load(f)
    except Exception as err:  # UnpicklingError, EOFError, ...
        raise ValueError(f"{path} is not readable VecNormalize statistics ({type(err).__name__}: {err}); restore "
                         "it from the run directory or train again.") from None
    if not hasattr(normalizer, "normalize_obs"):
        raise ValueError(f"{path} holds a {type(normalizer).__name__}, not VecNormalize statistics; restore it.")
    return normalizer


def check_network(model: Any, manifest: dict[str, Any], manifest_path: Path, model_path: Path) -> None:
    """Refuse a network whose input or output size contradicts the manifest's features or grids."""
    from gymnasium import spaces

    space = model.action_space
    nvec = [int(n) for n in space.nvec] if isinstance(space, spaces.MultiDiscrete) else (
        [int(space.n)] if isinstance(space, spaces.Discrete) else None)
    expected = [len(manifest["depths"]), len(manifest["verify_sizes"])] if manifest["kind"] == "size" else [2]
    if nvec != expected:
        raise ValueError(
            f"{manifest_path} describes a {manifest['kind']} policy over depths={manifest['depths']}, "
            f"verify_sizes={manifest['verify_sizes']} (outputs {expected}) but {model_path} outputs {nvec}; "
            "restore the policy.json of the run that trained this model."
        )
    num_inputs = int(np.prod(model.observation_space.shape))
    if num_inputs != len(manifest["feature_names"]):
        raise ValueError(
            f"{manifest_path} names {len(manifest['feature_names'])} features but {model_path} reads {num_inputs} "
            "inputs; restore the policy.json of the run that trained this model."
        )


def load_checked(path: str | Path) -> tuple[Any, dict[str, Any], Any]:
    """``(SB3 model, manifest, VecNormalize or None)`` of a saved policy, every file checked against the others."""
    model_path, vecnorm_path, manifest_path = policy_files(path)
    if not model_path.is_file():
        raise FileNotFoundError(f"{model_path} does not exist; point at a directory written by draftrl train.")
    manifest = read_policy_manifest(manifest_path)
    run_config_path = manifest_path.parent / CONFIG_FILE
    try:
        run_config = json.loads(run_config_path.read_text()) if run_config_path.is_file() else None
    except json.JSONDecodeError:
        run_config = None
    found = vecnorm_path if vecnorm_path.is_file() else None
    check_policy_files(manifest, manifest_path, model_path, found, run_config=run_config)
    model = load_sb3_model(model_path)
    check_network(model, manifest, manifest_path, model_path)
    normalizer = load_normalizer_file(found) if found is not None else None
    return model, manifest, normalizer


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
        :raises FileNotFoundError: when ``policy.zip``, ``policy.json`` or a normaliser the run wrote is missing.
        :raises ValueError: when ``env``'s depths or verify sizes differ from the policy's, or the files
            contradict each other (see ``load_checked``).
        """
        model, manifest, normalizer = load_checked(path)
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
