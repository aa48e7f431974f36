"""Policy names of ``draftrl eval --policies`` and how each one is built on the real engine.

Each policy gets its own real-engine env (``draftrl/SpecDecode-v1``, or ``SpecDecodeDepth-v1``
for a PPO depth policy) around the shared target model, so it sees exactly the observation it
was trained on, built by the envs' feature builder, and its cost features persist over the
requests as in training. Names:

==============  =========================================================================
``ar``          plain decoding (depth 0, no drafter): the reference of every speedup
``best-grid``   the best fixed setting of a grid search (``--grid DIR/grid.json``)
``fixed:D[:V[:W]]``  a fixed depth D, verify size V (0 = all) and width W
``heuristic``   Hugging Face's ``num_assistant_tokens_schedule="heuristic"`` (HFHeuristic)
``threshold``   ConfidenceThreshold on the draft's confidence (model drafters:
                ``draft_top1_prob``; n-gram: ``accept_rate_1``, the recent first-position
                acceptance)
``bandit``      UCBBandit over the env's (depth, verify_size) grid, rewarded by tokens/s
``ppo:PATH``    a PPO policy written by ``draftrl train`` (a directory or its policy.zip)
``oracle``      temperature 0 only: drafts exactly as deep as the target will accept
==============  =========================================================================
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftrl.config.env import EnvConfig

#: The names ``--policies`` accepts (``fixed`` and ``ppo`` take an argument after ``:``).
POLICY_NAMES: tuple[str, ...] = ("ar", "best-grid", "fixed:D[:V[:W]]", "heuristic", "threshold", "bandit",
                                 "ppo:PATH", "oracle")
_KINDS = ("ar", "best-grid", "fixed", "heuristic", "threshold", "bandit", "ppo", "oracle")


@dataclass(frozen=True)
class PolicySpec:
    """One entry of ``--policies``."""

    kind: str
    arg: str | None
    label: str
    """the name used in results.json, the report and wandb"""


def _bad(item: str, why: str = "is not a policy") -> ValueError:
    return ValueError(f"policy {item!r} {why}; valid policies: {', '.join(POLICY_NAMES)}")


def parse_policies(items: str | list[str] | tuple[str, ...]) -> list[PolicySpec]:
    """Parse ``"ar,best-grid,ppo:runs/x"`` (or a list); ``ar`` is always first (the reference).

    :raises ValueError: one line naming the bad entry and every valid name.
    """
    if isinstance(items, str):
        items = [s for s in items.split(",")]
    items = [s.strip() for s in items if s.strip()]
    specs: list[PolicySpec] = []
    for item in items:
        kind, _, arg = item.partition(":")
        kind = kind.strip().lower()
        if kind not in _KINDS:
            raise _bad(item)
        if kind == "ppo" and not arg:
            raise _bad(item, "needs a path (ppo:DIR written by draftrl train)")
        if kind == "fixed":
            parts = arg.split(":") if arg else []
            if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
                raise _bad(item, "must look like fixed:D, fixed:D:V or fixed:D:V:W with integers")
        elif kind not in ("ppo",) and arg:
            raise _bad(item, "takes no argument")
        specs.append(PolicySpec(kind, arg or None, item if kind in ("fixed",) else kind))
    ppo = [s for s in specs if s.kind == "ppo"]
    if len(ppo) > 1:  # several PPO policies: name them after their directories
        renamed = {id(s): f"ppo[{_policy_dir(s.arg).name}]" for s in ppo}
        specs = [dataclasses.replace(s, label=renamed[id(s)]) if id(s) in renamed else s for s in specs]
    labels = [s.label for s in specs]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise ValueError(f"policies {dup} are listed twice; list each once.")
    if "ar" not in labels:
        specs.insert(0, PolicySpec("ar", None, "ar"))
    else:
        specs.sort(key=lambda s: s.kind != "ar")
    return specs


def _policy_dir(path: str) -> Path:
    p = Path(path)
    return p.parent if p.suffix == ".zip" else p


def confidence_feature(drafter: str) -> str:
    """The observation feature ConfidenceThreshold reads for ``drafter``."""
    return "accept_rate_1" if drafter.partition(":")[0] in ("ngram", "none") else "draft_top1_prob"


def _run_config(path: str) -> dict:
    """The ``config.json`` of a ``draftrl train`` run directory, paths absolute ({} when absent)."""
    from draftrl.runs import policy_files, read_run_config, run_dir_of

    return read_run_config(run_dir_of(policy_files(path)[0])) or {}


def _trained_env(path: str, kind: str):
    """The ``EnvSpec`` a PPO policy of ``kind`` trained on (``depth_env`` for depth policies), None without
    the run's ``config.json``."""
    from draftrl.config import from_dict
    from draftrl.config.env_spec import ENV_SECTIONS

    cfg = _run_config(path)
    key = "depth_env" if kind == "depth" and cfg.get("depth_env") else "env"
    return from_dict(ENV_SECTIONS[key], cfg[key], prefix=f"{key}.") if cfg.get(key) else None


def ppo_env_config(path: str, base: EnvConfig) -> tuple[EnvConfig, str]:
    """The eval env config for a PPO policy: ``base`` with the policy's grids and the observation
    settings it was trained with (history, decays, width, cost table); and the env kind.

    Reads ``policy.json`` (grids) and, when present, the run's ``config.json`` (its env section).
    """
    from draftrl.policies.ppo import read_policy_manifest
    from draftrl.runs import MANIFEST_FILE

    directory = _policy_dir(path)
    manifest_path = directory / MANIFEST_FILE
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{manifest_path} does not exist; ppo:PATH must point at a directory written by "
                                "draftrl train (policy.zip + policy.json).")
    manifest = read_policy_manifest(manifest_path)
    trained: dict[str, Any] = {}
    section = _trained_env(path, manifest.get("kind", "size"))
    if section is not None and section.family is None:  # an EnvConfig env (analytic/serving ones have none)
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


def build_policy(spec: PolicySpec, base: EnvConfig, target, *, grid: dict | None = None,
                 references: dict[str, list[int]] | None = None) -> tuple[Any, Any]:
    """``(env, policy)`` for ``spec`` on the real engine around ``target`` (a ``LoadedModel``)."""
    from draftrl.envs.engines import build_engine
    from draftrl.envs.spec_decode import SpecDecodeEnv
    from draftrl.eval.oracle import GreedyOracle
    from draftrl.policies import ConfidenceThreshold, Fixed, HFHeuristic, PPOPolicy, UCBBandit

    kind, cfg, env_kind = spec.kind, base, "size"
    fixed: tuple[int, int, int] | None = None
    if kind == "ar":
        cfg = dataclasses.replace(base, drafter="none", depths=(0,), verify_sizes=(0,))
        fixed = (0, 0, 1)
    elif kind in ("best-grid", "fixed"):
        if kind == "best-grid":
            if grid is None:
                raise ValueError("policy best-grid needs a grid search result: pass --grid DIR/grid.json "
                                 "(written by draftrl grid --config C --out DIR).")
            best = grid["best"]
            fixed = (int(best["depth"]), int(best["verify_size"]), int(best["width"]))
        else:
            parts = [int(p) for p in spec.arg.split(":")]
            fixed = (parts[0], parts[1] if len(parts) > 1 else 0, parts[2] if len(parts) > 2 else 1)
        d, v, w = fixed
        if d == 0:
            cfg = dataclasses.replace(base, drafter="none", depths=(0,), verify_sizes=(0,))
        else:
            cfg = dataclasses.replace(base, depths=tuple(sorted({0, d, *base.depths})),
                                      verify_sizes=tuple(sorted({v, *base.verify_sizes})), width=w)
    elif kind == "ppo":
        cfg, env_kind = ppo_env_config(spec.arg, base)
    engine, tokenizer = build_engine(cfg, target)
    if env_kind == "depth":
        from draftrl.envs.spec_decode_depth import SpecDecodeDepthEnv

        run = _run_config(spec.arg)
        section = _trained_env(spec.arg, "depth")
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
        policy = PPOPolicy.load(spec.arg, feature_names=env.unwrapped.feature_names, name=spec.label)
    elif kind == "ppo":
        policy = PPOPolicy.load(spec.arg, env, name=spec.label)
    elif kind == "oracle":
        policy = GreedyOracle.for_env(env, env=env, references=references if references is not None else {},
                                      width=cfg.width)
    else:  # pragma: no cover - parse_policies rejects the rest
        raise AssertionError(kind)
    policy.name = spec.label
    return env, policy
