"""The final evaluation of a run: the policy, every fixed setting and the baselines on the same episodes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from draftrl.config import to_dict
from draftrl.policies import (
    ConfidenceThreshold,
    Fixed,
    HFHeuristic,
    LookAhead,
    Policy,
    PPOPolicy,
    UCBBandit,
    env_grids,
    evaluate_policy,
    paired_difference,
)
from draftrl.train.config import TrainConfig, TrainEnvConfig
from draftrl.train.envs import make_env


def build_baselines(names: list[str], env: gym.Env) -> list[Policy]:
    """The named baselines for ``env``; ones the env cannot support (e.g. no confidence feature) are skipped."""
    makers: dict[str, Callable[[], Policy]] = {
        "heuristic": lambda: HFHeuristic.for_env(env),
        "threshold": lambda: ConfidenceThreshold.for_env(env),
        "bandit": lambda: UCBBandit.for_env(env),
        "lookahead": lambda: LookAhead.for_env(env),
    }
    policies = []
    for name in names:
        try:
            policies.append(makers[name]())
        except (TypeError, ValueError) as err:
            print(f"draftrl train: skipping baseline {name}: {err}")
    return policies


def fixed_settings(env: gym.Env) -> list[Policy]:
    """Every fixed setting of ``env``'s grids: ``Fixed.grid`` on a round-level env; on a step-level
    env (a depth policy's) each depth drafted to the end, named ``fixed(d=D)``."""
    if not isinstance(env.action_space, gym.spaces.Discrete):
        return Fixed.grid(env)
    depths, _, _ = env_grids(env)
    fixed = [Fixed.for_env(env, depth=d) for d in depths]
    for policy in fixed:
        policy.name = f"fixed(d={policy.depth})"
    return fixed


def best_fixed_reference(cfg: TrainConfig, spec: TrainEnvConfig,
                         extra_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The best fixed setting on the env PPO trains on (``spec`` as trained, not its ``eval`` keys):
    the reference line of the learning curve (``rollout/best_fixed_throughput``).

    Every fixed setting plays ``cfg.eval_episodes`` episodes from ``cfg.eval_seed``; its score is
    the mean of the episodes' throughputs, the statistic ``rollout/episode_throughput`` logs.

    :return: ``{"name", "throughput", "episodes", "scores" {name: throughput}}``.
    """
    env = make_env(spec, extra_kwargs=extra_kwargs)
    scores = {p.name: float(np.mean(evaluate_policy(p, env, cfg.eval_episodes, cfg.eval_seed)["episode_throughputs"]))
              for p in fixed_settings(env)}
    env.close()
    name = max(scores, key=scores.__getitem__)
    return {"name": name, "throughput": scores[name], "episodes": cfg.eval_episodes, "scores": scores}


def evaluate_run(
    cfg: TrainConfig,
    policy_dir: Path,
    spec: TrainEnvConfig | None = None,
    extra_kwargs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Evaluate the saved policy, every fixed setting and the baselines on the same episodes.

    On a step-level env (a depth policy) the fixed settings are the grid's depths, each drafted
    to the end (``Policy.act_step``), and the env's own verify size applies.

    :param spec: the env to evaluate on (its ``eval`` keys apply); default ``cfg.env``.
    :param extra_kwargs: ``gymnasium.make`` arguments YAML cannot hold (a frozen size policy).
    :return: ``{"episodes", "seed", "env", "results": {name: evaluate_policy(...)},
        "best_fixed", "table": {name: {"throughput", "ratio_to_best_fixed", "diff_vs_best_fixed",
        "se"}}, "lookahead_gain_captured", "per_sampling"}``; ``lookahead_gain_captured`` = (policy - best
        fixed) / (lookahead - best fixed) in throughput, when the lookahead baseline ran; ``per_sampling``
        (:func:`per_sampling`) when the env's episodes drew more than one sampling class (a temperature mix).
    """
    spec = spec or cfg.env
    env = make_env(spec, evaluation=True, extra_kwargs=extra_kwargs)
    policies: list[Policy] = [PPOPolicy.load(policy_dir, env, name="ppo")]
    fixed = fixed_settings(env)
    baselines = list(cfg.baselines)
    serving = not getattr(env.unwrapped, "one_request_per_episode", True)
    if serving and "heuristic" in baselines:  # evaluated below on its own env
        baselines.remove("heuristic")
    policies += fixed + build_baselines(baselines, env)
    classes: list[str | None] = []  # each episode's sampling class: seeded, so the same for every policy
    results = {p.name: evaluate_policy(p, env, cfg.eval_episodes, cfg.eval_seed,
                                       on_reset=(lambda info: classes.append(info.get("sampling_class")))
                                       if not classes else None)
               for p in policies}
    env.close()
    if serving and "heuristic" in cfg.baselines:
        # a serving env's heuristic is per request (each request's own +2/-1 depth, the proposer's
        # rule "heuristic", as draftrl eval --engine vllm runs it) under the largest cap and budget
        heuristic_env = make_env(spec, evaluation=True, extra_kwargs={**(extra_kwargs or {}), "rule": "heuristic"})
        depths, verify_sizes, _ = env_grids(heuristic_env)
        heuristic = Fixed.for_env(heuristic_env, depth=max(depths), verify_size=max(verify_sizes))
        heuristic.name = "heuristic"
        results["heuristic"] = evaluate_policy(heuristic, heuristic_env, cfg.eval_episodes, cfg.eval_seed)
        heuristic_env.close()
    best_fixed = max((p.name for p in fixed), key=lambda name: results[name]["throughput"])
    best = results[best_fixed]
    table = {}
    for name, res in results.items():
        row: dict[str, Any] = {"throughput": res["throughput"],
                               "ratio_to_best_fixed": res["throughput"] / best["throughput"]}
        if name != best_fixed and cfg.eval_episodes >= 2:
            diff = paired_difference(res["episode_throughputs"], best["episode_throughputs"])
            row.update({"diff_vs_best_fixed": diff["mean"], "se": diff["se"]})
        table[name] = row
    summary: dict[str, Any] = {
        "episodes": cfg.eval_episodes,
        "seed": cfg.eval_seed,
        "env": to_dict(spec.evaluation()),
        "best_fixed": best_fixed,
        "table": table,
        "results": results,
    }
    if "lookahead" in results:
        gap = results["lookahead"]["throughput"] - best["throughput"]
        summary["lookahead_gain_captured"] = ((results["ppo"]["throughput"] - best["throughput"]) / gap
                                              if gap > 0 else None)
    if len(set(classes)) > 1:
        summary["per_sampling"] = per_sampling(results, classes, [p.name for p in fixed])
    return summary


def per_sampling(results: dict[str, dict[str, Any]], classes: list[str | None],
                 fixed: list[str]) -> dict[str, dict[str, Any]]:
    """The evaluation of a temperature mix split by the episodes' sampling classes (``reset`` info's
    ``sampling_class``): per class, each policy's throughput over that class's episodes (total tokens /
    total seconds), the best fixed setting among ``fixed`` on them, and each ratio to it.

    :return: ``{label: {"episodes", "best_fixed", "table": {name: {"throughput", "ratio_to_best_fixed"}}}}``.
    """
    split: dict[str, dict[str, Any]] = {}
    for label in sorted({c for c in classes if c is not None}):
        episodes = [i for i, c in enumerate(classes) if c == label]
        throughput = {}
        for name, res in results.items():
            tokens = sum(res["episode_tokens"][i] for i in episodes)
            seconds = sum(res["episode_seconds"][i] for i in episodes)
            throughput[name] = tokens / seconds if seconds > 0 else 0.0
        best = max(fixed, key=throughput.__getitem__)
        split[label] = {"episodes": len(episodes), "best_fixed": best, "table": {
            name: {"throughput": value, "ratio_to_best_fixed": value / throughput[best] if throughput[best] else 0.0}
            for name, value in throughput.items()}}
    return split


def format_table(evaluation: dict[str, Any]) -> str:
    """One line per policy, ratios first (STYLE.md, benchmarks)."""
    lines = []
    for name, row in sorted(evaluation["table"].items(), key=lambda kv: -kv[1]["throughput"]):
        diff = f"  diff={row['diff_vs_best_fixed']:+.3f}±{row['se']:.3f}" if "se" in row else ""
        mark = "  <- best fixed" if name == evaluation["best_fixed"] else ""
        lines.append(f"vs_best_fixed={row['ratio_to_best_fixed']:.3f}x  "
                     f"throughput={row['throughput']:.4f}{diff}  {name}{mark}")
    if evaluation.get("lookahead_gain_captured") is not None:
        lines.append("share of lookahead's gain over best fixed captured by ppo: "
                     f"{evaluation['lookahead_gain_captured']:.2f}")
    for label, part in (evaluation.get("per_sampling") or {}).items():  # a temperature mix, class by class
        ppo = part["table"].get("ppo", {}).get("ratio_to_best_fixed")
        vs = f"ppo_vs_best_fixed={ppo:.3f}x  " if ppo is not None else ""
        lines.append(f"{vs}best_fixed={part['best_fixed']}  sampling={label}  episodes={part['episodes']}")
    return "\n".join(lines)
