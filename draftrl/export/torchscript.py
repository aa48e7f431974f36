"""TorchScript runtime of an exported policy (``draftrl export --format torchscript``).

For processes that already hold torch (a serving engine's worker): same manifest, same
normalisation and action decoding as :class:`draftrl.export.controller.PolicyController`, the
network run by ``torch.jit.load``. The ONNX controller is the torch-free option.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from draftrl.export.manifest import read_manifest
from draftrl.export.runtime import ExportedPolicy


class TorchScriptRunner:
    """``run(x [B, F] float32) -> [*logits per head, action]`` with a traced module."""

    def __init__(self, path: str | Path, manifest: dict[str, Any], threads: int | None = None):
        try:
            self.module = torch.jit.load(str(path), map_location="cpu").eval()
        except Exception as err:  # RuntimeError from a file that is not TorchScript
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ValueError(f"{path} is not a loadable TorchScript module ({reason}); re-export it with draftrl "
                             "export --format torchscript.") from None

    def _run(self, x: np.ndarray) -> tuple[torch.Tensor, ...]:
        with torch.inference_mode():
            return self.module(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)))

    def run(self, x: np.ndarray) -> list[np.ndarray]:
        return [t.numpy() for t in self._run(x)]

    def run_action(self, x: np.ndarray) -> np.ndarray:
        return self._run(x)[-1].numpy()


class TorchScriptController(ExportedPolicy):
    """An exported TorchScript policy: ``act(obs)``, ``act_batch(obs)``, ``act_step(obs)``.

    :param path: the ``.pt`` file written by ``draftrl export --format torchscript``. The module
        runs on torch's process-wide thread pool (``torch.set_num_threads``), which this class
        leaves alone.
    """

    def __init__(self, path: str | Path):
        manifest = read_manifest(path)
        if manifest["backend"] != "torchscript":
            raise ValueError(f"{path} is a {manifest['backend']} export; TorchScriptController runs TorchScript files.")
        super().__init__(path, TorchScriptRunner(path, manifest), manifest)
