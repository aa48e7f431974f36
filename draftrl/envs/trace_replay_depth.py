"""``draftrl/TraceReplayDepth-v0``: ``SpecDecodeDepth-v1`` replayed from greedy traces.

The per-level CONTINUE/STOP decision of Learning to Draft's depth policy, at replay speed: the
level signals come from the recorded trees (the same values ``TreeBuilder.level_features``
gives), draft seconds per level from the cost table, and the round itself is replayed by
:class:`~draftrl.envs.trace_replay.TraceReplayEnv`'s code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, SupportsFloat

import numpy as np

from draftrl.config.env import EnvConfig
from draftrl.envs.depth_control import DepthControl
from draftrl.envs.trace_replay import TraceReplayEnv
from draftrl.replay.traces import Traces
from draftrl.signals.actions import SizePolicy
from draftrl.signals.costs import CostTable
from draftrl.signals.features import tree_level_features


class TraceReplayDepthEnv(DepthControl, TraceReplayEnv):
    """
    ## Description

    ``draftrl/SpecDecodeDepth-v1`` at temperature 0, replayed from ``draftrl collect`` traces:
    after each draft level the agent chooses STOP (0: verify now) or CONTINUE (1: one more
    level). A round ends in the same step as its last level when it reaches
    ``max(EnvConfig.depths)`` levels or the remaining budget, or when the recorded tree has no
    deeper level (the real drafter would have nothing more to propose). For the same actions
    the rounds equal the real env's (tested).

    ## Action Space

    ``Discrete(2)``: 0 = STOP, 1 = CONTINUE.

    ## Observation Space

    Identical to ``SpecDecodeDepth-v1``: the ``SpecDecode-v1`` features followed by `level`,
    `level_best_prob`, `level_num_nodes` of the recorded tree cut at the current level.

    ## Rewards

    As ``SpecDecodeDepth-v1`` with the cost table's seconds: a draft level costs
    ``draft.level_seconds(width)``, the per-round draft base is charged with the verification.
    Intermediate steps pay 0, or ``-rho * level seconds`` with ``EnvConfig.depth_shaping``.

    ## Starting State, Episode End, Information, Arguments

    As ``TraceReplay-v0`` (``max_episode_steps=16384``); draft steps report ``phase="draft"``
    and ``level``, verifying steps ``phase="verify"`` plus the round keys. Extra arguments:
    ``verify_size`` (0 = all drafted nodes) and ``size_policy(observation, tree) -> int``.

    ## Version History

    - v0: initial version.
    """

    def __init__(self, traces: str | Path | Traces, config: EnvConfig | dict | None = None, *,
                 cost_table: CostTable | str | Path | None = None, verify_size: int = 0,
                 size_policy: SizePolicy | None = None, render_mode: str | None = None, **overrides: Any):
        super().__init__(traces, config, cost_table=cost_table, render_mode=render_mode, **overrides)
        if verify_size < 0:
            raise ValueError(f"verify_size={verify_size} must be >= 0 (0 = all drafted nodes).")
        self._init_depth_control(verify_size, size_policy)
        if size_policy is not None:  # sizes chosen at STOP: no fixed size to find the best depth for
            self.lookahead_action = None
        self._reset_round()

    def _level_features(self) -> dict[str, float]:
        if self._finished or self._level == 0:
            return {}
        lo, hi = self._nodes()
        return tree_level_features(self._dep[lo:hi], self._score[lo:hi], self._level)

    def _has_level(self, level: int) -> bool:
        lo, hi = self._nodes()
        return any(d == level for d in self._dep[lo:hi])

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        _, info = super().reset(seed=seed, options=options)
        self._reset_round()
        return self._level_obs(), info

    def step(self, action) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        self._check_running()
        limit = min(self.max_depth, self._budget - self._t - 1) if self._has_drafter else 0
        step_reward = 0.0
        if self._continues(action) and self._level < limit and self._has_level(self._level + 1):
            seconds = self.cost_table.draft_level(self.config.width) * self._draft_scale * self._noise()
            self._level += 1
            self._draft_seconds += seconds
            if self.config.depth_shaping:
                step_reward, charged = self.rewards.draft_step(seconds)
                self._charged += charged
            if self._level < limit:
                info = {"phase": "draft", "level": self._level, "step_seconds": seconds}
                return self._level_obs(), float(step_reward), False, False, info
        return self._verify(step_reward)

    def _verify(self, step_reward: float) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        verify_size = self._chosen_size(self._tree)
        base = self.cost_table.draft_base_seconds * self._draft_scale * self._noise() if self._has_drafter else 0.0
        _, reward, terminated, truncated, info = self._play_round(
            self._level, verify_size, self._level, self._draft_seconds + base, charged=self._charged)
        info["phase"], info["level"] = "verify", self._level
        self._reset_round()
        return self._level_obs(), float(reward + step_reward), terminated, truncated, info

    def lookahead_action(self) -> np.ndarray:
        """TraceReplay-v0's per-round best at this env's fixed ``verify_size``: only the depth index
        (first entry) means anything here; ``Policy.act_step`` drafts to that depth and stops."""
        return self._lookahead((self.verify_size,))

    def _tree(self):
        """The recorded tree cut at the current level, as a ``DraftTree`` (for size policies)."""
        from draftrl.drafters.tree import DraftTree

        lo, hi = self._nodes()
        tree = DraftTree()
        for i in range(lo, hi):
            if self._dep[i] <= self._level:
                tree.add(self._tok[i], self._par[i], self._score[i])
        return tree
