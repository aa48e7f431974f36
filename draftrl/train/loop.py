"""The machinery under every recipe: phases, checkpoints, resume, saving, the summary.

A recipe (``ppo_size.py`` reads top to bottom) describes its training as ``Phase``s (an env
factory and the step count to train up to); ``learn_phases`` trains one PPO model through them
with one step counter, taking checkpoints at rollout boundaries and resuming from the newest
one; ``save_trained`` writes the policy files; ``finish_run`` evaluates the saved policy against
every fixed setting and writes ``train_summary.json``.
"""

from __future__ import annotations

import contextlib
import pickle
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from gymnasium import spaces
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import VecEnv, VecNormalize

from draftrl.config import to_dict
from draftrl.io import plain, write_json
from draftrl.policies import env_grids
from draftrl.policies.ppo import write_manifest
from draftrl.runs import CHECKPOINTS_DIR, STATE_FILE, SUMMARY_FILE, VECNORMALIZE_FILE, checkpoints, portable_config
from draftrl.train.callbacks import RolloutCheckpoint, ThroughputCallback, log_learning_curve, make_logger
from draftrl.train.config import TrainConfig, TrainEnvConfig
from draftrl.train.envs import detached
from draftrl.train.evaluation import evaluate_run
from draftrl.train.state import Stopwatch, save_policy, versions

#: ``(seed, normalizer or None) -> VecEnv``: builds a phase's training envs.
VenvFactory = Callable[[int, "VecNormalize | None"], VecEnv]


@dataclass
class Phase:
    """One stretch of training: ``make_venv``'s envs until the model has taken ``until`` steps."""

    name: str
    make_venv: VenvFactory
    until: int


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during training, after a checkpoint of what was learnt was saved in ``directory``."""

    def __init__(self, directory: Path, num_timesteps: int):
        super().__init__(f"checkpoint saved at {num_timesteps} steps in {Path(directory) / CHECKPOINTS_DIR}")
        self.directory = Path(directory)
        self.num_timesteps = num_timesteps


def load_normalizer(path: Path | None) -> VecNormalize | None:
    """VecNormalize statistics saved by SB3 (without a venv), or None."""
    if path is None or not Path(path).is_file():
        return None
    with Path(path).open("rb") as f:
        return pickle.load(f)


def resume_checkpoint(directory: Path, normalizes: bool) -> tuple[Path, Path | None, int] | None:
    """The newest checkpoint in ``directory/checkpoints`` that can be resumed from, or None if there is none.

    A checkpoint whose zip is damaged (an interrupted or corrupted write), or that lacks its
    VecNormalize file when training normalises (``normalizes``), is skipped with a warning naming
    it: resuming from it would crash, or continue with fresh statistics the weights never saw.

    :raises ValueError: checkpoints exist but none is usable (start a new ``--out``).
    """
    import sys
    import zipfile

    found = checkpoints(directory)
    for model_zip, vecnorm, steps in found:
        problem = None
        try:
            with zipfile.ZipFile(model_zip) as archive:
                damaged = archive.testzip()
            if damaged is not None:
                problem = f"member {damaged} is damaged"
        except (zipfile.BadZipFile, OSError) as err:
            problem = f"{type(err).__name__}: {err}"
        if problem is None and normalizes:
            if vecnorm is None:
                problem = "its VecNormalize statistics are missing"
            else:
                try:
                    load_normalizer(vecnorm)
                except Exception as err:  # UnpicklingError, EOFError: a damaged file
                    problem = f"{vecnorm.name} is unreadable ({type(err).__name__})"
        if problem is None:
            return model_zip, vecnorm, steps
        print(f"draftrl train: warning: skipping checkpoint {model_zip} ({problem}); resuming from an older one.",
              file=sys.stderr)
    if found:
        raise ValueError(f"no usable checkpoint in {directory / CHECKPOINTS_DIR} (all {len(found)} are damaged or lack "
                         "their VecNormalize statistics); start a new run with another --out.")
    return None


class Learned(NamedTuple):
    """A trained model and, when it was loaded from a checkpoint (no env attached), the file of its
    observation statistics: passed explicitly, since a loaded model does not carry them."""

    model: PPO
    normalizer_file: Path | None


def learn_phases(
    cfg: TrainConfig,
    phases: Sequence[Phase],
    directory: Path,
    *,
    kind: str,
    resume: bool,
    wandb_run: Any,
    on_save: Callable[[int], None],
    new_model: Callable[[VecEnv], PPO],
    callbacks: Sequence[BaseCallback] = (),
    start_from: Path | None = None,
    reference: float | None = None,
) -> Learned | None:
    """Train one PPO model through ``phases``; returns it, or None if a callback stopped the session.

    :param directory: where ``checkpoints/`` and ``logs/`` go.
    :param kind: ``"size"`` (the envs must have ``MultiDiscrete`` actions) or ``"depth"`` (``Discrete(2)``).
    :param resume: continue from the newest checkpoint in ``directory/checkpoints`` (if any).
    :param on_save: called with the step count after each checkpoint (the recipe records its state).
    :param new_model: ``venv -> PPO``: a fresh model, when there is no checkpoint or ``start_from``.
    :param start_from: a saved policy directory to continue training from when there is no
        checkpoint (co-training's later rounds), else a fresh PPO.
    :param reference: the best fixed setting's episode throughput on the training env, logged
        beside the learning curve (:class:`~draftrl.train.callbacks.ThroughputCallback`).
    """
    checkpoint = resume_checkpoint(directory, cfg.ppo.normalize_obs or cfg.ppo.normalize_reward) if resume else None
    model: PPO | None = None
    grids: tuple | None = None
    if checkpoint is not None:
        model_path, vecnorm_path, num_timesteps = checkpoint
        normalizer = load_normalizer(vecnorm_path)
    elif start_from is not None:
        model_path, num_timesteps = start_from / "policy.zip", 0
        normalizer = load_normalizer(start_from / "vecnormalize.pkl")
    else:
        model_path, num_timesteps, normalizer = None, 0, None

    for phase in phases:
        if num_timesteps >= phase.until:
            continue
        # Different env seeds per session, so a resumed run does not replay the same episodes.
        venv = phase.make_venv(cfg.seed + num_timesteps, detached(normalizer))
        try:
            phase_grids = env_grids(venv)  # the first env's, in this process or in its subprocess
            if grids is not None and phase_grids != grids:
                raise ValueError(
                    f"phase {phase.name!r} offers grids/features {phase_grids}, the policy was trained on {grids}; "
                    "make every phase's env with the same depths, verify_sizes and features."
                )
            grids = phase_grids
            _check_kind(kind, venv, phase.name)
            if model is None:
                if model_path is not None:
                    model = PPO.load(model_path, env=venv, device=cfg.ppo.device)
                    if checkpoint is None:
                        model.num_timesteps = 0  # a new phase of co-training counts its own steps
                else:
                    model = new_model(venv)
            else:
                model.set_env(venv)
            model.set_logger(make_logger(directory, model.num_timesteps, wandb_run))
            saver = RolloutCheckpoint(cfg.checkpoint_every, directory / "checkpoints", on_save=on_save)
            try:
                model.learn(
                    total_timesteps=phase.until - model.num_timesteps,
                    callback=[saver, ThroughputCallback(reference), *callbacks],
                    reset_num_timesteps=False,
                    progress_bar=cfg.progress_bar,
                )
            except KeyboardInterrupt:  # Ctrl-C: keep what was learnt, so --resume continues from here
                raise TrainingInterrupted(directory, saver.save_interrupted()) from None
        finally:  # ppo.vec_env=subproc: its processes end with the phase, however it ends; Ctrl-C or a
            # crashed env may have ended them already (a broken pipe then), which must not hide why
            with contextlib.suppress(OSError, EOFError):
                venv.close()
        num_timesteps = model.num_timesteps
        normalizer = model.get_vec_normalize_env()
        if num_timesteps < phase.until:  # a callback stopped the session: resume from the last checkpoint
            return None
        saver.save()  # end of phase: weights, statistics and step count agree

    if model is None:  # every phase was already done: the newest checkpoint is the result
        assert checkpoint is not None, "no phase ran and there is no checkpoint"
        return Learned(PPO.load(checkpoint[0], device=cfg.ppo.device), checkpoint[1])
    return Learned(model, None)


def _check_kind(kind: str, venv: VecEnv, phase: str) -> None:
    step_level = isinstance(venv.action_space, spaces.Discrete)
    if step_level != (kind == "depth"):
        want = ("a step-level env (Discrete(2): STOP/CONTINUE)" if kind == "depth"
                else "a round-level env (MultiDiscrete)")
        raise ValueError(
            f"phase {phase!r}: a {kind} policy needs {want}, but its env has {venv.action_space} actions; "
            "check the env id in the config section this recipe trains on (env, depth_env or finetune_env)."
        )


def save_trained(learned: Learned, directory: Path, *, kind: str, env_id: str, grids_env: Any,
                 extra: dict[str, Any]) -> None:
    """``policy.zip``, ``vecnormalize.pkl`` and the manifest ``policy.json`` in ``directory``."""
    model, normalizer_file = learned
    directory.mkdir(parents=True, exist_ok=True)
    save_policy(model, directory)
    if normalizer_file is not None:
        shutil.copyfile(normalizer_file, directory / VECNORMALIZE_FILE)
    depths, verify_sizes, feature_names = env_grids(grids_env)
    write_manifest(
        directory, kind=kind, env_id=env_id, depths=depths, verify_sizes=verify_sizes,
        feature_names=feature_names, extra={"num_timesteps": model.num_timesteps, **extra},
    )


def finish_run(
    cfg: TrainConfig,
    out: Path,
    state: dict[str, Any],
    clock: Stopwatch,
    num_timesteps: int,
    *,
    eval_spec: TrainEnvConfig,
    extra_kwargs: dict[str, Any] | None = None,
    wandb_run: Any = None,
    extra: dict[str, Any] | None = None,
    reference: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Mark the run complete, evaluate the policy in ``out`` and write ``train_summary.json``.

    :param reference: the best fixed setting on the training env
        (``draftrl.train.evaluation.best_fixed_reference``): kept in the summary as
        ``reference_best_fixed`` and drawn with the learning curve in wandb.
    """
    state.update(completed=True, num_timesteps=num_timesteps, wall_seconds=clock.elapsed())
    write_json(out / STATE_FILE, state)
    train_seconds = clock.elapsed()
    eval_clock = Stopwatch()
    evaluation = evaluate_run(cfg, out, eval_spec, extra_kwargs)
    summary = {
        "run_id": state["run_id"],
        "recipe": cfg.recipe,
        "config": portable_config(plain(to_dict(cfg)), out),
        "seeds": {"train": cfg.seed, "train_envs": [cfg.seed + i for i in range(cfg.ppo.n_envs)],
                  "eval": cfg.eval_seed},
        "versions": versions(),
        "num_timesteps": num_timesteps,
        "sessions": state["sessions"],
        "wall_seconds": {"training": train_seconds, "evaluation": eval_clock.elapsed()},
        **(extra or {}),
        **({"reference_best_fixed": reference} if reference else {}),
        "evaluation": evaluation,
    }
    write_json(out / SUMMARY_FILE, summary)
    if wandb_run is not None:
        wandb_run.summary.update({f"eval/{name}": row["throughput"] for name, row in evaluation["table"].items()})
        wandb_run.summary["eval/best_fixed"] = evaluation["best_fixed"]
        if evaluation.get("lookahead_gain_captured") is not None:
            wandb_run.summary["eval/lookahead_gain_captured"] = evaluation["lookahead_gain_captured"]
        for label, part in (evaluation.get("per_sampling") or {}).items():  # a temperature mix, per class
            wandb_run.summary.update({f"eval/{label}/{name}": row["throughput"] for name, row in part["table"].items()})
            wandb_run.summary[f"eval/{label}/best_fixed"] = part["best_fixed"]
        if reference:
            log_learning_curve(wandb_run, out, reference)
    return summary
