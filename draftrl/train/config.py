"""``TrainConfig``: every knob of a training run, with its default, in one dataclass tree.

YAML files in ``configs/`` override only what differs (``draftrl.config.load_config`` refuses
unknown keys); ``draftrl train --set ppo.learning_rate=1.0e-3`` overrides one key. The resolved
config is saved in ``DIR/config.json`` and in ``train_summary.json``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from draftrl.config import BASELINES
from draftrl.config.wandb import WandbConfig
from draftrl.envs.ids import holds_model
from draftrl.train.env_config import DepthTrainEnvConfig, FinetuneTrainEnvConfig, TrainEnvConfig

#: Recipes ``draftrl train`` can run: module ``draftrl.train.<recipe>`` with ``train(cfg, out, ...)``.
RECIPES: tuple[str, ...] = ("ppo_size", "ppo_depth", "cotrain")
#: Which checkpoint a run keeps as its policy (``draftrl.train.selection``).
KEEP: tuple[str, ...] = ("last", "best")
#: How ``ppo.n_envs`` training envs run: SB3's ``DummyVecEnv`` (this process) or ``SubprocVecEnv``.
VEC_ENVS: tuple[str, ...] = ("dummy", "subproc")


@dataclass
class PPOConfig:
    """stable-baselines3 PPO hyperparameters (names as in ``stable_baselines3.PPO``)."""

    learning_rate: float = 3.0e-4
    """Adam step size."""
    n_steps: int = 256
    """rollout length per env between updates."""
    batch_size: int = 64
    """minibatch size; must divide n_steps * n_envs."""
    n_epochs: int = 10
    """optimisation passes over each rollout."""
    gamma: float | None = None
    """discount; None = per policy kind (gamma_for): 0.5 for size policies, 0.99 for depth policies."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    clip_range: float = 0.2
    """PPO ratio clip."""
    ent_coef: float = 0.0
    """entropy bonus; 0 (SB3's default): 0.01 kept the trace policy near uniform for 20k steps."""
    vf_coef: float = 0.5
    """value-loss weight."""
    max_grad_norm: float = 0.5
    """gradient clip."""
    net_arch: list[int] = field(default_factory=lambda: [64, 64])
    """hidden layers of the policy and value MLPs."""
    n_envs: int = 4
    """parallel envs (vec_env says where they run)."""
    vec_env: str = "dummy"
    """dummy: the n_envs envs step in this process (SB3's DummyVecEnv); subproc: one subprocess each
    (SB3's SubprocVecEnv), for envs that hold no model (replay, analytic) on a machine with cores to spare."""
    normalize_obs: bool = True
    """VecNormalize observations; the statistics are saved with the policy."""
    obs_epsilon: float = 1.0e-2
    """VecNormalize epsilon: normalised x = (x - mean) / sqrt(var + obs_epsilon). SB3's 1e-8 turns a
    feature that hardly varied in training (a replayed cost ratio) into +-clip_obs as soon as the
    real engine measures it a little differently; 1e-2 floors every feature's scale at 0.1."""
    normalize_reward: bool = False
    """VecNormalize rewards (training only)."""
    device: str = "cpu"
    """device of the policy network; MLP policies are fastest on the CPU, wherever the models run."""

    def gamma_for(self, kind: str) -> float:
        """The discount of a ``"size"`` or ``"depth"`` policy: ``gamma`` if set, else the kind's default.

        Size policies act once per round, and with the envs' ratio reward the throughput-best
        action is (nearly) myopic, so a short horizon (0.5) cuts the return's variance: on traces,
        0.95 left the policy near uniform after 20k steps while 0.5 beat grid search. Depth
        policies act once per draft level and only a round's verifying step pays, up to
        ``max(depths) + 1`` steps after the first decision, so they need a long one (0.99; 0.95
        lost to grid search on traces, 0.99 beat it).
        """
        if self.gamma is not None:
            return self.gamma
        return 0.99 if kind == "depth" else 0.5


@dataclass
class TrainConfig:
    """One training run: env, PPO, budget, evaluation and logging."""

    recipe: str = "ppo_size"
    """ppo_size (depth and verify size per round) | ppo_depth (CONTINUE/STOP) | cotrain (both, alternating)."""
    env: TrainEnvConfig = field(default_factory=TrainEnvConfig)
    """the training env: id, EnvConfig fields (env.target, env.depths, ...), the id's own arguments, env.eval."""
    ppo: PPOConfig = field(default_factory=PPOConfig)
    """PPO hyperparameters."""
    total_timesteps: int = 50_000
    """env steps of the main training phase (rounds, or draft steps for ppo_depth)."""
    seed: int = 0
    """seeds PPO, the training envs (seed + i for env i) and torch."""
    finetune_real_timesteps: int = 0
    """after the main phase, continue training on finetune_env for this many steps (0 = skip)."""
    finetune_env: FinetuneTrainEnvConfig = field(default_factory=FinetuneTrainEnvConfig)
    """the real env of the fine-tuning phase; must share the training env's grids and features."""
    depth_env: DepthTrainEnvConfig = field(default_factory=DepthTrainEnvConfig)
    """step-level env of the depth policy (ppo_depth, cotrain): TraceReplayDepth-v1 or SpecDecodeDepth-v2."""
    cotrain_rounds: int = 2
    """cotrain: alternations, each training the depth policy (size frozen) then the size policy (depth frozen)."""
    frozen_size_policy: str | None = None
    """ppo_depth: a trained size-policy directory that picks the verify size at STOP; None = depth_env's verify_size."""
    eval_episodes: int = 50
    """episodes of the final evaluation (policy, every fixed setting, baselines: the same episodes)."""
    eval_seed: int = 1_000_000
    """seed of the first evaluation episode; far from training seeds."""
    baselines: list[str] = field(default_factory=lambda: list(BASELINES))
    """baselines evaluated besides the fixed grid: heuristic, threshold, bandit, lookahead
    (draftrl.config.BASELINES)."""
    checkpoint_every: int = 10_000
    """env steps between checkpoints (taken at the next rollout boundary); --resume restarts there."""
    keep: str = "last"
    """which checkpoint becomes policy.zip: last | best (the best on select_episodes fresh episodes of
    the training env, never the evaluation split; draftrl.train.selection)."""
    select_episodes: int = 15
    """keep=best: seeded episodes each checkpoint is scored on (the same ones for every checkpoint)."""
    select_seed: int = 2_000_000
    """keep=best: seed of the first selection episode; apart from training and evaluation seeds."""
    threads: int = 1
    """torch intra-op threads; 1 is fastest for small MLPs and fair to shared machines."""
    progress_bar: bool = True
    """SB3's rich/tqdm progress bar."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """logging."""

    def __post_init__(self) -> None:
        _check_numbers(self)
        if self.recipe not in RECIPES:
            raise ValueError(f"recipe={self.recipe!r} is not a recipe; choose one of {RECIPES}.")
        if self.keep not in KEEP:
            raise ValueError(f"keep={self.keep!r} is unknown; choose one of {', '.join(KEEP)}.")
        if self.keep == "best" and self.recipe == "cotrain":
            raise ValueError("keep=best scores one policy's checkpoints; recipe cotrain alternates two: use keep=last.")
        for name in ("total_timesteps", "eval_episodes", "checkpoint_every", "threads", "select_episodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= 1.")
        if self.finetune_real_timesteps < 0 or self.cotrain_rounds < 1:
            raise ValueError(
                f"finetune_real_timesteps={self.finetune_real_timesteps!r} must be >= 0 and "
                f"cotrain_rounds={self.cotrain_rounds!r} >= 1."
            )
        unknown = [b for b in self.baselines if b not in BASELINES]
        if unknown:
            raise ValueError(f"baselines {unknown} unknown; choose from {BASELINES}.")
        ppo = self.ppo
        if ppo.n_envs < 1 or ppo.n_steps < 2 or ppo.batch_size < 2:
            raise ValueError(f"ppo.n_envs={ppo.n_envs}, ppo.n_steps={ppo.n_steps}, "
                             f"ppo.batch_size={ppo.batch_size} are too small.")
        if (ppo.n_steps * ppo.n_envs) % ppo.batch_size:
            raise ValueError(
                f"ppo.batch_size={ppo.batch_size} does not divide ppo.n_steps * ppo.n_envs = "
                f"{ppo.n_steps * ppo.n_envs}; "
                "pick a divisor so that no minibatch is truncated."
            )
        if ppo.obs_epsilon <= 0:
            raise ValueError(f"ppo.obs_epsilon={ppo.obs_epsilon} must be > 0 (a floor on the normalising variance).")
        if ppo.vec_env not in VEC_ENVS:
            raise ValueError(f"ppo.vec_env={ppo.vec_env!r} is unknown; choose one of {', '.join(VEC_ENVS)}.")
        if ppo.vec_env == "subproc":
            for section in self.trained_sections():
                spec = getattr(self, section)
                if holds_model(spec.id, f"{section}.id"):
                    raise ValueError(
                        f"ppo.vec_env=subproc with {section}.id={spec.id!r}: that env holds a model (a live engine, "
                        "one per GPU), so n_envs subprocesses would load n_envs copies; use ppo.vec_env=dummy.")

    def trained_sections(self) -> tuple[str, ...]:
        """The env sections whose envs this run trains on: the recipe's, and finetune_env when it runs."""
        main = "env" if self.recipe == "ppo_size" else "depth_env"
        return (main, "finetune_env") if self.finetune_real_timesteps and self.recipe != "cotrain" else (main,)


def _check_numbers(obj: Any, prefix: str = "") -> None:
    """Reject strings where numbers belong: YAML reads ``1e-4`` as a string (write ``1.0e-4``)."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value, hint = getattr(obj, f.name), hints[f.name]
        if dataclasses.is_dataclass(value):
            _check_numbers(value, f"{prefix}{f.name}.")
        elif _numeric(hint) and value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            fix = " (YAML reads 1e-4 as text: write 1.0e-4)" if isinstance(value, str) else ""
            raise ValueError(f"config key '{prefix}{f.name}' has value {value!r}, expected a number{fix}")
        elif hint is int and isinstance(value, float):
            raise ValueError(f"config key '{prefix}{f.name}' has value {value!r}, expected an integer")


def _numeric(hint: Any) -> bool:
    """``float``, ``int``, a union of them or an optional one."""
    if hint in (float, int):
        return True
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    return union and all(arg in (float, int) for arg in args)
