"""SB3 callbacks and logging of a training run: rollout-boundary checkpoints, throughput, wandb."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback, CheckpointCallback
from stable_baselines3.common.logger import CSVOutputFormat, KVWriter, Logger

from draftrl.config import to_dict
from draftrl.runs import CHECKPOINT_PREFIX, LOGS_DIR
from draftrl.train.config import TrainConfig


class RolloutCheckpoint(CheckpointCallback):
    """SB3's ``CheckpointCallback``, but taken at rollout boundaries, after the PPO update.

    Saving mid-rollout would store a step count that includes experience the saved weights never
    learned from; at a boundary the weights, VecNormalize statistics and ``num_timesteps`` agree,
    so a resumed run trains exactly ``total_timesteps``. After each save, ``on_save(num_timesteps)``
    runs (the recipe records the run state there).

    :param every: env steps between checkpoints.
    """

    def __init__(self, every: int, save_path: str | Path, on_save: Callable[[int], None] | None = None):
        super().__init__(save_freq=1, save_path=str(save_path), name_prefix=CHECKPOINT_PREFIX, save_vecnormalize=True)
        self.every = int(every)
        self.on_save = on_save
        self._last_saved = -1

    def _init_callback(self) -> None:
        super()._init_callback()
        self._last_saved = self.model.num_timesteps
        self._rollout_start = self.model.num_timesteps
        self._collecting = False

    def save(self) -> None:
        """Save now; call only at a rollout boundary (or after ``learn`` returned)."""
        self.num_timesteps = self.model.num_timesteps  # BaseCallback refreshes it only in on_step
        self.model.save(self._checkpoint_path(extension="zip"))
        normalizer = self.model.get_vec_normalize_env()
        if normalizer is not None:
            normalizer.save(self._checkpoint_path("vecnormalize_", extension="pkl"))
        self._last_saved = self.num_timesteps
        if self.on_save is not None:
            self.on_save(self.num_timesteps)

    def save_interrupted(self) -> int:
        """Save after ``learn`` was interrupted (Ctrl-C); returns the steps the checkpoint holds.

        Interrupted while collecting a rollout, the weights have learned nothing of it yet: the
        step count goes back to the rollout's start, so ``--resume`` collects it again. Interrupted
        during the PPO update, the rollout counts (the weights moved on it).
        """
        if self._collecting:
            self.model.num_timesteps = self._rollout_start
        self.save()
        return self.num_timesteps

    def _on_rollout_start(self) -> None:
        if self.model.num_timesteps - self._last_saved >= self.every:
            self.save()
        self._rollout_start = self.model.num_timesteps
        self._collecting = True

    def _on_rollout_end(self) -> None:
        self._collecting = False

    def _on_step(self) -> bool:
        return True


class ThroughputCallback(BaseCallback):
    """Logs what draftrl cares about during training, once per rollout.

    ``rollout/episode_throughput`` (tokens / seconds of the episodes that ended in the rollout),
    ``rollout/tokens_per_round``, ``rollout/mean_depth`` and ``rollout/mean_verify_size``, and the
    chosen depths and verify sizes as histograms (wandb only). Reads the env's ``info``.
    """

    def __init__(self) -> None:
        super().__init__()
        self._episode_tokens: np.ndarray | None = None

    def _on_training_start(self) -> None:
        n = self.training_env.num_envs
        self._episode_tokens, self._episode_seconds = np.zeros(n), np.zeros(n)
        self._clear()

    def _clear(self) -> None:
        self._throughputs: list[float] = []
        self._depths: list[int] = []
        self._verify_sizes: list[int] = []
        self._tokens = self._rounds = 0.0

    def _on_step(self) -> bool:
        for i, (info, done) in enumerate(zip(self.locals["infos"], self.locals["dones"])):
            if "num_emitted" in info:
                self._episode_tokens[i] += info["num_emitted"]
                self._episode_seconds[i] += info["seconds"]
                self._tokens += info["num_emitted"]
                self._rounds += 1
                if "depth" in info:
                    self._depths.append(int(info["depth"]))
                if "verify_size" in info:
                    self._verify_sizes.append(int(info["verify_size"]))
            if done:
                if self._episode_seconds[i] > 0:
                    self._throughputs.append(self._episode_tokens[i] / self._episode_seconds[i])
                self._episode_tokens[i] = self._episode_seconds[i] = 0.0
        return True

    def _on_rollout_end(self) -> None:
        if self._throughputs:
            self.logger.record("rollout/episode_throughput", float(np.mean(self._throughputs)))
        if self._rounds:
            self.logger.record("rollout/tokens_per_round", self._tokens / self._rounds)
        for key, values in (("depth", self._depths), ("verify_size", self._verify_sizes)):
            if values:
                self.logger.record(f"rollout/mean_{key}", float(np.mean(values)))
                self.logger.record(f"rollout/{key}_histogram", np.asarray(values), exclude=("stdout", "log", "json", "csv"))
        self._clear()


class WandbOutput(KVWriter):
    """SB3 logger output that forwards every record to the active wandb run (arrays as histograms)."""

    def __init__(self, run: Any):
        self.run = run

    def write(self, key_values: dict[str, Any], key_excluded: dict[str, tuple[str, ...]], step: int = 0) -> None:
        import wandb

        data = {}
        for key, value in key_values.items():
            if "wandb" in (key_excluded.get(key) or ()):
                continue
            if isinstance(value, np.ndarray):
                value = wandb.Histogram(value)
            elif not isinstance(value, (int, float, np.number)):
                continue
            data[key] = value
        if data:
            self.run.log(data, step=int(step))

    def close(self) -> None:
        pass


def start_wandb(cfg: TrainConfig, out: Path, run_id: str) -> Any:
    """The wandb run of this training run (same id across resumes), or None when disabled.

    ``WANDB_MODE`` and ``WANDB_DIR`` in the environment win over the config (tests set
    ``WANDB_MODE=disabled``); the default directory is ``out``.
    """
    mode = os.environ.get("WANDB_MODE", cfg.wandb.mode)
    if mode == "disabled":
        return None
    import wandb

    return wandb.init(
        project=cfg.wandb.project,
        entity=cfg.wandb.entity,
        group=cfg.wandb.group,
        tags=list(cfg.wandb.tags),
        name=out.name,
        id=run_id,
        resume="allow",
        mode=mode,
        dir=os.environ.get("WANDB_DIR", str(out)),
        config=to_dict(cfg),
    )


def make_logger(out: Path, start: int, wandb_run: Any, verbose: bool = False) -> Logger:
    """SB3 logger writing ``logs/progress_<start>.csv`` (one file per session) and to wandb."""
    from stable_baselines3.common.logger import HumanOutputFormat

    (out / LOGS_DIR).mkdir(parents=True, exist_ok=True)
    formats: list[KVWriter] = [CSVOutputFormat(str(out / LOGS_DIR / f"progress_{start}.csv"))]
    if verbose:
        formats.append(HumanOutputFormat(sys.stdout))
    if wandb_run is not None:
        formats.append(WandbOutput(wandb_run))
    return Logger(folder=str(out / LOGS_DIR), output_formats=formats)
