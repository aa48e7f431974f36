"""Recipe ``ppo_depth``: a PPO policy deciding CONTINUE / STOP after every draft level.

Learning to Draft's depth policy. The env is step-level (``cfg.depth_env``:
``draftrl/TraceReplayDepth-v0`` on recorded traces, ``draftrl/SpecDecodeDepth-v0`` on the real
engine): ``Discrete(2)`` actions (0 = STOP, 1 = CONTINUE), the round features plus the current
level's (``level``, ``level_best_prob``, ``level_num_nodes``). The verification size is the
env's ``verify_size`` or, with ``cfg.frozen_size_policy``, a trained size policy's choice at STOP
(the env's ``size_policy`` hook). Otherwise the same steps as ``ppo_size``: phases,
checkpoints, resume, save, evaluation against every fixed depth on the same episodes.

    draftrl train --config configs/cpu_default.yaml --set recipe=ppo_depth --out runs/depth
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from stable_baselines3.common.callbacks import BaseCallback

from draftrl.policies import PPOPolicy
from draftrl.train.common import STATE_FILE, Stopwatch, make_env, make_vec_env, open_run, start_wandb, write_json
from draftrl.train.config import EnvSpec, TrainConfig
from draftrl.train.loop import Phase, finish_run, learn_phases, save_trained

#: The depth envs' hook: ``size_policy(observation, tree) -> verify_size``.
SizeHook = Callable[[np.ndarray, Any], int]


def size_hook(policy_dir: str | Path, spec: EnvSpec) -> SizeHook:
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
    out = Path(out)
    torch.set_num_threads(cfg.torch_threads)
    grids_env = make_env(cfg.depth_env)  # fails before DIR is written
    state = open_run(cfg, out, resume)
    clock = Stopwatch(state["wall_seconds"])
    wandb_run = start_wandb(cfg, out, state["run_id"])

    def record_state(num_timesteps: int) -> None:
        state.update(num_timesteps=num_timesteps, wall_seconds=clock.elapsed())
        write_json(out / STATE_FILE, state)

    if size_policy is None and cfg.frozen_size_policy:
        size_policy = size_hook(cfg.frozen_size_policy, cfg.depth_env)
    hook = {"size_policy": size_policy} if size_policy is not None else None

    def depth_envs(spec: EnvSpec) -> Callable[..., Any]:
        return lambda seed, norm: make_vec_env(cfg, spec, seed, norm, extra_kwargs=hook, kind="depth")

    phases = [Phase("main", depth_envs(cfg.depth_env), cfg.total_timesteps)]
    if cfg.finetune_real_timesteps:  # e.g. finetune_env.id: draftrl/SpecDecodeDepth-v0
        until = cfg.total_timesteps + cfg.finetune_real_timesteps
        phases.append(Phase("finetune", depth_envs(cfg.finetune_env), until))
    try:
        model = learn_phases(
            cfg, phases, out, kind="depth", resume=resume, wandb_run=wandb_run, on_save=record_state,
            callbacks=callbacks,
        )
        if model is None:
            return None
        save_trained(model, out, kind="depth", env_id=cfg.depth_env.id, grids_env=grids_env,
                     extra={"run_id": state["run_id"], "frozen_size_policy": cfg.frozen_size_policy})
        return finish_run(cfg, out, state, clock, model.num_timesteps, eval_spec=cfg.depth_env, eval_kwargs=hook,
                          wandb_run=wandb_run)
    finally:
        if wandb_run is not None:
            wandb_run.finish()
