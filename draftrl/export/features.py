"""The training env's observation settings, and its ``FeatureBuilder`` rebuilt from them.

A deployed policy must see the features it was trained on, computed the same way. The envs that
wrap the engine (``SpecDecode-v2``, ``TraceReplay-v1`` and their depth variants) build every
observation with :class:`draftrl.signals.features.FeatureBuilder`; this module records that
builder's settings in the export manifest (``features_entry``) and rebuilds the very same class
from them at run time (``make_feature_builder``), so no feature is re-implemented here.

The serving envs (``ServeVLLM-v1``, ``ServeReplay-v1``) build their observation with
:class:`draftrl.signals.serving.ServingFeatures` (load and acceptance of the whole batch, one
engine step at a time): ``features_entry`` records its settings (``serving_entry``) and
``make_serving_features`` rebuilds it, for the controller of vLLM's proposer that runs such a policy
(``draftrl.export.vllm_control.BatchPolicyControl``).

``draftrl/Analytic-v0`` has no engine-side builder: its features (regime acceptance statistics,
a synthetic ``draft_confidence``) come from the analytic model itself, and no engine measures
them. Its policies export and run through the controller, but cannot drive an engine.

Which builder made a policy's observation is read from the feature names the policy recorded
(``feature_builder``), not from its env id.

Import direction: this module uses ``draftrl.signals`` (the feature builder, cost tables) and reads
the run's saved env section as plain data with the base configs (``EnvConfig``, ``ServeConfig``);
it imports neither ``draftrl.envs`` nor ``draftrl.train``, and no model code.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from draftrl.config import from_section
from draftrl.config.env import EnvConfig
from draftrl.config.serve import ServeConfig
from draftrl.signals.costs import CostTable
from draftrl.signals.features import DRAFT_FEATURES, CostTracker, FeatureBuilder, feature_names
from draftrl.signals.serving import BUILDER as SERVING_BUILDER
from draftrl.signals.serving import FEATURE_NAMES as SERVING_FEATURES
from draftrl.signals.serving import FEATURE_NAMES_V0 as SERVING_FEATURES_V0
from draftrl.signals.serving import ServingFeatures

BUILDER = "draftrl.signals.features.FeatureBuilder"
#: Per-request rules of the serving env that vLLM's proposer can follow (``hindsight`` is the replay's ceiling).
SERVING_RULES: tuple[str, ...] = ("match", "heuristic")
#: The training config's env sections, in the order a run's env is looked for: the keys of
#: ``draftrl.train.env_config.ENV_SECTIONS`` (export may not import train; a test keeps them equal).
TRAIN_ENV_SECTIONS: tuple[str, ...] = ("env", "depth_env", "finetune_env")


def feature_builder(names: list[str] | tuple[str, ...]) -> str | None:
    """The builder whose observation a policy reading ``names`` was trained on: ``SERVING_BUILDER``
    when it reads the serving features, ``BUILDER`` when it starts with the engine's draft features
    (then history, costs and, for depth policies, ``level``), None for env-made features (Analytic-v0)."""
    if set(SERVING_FEATURES_V0) <= set(names):  # v0's names too: refused with the fix where they are read
        return SERVING_BUILDER
    if tuple(names[: len(DRAFT_FEATURES)]) == DRAFT_FEATURES:
        return BUILDER
    return None


def env_section(train_config: dict[str, Any] | None, env_id: str, evaluation: bool = False) -> dict[str, Any]:
    """The env section of the training config that made ``env_id``, as plain data (``{"id": env_id}``,
    every key at its default, when no section did).

    :param evaluation: the final evaluation's section: ``eval``'s keys on top, a nested section's
        (``serve``, ``analytic``) key by key, as ``TrainEnvConfig.evaluation`` applies them.
    """
    section: dict[str, Any] = {"id": env_id}
    for key in TRAIN_ENV_SECTIONS:
        found = (train_config or {}).get(key)
        if isinstance(found, dict) and found.get("id") == env_id:
            section = dict(found)
            break
    overrides = section.pop("eval", None) or {}
    if evaluation:
        for key, value in overrides.items():
            nested = section.get(key)
            section[key] = {**nested, **value} if isinstance(nested, dict) and isinstance(value, dict) else value
    return section


def env_config_of(section: dict[str, Any]) -> EnvConfig:
    """The ``EnvConfig`` keys of an env section (``env_section``), checked."""
    return from_section(EnvConfig, section, prefix="env.")


def serve_config_of(section: dict[str, Any]) -> ServeConfig:
    """The ``ServeConfig`` keys of an env section's ``serve`` (``env_section``), checked."""
    return from_section(ServeConfig, section.get("serve") or {}, prefix="env.serve.")


def find_near_run(path: str | Path | None, run_dir: Path | None) -> Path | None:
    """``path`` as given (relative to the working directory), else relative to the run directory
    or one of its parents (training usually ran from the repository root)."""
    if not path:
        return None
    path = Path(path)
    candidates = [path]
    if run_dir is not None and not path.is_absolute():
        candidates += [run_dir / path] + [parent / path for parent in run_dir.resolve().parents]
    return next((c for c in candidates if c.exists()), None)


def _cost_table(cost_table: str | None, traces: str | None, run_dir: Path | None) -> CostTable | None:
    """The table the training env started its cost features from: ``env.cost_table``, else (TraceReplay)
    the one stored with the traces."""
    table_path = find_near_run(cost_table, run_dir)
    trace_dir = find_near_run(traces, run_dir)
    if table_path is None and trace_dir is not None:
        from draftrl.runs import stored_cost_table_path

        table_path = stored_cost_table_path(trace_dir)
    if trace_dir is None and traces:
        warnings.warn(
            f"the training traces {traces!r} were not found from here or the run directory; the manifest "
            "records no cost table (cost features then start unknown). Export where the traces are.", stacklevel=3)
    return CostTable.load(table_path) if table_path is not None else None


def features_entry(train_config: dict[str, Any] | None, env_id: str, names: list[str],
                   run_dir: str | Path | None = None) -> dict[str, Any]:
    """The manifest's ``features`` section for a policy trained on ``env_id`` reading ``names``.

    :return: ``{"builder": BUILDER, "history", "ema_decay", "cost_decay", "width", "drafter",
        "temperature", "sampling_classes" (the labels of the training mix, one without a mix), "max_depth",
        "max_new_tokens" (the training budget), "cost_table" (the
        table's JSON or None), "source"}`` for the
        engine envs; ``{"builder": None, "reason": ...}`` otherwise.
    """
    builder = feature_builder(names)
    if builder == SERVING_BUILDER:
        return serving_entry(train_config, env_id, names)
    if builder is None:
        return {
            "builder": None,
            "reason": f"{env_id} computes its features inside the env (no engine measures them); "
            "the policy runs through the controller but cannot drive an engine.",
        }
    section = env_section(train_config, env_id)
    config, traces = env_config_of(section), section.get("traces")
    table = _cost_table(config.cost_table, traces, Path(run_dir) if run_dir is not None else None)
    expected = list(feature_names(config.history))
    if names[: len(expected)] != expected:
        raise ValueError(
            f"the policy reads features {names} but {BUILDER} with history={config.history} builds {expected}; "
            "the training config does not describe this policy (was the run directory mixed up?)."
        )
    return {
        "builder": BUILDER,
        "history": config.history,
        "ema_decay": config.ema_decay,
        "cost_decay": config.cost_decay,
        "width": config.width,
        "drafter": config.drafter,
        "temperature": config.temperature,
        "sampling_classes": [c.label for c in config.sampling_classes],
        "max_depth": config.max_depth,
        "max_new_tokens": config.max_new_tokens or config.max_new_tokens_cap,
        "cost_table": table.to_dict() if table is not None else None,
        "source": ("train config" if train_config else "EnvConfig defaults (no train config)")
        + (f", traces {traces}" if traces else ""),
    }


def check_serving_names(names: list[str] | tuple[str, ...]) -> None:
    """Refuse, naming the fix, a serving policy that does not read today's serving observation: the
    20 entries of ``ServeVLLM-v1`` / ``ServeReplay-v1`` (blind to the batch's sampling) or others."""
    if tuple(names) == SERVING_FEATURES_V0:
        raise ValueError("the policy reads the 20-entry observation of draftrl/ServeVLLM-v1 / ServeReplay-v1, which "
                         f"does not see the batch's sampling; {SERVING_BUILDER} now builds v1's "
                         f"{len(SERVING_FEATURES)} (+ {', '.join(SERVING_FEATURES[len(SERVING_FEATURES_V0):])}): "
                         "train the policy again on draftrl/ServeReplay-v1 (env.id) and export it again.")
    if list(names) != list(SERVING_FEATURES):
        raise ValueError(f"the policy reads features {list(names)} but {SERVING_BUILDER} builds "
                         f"{list(SERVING_FEATURES)}; the run was trained by another draftrl version: train it again.")


def serving_entry(train_config: dict[str, Any] | None, env_id: str, names: list[str]) -> dict[str, Any]:
    """The manifest's ``features`` section for a serving-env policy.

    :return: ``{"builder": SERVING_BUILDER, "settings": ServingFeatures' arguments, "rule", "drafter",
        "depths", "budgets", "source"}``; ``rule`` is the env's per-request rule, ``drafter`` the
        env's (``env.serve.drafter``, what the exported proposer drafts with: token-id drafters only).
    """
    from draftrl.decoding.vllm.head_proposer import needs_head

    check_serving_names(names)
    config = serve_config_of(env_section(train_config, env_id))
    if needs_head(config.drafter):
        raise ValueError(f"the policy was trained with env.serve.drafter={config.drafter!r}, an EAGLE-3 head the "
                         "exported serving proposer does not run (it drafts on token ids); train with an n-gram "
                         "drafter, "
                         "or serve the head with draftrl export fixed:K@eagle3 --format vllm.")
    return {
        "builder": SERVING_BUILDER,
        "settings": ServingFeatures.from_config(config).settings(),
        "rule": config.rule,
        "drafter": config.drafter,
        "depths": list(config.depths),
        "budgets": list(config.budgets),
        "source": "train config" if train_config else "ServeConfig defaults (no train config)",
    }


def make_serving_features(entry: dict[str, Any], names: list[str] | tuple[str, ...]) -> ServingFeatures:
    """The serving env's ``ServingFeatures``, from a manifest's ``features`` section.

    :raises ValueError: for a manifest of another builder, or a rule vLLM's proposer cannot follow.
    """
    if (entry or {}).get("builder") != SERVING_BUILDER:
        raise ValueError(f"the manifest names the feature builder {(entry or {}).get('builder')!r}, not "
                         f"{SERVING_BUILDER!r}: this is not a serving-env policy (ServeVLLM-v1 / ServeReplay-v1).")
    check_serving_names(names)
    if entry.get("rule", "match") not in SERVING_RULES:
        raise ValueError(f"the policy was trained with rule={entry.get('rule')!r}, which only the replay can follow "
                         f"(it knows the future); train with env.serve.rule one of {', '.join(SERVING_RULES)}.")
    return ServingFeatures(**entry["settings"])


def make_feature_builder(entry: dict[str, Any], names: list[str] | tuple[str, ...]) -> FeatureBuilder:
    """The training env's ``FeatureBuilder``, from a manifest's ``features`` section.

    :raises ValueError: for policies whose features no engine can build (e.g. ``Analytic-v0``) or
        whose feature list the rebuilt builder does not reproduce.
    """
    builder_name = (entry or {}).get("builder")
    if builder_name == SERVING_BUILDER:
        raise ValueError("this policy was trained on a serving env: it sets each engine step's depth cap and "
                         "budget for "
                         "a whole batch, not one request's round; run it in vLLM (draftrl export RUN --format vllm "
                         "--out DIR, or draftrl eval --engine vllm --policies ppo:RUN).")
    if builder_name is not None and builder_name != BUILDER:
        raise ValueError(f"the manifest names the feature builder {builder_name!r}, not {BUILDER!r}; export the "
                         "policy again (draftrl export RUN) to write its manifest with this draftrl.")
    if not entry or builder_name is None:
        reason = (entry or {}).get("reason", "the manifest names no feature builder")
        raise ValueError(
            f"this policy cannot drive an engine: {reason} Train it on draftrl/TraceReplay-v1 or "
            "draftrl/SpecDecode-v2 (whose observations draftrl.signals.features.FeatureBuilder builds), or for "
            "vLLM on draftrl/ServeReplay-v1 (draftrl.signals.serving.ServingFeatures)."
        )
    table = CostTable.from_dict(entry["cost_table"]) if entry.get("cost_table") else None
    builder = FeatureBuilder(
        int(entry["history"]), float(entry["ema_decay"]),
        CostTracker(table, float(entry["cost_decay"]), int(entry["width"])),
    )
    if list(builder.names) != list(names):
        raise ValueError(
            f"the policy reads {list(names)} but the rebuilt FeatureBuilder builds {list(builder.names)}; "
            "step-level (depth) policies need a per-level driver, which draftrl generate does not have."
        )
    return builder


def ngram_drafter(spec: str) -> Any:
    """draftrl's ``NgramDrafter`` from a drafter spec (``ngram[:MIN:MAX[:FIRST]]``, the registry's grammar).

    The adapters that run inside other engines (transformers, vLLM) draft with it, so their
    proposals and n-gram features are the ones the policy was trained on.

    :raises ValueError: for other drafters, whose features only draftrl's engine measures.
    """
    from draftrl.drafters.registry import build_drafter

    if spec.partition(":")[0] != "ngram":
        raise ValueError(
            f"the policy was trained with drafter {spec!r}; outside draftrl's engine the adapters compute only n-gram "
            "draft features. Train on traces collected with drafter=ngram, or drive draftrl's engine "
            "(draftrl generate --policy), which measures every drafter's features."
        )
    return build_drafter(spec)
