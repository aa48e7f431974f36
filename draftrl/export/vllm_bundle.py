"""``draftrl export RUN --format vllm --out DIR``: everything vLLM 0.32 needs to run a trained policy.

``DIR`` holds

- ``policy.onnx`` + ``policy.onnx.json``: the policy network and its manifest (feature order,
  normalisation, grids, training config; ``draftrl.export.network``);
- ``proposer.json``: the proposer's settings (the policy file, the step's depth cap and budget);
- ``vllm.json``: the ``speculative_config`` (``custom_class`` ->
  ``draftrl.export.vllm_proposer.PolicyProposer``), the environment variable that points the
  proposer at ``proposer.json``, and ready-to-run ``LLM(...)`` / ``vllm serve`` lines.

The proposer drafts with draftrl's n-gram drafter, so the policy must be a size policy trained
with ``drafter=ngram`` (``draftrl/TraceReplay-v0`` or ``SpecDecode-v1``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from draftrl.decoding.vllm.proposer import CONFIG_ENV
from draftrl.io import staged_files, write_json
from draftrl.export.vllm_proposer import CLASS_PATH

FORMAT = "draftrl-vllm-bundle/1"
VLLM_VERSION = "0.32.0"


def write_bundle(policy: str | Path, out: str | Path, *, model: str = "smollm2-135m", budget: int | None = None,
                 check_observations: int = 4096) -> dict[str, Any]:
    """Export ``policy`` (a ``draftrl train`` run, its ``policy.zip`` or a checkpoint) into ``out``.

    :param model: what ``vllm.json``'s example lines load (a known draftrl model or a directory).
    :param budget: the step's verification budget written to ``proposer.json`` (None = none).
    :returns: the ``vllm.json`` contents.
    """
    from draftrl.export.features import make_feature_builder, ngram_drafter
    from draftrl.export.network import export

    out = Path(out)
    with staged_files(out) as stage:  # a refused policy leaves nothing in ``out``
        manifest_file, manifest = export(policy, stage / "policy.onnx", "onnx", check_observations=check_observations)
        action = manifest["action"]
        if manifest.get("kind") != "size" or int(action.get("width", 1)) != 1:
            raise ValueError("vLLM drafts chains: export a size policy of width 1 (draftrl train with ppo_size).")
        entry = manifest.get("features") or {}
        make_feature_builder(entry, manifest["feature_names"])  # refuses policies no engine can feed
        ngram_drafter(str(entry.get("drafter") or "ngram"))
        depth = max(int(d) for d in action["depths"])
        if depth < 1:
            raise ValueError(f"the policy's depths {action['depths']} never speculate; nothing to run in vLLM.")
        proposer = {"policy": "policy.onnx", "depth": depth, "budget": budget}
        write_json(stage / "proposer.json", proposer)
        bundle = _bundle(out, model, proposer, manifest_file.name)
        write_json(stage / "vllm.json", bundle)
    return bundle


def _bundle(out: Path, model: str, proposer: dict[str, Any], manifest_name: str) -> dict[str, Any]:
    """``vllm.json``: the speculative config, the variable that points at ``proposer.json`` and ready lines."""
    depth = proposer["depth"]
    speculative = {"method": "custom_class", "model": CLASS_PATH, "num_speculative_tokens": depth}
    config_path = str((out / "proposer.json").resolve())
    spec_json = json.dumps(speculative)
    return {
        "format": FORMAT,
        "engine": "vllm",
        "engine_version": VLLM_VERSION,
        "speculative_config": speculative,
        "env": {CONFIG_ENV: config_path},
        "policy": "policy.onnx",
        "manifest": manifest_name,
        "proposer": proposer,
        "python": f"import os; os.environ[{CONFIG_ENV!r}] = {config_path!r}\n"
                  f"from vllm import LLM; llm = LLM(model=MODEL_DIR, speculative_config={spec_json})",
        "serve": f"{CONFIG_ENV}={config_path} vllm serve MODEL_DIR --speculative-config '{spec_json}'",
        "notes": [
            "draftrl must be importable where vLLM runs (pip install draftrl[export]: onnxruntime runs the policy).",
            f"MODEL_DIR: the model the policy was trained for ({model}); draftrl models fetch {model} converts it "
            "into draftrl's cache (draftrl.models.model_dir).",
            "Greedy outputs are unchanged by the policy (vLLM verifies every draft); check in float32.",
        ],
    }
