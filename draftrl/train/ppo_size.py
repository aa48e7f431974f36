"""Recipe ``ppo_size``: one PPO policy choosing ``(depth, verify_size)`` every round.

Reads top to bottom like CleanRL's ``ppo.py``, with SB3 doing the PPO:

1. open (or resume) the run directory and the wandb run;
2. phases: the main phase on ``cfg.env`` (trace replay or the analytic model) up to
   ``total_timesteps``, then optionally ``finetune_real_timesteps`` more on ``cfg.finetune_env``
   (the real engine), both counted by the same step counter;
3. PPO ("MlpPolicy" over the flat observation, ``MultiDiscrete([len(depths), len(verify_sizes)])``
   actions) from scratch or from the latest checkpoint; VecNormalize statistics continue too;
4. save ``policy.zip`` + ``vecnormalize.pkl`` + ``policy.json``;
5. evaluate the saved policy, every fixed setting and the baselines on the same seeded episodes
   and write ``train_summary.json``.

Run it with ``draftrl train --config configs/analytic_regimes.yaml --out runs/analytic``.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import VecEnv, VecNormalize

from draftrl.config import to_dict
from draftrl.policies import env_grids
from draftrl.policies.ppo import write_manifest
from draftrl.train.common import (
    SUMMARY_FILE,
    STATE_FILE,
    RolloutCheckpoint,
    check_same_grids,
    Stopwatch,
    ThroughputCallback,
    evaluate_run,
    format_table,
    latest_checkpoint,
    make_env,
    make_logger,
    make_vec_env,
    open_run,
    save_policy,
    start_wandb,
    versions,
    write_json,
)
from draftrl.train.config import EnvSpec, TrainConfig


def build_ppo(cfg: TrainConfig, venv: VecEnv) -> PPO:
    """A fresh SB3 PPO with ``cfg.ppo``'s hyperparameters, seeded with ``cfg.seed``."""
    p = cfg.ppo
    return PPO(
        "MlpPolicy",
        venv,
        learning_rate=p.learning_rate,
        n_steps=p.n_steps,
        batch_size=p.batch_size,
        n_epochs=p.n_epochs,
        gamma=p.gamma,
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


def detached(normalizer: VecNormalize | None) -> VecNormalize | None:
    """A copy of VecNormalize statistics without their venv, to wrap another venv."""
    if normalizer is None:
        return None
    if normalizer.venv is None:  # loaded from a checkpoint: already detached, and used once
        return normalizer
    return pickle.loads(pickle.dumps(normalizer))  # VecNormalize pickles without its venv


def train(
    cfg: TrainConfig, out: str | Path, resume: bool = False, callbacks: Sequence[BaseCallback] = ()
) -> dict[str, Any] | None:
    """Train, save and evaluate a size policy in ``out``.

    :param cfg: the resolved config.
    :param out: run directory (created; a fresh run refuses one that holds a run).
    :param resume: continue the run in ``out`` from its latest checkpoint, same run id.
    :param callbacks: extra SB3 callbacks; one returning False stops the session early (the run
        stays resumable).
    :return: the training summary, or None when the session stopped before ``total_timesteps``.
    """
    out = Path(out)
    torch.set_num_threads(cfg.torch_threads)  # tiny MLPs: one thread is fastest, and fair on shared CPUs
    state = open_run(cfg, out, resume)
    clock = Stopwatch(state["wall_seconds"])
    wandb_run = start_wandb(cfg, out, state["run_id"])

    def record_state(num_timesteps: int) -> None:
        state.update(num_timesteps=num_timesteps, wall_seconds=clock.elapsed())
        write_json(out / STATE_FILE, state)

    # Phases share one step counter: (env, train until this many steps).
    phases: list[tuple[EnvSpec, int]] = [(cfg.env, cfg.total_timesteps)]
    if cfg.finetune_real_timesteps:
        phases.append((cfg.finetune_env, cfg.total_timesteps + cfg.finetune_real_timesteps))

    checkpoint = latest_checkpoint(out) if resume else None
    model: PPO | None = None
    normalizer: VecNormalize | None = None
    num_timesteps = 0
    if checkpoint is not None:
        model_path, vecnorm_path, num_timesteps = checkpoint
        if vecnorm_path is not None:
            with vecnorm_path.open("rb") as f:
                normalizer = pickle.load(f)
    grids_env = make_env(cfg.env)  # the grids and features the policy is trained for

    for spec, until in phases:
        if num_timesteps >= until:
            continue
        # Different env seeds per session, so a resumed run does not replay the same episodes.
        venv = make_vec_env(cfg, spec, seed=cfg.seed + num_timesteps, normalizer=detached(normalizer))
        _check_phase_env(grids_env, venv, spec)
        if model is None:
            model = PPO.load(model_path, env=venv, device=cfg.ppo.device) if checkpoint else build_ppo(cfg, venv)
        else:
            model.set_env(venv)
        model.set_logger(make_logger(out, model.num_timesteps, wandb_run))
        saver = RolloutCheckpoint(cfg.checkpoint_every, out / "checkpoints", on_save=record_state)
        model.learn(
            total_timesteps=until - model.num_timesteps,
            callback=[saver, ThroughputCallback(), *callbacks],
            reset_num_timesteps=False,
            progress_bar=cfg.progress_bar,
        )
        num_timesteps = model.num_timesteps
        normalizer = model.get_vec_normalize_env()
        if num_timesteps < until:  # a callback stopped the session: resume from the last checkpoint
            if wandb_run is not None:
                wandb_run.finish()
            return None
        saver.save()  # end of phase: weights, statistics and step count agree
        venv.close()

    assert model is not None, "no phase ran"
    save_policy(model, out)
    depths, verify_sizes, feature_names = env_grids(grids_env)
    write_manifest(
        out, kind="size", env_id=cfg.env.id, depths=depths, verify_sizes=verify_sizes,
        feature_names=feature_names, extra={"run_id": state["run_id"], "num_timesteps": model.num_timesteps},
    )
    state["completed"] = True
    record_state(model.num_timesteps)
    train_seconds = clock.elapsed()

    eval_clock = Stopwatch()
    evaluation = evaluate_run(cfg, out)
    summary = {
        "run_id": state["run_id"],
        "recipe": cfg.recipe,
        "config": to_dict(cfg),
        "seeds": {"train": cfg.seed, "train_envs": [cfg.seed + i for i in range(cfg.ppo.n_envs)], "eval": cfg.eval_seed},
        "versions": versions(),
        "num_timesteps": model.num_timesteps,
        "sessions": state["sessions"],
        "wall_seconds": {"training": train_seconds, "evaluation": eval_clock.elapsed()},
        "evaluation": evaluation,
    }
    write_json(out / SUMMARY_FILE, summary)
    print(format_table(evaluation))
    if wandb_run is not None:
        wandb_run.summary.update({f"eval/{name}": row["throughput"] for name, row in evaluation["table"].items()})
        wandb_run.summary["eval/best_fixed"] = evaluation["best_fixed"]
        wandb_run.finish()
    return summary


def _check_phase_env(grids_env: Any, venv: VecEnv, spec: EnvSpec) -> None:
    """A phase's env must offer the grids and features the policy is trained for."""
    inner = venv
    while not hasattr(inner, "envs"):
        inner = inner.venv
    check_same_grids(grids_env, inner.envs[0], f"env {spec.id}")
