"""A step-level analytic env for the depth recipes' fast tests (no traces, no models).

``tests/AnalyticDepth-v0`` plays ``draftrl/Analytic-v0`` one draft level per step, with the
contract of ``SpecDecodeDepth-v2`` / ``TraceReplayDepth-v1``: ``Discrete(2)`` actions (0 = STOP,
1 = CONTINUE), the round-level features followed by ``level``, draft steps with
``info["phase"] == "draft"`` and no ``tokens``, verifying steps with the round's info plus
``phase="verify"``, a public ``verify_size`` and an optional ``size_policy(obs, tree) -> int``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from draftrl.envs.analytic import AnalyticEnv


class AnalyticDepthEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, verify_size: int = 0, size_policy: Any = None, **kwargs: Any):
        self.inner = AnalyticEnv(**kwargs)
        self.depths, self.verify_sizes = self.inner.depths, self.inner.verify_sizes
        assert self.depths == tuple(range(len(self.depths))), "levels must index depths"
        self.feature_names = self.inner.feature_names + ("level",)
        self.verify_size, self.size_policy = verify_size, size_policy
        self.action_space = spaces.Discrete(2)
        low = np.append(self.inner.observation_space.low, 0.0).astype(np.float32)
        high = np.append(self.inner.observation_space.high, max(self.depths)).astype(np.float32)
        self.observation_space = spaces.Box(low, high, dtype=np.float32)

    def _obs(self) -> np.ndarray:
        return np.append(self._base, self.level).astype(np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._base, info = self.inner.reset(seed=seed, options=options)
        self.level = 0
        return self._obs(), info

    def step(self, action):
        if int(action) == 1 and self.level < max(self.depths):
            self.level += 1
            if self.level < max(self.depths):
                return self._obs(), 0.0, False, False, {"phase": "draft", "level": self.level}
        verify_size = self.verify_size
        if self.size_policy is not None:
            verify_size = int(self.size_policy(self._obs(), None))
        action = np.array([self.depths.index(self.level), self.verify_sizes.index(verify_size)])
        self._base, reward, terminated, truncated, info = self.inner.step(action)
        info = {**info, "phase": "verify", "level": self.level}
        self.level = 0
        return self._obs(), reward, terminated, truncated, info
