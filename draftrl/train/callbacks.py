"""SB3 callbacks and logging of a training run: rollout-boundary checkpoints, throughput, wandb."""

from __future__ import annotations

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

    :param reference: the best fixed setting's episode throughput on the same env
        (``draftrl.train.evaluation.best_fixed_reference``): then also ``rollout/best_fixed_throughput``
        and ``rollout/throughput_vs_best_fixed``, which passes 1.0 when the policy does.
    """

    def __init__(self, reference: float | None = None) -> None:
        super().__init__()
        self.reference = reference
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
            if self.reference:
                self.logger.record("rollout/best_fixed_throughput", self.reference)
                self.logger.record("rollout/throughput_vs_best_fixed",
                                   float(np.mean(self._throughputs)) / self.reference)
        if self._rounds:
            self.logger.record("rollout/tokens_per_round", self._tokens / self._rounds)
        for key, values in (("depth", self._depths), ("verify_size", self._verify_sizes)):
            if values:
                self.logger.record(f"rollout/mean_{key}", float(np.mean(values)))
                self.logger.record(f"rollout/{key}_histogram", np.asarray(values),
                                   exclude=("stdout", "log", "json", "csv"))
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
    """The wandb run of this training run (``job_type`` train, the run id of ``run_state.json``, so a
    resumed run continues it), or None when disabled (``draftrl.config.wandb.start_run``: offline
    runs in ``out/wandb/``, or the pipeline's ``wandb.dir``; ``WANDB_MODE`` and ``WANDB_DIR`` win)."""
    from draftrl.config.wandb import start_run

    return start_run(cfg.wandb, out, job_type="train", name=f"train-{out.name}", config=to_dict(cfg), run_id=run_id)


def log_learning_curve(run: Any, out: Path, reference: dict[str, Any]) -> None:
    """``rollout/learning_curve``: PPO's episode throughput per rollout (every session's
    ``logs/progress_*.csv``) and the best fixed setting's on the same env, on one chart."""
    import csv

    import wandb

    points = []
    for path in sorted((out / LOGS_DIR).glob("progress_*.csv")):
        with path.open() as f:
            for row in csv.DictReader(f):
                if row.get("rollout/episode_throughput"):
                    points.append((int(float(row["time/total_timesteps"])), float(row["rollout/episode_throughput"])))
    if not points:
        return
    points.sort()
    steps = [s for s, _ in points]
    run.log({"rollout/learning_curve": wandb.plot.line_series(
        xs=steps, ys=[[v for _, v in points], [reference["throughput"]] * len(steps)],
        keys=["PPO (episode throughput)", f"best fixed {reference['name']} (same env)"],
        title="learning curve vs the best fixed setting", xname="env steps")})
    run.summary.update({"reference/best_fixed": reference["name"],
                        "reference/best_fixed_throughput": reference["throughput"]})


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
