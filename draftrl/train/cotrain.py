"""Recipe ``cotrain``: Learning to Draft's alternating co-training of a depth and a size policy.

Each of ``cfg.cotrain_rounds`` rounds trains

1. the **depth** policy (CONTINUE / STOP per draft level) on ``cfg.depth_env`` with the size
   policy frozen (the env's ``size_policy`` hook; in round 1, the env's ``verify_size``), then
2. the **size** policy (the verify size of each round) on ``FrozenDepthEnv``: the same depth
   env, driven level by level by the frozen depth policy, one step per round.

Each policy continues from its previous round's weights. The size policy decides from the
round features (known at the start of the round, as in ``SpecDecode-v2``), so it sees the same
inputs in both phases. Every phase is a sub-run in ``DIR/phases/<round>_<depth|size>/`` with its
own checkpoints; ``--resume`` skips finished phases and continues the current one. The final
pair is saved in ``DIR/depth/`` and ``DIR/size/`` and evaluated together on the depth env
(``train_summary.json``: the depth policy with the learned size hook against every fixed depth
with the same hook, on the same episodes).

    draftrl train --config configs/cpu_default.yaml --set recipe=cotrain --out runs/cotrain
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.callbacks import BaseCallback

from draftrl.config.wandb import exit_code
from draftrl.io import write_json
from draftrl.policies import LEVEL_FEATURE, Policy, PPOPolicy, env_grids
from draftrl.runs import MANIFEST_FILE, POLICY_FILE, STATE_FILE, VECNORMALIZE_FILE
from draftrl.train.callbacks import start_wandb
from draftrl.train.config import TrainConfig
from draftrl.train.envs import make_env, make_vec_env
from draftrl.train.loop import Phase, finish_run, learn_phases, save_trained
from draftrl.train.ppo_depth import size_hook
from draftrl.train.ppo_size import new_ppo
from draftrl.train.state import Stopwatch, open_run


class FrozenDepthEnv(gym.Env):
    """A step-level depth env whose draft levels a frozen depth policy plays: one step = one round.

    ## Action Space

    ``MultiDiscrete([1, len(verify_sizes)])``: ``action[1]`` indexes ``verify_sizes`` (the depth
    env's grid). ``depths = (max depth,)``: the depth is the frozen policy's, at most that.

    ## Observation Space

    The depth env's features without the per-level ones (``level``, ``level_best_prob``,
    ``level_num_nodes``), at the start of the round.

    ## Rewards, Episode End, Information

    The depth env's: the step's reward sums the round's draft steps and its verifying step;
    ``info`` is the verifying step's.

    :param env: a step-level env (``TraceReplayDepth-v1``, ``SpecDecodeDepth-v2``) with a
        public ``verify_size``.
    :param depth_policy: the frozen depth policy (``act_step``), built for ``env``.
    """

    metadata = {"render_modes": []}

    def __init__(self, env: gym.Env, depth_policy: Policy):
        self.env = env
        self.depth_policy = depth_policy
        depths, verify_sizes, names = env_grids(env)
        if not hasattr(env.unwrapped, "verify_size"):
            raise TypeError(f"{type(env.unwrapped).__name__} has no verify_size; FrozenDepthEnv needs a depth env.")
        level_names = {LEVEL_FEATURE, "level_best_prob", "level_num_nodes"}
        self._keep = np.array([i for i, name in enumerate(names) if name not in level_names])
        self.feature_names = tuple(names[i] for i in self._keep)
        self.depths = (max(depths),)
        self.verify_sizes = verify_sizes
        self.action_space = spaces.MultiDiscrete([1, len(verify_sizes)])
        box = env.observation_space
        self.observation_space = spaces.Box(box.low[self._keep], box.high[self._keep], dtype=np.float32)
        self._obs: np.ndarray | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._obs, info = self.env.reset(seed=seed, options=options)
        self.depth_policy.reset()
        return self._obs[self._keep], info

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.env.unwrapped.verify_size = self.verify_sizes[int(np.asarray(action).reshape(-1)[1])]
        total, obs = 0.0, self._obs
        while True:
            obs, reward, terminated, truncated, info = self.env.step(int(self.depth_policy.act_step(obs)))
            total += float(reward)
            if terminated or truncated or "num_emitted" in info:
                break
        self.depth_policy.observe(info)
        self._obs = obs
        return obs[self._keep], total, terminated, truncated, info

    def close(self) -> None:
        self.env.close()


def _copy_policy(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for name in (POLICY_FILE, VECNORMALIZE_FILE, MANIFEST_FILE):
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)


def train(
    cfg: TrainConfig, out: str | Path, resume: bool = False, callbacks: Sequence[BaseCallback] = ()
) -> dict[str, Any] | None:
    """Co-train a depth and a size policy in ``out``; returns the summary, or None if stopped early."""
    out = Path(out)
    torch.set_num_threads(cfg.threads)
    make_env(cfg.depth_env).close()  # fails before DIR is written
    state = open_run(cfg, out, resume)
    clock = Stopwatch(state["wall_seconds"])
    wandb_run = start_wandb(cfg, out, state["run_id"])
    depth_dir: Path | None = None
    size_dir: Path | None = None
    try:
        for rnd in range(1, cfg.cotrain_rounds + 1):
            for kind in ("depth", "size"):
                phase_dir = out / "phases" / f"{rnd}_{kind}"
                done = (phase_dir / POLICY_FILE).is_file()
                if not done:
                    hook = {"size_policy": size_hook(size_dir, cfg.depth_env)} if size_dir else None
                    if kind == "depth":
                        make = lambda seed, norm, hook=hook: make_vec_env(  # noqa: E731
                            cfg, cfg.depth_env, seed, norm, extra_kwargs=hook, kind="depth")
                        grids_env = make_env(cfg.depth_env)
                    else:
                        wrap = _frozen_depth_wrapper(depth_dir)
                        make = lambda seed, norm, wrap=wrap: make_vec_env(  # noqa: E731
                            cfg, cfg.depth_env, seed, norm, wrapper=wrap)
                        grids_env = make_env(cfg.depth_env, wrapper=wrap)
                    previous = depth_dir if kind == "depth" else size_dir

                    def record_state(num_timesteps: int, where: str = phase_dir.name) -> None:
                        state.update(phase=where, num_timesteps=num_timesteps, wall_seconds=clock.elapsed())
                        write_json(out / STATE_FILE, state)

                    learned = learn_phases(
                        cfg, [Phase(f"{rnd}_{kind}", make, cfg.total_timesteps)], phase_dir, kind=kind,
                        resume=resume, wandb_run=wandb_run, on_save=record_state,
                        new_model=lambda venv, kind=kind: new_ppo(cfg, venv, kind), callbacks=callbacks,
                        start_from=previous,
                    )
                    if learned is None:
                        return None
                    save_trained(learned, phase_dir, kind="size" if kind == "size" else "depth",
                                 env_id=cfg.depth_env.id, grids_env=grids_env,
                                 extra={"run_id": state["run_id"], "cotrain_round": rnd})
                if kind == "depth":
                    depth_dir = phase_dir
                else:
                    size_dir = phase_dir
        assert depth_dir is not None and size_dir is not None
        _copy_policy(depth_dir, out / "depth")
        _copy_policy(size_dir, out / "size")
        _copy_policy(depth_dir, out)  # DIR itself holds the depth policy, like the other recipes
        hook = {"size_policy": size_hook(size_dir, cfg.depth_env)}
        steps = 2 * cfg.cotrain_rounds * cfg.total_timesteps
        return finish_run(cfg, out, state, clock, steps, eval_spec=cfg.depth_env, extra_kwargs=hook,
                          wandb_run=wandb_run,
                          extra={"policies": {"depth": str(out / "depth"), "size": str(out / "size")}})
    except BaseException as err:
        if wandb_run is not None:
            wandb_run.finish(exit_code=exit_code(err))  # marked failed (Ctrl-C: 130); --resume continues it
            wandb_run = None
        raise
    finally:
        if wandb_run is not None:
            wandb_run.finish()


def _frozen_depth_wrapper(depth_dir: Path | None):
    """``env -> FrozenDepthEnv(env, frozen depth policy)``; without a depth policy yet, draft the maximum."""

    def wrap(env: gym.Env) -> gym.Env:
        if depth_dir is None:
            from draftrl.policies import Fixed

            depths, _, _ = env_grids(env)
            return FrozenDepthEnv(env, Fixed.for_env(env, depth=max(depths)))
        return FrozenDepthEnv(env, PPOPolicy.load(depth_dir, env, name="ppo_depth"))

    return wrap
