"""How each policy of ``draftrl eval --engine hf`` is built on the real engine.

The names are ``draftrl.eval.policy_names``' (one grammar for both engines). Each policy gets its
own real-engine env (``draftrl/SpecDecode-v2``, or ``SpecDecodeDepth-v2`` for a PPO depth policy)
around the shared target model, so it sees exactly the observation it was trained on, built by
the envs' feature builder, and its cost features persist over the requests as in training.
``threshold`` reads ``draft_top1_prob`` for model drafters and ``accept_rate_1`` (the recent
first-position acceptance) for n-gram drafters; ``lookahead`` (temperature 0, or any with ``env.keyed``)
looks ahead at plain decoding's output and drafts exactly as deep as the target will accept.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from draftrl.config.env import EnvConfig
from draftrl.eval.policy_names import REFERENCE, PolicyName, policy_dir


def confidence_feature(drafter: str) -> str:
    """The observation feature ConfidenceThreshold reads for ``drafter``."""
    return "accept_rate_1" if drafter.partition(":")[0] in ("ngram", "none") else "draft_top1_prob"


def _run_config(path: str) -> dict:
    """The ``config.json`` of a ``draftrl train`` run directory, paths absolute ({} when absent)."""
    from draftrl.runs import policy_files, read_run_config, run_dir_of

    return read_run_config(run_dir_of(policy_files(path)[0])) or {}


def _trained_env(path: str, kind: str):
    """The ``TrainEnvConfig`` a PPO policy of ``kind`` trained on (``depth_env`` for depth policies), None without
    the run's ``config.json``."""
    from draftrl.config import from_dict
    from draftrl.train.env_config import ENV_SECTIONS

    cfg = _run_config(path)
    key = "depth_env" if kind == "depth" and cfg.get("depth_env") else "env"
    return from_dict(ENV_SECTIONS[key], cfg[key], prefix=f"{key}.") if cfg.get(key) else None


def ppo_env_config(path: str, base: EnvConfig) -> tuple[EnvConfig, str]:
    """The eval env config for a PPO policy: ``base`` with the policy's grids and the observation
    settings it was trained with (history, decays, width, cost table); and the env kind.

    Reads ``policy.json`` (grids) and, when present, the run's ``config.json`` (its env section).
    """
    from draftrl.envs.ids import section_of
    from draftrl.policies.ppo import read_policy_manifest
    from draftrl.runs import MANIFEST_FILE

    directory = policy_dir(path)
    manifest_path = directory / MANIFEST_FILE
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{manifest_path} does not exist; ppo:PATH must point at a directory written by "
                                "draftrl train (policy.zip + policy.json).")
    manifest = read_policy_manifest(manifest_path)
    trained: dict[str, Any] = {}
    section = _trained_env(path, manifest.get("kind", "size"))
    if section is not None and section_of(section.id) == "env":  # an EnvConfig env (analytic/serving ones have none)
        trained = {f.name: getattr(section, f.name) for f in dataclasses.fields(EnvConfig)}
        if not trained["cost_table"] and section.traces:
            from draftrl.runs import stored_cost_table_path

            stored = stored_cost_table_path(Path(section.traces))
            if stored is not None:
                trained["cost_table"] = str(stored)
    if trained.get("drafter") not in (None, base.drafter):
        raise ValueError(
            f"the PPO policy {path} was trained with drafter={trained['drafter']!r} but the evaluation uses "
            f"drafter={base.drafter!r}; evaluate with --set env.drafter={trained['drafter']} or retrain."
        )
    keep = {k: trained[k] for k in ("history", "ema_decay", "cost_decay", "cost_table", "width") if k in trained}
    keep["depths"] = tuple(manifest["depths"])
    keep["verify_sizes"] = tuple(manifest["verify_sizes"])
    return dataclasses.replace(base, **keep), manifest.get("kind", "size")


def build_policy(spec: PolicyName, base: EnvConfig, target, *, grid: dict | None = None,
                 references: dict[str, list[int]] | None = None) -> tuple[Any, Any]:
    """``(env, policy)`` for ``spec`` on the real engine around ``target`` (a ``LoadedModel``), drafting
    with the policy's own drafter (``fixed:4@eagle3``) where it names one, else ``base.drafter``."""
    from draftrl.decoding.build import build_engine
    from draftrl.envs.spec_decode import SpecDecodeEnv
    from draftrl.eval.round.lookahead import GreedyLookAhead
    from draftrl.policies import ConfidenceThreshold, Fixed, HFHeuristic, PPOPolicy, UCBBandit

    if spec.drafter is not None:
        base = dataclasses.replace(base, drafter=spec.drafter)
    kind, cfg, env_kind = spec.kind, base, "size"
    fixed: tuple[int, int, int] | None = None
    if kind == REFERENCE:
        cfg = dataclasses.replace(base, drafter="none", depths=(0,), verify_sizes=(0,))
        fixed = (0, 0, 1)
    elif kind in ("best-grid", "fixed"):
        if kind == "best-grid":
            if grid is None:
                raise ValueError("policy best-grid needs a grid search result: pass --grid DIR/grid.json "
                                 "(written by draftrl grid --config C --out DIR).")
            best = grid["best"]
            fixed = (int(best["depth"]), int(best["verify_size"]), int(best["width"]))
        else:  # no V: verify every drafted node (verify_size 0 in the env's grid)
            fixed = (spec.depth, spec.verify_size or 0, spec.width)
        d, v, w = fixed
        if d == 0:
            cfg = dataclasses.replace(base, drafter="none", depths=(0,), verify_sizes=(0,))
        else:
            cfg = dataclasses.replace(base, depths=tuple(sorted({0, d, *base.depths})),
                                      verify_sizes=tuple(sorted({v, *base.verify_sizes})), width=w)
    elif kind == "ppo":
        cfg, env_kind = ppo_env_config(spec.path, base)
    engine, tokenizer = build_engine(cfg, target)
    if env_kind == "depth":
        from draftrl.envs.spec_decode_depth import SpecDecodeDepthEnv

        run = _run_config(spec.path)
        section = _trained_env(spec.path, "depth")
        verify_size = section.verify_size if section is not None else 0
        env = SpecDecodeDepthEnv(cfg, engine=engine, tokenizer=tokenizer, verify_size=verify_size)
        if run.get("frozen_size_policy"):  # the size policy it was trained with picks the verify size
            sizer = PPOPolicy.load(run["frozen_size_policy"], feature_names=env.unwrapped.feature_names,
                                   name="ppo_size")
            env.unwrapped.size_policy = lambda observation, tree: sizer.act(observation)[1]
    else:
        env = SpecDecodeEnv(cfg, engine=engine, tokenizer=tokenizer)

    if fixed is not None:
        policy = Fixed.for_env(env, depth=fixed[0], verify_size=fixed[1])
    elif kind == "heuristic":
        policy = HFHeuristic.for_env(env)
    elif kind == "threshold":
        policy = ConfidenceThreshold.for_env(env, feature=confidence_feature(cfg.drafter))
    elif kind == "bandit":
        policy = UCBBandit.for_env(env)
    elif kind == "ppo" and env_kind == "depth":  # the depth env has no (depth, verify_size) grid to check
        policy = PPOPolicy.load(spec.path, feature_names=env.unwrapped.feature_names, name=spec.label)
    elif kind == "ppo":
        policy = PPOPolicy.load(spec.path, env, name=spec.label)
    elif kind == "lookahead":
        policy = GreedyLookAhead.for_env(env, env=env, references=references if references is not None else {},
                                      width=cfg.width)
    else:  # pragma: no cover - parse_policies rejects the rest
        raise AssertionError(kind)
    policy.name = spec.label
    return env, policy
