"""``PolicyController``: run an exported drafting policy with numpy and onnxruntime only.

No stable-baselines3, no torch: a serving process loads ``FILE.onnx`` and its manifest
(``FILE.onnx.json``, see ``draftrl.export.manifest``) and asks, once per round::

    controller = PolicyController("policy.onnx")
    depth, verify_size = controller.act(obs)         # obs: [len(controller.feature_names)] float32
    settings = controller.act_batch(observations)    # [B, F] -> [B, 2] int64 (depth, verify_size)

``obs`` is the raw observation in ``controller.feature_names`` order (the training env's order;
``controller.observation({name: value})`` builds one by name). The exported graph applies the
training run's VecNormalize statistics exactly as SB3 does (exports made before it did are
normalised here from the manifest), runs the network and maps the argmax of each head to grid
values. Non-finite observations are refused: the policy would act on garbage. Step-level (``kind == "depth"``) policies answer ``act_step(obs)``.

onnxruntime runs on one thread by default: a 2-layer MLP gains nothing from more, and a serving
process has better uses for its cores.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from draftrl.export.manifest import ACTION_NAME, INPUT_NAME, Normalization, logits_name, read_manifest

INSTALL_HINT = 'run pip install "draftrl[export]"'


def _onnxruntime() -> Any:
    try:
        import onnxruntime
    except ImportError:
        raise ImportError(f"onnxruntime is not installed; {INSTALL_HINT}.") from None
    return onnxruntime


class OnnxRunner:
    """One onnxruntime session: ``run(x [B, F] float32) -> [*logits per head, action]``; ``x`` is
    the graph's input (raw observations, or normalised ones for exports whose manifest says so)."""

    def __init__(self, path: str | Path, manifest: dict[str, Any], threads: int = 1):
        ort = _onnxruntime()
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(threads)
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.log_severity_level = 3
        try:
            self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as err:  # onnxruntime's InvalidProtobuf / Fail / NoSuchFile: one line, never a traceback
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ValueError(f"{path} is not a loadable ONNX model ({reason}); re-export it with draftrl export "
                             "--format onnx.") from None
        self.output_names = [logits_name(h) for h in manifest["action"]["heads"]] + [ACTION_NAME]
        found = {o.name for o in self.session.get_outputs()}
        missing = [n for n in self.output_names if n not in found]
        if missing or self.session.get_inputs()[0].name != INPUT_NAME:
            raise ValueError(f"{path} lacks inputs/outputs {missing or [INPUT_NAME]}; re-export it with draftrl export.")

    def run(self, x: np.ndarray) -> list[np.ndarray]:
        return self.session.run(self.output_names, {INPUT_NAME: x})

    def run_action(self, x: np.ndarray) -> np.ndarray:
        return self.session.run([ACTION_NAME], {INPUT_NAME: x})[0]


def load_runner(path: str | Path, manifest: dict[str, Any], threads: int = 1) -> Any:
    """The runner for ``manifest["backend"]``; TorchScript imports torch (only then)."""
    if manifest["backend"] == "onnx":
        return OnnxRunner(path, manifest, threads)
    if manifest["backend"] == "torchscript":
        from draftrl.export.torchscript import TorchScriptRunner

        return TorchScriptRunner(path, manifest, threads)
    raise ValueError(f"backend {manifest['backend']!r} is unknown; expected 'onnx' or 'torchscript'.")


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

    def act_step(self, obs: np.ndarray) -> bool:
        """Step-level policies: True = draft one more level (CONTINUE), False = verify now (STOP)."""
        if self.kind != "depth":
            raise ValueError(f"this is a {self.kind!r} policy; use act() once per round.")
        return int(self.act_indices(np.asarray(obs).reshape(1, -1))[0, 0]) == self.continue_action

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r}, kind={self.kind!r}, features={len(self.feature_names)})"


def embedded_manifest(path: str | Path) -> dict[str, Any]:
    """The manifest ``draftrl export`` embedded in an ONNX file's metadata (``draftrl.manifest``)."""
    import json

    from draftrl.export.manifest import FORMAT, check_fields

    ort = _onnxruntime()
    try:
        meta = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).get_modelmeta().custom_metadata_map
    except Exception as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"{path} is not a loadable ONNX model ({reason}); re-export it with draftrl export "
                         "--format onnx.") from None
    try:
        manifest = json.loads(meta["draftrl.manifest"])
    except (KeyError, json.JSONDecodeError):
        raise FileNotFoundError(f"{path} carries no draftrl manifest and {Path(str(path) + '.json')} does not exist; "
                                "re-export the policy with draftrl export --format onnx.") from None
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path} embeds a manifest of format {manifest.get('format')!r}, expected {FORMAT!r}; "
                         "re-export the policy.")
    check_fields(manifest, f"embedded in {path}")
    return manifest


class PolicyController(ExportedPolicy):
    """An exported ONNX policy on onnxruntime (see the module docstring).

    :param path: the ``.onnx`` file written by ``draftrl export --format onnx``. Its manifest is
        ``path.json`` beside it, or, when that is missing, the copy embedded in the file's metadata
        (``draftrl.manifest``): the graph normalises its own input, so the file runs alone.
    :param threads: onnxruntime intra-op threads.
    :raises ImportError: when onnxruntime is not installed (with the install command).
    """

    def __init__(self, path: str | Path, *, threads: int = 1):
        try:
            manifest = read_manifest(path)
        except FileNotFoundError:
            if not Path(path).is_file():
                raise
            manifest = embedded_manifest(path)
        if manifest.get("backend") != "onnx":
            raise ValueError(
                f"{path} is a {manifest['backend']} export; PolicyController runs ONNX files "
                "(draftrl.export.torchscript.TorchScriptController runs TorchScript ones)."
            )
        super().__init__(path, OnnxRunner(path, manifest, threads), manifest)
