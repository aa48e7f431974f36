"""Static speculation configs for engines without a per-round hook: vLLM and SGLang.

A serving engine that cannot ask a policy every round gets the policy summarised:

1. **Depth at batch size 1** (``k1``): the median of the depths the policy chose, per round,
   in the run's final evaluation (``train_summary.json``; or a fresh rollout when the summary is
   missing). The histogram, mean and mode are recorded too.
2. **Depth at batch size B** (``k(B)``): ``k1`` carried to batch B by the factor ``k*(B) / k*(1)``
   of the batch cost model (:mod:`draftrl.signals.batch_scaling`, which states the model), snapped
   down to the policy's grid and non-increasing in B: the policy decides batch 1, the cost model
   decides by which factor larger batches go shallower (to 0 once ``k*(B) = 0``: speculation off).
   ``alpha`` is fitted to the policy's own evaluation (mean tokens per round given its depth
   histogram, i.i.d. acceptance); ``c`` and ``g`` come from the training env (the analytic env's
   ``draft_cost`` / ``verify_cost``, or the cost table), or from a table ``draftrl calibrate``
   measured (``cost_table``); a run with no costs is refused, never given defaults. The
   saturation size ``S`` is an input (``--saturation-tokens``, default 256 tokens: calibrate it on
   the serving GPU).
3. **Engine keys**: vLLM ``speculative_config`` (``num_speculative_tokens = k1`` and
   ``num_speculative_tokens_per_batch_size = [[start_bs, end_bs, k], ...]``, vLLM's dynamic
   speculative decoding table; the method follows the training drafter: ``ngram`` for n-gram
   lookup, ``eagle3`` with the head folder for ``eagle3`` and ``sam`` drafters), plus a ``custom_class``
   variant that runs the policy itself (draftrl's proposer with the controller
   ``draftrl.export.vllm_control.RequestPolicyControl``); SGLang server arguments (``speculative_num_steps``,
   ``speculative_eagle_topk``, ``speculative_num_draft_tokens``) and an adaptive config
   (``speculative_adaptive_config``: per-batch-size tiers of ``candidate_steps``: the depths the
   policy uses in at least ``min_share`` of rounds, plus ``k(B)``, under a ceiling that follows
   the same rule from the deepest of them).

The same factor applied to the grid's maximum depth (``policy_cap_by_batch``)
caps the policy itself when it runs inside vLLM (``RequestPolicyControl``'s ``depth_by_batch``).

The static vLLM keys follow vLLM 0.32's config (vllm/config/speculative.py); SGLang's its documentation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from draftrl.export.artifacts import TrainedPolicy, resolve
from draftrl.export.features import (
    SERVING_BUILDER,
    env_config_of,
    env_section,
    feature_builder,
    features_entry,
    serve_config_of,
)
from draftrl.signals.batch_scaling import (
    DEFAULT_SATURATION_TOKENS,
    RULE,
    depth_by_batch,
    depth_scale,
    fit_alpha,
    relative_costs,
)
from draftrl.signals.costs import CostTable
from draftrl.signals.speedup import DRAFT_COST, VERIFY_COST, verify_cost_table

FORMAT = "draftrl-engine-config/1"
#: vLLM release whose custom_class proposer interface and config keys the vLLM outputs target.
VLLM_VERSION = "0.32.0"
#: SGLang release family whose adaptive speculation keys (speculative_adaptive_config) the outputs target.
SGLANG_VERSION = "main as of 2026 (speculative_adaptive, speculative_adaptive_config)"
#: the class the ``custom_class`` variant names (its ``proposer.json`` names the controller)
PROPOSER_CLASS = "draftrl.decoding.vllm.proposer.DraftrlProposer"
#: Batch sizes the SGLang tiers and the vLLM table are evaluated on (up to ``max_batch_size``).
DEFAULT_MAX_BATCH = 512


# ----------------------------------------------------------------------------- the policy's depths
def depth_statistics(trained: TrainedPolicy, episodes: int = 20, seed: int = 0) -> dict[str, Any]:
    """The policy's per-round depth histogram and mean tokens per round.

    From the run's final evaluation when the summary has one, else from ``episodes`` fresh
    episodes of the training env (``PPOPolicy`` with SB3; the env is made as training made it).
    """
    evaluation = trained.evaluation()
    source = "train_summary.json evaluation"
    if not evaluation or not evaluation.get("depth_histogram"):
        evaluation = _rollout(trained, episodes, seed)
        source = f"rollout of {episodes} episodes of {trained.env_id}"
    hist = {int(k): int(v) for k, v in evaluation["depth_histogram"].items() if int(v) > 0}
    vhist = {int(k): int(v) for k, v in (evaluation.get("verify_size_histogram") or {}).items() if int(v) > 0}
    return {
        "source": source,
        "depth_histogram": dict(sorted(hist.items())),
        "verify_size_histogram": dict(sorted(vhist.items())),
        "num_rounds": int(sum(hist.values())),
        "mean_tokens_per_round": float(evaluation["mean_tokens_per_round"]),
    }


def _rollout(trained: TrainedPolicy, episodes: int, seed: int) -> dict[str, Any]:
    from draftrl.policies.evaluate import evaluate_saved_policy

    section = env_section(trained.train_config, trained.env_id, evaluation=True)
    # a checkpoint's own normaliser statistics, not the final ones
    return evaluate_saved_policy(trained.model_path, section, episodes=episodes, seed=seed)


def run_target(trained: TrainedPolicy) -> str:
    """The target a trained policy was trained for (its training env's ``target``; a serving env's
    is in its ``serve`` section)."""
    section = env_section(trained.train_config, trained.env_id)
    serving = feature_builder(trained.feature_names) == SERVING_BUILDER
    return str(serve_config_of(section).target if serving else env_config_of(section).target)


def weighted_median(hist: Mapping[int, int]) -> int:
    """The smallest depth with at least half of the rounds at or below it."""
    total = sum(hist.values())
    running = 0
    for depth in sorted(hist):
        running += hist[depth]
        if 2 * running >= total:
            return int(depth)
    return 0


# ----------------------------------------------------------------------------- cost model
def training_costs(trained: TrainedPolicy, max_depth: int, cost_table: str | Path | None = None) -> dict[str, Any]:
    """``{"draft_cost": c, "verify_cost": [g(0)=1, g(1), ..., g(max_depth)], "source"}``: from
    ``cost_table`` (a table ``draftrl calibrate`` measured) when given, else the training env's
    (the analytic env's cost model, or the cost table its engine env read).

    :raises ValueError: the run has no measured costs (and no ``cost_table``): a default would
        decide how the depth shrinks with the batch without any measurement behind it.
    """
    if cost_table is not None:
        t = CostTable.load(cost_table)
        width = int(features_entry(trained.train_config, trained.env_id, trained.feature_names,
                                   trained.run_dir).get("width") or 1) if trained.env_id != "draftrl/Analytic-v0" else 1
        c, g = relative_costs(t, width, max_depth)
        return {"draft_cost": c, "verify_cost": g, "source": f"{cost_table} at context {np.median(t.context_lens):.0f}"}
    if trained.env_id == "draftrl/Analytic-v0":
        analytic = env_section(trained.train_config, trained.env_id).get("analytic") or {}
        kwargs = {key: value for key, value in analytic.items() if value is not None}
        c = float(kwargs.get("draft_cost", DRAFT_COST))
        g = verify_cost_table(kwargs.get("verify_cost", VERIFY_COST), max_depth, "the policy's depths").tolist()
        return {"draft_cost": c, "verify_cost": g, "source": "analytic env (draft_cost, verify_cost)"}
    entry = features_entry(trained.train_config, trained.env_id, trained.feature_names, trained.run_dir)
    table = entry.get("cost_table")
    if table:
        t = CostTable.from_dict(table)
        c, g = relative_costs(t, int(entry.get("width") or 1), max_depth)
        return {"draft_cost": c, "verify_cost": g, "source": f"cost table at context {np.median(t.context_lens):.0f}"}
    spec = env_config_of(env_section(trained.train_config, trained.env_id))
    raise ValueError(f"the run {trained.run_dir} has no measured costs (no cost table in its training config or "
                     f"traces); measure them with draftrl calibrate --target {spec.target} --drafter {spec.drafter} "
                     "--json --out costs.json and pass --cost-table costs.json.")


def runs(values: list[int]) -> list[list[int]]:
    """``[[start_bs, end_bs, k], ...]`` (1-based, inclusive) of equal consecutive values."""
    table: list[list[int]] = []
    for batch, k in enumerate(values, start=1):
        if table and table[-1][2] == k:
            table[-1][1] = batch
        else:
            table.append([batch, batch, int(k)])
    return table


def derive(
    policy: str | Path,
    *,
    saturation_tokens: float = DEFAULT_SATURATION_TOKENS,
    max_batch_size: int = DEFAULT_MAX_BATCH,
    min_share: float = 0.05,
    episodes: int = 20,
    cost_table: str | Path | None = None,
) -> dict[str, Any]:
    """The engine-independent part: depth statistics, cost model and ``k(B)`` for every batch size.

    :param cost_table: costs ``draftrl calibrate`` measured, instead of the run's own (a run with
        none is refused: :func:`training_costs`)."""
    if saturation_tokens <= 0 or max_batch_size < 1 or not 0 <= min_share < 1:
        raise ValueError(
            f"saturation_tokens={saturation_tokens} must be > 0, max_batch_size={max_batch_size} >= 1 and "
            f"min_share={min_share} in [0, 1)."
        )
    trained = resolve(policy)
    if trained.kind != "size":
        raise ValueError(f"engine configs summarise size policies (depth per round); "
                         f"this is a {trained.kind!r} policy.")
    stats = depth_statistics(trained, episodes)
    hist = stats["depth_histogram"]
    depths = trained.depths
    vhist = stats["verify_size_histogram"]
    verify_size = max(vhist, key=vhist.get) if vhist else 0
    k1 = weighted_median(hist)
    alpha = fit_alpha(hist, stats["mean_tokens_per_round"], verify_size)
    costs = training_costs(trained, max(depths), cost_table)
    scale, k_star = depth_scale(max(depths), alpha, costs["draft_cost"], costs["verify_cost"], saturation_tokens,
                                max_batch_size, verify_size)
    total = max(1, stats["num_rounds"])
    common = sorted(d for d, n in hist.items() if n >= min_share * total)
    deepest = max(common + [k1])
    features = features_entry(trained.train_config, trained.env_id, trained.feature_names, trained.run_dir)
    return {
        "policy": str(trained.model_path),
        "run_dir": str(trained.run_dir),
        "env_id": trained.env_id,
        "drafter": features.get("drafter"),
        "target": run_target(trained),
        "width": int(features.get("width") or 1),
        "depths": depths,
        "verify_size": verify_size,
        **stats,
        "depth_mean": sum(d * n for d, n in hist.items()) / total,
        "depth_mode": max(hist, key=hist.get) if hist else 0,
        "k1": k1,
        "common_depths": common,
        "min_share": min_share,
        "cost_model": {"alpha": alpha, **costs, "saturation_tokens": saturation_tokens},
        "rule": RULE,
        "k_star_by_batch": runs(k_star),
        "depth_by_batch": runs(depth_by_batch(k1, depths, scale)),
        "deepest_common_by_batch": runs(depth_by_batch(deepest, depths, scale)),
        "policy_cap_by_batch": runs(depth_by_batch(max(depths), depths, scale)),
        "best_fixed_in_training": ((trained.summary or {}).get("evaluation") or {}).get("best_fixed"),
    }


# ----------------------------------------------------------------------------- vLLM
def head_folder(drafter: str | None, target: str | None, run_dir: Path | None = None,
                strict: bool = False) -> Path | str | None:
    """The EAGLE-3 head an ``eagle3[:PATH]`` / ``sam:N[:PATH]`` drafter runs (the one draftrl ships
    for ``target`` when the spec names none): its folder (a path as written, else relative to the
    run directory or a parent of it, where training ran), or its hub id; None for drafters that run
    no head. Stock engines run such a drafter as their EAGLE-3 method (``sam`` loses its lookup there).
    A folder not found is written as given, or refused with ``strict`` (a bundle copies it)."""
    from draftrl.decoding.vllm.head_proposer import head_spec

    parsed = head_spec(drafter or "ngram")
    if parsed is None:
        return None
    from draftrl.drafters.packaged import resolve_head

    return _located(resolve_head(parsed[1], target or "smollm2-135m"), run_dir, strict)


def drafter_source(drafter: str, run_dir: Path | None = None, strict: bool = False) -> Path | str:
    """A draft model's weights: a known name's folder in draftrl's cache, a folder (as written, else
    relative to the run directory or a parent of it), or the hub id as it is (``strict``: as
    :func:`head_folder`)."""
    from draftrl.models.registry import KNOWN_MODELS

    if drafter in KNOWN_MODELS:
        from draftrl.models.fetch import fetch_model

        return fetch_model(drafter, quiet=True)
    return _located(drafter, run_dir, strict)


def _located(spec: str, run_dir: Path | None, strict: bool) -> Path | str:
    from draftrl.export.features import find_near_run

    found = find_near_run(spec, run_dir)
    if found is not None and found.is_dir():
        return found.resolve()
    if strict and (spec.startswith(("/", ".", "~")) or spec.count("/") > 1):
        raise ValueError(f"the drafter folder {spec!r} the policy trained with is not found from here or the run "
                         "directory; export where it is (or copy it back there).")
    return spec  # a hub id (vLLM fetches it), or a folder of the training machine, as written


#: the note of a bundle whose draft model's output matrix differs in size from the target's
VOCAB_NOTE = ("use_heterogeneous_vocab: the draft's vocab_size differs from the target's (embedding rows padded past "
              "the shared tokenizer by other amounts), which vLLM's draft_model method refuses unless told; with it, "
              "vLLM drafts over the ids both tokenizers define, as draftrl did in training, and still verifies every "
              "draft with the target.")


def draft_vocab_options(target: str, draft: Path | str) -> tuple[dict[str, Any], str | None]:
    """What vLLM's ``draft_model`` method needs for this pair besides the draft, and the note that says why:
    ``{"use_heterogeneous_vocab": True}`` when the two ``config.json`` give different ``vocab_size``;
    nothing when they agree; nothing and a note naming the flag when a config cannot be read here
    (a hub id out of reach: vLLM fetches it on the serving host).

    Why: vLLM 0.32 refuses a draft model whose vocab_size differs from the target's
    (``SpeculativeConfig.verify_equal_vocab_size_if_draft_model``), though one family's models share a
    tokenizer and only pad their embedding matrices by different amounts (Qwen2.5-7B 152,064 rows,
    Qwen2.5-0.5B 151,936). draftrl compares such a pair over the tokenizer's ids
    (``draftrl.models.vocab.SharedVocab``); vLLM's ``use_heterogeneous_vocab`` does the same (the draft's
    logits masked to the tokens both tokenizers define, ids mapped by token), so the bundle keeps the
    draft's weights as they are. Greedy drafts only, vLLM's default.
    """
    from draftrl.models import model_config

    try:
        sizes = [model_config(str(spec)).get_text_config().vocab_size for spec in (target, draft)]
    except FileNotFoundError as err:
        return {}, (f"The draft's and the target's vocab_size were not compared ({' '.join(str(err).split())}); if "
                    "vLLM refuses the pair for their vocabulary sizes, add \"use_heterogeneous_vocab\": true to the "
                    "speculative_config.")
    if sizes[0] == sizes[1]:
        return {}, None
    return {"use_heterogeneous_vocab": True}, VOCAB_NOTE


def _vllm_method(drafter: str | None, method: str | None, target: str | None = None,
                 run_dir: Path | None = None) -> tuple[str, dict[str, Any], str | None]:
    """``(method, its speculative_config keys, a note or None)`` for the training drafter."""
    kind, _, arg = (drafter or "ngram").partition(":")
    head = head_folder(drafter, target, run_dir)
    folder = None if head is None else str(head)
    if method:
        return method, ({"model": folder} if method == "eagle3" and folder else {}), None
    if kind == "ngram":
        low, high = (arg.split(":")[:2] if arg else ("1", "3"))  # ngram:MIN:MAX[:FIRST]
        return "ngram", {"prompt_lookup_min": int(low), "prompt_lookup_max": int(high)}, None
    if kind in ("none", "layerskip", "self"):
        return "ngram", {"prompt_lookup_min": 1, "prompt_lookup_max": 3}, None
    if folder:
        return "eagle3", {"model": folder}, None
    draft = drafter_source(str(drafter), run_dir)
    vocab, note = draft_vocab_options(str(target), draft)
    return "draft_model", {"model": str(draft), **vocab}, note


def vllm_config(derivation: dict[str, Any], *, method: str | None = None) -> dict[str, Any]:
    """vLLM ``speculative_config`` (static + per-batch-size table) and the ``custom_class`` variant."""
    k1 = derivation["k1"]
    table = derivation["depth_by_batch"]
    run_dir = Path(derivation["run_dir"]) if derivation.get("run_dir") else None
    name, extra, vocab_note = _vllm_method(derivation["drafter"], method, derivation.get("target"), run_dir)
    notes = [
        "num_speculative_tokens_per_batch_size is vLLM's dynamic speculative decoding table ([start_bs, end_bs, K]); "
        "vLLM documents it as tested with EAGLE, EAGLE-3 and DFlash and disables it under data parallelism.",
        "The custom_class variant runs the policy itself every step (draftrl's proposer with the controller "
        "draftrl.export.vllm_control:RequestPolicyControl, n-gram drafts): "
        "draftrl export RUN --format vllm --out DIR (a directory) writes its files and the lines that start vLLM.",
    ]
    if k1 == 0:
        speculative = None
        notes.insert(0, "The policy's median depth is 0 (it mostly does not speculate): run without speculation.")
    else:
        if (derivation["drafter"] or "").startswith("sam:") and name == "eagle3":
            notes.insert(0, "Trained with sam (n-gram lookup on a long match, else the head): stock vLLM runs one "
                            "proposer, so this config drafts with the head alone; draftrl export fixed:K@sam:N "
                            "--format vllm --out DIR runs both inside vLLM (route (b)).")
        speculative = {"method": name, **extra, "num_speculative_tokens": k1,
                       "num_speculative_tokens_per_batch_size": table}
        if vocab_note:
            notes.append(vocab_note)
    return {
        "format": FORMAT,
        "engine": "vllm",
        "engine_version": VLLM_VERSION,
        "target": derivation.get("target"),
        "speculative_config": speculative,
        "custom_class_speculative_config": {
            "method": "custom_class",
            "model": PROPOSER_CLASS,
            "num_speculative_tokens": max(1, max(derivation["depths"])),
        },
        "custom_class_env": {
            "DRAFTRL_PROPOSER_CONFIG": "proposer.json (run from DIR, written by draftrl export RUN --format vllm "
                                       "--out DIR)",
        },
        "derivation": derivation,
        "notes": notes,
    }


# ----------------------------------------------------------------------------- SGLang
def _sglang_algorithm(drafter: str | None, algorithm: str | None) -> str:
    if algorithm:
        return algorithm.upper()
    kind = (drafter or "ngram").partition(":")[0]
    return {"ngram": "NGRAM", "none": "NGRAM", "layerskip": "NGRAM", "self": "NGRAM",
            "eagle3": "EAGLE3", "sam": "EAGLE3"}.get(kind, "STANDALONE")


def _sglang_draft_model(drafter: str | None, algorithm: str, target: str | None = None) -> str | None:
    """``speculative_draft_model_path``: STANDALONE and EAGLE* load a draft model, NGRAM does not.

    The training drafter's path when it was a model; a placeholder naming what is needed otherwise
    (an n-gram-trained policy exported for EAGLE3 still needs an EAGLE-3 head)."""
    if algorithm == "NGRAM":
        return None
    folder = head_folder(drafter, target) if algorithm.startswith("EAGLE") else None
    if folder:
        return str(folder)
    kind = (drafter or "ngram").partition(":")[0]
    if kind not in ("ngram", "none", "layerskip", "self") and algorithm == "STANDALONE":
        return drafter
    return "<EAGLE draft model path>" if algorithm.startswith("EAGLE") else "<draft model path>"


def sglang_config(derivation: dict[str, Any], *, algorithm: str | None = None,
                  adaptive_file: str | None = None) -> dict[str, Any]:
    """SGLang server arguments and adaptive tiers (``speculative_adaptive_config`` JSON)."""
    k1 = derivation["k1"]
    width = derivation["width"]
    algo = _sglang_algorithm(derivation["drafter"], algorithm)
    verify_size = derivation["verify_size"]
    draft_tokens = (verify_size if verify_size else width * k1) + 1
    tiers: dict[str, Any] = {"strategy": "ema"}
    k_table, ceiling_table = derivation["depth_by_batch"], derivation["deepest_common_by_batch"]
    previous: list[int] | None = None
    for start in sorted({s for s, _, _ in k_table} | {s for s, _, _ in ceiling_table}):
        k = next(k for s, e, k in k_table if s <= start <= e)
        ceiling = next(k for s, e, k in ceiling_table if s <= start <= e)
        candidates = sorted({d for d in derivation["common_depths"] if d <= ceiling} | {k})
        if candidates != previous:  # a tier only where the candidates change
            tiers[str(start)] = {"candidate_steps": candidates}
        previous = candidates
    adaptive_ok = algo in ("EAGLE", "EAGLE3") and width == 1
    notes = [
        "SGLang's adaptive mode picks among each tier's candidate_steps from an EMA of accepted lengths; it "
        "reproduces the policy's depth support per batch size, not its per-round decisions.",
        f"Not run here: no GPU and no SGLang on the machine that wrote this file; keys follow SGLang {SGLANG_VERSION}.",
    ]
    if not adaptive_ok:
        notes.insert(0, f"SGLang's adaptive speculation supports EAGLE/EAGLE3 with topk 1 only (algorithm={algo}, "
                        f"topk={width}): speculative_adaptive is off; pass --algorithm EAGLE3 with an EAGLE-3 draft.")
    if k1 == 0:
        notes.insert(0, "The policy's median depth is 0 (it mostly does not speculate): run without speculation.")
    draft_model = _sglang_draft_model(derivation["drafter"], algo, derivation.get("target"))
    if draft_model is not None and draft_model.startswith("<"):
        notes.insert(0, f"SGLang's {algo} algorithm loads a separate draft model: replace "
                        f"speculative_draft_model_path={draft_model} with its path or hub id.")
    server_args = None if k1 == 0 else {
        "speculative_algorithm": algo,
        "speculative_draft_model_path": draft_model,
        "speculative_num_steps": k1,
        "speculative_eagle_topk": width,
        "speculative_num_draft_tokens": draft_tokens,
        "speculative_adaptive": adaptive_ok,
        "speculative_adaptive_config": adaptive_file if adaptive_ok else None,
    }
    launch = []
    for key, value in (server_args or {}).items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        launch += [flag] if value is True else [flag, str(value)]
    return {
        "format": FORMAT,
        "engine": "sglang",
        "engine_version": SGLANG_VERSION,
        "target": derivation.get("target"),
        "server_args": server_args,
        "adaptive_config": tiers,
        "launch_args": launch,
        "derivation": derivation,
        "notes": notes,
    }


def check_finite(obj: Any) -> None:
    """Refuse NaN/inf anywhere in a config (engines reject them, JSON cannot hold them)."""
    if isinstance(obj, dict):
        for v in obj.values():
            check_finite(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            check_finite(v)
    elif isinstance(obj, float) and not math.isfinite(obj):
        raise ValueError(f"a derived value is {obj}; the policy's evaluation is degenerate.")
