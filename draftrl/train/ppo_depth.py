"""Recipe ``ppo_depth``: a PPO policy deciding CONTINUE / STOP after every draft level.

Learning to Draft's depth policy. The env is step-level (``cfg.depth_env``:
``draftrl/TraceReplayDepth-v1`` on recorded traces, ``draftrl/SpecDecodeDepth-v2`` on the real
engine): ``Discrete(2)`` actions (0 = STOP, 1 = CONTINUE), the round features plus the current
level's (``level``, ``level_best_prob``, ``level_num_nodes``). The verification size is the
env's ``verify_size`` or, with ``cfg.frozen_size_policy``, a trained size policy's choice at STOP
(the env's ``size_policy`` hook). Otherwise the steps of ``ppo_size`` (its ``run``): phases,
checkpoints, resume, save, evaluation against every fixed depth on the same episodes.

    draftrl train --config configs/cpu_default.yaml --set recipe=ppo_depth --out runs/depth
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

from draftrl.policies import PPOPolicy
from draftrl.train.config import TrainConfig, TrainEnvConfig
from draftrl.train.envs import make_env
from draftrl.train.ppo_size import run

#: The depth envs' hook: ``size_policy(observation, tree) -> verify_size``.
SizeHook = Callable[[np.ndarray, Any], int]


def size_hook(policy_dir: str | Path, spec: TrainEnvConfig) -> SizeHook:
    """A frozen size policy as the depth env's ``size_policy`` hook.

    The size policy reads its features by name from the depth env's observation (the round
    features are the same; the level features it was not trained on are ignored).
    """
    names = tuple(make_env(spec).unwrapped.feature_names)
    policy = PPOPolicy.load(policy_dir, feature_names=names, name="ppo_size")
    return lambda observation, tree: policy.act(observation)[1]


def train(
    cfg: TrainConfig,
    out: str | Path,
    resume: bool = False,
    callbacks: Sequence[BaseCallback] = (),
    size_policy: SizeHook | None = None,
) -> dict[str, Any] | None:
    """Train, save and evaluate a depth policy in ``out``.

    :param size_policy: a verify-size hook for the depth env; default: ``cfg.frozen_size_policy``'s.
    :return: the training summary, or None when the session stopped early (resumable).
    """
    if size_policy is None and cfg.frozen_size_policy:
        size_policy = size_hook(cfg.frozen_size_policy, cfg.depth_env)
    return run(cfg, out, kind="depth", spec=cfg.depth_env, resume=resume, callbacks=callbacks,
               env_kwargs={"size_policy": size_policy} if size_policy is not None else None,
               extra={"frozen_size_policy": cfg.frozen_size_policy})
