"""Pieces every training recipe shares: envs, run directories, checkpoints, logging, evaluation.

A run directory ``DIR`` (``draftrl train --out DIR``) holds:

- ``config.json``: the resolved ``TrainConfig``; ``run_state.json``: run id, step count, wall time;
- ``checkpoints/ppo_<steps>_steps.zip`` and ``checkpoints/ppo_vecnormalize_<steps>_steps.pkl``
  (taken at rollout boundaries, so the PPO state and the step count agree; PPO has no replay
  buffer), which ``--resume`` continues from;
- ``logs/progress_<start>.csv``: SB3's training curves, one file per session;
- ``policy.zip``, ``vecnormalize.pkl``, ``policy.json``: the trained policy (``PPOPolicy.load(DIR)``);
- ``train_summary.json``: config, seeds, versions, wall time, and the final evaluation of the
  policy, of every fixed setting and of the baselines on the same episodes;
- ``wandb/``: the offline wandb run (unless ``WANDB_DIR`` points elsewhere).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import pickle
import platform
import re
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3.common.callbacks import BaseCallback, CheckpointCallback
from stable_baselines3.common.logger import CSVOutputFormat, KVWriter, Logger
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv, VecNormalize

import draftrl
import draftrl.envs  # noqa: F401  registers the draftrl/* env ids
from draftrl.config import to_dict
from draftrl.policies import (
    ConfidenceThreshold,
    Fixed,
    HFHeuristic,
    Oracle,
    Policy,
    PPOPolicy,
    UCBBandit,
    env_grids,
    evaluate_policy_on_env,
    paired_difference,
)
from draftrl.policies.ppo import POLICY_FILE, VECNORMALIZE_FILE
from draftrl.train.config import EnvSpec, TrainConfig

CHECKPOINT_PREFIX = "ppo"
CONFIG_FILE = "config.json"
STATE_FILE = "run_state.json"
SUMMARY_FILE = "train_summary.json"


# ----------------------------------------------------------------------------- envs
def make_env(
    spec: EnvSpec,
    evaluation: bool = False,
    extra_kwargs: dict[str, Any] | None = None,
    wrapper: Callable[[gym.Env], gym.Env] | None = None,
) -> gym.Env:
    """``gymnasium.make(spec.id, **spec.kwargs)``; ``evaluation`` applies ``spec.eval_kwargs`` on top.

    :param extra_kwargs: more ``gymnasium.make`` arguments that YAML cannot hold (e.g. a frozen
        ``size_policy`` callable for the depth envs).
    :param wrapper: applied to the made env (e.g. ``FrozenDepth`` in co-training).
    """
    kwargs = {**spec.kwargs, **(spec.eval_kwargs if evaluation else {}), **(extra_kwargs or {})}
    try:
        env = gym.make(spec.id, **kwargs)
    except gym.error.NameNotFound as err:
        raise ValueError(f"env id {spec.id!r} is not registered ({err}); `import draftrl` registers draftrl/*.") from None
    except TypeError as err:  # e.g. TraceReplay-v0 without traces
        raise ValueError(
            f"gymnasium.make({spec.id!r}) failed: {err}; give its arguments under env.kwargs in the config "
            "(TraceReplay-v0 needs traces: DIR from draftrl collect, see configs/cpu_default.yaml)."
        ) from None
    return wrapper(env) if wrapper is not None else env


def make_vec_env(
    cfg: TrainConfig,
    spec: EnvSpec,
    seed: int,
    normalizer: VecNormalize | None = None,
    extra_kwargs: dict[str, Any] | None = None,
    wrapper: Callable[[gym.Env], gym.Env] | None = None,
    kind: str = "size",
) -> VecEnv:
    """``cfg.ppo.n_envs`` copies of ``spec`` in a ``DummyVecEnv``, each under SB3's ``Monitor``.

    With ``cfg.ppo.normalize_obs`` or ``normalize_reward`` the result is a ``VecNormalize``; pass
    ``normalizer`` (detached from its venv) to continue its statistics (resume, next phase).
    """
    venv: VecEnv = DummyVecEnv(
        [lambda: Monitor(make_env(spec, extra_kwargs=extra_kwargs, wrapper=wrapper)) for _ in range(cfg.ppo.n_envs)]
    )
    venv.seed(seed)
    if normalizer is not None:
        normalizer.set_venv(venv)
        normalizer.training = True
        return normalizer
    if cfg.ppo.normalize_obs or cfg.ppo.normalize_reward:
        venv = VecNormalize(
            venv, norm_obs=cfg.ppo.normalize_obs, norm_reward=cfg.ppo.normalize_reward, gamma=cfg.ppo.gamma_for(kind),
            epsilon=cfg.ppo.obs_epsilon,
        )
    return venv


def first_env(venv: VecEnv) -> gym.Env:
    """The first env inside a (possibly ``VecNormalize``-wrapped) ``DummyVecEnv``, with its wrappers."""
    while not hasattr(venv, "envs"):
        venv = venv.venv
    return venv.envs[0]


def detached(normalizer: VecNormalize | None) -> VecNormalize | None:
    """VecNormalize statistics without a venv, ready to wrap another one (``make_vec_env``)."""
    if normalizer is None or normalizer.venv is None:  # None, or loaded from a checkpoint (used once)
        return normalizer
    return pickle.loads(pickle.dumps(normalizer))  # VecNormalize pickles without its venv


# ----------------------------------------------------------------------------- run directory
def versions() -> dict[str, str]:
    """Versions that decide whether a result reproduces."""
    import stable_baselines3
    import torch

    return {
        "draftrl": getattr(draftrl, "__version__", None) or importlib.metadata.version("draftrl"),
        "torch": torch.__version__,
        "stable_baselines3": stable_baselines3.__version__,
        "gymnasium": gym.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
    }


def new_run_state(cfg: TrainConfig) -> dict[str, Any]:
    return {
        "run_id": secrets.token_hex(4),
        "recipe": cfg.recipe,
        "seed": cfg.seed,
        "num_timesteps": 0,
        "wall_seconds": 0.0,
        "sessions": 0,
        "completed": False,
    }


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(_plain(data), indent=2) + "\n")
    tmp.replace(path)  # atomic: an interrupted write never leaves half a file


def _plain(obj: Any) -> Any:
    """JSON-safe copy: numpy scalars to Python, dict keys to str, inf/nan to null."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    return obj


def open_run(cfg: TrainConfig, out: Path, resume: bool) -> dict[str, Any]:
    """Create ``out`` for a fresh run, or load its state for ``--resume``; returns the run state.

    A fresh run refuses a directory that already holds one; a resumed run refuses a config that
    differs from the saved one except for ``total_timesteps``, ``finetune_real_timesteps``,
    ``eval_*``, ``progress_bar`` and ``wandb`` (extending a run or changing how it is watched).
    """
    state_path, config_path = out / STATE_FILE, out / CONFIG_FILE
    if resume:
        if not state_path.is_file():
            raise FileNotFoundError(f"{state_path} does not exist; nothing to resume (drop --resume to start a run).")
        saved = read_json(config_path)
        changed = _changed_keys(saved, _plain(to_dict(cfg)))
        if changed:
            raise ValueError(
                f"--resume with a different config: {', '.join(changed)} changed since the run started; "
                "resume with the same --config/--set, or start a new --out."
            )
        state = read_json(state_path)
        state["sessions"] += 1
        return state
    if state_path.exists():
        raise ValueError(f"{out} already holds a run; pass --resume to continue it or choose another --out.")
    out.mkdir(parents=True, exist_ok=True)
    write_json(config_path, to_dict(cfg))
    state = new_run_state(cfg)
    state["sessions"] = 1
    write_json(state_path, state)
    return state


_RESUMABLE = ("total_timesteps", "finetune_real_timesteps", "eval_episodes", "eval_seed", "progress_bar", "wandb", "baselines")


def _changed_keys(saved: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    changed = []
    for key in sorted(set(saved) | set(current)):
        if not prefix and key in _RESUMABLE:
            continue
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict) and key not in ("kwargs", "eval_kwargs"):
            changed += _changed_keys(a, b, f"{prefix}{key}.")
        elif a != b:
            changed.append(f"{prefix}{key}")
    return changed


def checkpoints(out: Path) -> list[tuple[Path, Path | None, int]]:
    """``(model_zip, vecnormalize_pkl or None, num_timesteps)`` of every checkpoint, newest first."""
    found = []
    for path in (out / "checkpoints").glob(f"{CHECKPOINT_PREFIX}_*_steps.zip"):
        match = re.fullmatch(rf"{CHECKPOINT_PREFIX}_(\d+)_steps\.zip", path.name)
        if match:
            found.append((int(match.group(1)), path))
    out_list = []
    for steps, path in sorted(found, reverse=True):
        vecnorm = path.with_name(f"{CHECKPOINT_PREFIX}_vecnormalize_{steps}_steps.pkl")
        out_list.append((path, vecnorm if vecnorm.is_file() else None, steps))
    return out_list


# ----------------------------------------------------------------------------- callbacks
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

    def _on_rollout_start(self) -> None:
        if self.model.num_timesteps - self._last_saved >= self.every:
            self.save()

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
            if "tokens" in info:
                self._episode_tokens[i] += info["tokens"]
                self._episode_seconds[i] += info["seconds"]
                self._tokens += info["tokens"]
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

    (out / "logs").mkdir(parents=True, exist_ok=True)
    formats: list[KVWriter] = [CSVOutputFormat(str(out / "logs" / f"progress_{start}.csv"))]
    if verbose:
        formats.append(HumanOutputFormat(sys.stdout))
    if wandb_run is not None:
        formats.append(WandbOutput(wandb_run))
    return Logger(folder=str(out / "logs"), output_formats=formats)


# ----------------------------------------------------------------------------- evaluation
def build_baselines(names: list[str], env: gym.Env) -> list[Policy]:
    """The named baselines for ``env``; ones the env cannot support (e.g. no confidence feature) are skipped."""
    makers: dict[str, Callable[[], Policy]] = {
        "hf_heuristic": lambda: HFHeuristic.for_env(env),
        "confidence": lambda: ConfidenceThreshold.for_env(env),
        "ucb_bandit": lambda: UCBBandit.for_env(env),
        "oracle": lambda: Oracle.for_env(env),
    }
    policies = []
    for name in names:
        try:
            policies.append(makers[name]())
        except (TypeError, ValueError) as err:
            print(f"draftrl train: skipping baseline {name}: {err}")
    return policies


def evaluate_run(
    cfg: TrainConfig,
    policy_dir: Path,
    spec: EnvSpec | None = None,
    extra_kwargs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Evaluate the saved policy, every fixed setting and the baselines on the same episodes.

    On a step-level env (a depth policy) the fixed settings are the grid's depths, each drafted
    to the end (``Policy.act_step``), and the env's own verify size applies.

    :param spec: the env to evaluate on (its ``eval_kwargs`` apply); default ``cfg.env``.
    :param extra_kwargs: ``gymnasium.make`` arguments YAML cannot hold (a frozen size policy).
    :return: ``{"episodes", "seed", "env", "results": {name: evaluate_policy_on_env(...)},
        "best_fixed", "table": {name: {"throughput", "ratio_to_best_fixed", "diff_vs_best_fixed",
        "se"}}, "oracle_gain_captured"}``; ``oracle_gain_captured`` = (policy - best fixed) /
        (oracle - best fixed) in throughput, when an oracle ran.
    """
    spec = spec or cfg.env
    env = make_env(spec, evaluation=True, extra_kwargs=extra_kwargs)
    step_level = isinstance(env.action_space, gym.spaces.Discrete)
    policies: list[Policy] = [PPOPolicy.load(policy_dir, env, name="ppo")]
    if step_level:
        depths, _, _ = env_grids(env)
        fixed = [Fixed.for_env(env, depth=d) for d in depths]
        for policy in fixed:
            policy.name = f"fixed(d={policy.depth})"
    else:
        fixed = Fixed.grid(env)
    policies += fixed + build_baselines(list(cfg.baselines), env)
    results = {p.name: evaluate_policy_on_env(p, env, cfg.eval_episodes, cfg.eval_seed) for p in policies}
    env.close()
    best_fixed = max((p.name for p in fixed), key=lambda name: results[name]["throughput"])
    best = results[best_fixed]
    table = {}
    for name, res in results.items():
        row: dict[str, Any] = {"throughput": res["throughput"], "ratio_to_best_fixed": res["throughput"] / best["throughput"]}
        if name != best_fixed and cfg.eval_episodes >= 2:
            diff = paired_difference(res["episode_throughputs"], best["episode_throughputs"])
            row.update({"diff_vs_best_fixed": diff["mean"], "se": diff["se"]})
        table[name] = row
    summary: dict[str, Any] = {
        "episodes": cfg.eval_episodes,
        "seed": cfg.eval_seed,
        "env": {"id": spec.id, "kwargs": {**spec.kwargs, **spec.eval_kwargs}},
        "best_fixed": best_fixed,
        "table": table,
        "results": results,
    }
    if "oracle" in results:
        gap = results["oracle"]["throughput"] - best["throughput"]
        summary["oracle_gain_captured"] = (results["ppo"]["throughput"] - best["throughput"]) / gap if gap > 0 else None
    return summary


def format_table(evaluation: dict[str, Any]) -> str:
    """One line per policy, ratios first (STYLE.md, benchmarks)."""
    lines = []
    for name, row in sorted(evaluation["table"].items(), key=lambda kv: -kv[1]["throughput"]):
        diff = f"  diff={row['diff_vs_best_fixed']:+.3f}±{row['se']:.3f}" if "se" in row else ""
        mark = "  <- best fixed" if name == evaluation["best_fixed"] else ""
        lines.append(f"vs_best_fixed={row['ratio_to_best_fixed']:.3f}x  throughput={row['throughput']:.4f}{diff}  {name}{mark}")
    if evaluation.get("oracle_gain_captured") is not None:
        lines.append(f"share of oracle's gain over best fixed captured by ppo: {evaluation['oracle_gain_captured']:.2f}")
    return "\n".join(lines)


def save_policy(model: Any, out: Path) -> None:
    """``policy.zip`` and (when training normalised observations) ``vecnormalize.pkl`` in ``out``."""
    model.save(out / POLICY_FILE)
    normalizer = model.get_vec_normalize_env()
    if normalizer is not None:
        normalizer.save(str(out / VECNORMALIZE_FILE))


class Stopwatch:
    """Wall time of a run across sessions: ``elapsed()`` = earlier sessions + this one."""

    def __init__(self, earlier: float = 0.0):
        self.earlier = earlier
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return self.earlier + time.perf_counter() - self.start
