"""PPO over ``draftrl/TraceChoice-v0``: learn each round's drafter and depth on the tune traces.

Stable-baselines3's PPO with observation normalisation (``VecNormalize``), trained on one split's
traces and played deterministically on another's, so the reported gain is on prompts the policy
never saw. Training on replayed traces takes a minute on 2 CPU cores.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from draftrl.envs.trace_choice import TraceChoiceEnv


@dataclass
class ChoicePolicy:
    """A trained PPO model and its observation statistics; ``act`` answers an arm index."""

    model: object
    normalizer: object

    def act(self, observation: np.ndarray) -> int:
        obs = self.normalizer.normalize_obs(observation[None, :]) if self.normalizer is not None else observation[None]
        action, _ = self.model.predict(obs, deterministic=True)
        return int(np.asarray(action).reshape(-1)[0])

    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save(directory / "model.zip")
        if self.normalizer is not None:
            self.normalizer.save(str(directory / "vecnormalize.pkl"))
        return directory


def train_choice(make_env: Callable[[], TraceChoiceEnv], total_timesteps: int = 60_000, seed: int = 0,
                 n_envs: int = 4, progress: bool = False) -> ChoicePolicy:
    """PPO on ``n_envs`` copies of ``make_env()`` (each seeded apart), ``total_timesteps`` rounds."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    def factory(i: int):
        def make():
            env = make_env()
            env.reset(seed=seed + i)
            return env
        return make

    venv = VecNormalize(DummyVecEnv([factory(i) for i in range(n_envs)]), norm_obs=True, norm_reward=True,
                        gamma=0.995)
    model = PPO("MlpPolicy", venv, n_steps=512, batch_size=256, gamma=0.995, gae_lambda=0.95, ent_coef=0.01,
                learning_rate=3e-4, seed=seed, verbose=0, device="cpu")
    model.learn(total_timesteps=total_timesteps, progress_bar=progress)
    venv.training = False
    return ChoicePolicy(model, venv)


def play_choice(env: TraceChoiceEnv, choose: Callable[[np.ndarray], int]) -> list[float]:
    """Seconds per recorded prompt of ``env`` when ``choose(observation)`` picks every round's arm."""
    seconds = []
    for p in range(len(env.prompts)):
        obs, _ = env.reset(options={"prompt_index": p})
        total, done = 0.0, False
        while not done:
            obs, _, done, _, info = env.step(choose(obs))
            total += info["seconds"]
        seconds.append(total)
    return seconds
