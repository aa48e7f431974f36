"""``PolicyController``: run an exported drafting policy with numpy and onnxruntime only.

No stable-baselines3, no torch: a serving process loads ``FILE.onnx`` and its manifest
(``FILE.onnx.json``, see ``draftrl.export.manifest``) and asks, once per round::

    controller = PolicyController("policy.onnx")
    depth, verify_size = controller.act(obs)         # obs: [len(controller.feature_names)] float32
    settings = controller.act_batch(observations)    # [B, F] -> [B, 2] int64 (depth, verify_size)

``obs`` is the raw observation in ``controller.feature_names`` order (the training env's order;
``controller.observation({name: value})`` builds one by name). The controller applies the
training run's VecNormalize statistics exactly as SB3 does, runs the network and maps the argmax
of each head to grid values. Step-level (``kind == "depth"``) policies answer ``act_step(obs)``.

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
    """One onnxruntime session: ``run_normalized(x [B, F] float32) -> [*logits per head, action]``."""

    def __init__(self, path: str | Path, manifest: dict[str, Any], threads: int = 1):
        ort = require("onnxruntime")
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(threads)
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.log_severity_level = 3
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.output_names = [logits_name(h) for h in manifest["action"]["heads"]] + [ACTION_NAME]
        found = {o.name for o in self.session.get_outputs()}
        missing = [n for n in self.output_names if n not in found]
        if missing or self.session.get_inputs()[0].name != INPUT_NAME:
            raise ValueError(f"{path} lacks inputs/outputs {missing or [INPUT_NAME]}; re-export it with draftrl export.")

    def run_normalized(self, x: np.ndarray) -> list[np.ndarray]:
        return self.session.run(self.output_names, {INPUT_NAME: x})

    def run_action(self, x: np.ndarray) -> np.ndarray:
        return self.session.run([ACTION_NAME], {INPUT_NAME: x})[0]


class PolicyController(ExportedPolicy):
    """An exported ONNX policy on onnxruntime (see the module docstring).

    :param path: the ``.onnx`` file written by ``draftrl export --format onnx``; its manifest
        ``path.json`` must sit beside it.
    :param threads: onnxruntime intra-op threads.
    :raises ImportError: when onnxruntime is not installed (with the install command).
    """

    def __init__(self, path: str | Path, *, threads: int = 1):
        manifest = read_manifest(path)
        if manifest["backend"] != "onnx":
            raise ValueError(
                f"{path} is a {manifest['backend']} export; PolicyController runs ONNX files "
                "(draftrl.export.torchscript.TorchScriptController runs TorchScript ones)."
            )
        super().__init__(path, OnnxRunner(path, manifest, threads), manifest)
