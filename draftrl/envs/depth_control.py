"""What the two per-level envs share: the STOP/CONTINUE action, their spaces, the verify size.

``SpecDecodeDepth-v1`` (real engine) and ``TraceReplayDepth-v0`` (recorded trees) differ in how a
level is drafted and a round verified, not in what the agent sees or does; this mixin holds the
latter so that the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium import spaces

from draftrl.signals.actions import CONTINUE, SizePolicy
from draftrl.signals.features import LEVEL_FEATURES, feature_bounds, level_observation


class DepthControl:
    """Mixin over an env that has ``config``, ``features``, ``_observation()`` (the round's features)
    and ``_level_features()`` (the current level's, ``{}`` before the first level)."""

    def _init_depth_control(self, verify_size: int, size_policy: SizePolicy | None) -> None:
        self.verify_size, self.size_policy = verify_size, size_policy
        self.max_depth = self.config.max_depth
        self.feature_names = self.features.names + LEVEL_FEATURES
        self.action_space = spaces.Discrete(2)
        low, high = feature_bounds(self.feature_names)
        self.observation_space = spaces.Box(low, high, dtype=np.float32)

    def _reset_round(self) -> None:
        """A new round: no level drafted, nothing charged, the round's features not built yet."""
        self._level = 0
        self._draft_seconds = 0.0
        self._charged = 0.0
        self._base_obs: np.ndarray | None = None

    def _level_obs(self) -> np.ndarray:
        """The round's features (built once per round) followed by the current level's."""
        if self._base_obs is None:
            self._base_obs = self._observation()
        return level_observation(self._base_obs, self._level_features())

    def _continues(self, action) -> bool:
        """True for CONTINUE, False for STOP; anything else is refused."""
        value = int(np.asarray(action))
        if not self.action_space.contains(value):
            raise ValueError(f"action={action!r} is outside {self.action_space} (0 = STOP, 1 = CONTINUE).")
        return value == CONTINUE

    def _chosen_size(self, tree: Callable[[], Any]) -> int:
        """The round's verify size: the size policy's choice on ``tree()``, else the fixed value."""
        if self.size_policy is None:
            return self.verify_size
        return int(self.size_policy(self._level_obs(), tree()))
