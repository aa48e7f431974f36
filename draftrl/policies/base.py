"""The one interface every drafting policy implements, learned (PPO) or hand-written (baselines).

A policy is built for one env's action grids and observation features: ``depths`` and
``verify_sizes`` (the values that ``MultiDiscrete([len(depths), len(verify_sizes)])`` indexes) and
``feature_names`` (the names of the flat observation vector). ``Policy.for_env(env)`` reads all
three from ``env.unwrapped``. Policies read features by name (``self.feature(obs, "name")``), never
by position, so they keep working when an env adds or reorders features.

Round-level envs (``draftrl/Analytic-v0``, ``draftrl/SpecDecode-v2``, ``draftrl/TraceReplay-v1``)::

    policy.reset()                           # episode start
    depth, verify_size = policy.act(obs)     # values, not indices
    obs, reward, terminated, truncated, info = env.step(policy.to_action(depth, verify_size))
    policy.observe(info)                     # after each round: info["num_emitted"], ["num_accepted"], ["seconds"], ...

Step-level envs (``draftrl/SpecDecodeDepth-v2``, ``draftrl/TraceReplayDepth-v1``):
``policy.act_step(obs)`` returns ``CONTINUE`` (draft one more level) or ``STOP`` (verify now) after
each draft level; ``observe(info)`` follows every verifying step.

Every decision may use only what is known before the target verifies the round: the observation
and the ``info`` of rounds that already finished (docs/design.md, exactness contract).
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

# act_step answers with the step-level envs' own actions: CONTINUE (1) drafts another level, STOP (0) verifies
from draftrl.signals.actions import CONTINUE, STOP

#: Observation feature of step-level envs: draft levels built so far this round.
LEVEL_FEATURE = "level"

P = TypeVar("P", bound="Policy")


def env_grids(env: Any) -> tuple[tuple[int, ...], tuple[int, ...], tuple[str, ...]]:
    """``(depths, verify_sizes, feature_names)`` of a (possibly wrapped) draftrl env; on the serving
    envs the second grid is their ``budgets`` (draft tokens the whole batch may verify per step).

    ``env`` may also be an SB3 ``VecEnv``: its first env's, read through ``has_attr`` / ``get_attr``, so
    an env in a subprocess (``SubprocVecEnv``) answers with these small values, never its whole self.

    :raises TypeError: when the env does not expose the draftrl contract.
    """
    if hasattr(env, "get_attr") and hasattr(env, "num_envs"):  # an SB3 VecEnv
        has, base_name = env.has_attr, "the VecEnv's first env"

        def get(name: str) -> Any:
            return env.get_attr(name, indices=[0])[0]
    else:
        base = getattr(env, "unwrapped", env)
        has, get, base_name = functools.partial(hasattr, base), functools.partial(getattr, base), type(base).__name__

    config = get("config") if has("config") else None  # step-level envs keep their grids in the EnvConfig

    def grid(name: str) -> Any:
        return get(name) if has(name) else getattr(config, name, None)

    values = {name: grid(name) for name in ("depths", "verify_sizes", "feature_names")}
    if values["verify_sizes"] is None:  # the serving envs' second grid: the batch's verification budgets
        values["verify_sizes"] = grid("budgets")
    missing = [name for name, value in values.items() if value is None]
    if missing:
        raise TypeError(
            f"{base_name} lacks {', '.join(missing)}; draftrl policies need an env that exposes "
            "depths, verify_sizes and feature_names on env.unwrapped (e.g. draftrl/Analytic-v0)."
        )
    return tuple(values["depths"]), tuple(values["verify_sizes"]), tuple(values["feature_names"])


class Policy(ABC):
    """Chooses ``(depth, verify_size)`` each round, from the observation and past rounds.

    :param depths: depth values the env offers, in action-index order (0 = no speculation).
    :param verify_sizes: verify-size values the env offers, in action-index order.
    :param feature_names: names of the observation vector's entries, in order.
    """

    #: Short name used in reports and summaries.
    name: str = "policy"

    def __init__(self, depths: Sequence[int], verify_sizes: Sequence[int], feature_names: Sequence[str]):
        self.depths: tuple[int, ...] = tuple(int(d) for d in depths)
        self.verify_sizes: tuple[int, ...] = tuple(int(v) for v in verify_sizes)
        self.feature_names: tuple[str, ...] = tuple(feature_names)
        if not self.depths or not self.verify_sizes:
            raise ValueError(f"depths={self.depths} and verify_sizes={self.verify_sizes} must both be non-empty.")
        self._feature_index = {name: i for i, name in enumerate(self.feature_names)}
        self._depth_index = {d: i for i, d in enumerate(self.depths)}
        self._verify_index = {v: i for i, v in enumerate(self.verify_sizes)}
        self._round_depth: int | None = None  # act_step: the depth act() chose at level 0

    @classmethod
    def for_env(cls: type[P], env: Any, /, **kwargs: Any) -> P:
        """Build the policy for ``env``'s grids and features; ``kwargs`` go to the constructor."""
        depths, verify_sizes, feature_names = env_grids(env)
        return cls(depths=depths, verify_sizes=verify_sizes, feature_names=feature_names, **kwargs)

    # ------------------------------------------------------------------ the interface
    def reset(self) -> None:
        """Called at the start of every episode. Stateless policies do nothing."""

    def observe(self, info: Mapping[str, Any]) -> None:
        """Called after every round with the env's ``info`` (``tokens``, ``accepted``, ``seconds``, ...)."""

    @abstractmethod
    def act(self, observation: np.ndarray) -> tuple[int, int]:
        """Choose this round's setting.

        :param observation: the env's flat observation, ``[len(feature_names)]`` float32.
        :return: ``(depth, verify_size)`` values from ``depths`` and ``verify_sizes``.
        """

    def act_step(self, observation: np.ndarray) -> int:
        """Per-draft-level form for step-level envs (``SpecDecodeDepth-v2``, ``TraceReplayDepth-v1``).

        Called with the observation after ``level`` draft levels (the feature ``level``); answers
        ``CONTINUE`` (draft one more level) or ``STOP`` (verify now). The default plays the
        round-level policy: at level 0 it calls ``act`` on the round's observation and then
        drafts that depth, so every baseline behaves the same on both kinds of env. The env's
        fixed ``verify_size`` (or its ``size_policy``) chooses the verification size.
        """
        level = self.feature(observation, LEVEL_FEATURE)
        if level <= 0 or self._round_depth is None:
            self._round_depth = self.act(observation)[0]
        return CONTINUE if level < self._round_depth else STOP

    # ------------------------------------------------------------------ helpers
    def has_feature(self, name: str) -> bool:
        return name in self._feature_index

    def require_feature(self, name: str) -> int:
        """Index of feature ``name``; a ``ValueError`` that lists the available ones otherwise."""
        try:
            return self._feature_index[name]
        except KeyError:
            raise ValueError(
                f"{type(self).__name__} needs observation feature {name!r}, which this env does not provide; "
                f"its features are {list(self.feature_names)}."
            ) from None

    def feature(self, observation: np.ndarray, name: str) -> float:
        """The value of feature ``name`` in ``observation``."""
        return float(np.asarray(observation).reshape(-1)[self.require_feature(name)])

    def to_action(self, depth: int, verify_size: int) -> np.ndarray:
        """The env action ``[depth_index, verify_size_index]`` for grid values."""
        try:
            return np.array([self._depth_index[int(depth)], self._verify_index[int(verify_size)]], dtype=np.int64)
        except KeyError:
            raise ValueError(
                f"(depth={depth}, verify_size={verify_size}) is not on the env's grid "
                f"depths={self.depths}, verify_sizes={self.verify_sizes}."
            ) from None

    def from_action(self, action: Sequence[int] | np.ndarray) -> tuple[int, int]:
        """Grid values of an env action ``[depth_index, verify_size_index]``."""
        action = np.asarray(action).reshape(-1)
        return self.depths[int(action[0])], self.verify_sizes[int(action[1])]

    def default_verify_size(self) -> int:
        """The verify size used by policies that choose only a depth: "verify everything drafted".

        0 where the env offers it (it means "all" in the chain envs), else the largest size.
        """
        return 0 if 0 in self._verify_index else max(self.verify_sizes)

    def snap_depth(self, depth: float) -> int:
        """The largest grid depth ``<= depth`` (the smallest grid depth if none is)."""
        below = [d for d in self.depths if d <= depth]
        return max(below) if below else min(self.depths)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
