"""Recipe ``ppo_size``: one PPO policy choosing ``(depth, verify_size)`` every round.

Reads top to bottom like CleanRL's ``ppo.py``, with SB3 doing the PPO:

1. open (or resume) the run directory and its wandb run;
2. phases: the main phase on ``cfg.env`` (trace replay, or the analytic model) up to
   ``total_timesteps``, then optionally ``finetune_real_timesteps`` more on ``cfg.finetune_env``
   (the real engine), both counted by the same step counter;
3. PPO ("MlpPolicy" over the flat observation, ``MultiDiscrete([len(depths), len(verify_sizes)])``
   actions) from scratch or from the newest checkpoint, VecNormalize statistics included;
4. save ``policy.zip`` + ``vecnormalize.pkl`` + ``policy.json``;
5. evaluate the saved policy, every fixed setting and the baselines on the same seeded episodes
   and write ``train_summary.json``.

Run it with ``draftrl train --config configs/analytic_regimes.yaml --out runs/analytic``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from stable_baselines3.common.callbacks import BaseCallback

from draftrl.train.common import STATE_FILE, Stopwatch, make_env, make_vec_env, open_run, start_wandb, write_json
from draftrl.train.config import TrainConfig
from draftrl.train.loop import Phase, finish_run, learn_phases, save_trained


def train(
    cfg: TrainConfig, out: str | Path, resume: bool = False, callbacks: Sequence[BaseCallback] = ()
) -> dict[str, Any] | None:
    """Train, save and evaluate a size policy in ``out``.

    :param cfg: the resolved config.
    :param out: run directory (created; a fresh run refuses one that holds a run).
    :param resume: continue the run in ``out`` from its newest checkpoint, same run id.
    :param callbacks: extra SB3 callbacks; one returning False stops the session early (the run
        stays resumable).
    :return: the training summary, or None when the session stopped before the last phase's end.
    """
    out = Path(out)
    torch.set_num_threads(cfg.torch_threads)  # tiny MLPs: one thread is fastest, and fair on shared CPUs
    grids_env = make_env(cfg.env)  # the grids and features the policy is for; fails before DIR is written
    state = open_run(cfg, out, resume)
    clock = Stopwatch(state["wall_seconds"])
    wandb_run = start_wandb(cfg, out, state["run_id"])

    def record_state(num_timesteps: int) -> None:
        state.update(num_timesteps=num_timesteps, wall_seconds=clock.elapsed())
        write_json(out / STATE_FILE, state)

    phases = [Phase("main", lambda seed, norm: make_vec_env(cfg, cfg.env, seed, norm), cfg.total_timesteps)]
    if cfg.finetune_real_timesteps:  # same policy, same step counter, now on the real engine
        until = cfg.total_timesteps + cfg.finetune_real_timesteps
        phases.append(Phase("finetune", lambda seed, norm: make_vec_env(cfg, cfg.finetune_env, seed, norm), until))

    try:
        model = learn_phases(
            cfg, phases, out, kind="size", resume=resume, wandb_run=wandb_run, on_save=record_state,
            callbacks=callbacks,
        )
        if model is None:
            return None
        save_trained(model, out, kind="size", env_id=cfg.env.id, grids_env=grids_env,
                     extra={"run_id": state["run_id"]})
        return finish_run(cfg, out, state, clock, model.num_timesteps, eval_spec=cfg.env, wandb_run=wandb_run)
    finally:
        if wandb_run is not None:
            wandb_run.finish()
