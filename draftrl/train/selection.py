"""Which checkpoint a run keeps (``TrainConfig.keep``): the last one, or the best on fresh episodes.

Why: PPO's throughput does not rise monotonically. On the serving replay one seed reached
1.238x no speculation (geometric mean over five loads, tuning split) at 10k steps and fell to
1.190x at 90k, while another rose from 1.165x to 1.248x. With ``keep: best`` every checkpoint is
scored on the same ``select_episodes`` seeded episodes of the *training* env (its split, its
loads and cost jitter: never the evaluation split, so the final evaluation stays held out), and
the best becomes ``policy.zip``: stable-baselines3's ``EvalCallback`` idea, after the fact.
The score is the geometric mean of the episodes' throughputs: a serving run's episodes differ
4x in tokens/s by load, and a plain total would be decided by the slowest loads alone.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from draftrl.policies import PPOPolicy, evaluate_policy
from draftrl.runs import checkpoints
from draftrl.train.config import TrainConfig, TrainEnvConfig
from draftrl.train.envs import make_env


def score_checkpoints(cfg: TrainConfig, directory: Path, spec: TrainEnvConfig,
                      extra_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Score every checkpoint of the run in ``directory`` on ``spec``'s training env.

    :return: ``{"episodes", "seed", "scores": {num_timesteps: geometric-mean episode throughput},
        "best": num_timesteps, "best_path", "best_vecnormalize"}`` (ties go to the later checkpoint).
    """
    found = checkpoints(directory)
    if not found:
        raise ValueError(f"keep=best found no checkpoint in {directory}; train with checkpoint_every below "
                         "total_timesteps, or keep=last.")
    env = make_env(spec, extra_kwargs=extra_kwargs)
    scores: dict[int, float] = {}
    paths: dict[int, tuple[Path, Path | None]] = {}
    try:
        for model_zip, vecnorm, steps in found:
            policy = PPOPolicy.load(model_zip, env, name=f"ppo@{steps}")
            result = evaluate_policy(policy, env, cfg.select_episodes, cfg.select_seed)
            scores[steps] = math.exp(sum(map(math.log, result["episode_throughputs"])) / cfg.select_episodes)
            paths[steps] = (model_zip, vecnorm)
    finally:
        env.close()
    best = max(scores, key=lambda s: (scores[s], s))
    return {"episodes": cfg.select_episodes, "seed": cfg.select_seed,
            "scores": {str(s): scores[s] for s in sorted(scores)}, "best": best,
            "best_path": paths[best][0], "best_vecnormalize": paths[best][1]}
