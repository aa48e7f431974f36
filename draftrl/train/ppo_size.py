"""Recipe ``ppo_size``: one PPO policy choosing ``(depth, verify_size)`` every round.

Reads top to bottom like CleanRL's ``ppo.py``, with SB3 doing the PPO update:

1. the env (``cfg.env``: trace replay, the analytic model or the real engine); its grids and
   features are what the policy is for, and a bad config fails before ``DIR`` is written;
2. the run directory (fresh, or ``--resume``d with the same run id), its clock and wandb run (with
   the best fixed setting on this env measured as the learning curve's reference line);
3. the phases: ``total_timesteps`` on ``cfg.env``, then optionally ``finetune_real_timesteps``
   more on ``cfg.finetune_env`` (the real engine), counted by one step counter;
4. PPO: SB3's ``"MlpPolicy"`` over the flat observation, ``MultiDiscrete([len(depths),
   len(verify_sizes)])`` actions, ``cfg.ppo``'s hyperparameters (:func:`new_ppo`), trained with
   the checkpoint and throughput callbacks (``draftrl.train.callbacks``) and yours;
5. keep the last checkpoint, or with ``keep: best`` the one that scores best on fresh episodes
   of the training env (``draftrl.train.selection``); save it as ``policy.zip`` +
   ``vecnormalize.pkl`` + ``policy.json`` (``draftrl.runs``);
6. evaluate the saved policy, every fixed setting and the baselines on the same seeded episodes
   (``draftrl.train.evaluation``) and write ``train_summary.json``.

``ppo_depth`` runs the same steps on the step-level env (:func:`run` with ``kind="depth"``).

    draftrl train --config configs/analytic_regimes.yaml --out runs/analytic
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import VecEnv

from draftrl.config.wandb import exit_code
from draftrl.io import write_json
from draftrl.runs import STATE_FILE
from draftrl.train.callbacks import start_wandb
from draftrl.train.config import TrainConfig, TrainEnvConfig
from draftrl.train.envs import make_env, make_vec_env
from draftrl.train.evaluation import best_fixed_reference
from draftrl.train.loop import Learned, Phase, finish_run, learn_phases, save_trained
from draftrl.train.selection import score_checkpoints
from draftrl.train.state import Stopwatch, open_run


def new_ppo(cfg: TrainConfig, venv: VecEnv, kind: str = "size") -> PPO:
    """A fresh SB3 PPO ("MlpPolicy") with ``cfg.ppo``'s hyperparameters for a ``kind`` policy, seeded with
    ``cfg.seed``."""
    p = cfg.ppo
    return PPO(
        "MlpPolicy",
        venv,
        learning_rate=p.learning_rate,
        n_steps=p.n_steps,
        batch_size=p.batch_size,
        n_epochs=p.n_epochs,
        gamma=p.gamma_for(kind),
        gae_lambda=p.gae_lambda,
        clip_range=p.clip_range,
        ent_coef=p.ent_coef,
        vf_coef=p.vf_coef,
        max_grad_norm=p.max_grad_norm,
        policy_kwargs={"net_arch": list(p.net_arch)},
        seed=cfg.seed,
        device=p.device,
        verbose=0,
    )


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
    return run(cfg, out, kind="size", spec=cfg.env, resume=resume, callbacks=callbacks)


def run(
    cfg: TrainConfig,
    out: str | Path,
    *,
    kind: str,
    spec: TrainEnvConfig,
    resume: bool,
    callbacks: Sequence[BaseCallback],
    env_kwargs: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The steps of the module docstring for a ``kind`` ("size" or "depth") policy trained on ``spec``.

    ``env_kwargs`` go to every env built (training and evaluation); ``extra`` into the manifest.
    """
    out = Path(out)
    torch.set_num_threads(cfg.threads)  # tiny MLPs: one thread is fastest, and fair on shared CPUs

    # 1. the env the policy is for
    grids_env = make_env(spec)

    # 2. the run directory, its wall clock and wandb run
    state = open_run(cfg, out, resume)
    clock = Stopwatch(state["wall_seconds"])
    wandb_run = start_wandb(cfg, out, state["run_id"])

    def record_state(num_timesteps: int) -> None:
        state.update(num_timesteps=num_timesteps, wall_seconds=clock.elapsed())
        write_json(out / STATE_FILE, state)

    # 3. the phases, each a factory of cfg.ppo.n_envs vectorised envs
    def envs(phase_spec: TrainEnvConfig):
        return lambda seed, norm: make_vec_env(cfg, phase_spec, seed, norm, extra_kwargs=env_kwargs, kind=kind)

    phases = [Phase("main", envs(spec), cfg.total_timesteps)]
    if cfg.finetune_real_timesteps:
        phases.append(Phase("finetune", envs(cfg.finetune_env), cfg.total_timesteps + cfg.finetune_real_timesteps))
    try:
        # the learning curve's reference line: the best fixed setting on this env (only when it is drawn)
        reference = best_fixed_reference(cfg, spec, env_kwargs) if wandb_run is not None else None
        # 4. PPO through the phases (fresh, or from the newest checkpoint)
        learned = learn_phases(cfg, phases, out, kind=kind, resume=resume, wandb_run=wandb_run, on_save=record_state,
                               new_model=lambda venv: new_ppo(cfg, venv, kind), callbacks=callbacks,
                               reference=reference["throughput"] if reference else None)
        if learned is None:
            return None
        # 5. the policy files; with keep=best, then replaced by the checkpoint best on fresh training-env episodes
        trained_steps = learned.model.num_timesteps
        manifest_extra = {"run_id": state["run_id"], **(extra or {})}
        save_trained(learned, out, kind=kind, env_id=spec.id, grids_env=grids_env, extra=manifest_extra)
        selection = None
        if cfg.keep == "best":
            selection = score_checkpoints(cfg, out, spec, env_kwargs)
            best_path, best_vecnormalize = selection.pop("best_path"), selection.pop("best_vecnormalize")
            if selection["best"] != trained_steps:
                best = Learned(PPO.load(best_path, device=cfg.ppo.device), best_vecnormalize)
                save_trained(best, out, kind=kind, env_id=spec.id, grids_env=grids_env, extra=manifest_extra)
        # 6. the evaluation against every fixed setting and the baselines, train_summary.json
        return finish_run(cfg, out, state, clock, trained_steps, eval_spec=spec, extra_kwargs=env_kwargs,
                          wandb_run=wandb_run, extra={"selection": selection} if selection else None,
                          reference=reference)
    except BaseException as err:
        if wandb_run is not None:
            wandb_run.finish(exit_code=exit_code(err))  # marked failed (Ctrl-C: 130); --resume continues it
            wandb_run = None
        raise
    finally:
        if wandb_run is not None:
            wandb_run.finish()
