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
values. Non-finite observations are refused: the policy would act on garbage. Step-level (``kind == "depth"``)
policies answer ``act_step(obs)``.

onnxruntime runs on one thread by default: a 2-layer MLP gains nothing from more, and a serving
process has better uses for its cores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from draftrl.deps import require
from draftrl.export.manifest import ACTION_NAME, INPUT_NAME, logits_name, read_manifest
from draftrl.export.runtime import ExportedPolicy


class OnnxRunner:
    """One onnxruntime session: ``run(x [B, F] float32) -> [*logits per head, action]``; ``x`` is
    the graph's input (raw observations, or normalised ones for exports whose manifest says so)."""

    def __init__(self, path: str | Path, manifest: dict[str, Any], threads: int = 1):
        ort = require("onnxruntime")
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
            raise ValueError(f"{path} lacks inputs/outputs {missing or [INPUT_NAME]}; "
                             "re-export it with draftrl export.")

    def run(self, x: np.ndarray) -> list[np.ndarray]:
        return self.session.run(self.output_names, {INPUT_NAME: x})

    def run_action(self, x: np.ndarray) -> np.ndarray:
        return self.session.run([ACTION_NAME], {INPUT_NAME: x})[0]


def embedded_manifest(path: str | Path) -> dict[str, Any]:
    """The manifest ``draftrl export`` embedded in an ONNX file's metadata (``draftrl.manifest``)."""
    import json

    from draftrl.export.manifest import FORMAT, check_fields

    ort = require("onnxruntime")
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
