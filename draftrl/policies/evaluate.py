"""Roll policies out on seeded episodes and measure throughput.

Every policy sees the same episodes: episode ``i`` starts with ``env.reset(seed=seed + i)``, so
the workload (prompts, traces, regimes) is the same for every policy. Throughput is total tokens
/ total seconds over all episodes (the env's ``info["num_emitted"]`` and ``info["seconds"]``; seconds
are wall clock on real engines, target steps on the analytic env).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces

from draftrl.policies.base import Policy


def evaluate_policy(policy: Policy, env: Any, episodes: int = 20, seed: int | None = 0, *,
                    options: Mapping[str, Any] | None = None,
                    on_reset: Callable[[dict[str, Any]], None] | None = None,
                    on_round: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run ``episodes`` seeded episodes of ``policy`` on ``env``: the one rollout loop (SB3's
    ``common.evaluation.evaluate_policy``), which training's evaluation and selection, ``export``
    and both tracks of ``eval`` run.

    Round-level envs and serving envs (``MultiDiscrete`` actions) call ``policy.act``; step-level
    envs (``Discrete(2)`` actions, e.g. ``draftrl/SpecDecodeDepth-v2``) call ``policy.act_step`` and
    pass ``int(decision)`` as the action; their draft steps inside a round (no ``num_emitted`` in
    ``info``) are skipped. ``on_reset(info)`` runs after each ``env.reset``; after every verified
    round (serving envs: engine step) the policy observes its ``info``, then ``on_round(info)`` runs.

    :param policy: built for ``env``'s grids (``Policy.for_env(env)``).
    :param env: a draftrl env (gymnasium API).
    :param episodes: number of episodes; episode ``i`` resets with ``seed + i`` and, on envs
        with a prompt workload (the real and replay envs), on prompt ``i % len(workload)``, so
        every policy meets the same episodes and every prompt is visited in turn. (A seeded
        reset restarts the env's own prompt order: with ``shuffle`` off, seeds alone would make
        every episode the first prompt.)
    :param seed: seed of the first episode; None resets unseeded (one episode only: the env goes
        on from its own random state, as ``eval`` does after an env's first request).
    :param options: ``env.reset``'s options for every episode instead of the prompt picked above
        (``{"prompt_id": ...}`` for one request, ``{"prompt_ids": [...]}`` for a serving episode).
    :param on_reset: called with each episode's reset ``info`` (e.g. its ``prefill_seconds``).
    :param on_round: called with each verified round's (serving envs: engine step's) ``info``,
        after ``policy.observe``: what a caller records per round (its timing, a monitor).
    :return: ``{"policy", "throughput" (total tokens / total seconds), "episode_throughputs"
        [episodes], "episode_tokens", "episode_seconds", "num_rounds", "mean_tokens_per_round",
        "depth_histogram" {depth: rounds}, "verify_size_histogram" {verify_size: rounds},
        "episodes", "seed"}``.
    """
    if episodes < 1:
        raise ValueError(f"episodes={episodes!r} must be >= 1.")
    if seed is None and episodes != 1:
        raise ValueError(f"seed=None with episodes={episodes}: unseeded episodes are not paired across "
                         "policies; pass a seed.")
    step_level = isinstance(env.action_space, spaces.Discrete)
    episode_tokens: list[float] = []
    episode_seconds: list[float] = []
    depths: Counter[int] = Counter()
    verify_sizes: Counter[int] = Counter()
    num_rounds = 0
    workload = getattr(env.unwrapped, "workload", None)
    if options is not None or not getattr(env.unwrapped, "one_request_per_episode", True):
        workload = None  # the caller's options, or a serving env: every episode is the whole workload
    for i in range(episodes):
        reset_options = {"prompt_index": i % len(workload)} if workload is not None else options
        obs, info = env.reset(seed=None if seed is None else seed + i, options=reset_options)
        if on_reset is not None:
            on_reset(info)
        policy.reset()
        tokens = seconds = 0.0
        done = False
        while not done:
            if step_level:
                action: Any = int(policy.act_step(obs))
                chosen = None
            else:
                chosen = policy.act(obs)
                action = policy.to_action(*chosen)
            obs, _, terminated, truncated, info = env.step(action)
            done = terminated or truncated
            if step_level and "num_emitted" not in info:
                continue  # a draft step inside a round: nothing was emitted yet
            policy.observe(info)
            if on_round is not None:
                on_round(info)
            tokens += float(info["num_emitted"])
            seconds += float(info["seconds"])
            num_rounds += 1
            depth = info.get("depth", chosen[0] if chosen else None)
            verify_size = info.get("verify_size", chosen[1] if chosen else None)
            if depth is not None:
                depths[int(depth)] += 1
            if verify_size is not None:
                verify_sizes[int(verify_size)] += 1
        episode_tokens.append(tokens)
        episode_seconds.append(seconds)
    total_tokens, total_seconds = sum(episode_tokens), sum(episode_seconds)
    return {
        "policy": policy.name,
        "throughput": total_tokens / total_seconds if total_seconds > 0 else 0.0,
        "episode_throughputs": [t / s if s > 0 else 0.0 for t, s in zip(episode_tokens, episode_seconds)],
        "episode_tokens": episode_tokens,
        "episode_seconds": episode_seconds,
        "num_rounds": num_rounds,
        "mean_tokens_per_round": total_tokens / num_rounds if num_rounds else 0.0,
        "depth_histogram": dict(sorted(depths.items())),
        "verify_size_histogram": dict(sorted(verify_sizes.items())),
        "episodes": episodes,
        "seed": seed,
    }


def evaluate_saved_policy(path: str | Path, section: Mapping[str, Any], episodes: int = 20,
                          seed: int = 0) -> dict[str, Any]:
    """:func:`evaluate_policy` of the PPO policy saved at ``path`` (a run directory or a
    checkpoint, with its own normaliser statistics) on the env a training env ``section`` makes (plain
    data, as a run's ``config.json`` holds it), the way training made it (``draftrl.envs.ids.make_kwargs``).

    What ``export`` reads when a run's summary has no evaluation (a checkpoint): it may not make
    envs itself, this layer may.
    """
    import gymnasium as gym

    import draftrl.envs  # noqa: F401  registers the draftrl/* ids
    from draftrl.envs.ids import make_kwargs
    from draftrl.policies.ppo import PPOPolicy

    env = gym.make(section["id"], **make_kwargs(section))
    try:
        return evaluate_policy(PPOPolicy.load(path, env), env, episodes=episodes, seed=seed)
    finally:
        env.close()


def paired_difference(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """Mean and standard error of ``a[i] - b[i]`` over paired episodes (same seeds).

    :return: ``{"mean", "se", "z"}``; ``z = mean / se`` (inf when every difference is equal and
        nonzero, 0 when they are all 0).
    """
    diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if diff.size < 2:
        raise ValueError(f"need at least 2 paired episodes to estimate noise, got {diff.size}.")
    mean = float(diff.mean())
    se = float(diff.std(ddof=1) / math.sqrt(diff.size))
    z = mean / se if se > 0 else (0.0 if mean == 0 else math.copysign(math.inf, mean))
    return {"mean": mean, "se": se, "z": z}


def compare(results: dict[str, dict[str, Any]], reference: str) -> dict[str, dict[str, float]]:
    """Throughput ratio and paired episode difference of every result against ``results[reference]``."""
    ref = results[reference]
    table = {}
    for name, res in results.items():
        row = {"throughput": res["throughput"], "ratio": res["throughput"] / ref["throughput"]}
        if name != reference and len(res["episode_throughputs"]) >= 2:
            diff = paired_difference(res["episode_throughputs"], ref["episode_throughputs"])
            row.update({"diff_mean": diff["mean"], "diff_se": diff["se"]})
        table[name] = row
    return table
