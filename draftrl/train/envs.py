"""The envs a training run learns on: ``gymnasium.make`` from a config section, vectorised for SB3."""

from __future__ import annotations

import functools
import multiprocessing
import pickle
import sys
from collections.abc import Callable
from typing import Any

import gymnasium as gym
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv, VecNormalize

import draftrl.envs  # noqa: F401  registers the draftrl/* env ids
from draftrl.config import to_dict
from draftrl.envs.ids import make_kwargs, register_id, registered_at_run_time
from draftrl.train.config import TrainConfig, TrainEnvConfig

#: How ``ppo.vec_env: subproc`` starts its processes: forked from a clean server process (SB3's
#: default), never from this one, whose threads (torch's, wandb's, the progress bar's) a fork does not
#: copy. The server first imports the draftrl modules this process has imported (the recipes make an
#: env in-process first, so the env's engine, scipy, transformers, torch, SB3 are among them); without
#: that every env imported them itself (benchmarks/README.md, ``vec_env_speed.py``).
START_METHOD = "forkserver"


def make_env(
    spec: TrainEnvConfig,
    evaluation: bool = False,
    extra_kwargs: dict[str, Any] | None = None,
    wrapper: Callable[[gym.Env], gym.Env] | None = None,
) -> gym.Env:
    """``gymnasium.make(spec.id, **make_kwargs(...))`` (the id's registry entry says which of the section's
    keys it takes); ``evaluation`` applies ``spec.eval`` first.

    :param extra_kwargs: more ``gymnasium.make`` arguments that YAML cannot hold (e.g. a frozen
        ``size_policy`` callable for the depth envs).
    :param wrapper: applied to the made env (e.g. ``FrozenDepth`` in co-training).
    """
    spec = spec.evaluation() if evaluation else spec
    try:
        env = gym.make(spec.id, **make_kwargs(to_dict(spec), spec.section), **(extra_kwargs or {}))
    except gym.error.NameNotFound as err:
        raise ValueError(f"env id {spec.id!r} is not registered ({err}); "
                         "`import draftrl.envs` registers draftrl/*.") from None
    except TypeError as err:  # e.g. TraceReplay-v1 without traces
        raise ValueError(
            f"gymnasium.make({spec.id!r}) failed: {err}; give its arguments in the env section of the config "
            "(TraceReplay-v1 needs env.traces: DIR from draftrl collect, see configs/cpu_default.yaml)."
        ) from None
    return wrapper(env) if wrapper is not None else env


def make_vec_env(
    cfg: TrainConfig,
    spec: TrainEnvConfig,
    seed: int,
    normalizer: VecNormalize | None = None,
    extra_kwargs: dict[str, Any] | None = None,
    wrapper: Callable[[gym.Env], gym.Env] | None = None,
    kind: str = "size",
) -> VecEnv:
    """``cfg.ppo.n_envs`` copies of ``spec``, each under SB3's ``Monitor``, in a ``DummyVecEnv`` (this
    process) or, with ``cfg.ppo.vec_env: subproc``, a ``SubprocVecEnv`` (one process each). Env ``i``
    is seeded ``seed + i`` either way, so both give the same episodes.

    With ``cfg.ppo.normalize_obs`` or ``normalize_reward`` the result is a ``VecNormalize``; pass
    ``normalizer`` (detached from its venv) to continue its statistics (resume, next phase).
    """
    make = functools.partial(monitored, spec, extra_kwargs, wrapper, registered_at_run_time(spec.id))
    if cfg.ppo.vec_env == "subproc":
        if START_METHOD == "forkserver":  # read when the server starts (the first SubprocVecEnv), then kept
            imported = sorted(m for m in sys.modules if m.partition(".")[0] == "draftrl" and "__main__" not in m)
            multiprocessing.get_context("forkserver").set_forkserver_preload(["__main__", __name__, *imported])
        venv: VecEnv = SubprocVecEnv([make] * cfg.ppo.n_envs, start_method=START_METHOD)
    else:
        venv = DummyVecEnv([make] * cfg.ppo.n_envs)
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


def monitored(
    spec: TrainEnvConfig,
    extra_kwargs: dict[str, Any] | None,
    wrapper: Callable[[gym.Env], gym.Env] | None,
    registration: dict[str, Any] | None,
) -> gym.Env:
    """One training env under SB3's ``Monitor``, in whichever process calls it.

    :param registration: ``spec.id``'s ``register_id`` arguments when the parent process registered it
        at run time; a subprocess (which knows only draftrl's ids) registers it first.
    """
    if registration is not None and registration["id"] not in gym.registry:
        register_id(**registration)
    return Monitor(make_env(spec, extra_kwargs=extra_kwargs, wrapper=wrapper))


def detached(normalizer: VecNormalize | None) -> VecNormalize | None:
    """VecNormalize statistics without a venv, ready to wrap another one (``make_vec_env``)."""
    if normalizer is None or normalizer.venv is None:  # None, or loaded from a checkpoint (used once)
        return normalizer
    return pickle.loads(pickle.dumps(normalizer))  # VecNormalize pickles without its venv
