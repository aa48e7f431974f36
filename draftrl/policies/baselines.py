"""Hand-written drafting policies that every report compares PPO with.

- ``Fixed``: one ``(depth, verify_size)`` for every round (what vLLM's ``num_speculative_tokens``
  does); the best one on the grid is the grid-search baseline.
- ``HFHeuristic``: Hugging Face's ``num_assistant_tokens_schedule="heuristic"``.
- ``ConfidenceThreshold``: stop drafting when the draft's confidence says a rejection is likely
  (SpecDec++, DISCO, HF's ``assistant_confidence_threshold``).
- ``DynamicSD``: vLLM's Dynamic SD, the depth from the running batch size (serving envs).
- ``UCBBandit``: UCB over ``(depth, verify_size)`` arms rewarded by observed tokens per second
  (BanditSpec).
- ``LookAhead``: knows the coming round before it is played (the analytic env's acceptance
  regime, a trace's true acceptance); the upper bound of every comparison, not a deployable policy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from draftrl.decoding.schedule import heuristic_depth
from draftrl.policies.base import Policy, env_grids
from draftrl.signals.speedup import expected_tokens

#: Features ``ConfidenceThreshold`` can read as a per-token acceptance estimate, in order of preference.
CONFIDENCE_FEATURES: tuple[str, ...] = ("draft_confidence", "draft_top1_prob", "accept_rate_1")


class Fixed(Policy):
    """The same ``(depth, verify_size)`` every round.

    :param depth: draft depth, a value of ``depths``.
    :param verify_size: verify size, a value of ``verify_sizes``; None = ``default_verify_size()``.
    """

    def __init__(
        self,
        depths: Sequence[int],
        verify_sizes: Sequence[int],
        feature_names: Sequence[str],
        depth: int = 0,
        verify_size: int | None = None,
    ):
        super().__init__(depths, verify_sizes, feature_names)
        self.depth = int(depth)
        self.verify_size = self.default_verify_size() if verify_size is None else int(verify_size)
        self.to_action(self.depth, self.verify_size)  # validates against the grid
        self.name = f"fixed(d={self.depth},v={self.verify_size})"

    @classmethod
    def grid(cls, env: Any) -> list[Fixed]:
        """One ``Fixed`` per ``(depth, verify_size)`` on ``env``'s grid, depth-major."""
        depths, verify_sizes, _ = env_grids(env)
        return [cls.for_env(env, depth=d, verify_size=v) for d in depths for v in verify_sizes]

    def act(self, observation: np.ndarray) -> tuple[int, int]:
        return self.depth, self.verify_size


class HFHeuristic(Policy):
    """Hugging Face assisted generation's ``num_assistant_tokens_schedule="heuristic"``.

    The number of draft tokens starts at ``initial_depth``; after a round in which every verified
    draft token was accepted it grows by 2, otherwise it shrinks by 1, never below 1. The schedule
    runs on real numbers and is snapped to the largest grid depth not above it (capped at the
    grid's maximum). As in transformers, the schedule carries over between episodes (requests);
    ``forget()`` restarts it.

    :param initial_depth: starting number of draft tokens (transformers' ``num_assistant_tokens``
        default is 20; here it is capped by the grid).
    :param verify_size: verify size used every round; None = ``default_verify_size()``.
    """

    name = "heuristic"

    def __init__(
        self,
        depths: Sequence[int],
        verify_sizes: Sequence[int],
        feature_names: Sequence[str],
        initial_depth: float = 20.0,
        verify_size: int | None = None,
    ):
        super().__init__(depths, verify_sizes, feature_names)
        if initial_depth < 1:
            raise ValueError(f"initial_depth={initial_depth!r} must be >= 1 (the schedule's floor).")
        self.initial_depth = float(initial_depth)
        self.verify_size = self.default_verify_size() if verify_size is None else int(verify_size)
        self.to_action(min(self.depths), self.verify_size)
        self.forget()

    def forget(self) -> None:
        """Restart the schedule at ``initial_depth``."""
        self.schedule = min(self.initial_depth, float(max(self.depths)))

    def act(self, observation: np.ndarray) -> tuple[int, int]:
        return self.snap_depth(self.schedule), self.verify_size

    def observe(self, info: Mapping[str, Any]) -> None:
        verified = info.get("num_verified", info.get("depth")) or 0
        self.schedule = heuristic_depth(self.schedule, info["num_accepted"], verified, max(self.depths))


class ConfidenceThreshold(Policy):
    """Draft while the draft's confidence says the whole draft is still likely to be accepted.

    SpecDec++ stops drafting once the probability that some drafted token gets rejected exceeds a
    threshold. With a per-token acceptance estimate ``c`` (the feature ``feature``, e.g. the
    draft's confidence), the probability that ``d`` drafts all pass is ``c ** d``:

    ``act`` picks the largest grid depth with ``c ** depth > threshold`` (depth 0 always
    qualifies, so ``c`` near 0 means no speculation); on step-level envs ``act_step`` drafts that
    depth (``Policy.act_step``), i.e. continues while ``c ** (level + 1) > threshold``. Which
    feature estimates ``c`` depends on the drafter: ``draft_confidence`` on the analytic env,
    ``draft_top1_prob`` for model drafters, ``accept_rate_1`` (the running first-position
    acceptance) for n-gram drafters; the default picks the first of these the env provides.

    :param threshold: probability in (0, 1); higher = shallower drafts.
    :param feature: name of the confidence feature in ``feature_names``; None = the first of
        ``CONFIDENCE_FEATURES`` present.
    :param verify_size: verify size used every round; None = ``default_verify_size()``.
    """

    def __init__(
        self,
        depths: Sequence[int],
        verify_sizes: Sequence[int],
        feature_names: Sequence[str],
        threshold: float = 0.35,
        feature: str | None = None,
        verify_size: int | None = None,
    ):
        super().__init__(depths, verify_sizes, feature_names)
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"threshold={threshold!r} must be a probability in (0, 1).")
        self.threshold = float(threshold)
        if feature is None:
            feature = next((f for f in CONFIDENCE_FEATURES if self.has_feature(f)), CONFIDENCE_FEATURES[0])
        self.feature_name = feature
        self.require_feature(feature)
        self.verify_size = self.default_verify_size() if verify_size is None else int(verify_size)
        self.to_action(min(self.depths), self.verify_size)
        self.name = f"threshold(t={self.threshold:g})"

    @classmethod
    def for_env(cls, env: Any, /, **kwargs: Any) -> ConfidenceThreshold:
        """As ``Policy.for_env``; without ``feature``, n-gram drafters (no draft probabilities) read
        ``accept_rate_1``."""
        drafter = getattr(getattr(env.unwrapped, "config", None), "drafter", None)
        if "feature" not in kwargs and isinstance(drafter, str) and drafter.partition(":")[0] in ("ngram", "none"):
            kwargs["feature"] = "accept_rate_1"
        return super().for_env(env, **kwargs)

    def depth_for(self, confidence: float) -> int:
        """Largest grid depth ``d`` with ``confidence ** d > threshold`` (the smallest depth if none)."""
        c = min(max(confidence, 0.0), 1.0)
        passing = [d for d in self.depths if d == 0 or c**d > self.threshold]
        return max(passing) if passing else min(self.depths)

    def act(self, observation: np.ndarray) -> tuple[int, int]:
        return self.depth_for(self.feature(observation, self.feature_name)), self.verify_size

class DynamicSD(Policy):
    """vLLM's Dynamic SD schedule on the serving envs: each step's depth cap K from the running
    batch size, one K per batch-size range, the batch's budget unbounded.

    Reads the feature ``running`` (running requests / ``max_num_seqs``) by name; K is snapped to
    the largest grid depth not above it.

    :param table: ``(start, end, K)`` rows over batch sizes, the first starting at 1; a batch
        larger than every row takes the last row's K.
    :param max_num_seqs: the engine's most concurrent sequences (``running``'s denominator);
        ``for_env`` reads it from the env's config.
    """

    name = "dsd"

    def __init__(
        self,
        depths: Sequence[int],
        verify_sizes: Sequence[int],
        feature_names: Sequence[str],
        table: Sequence[tuple[int, int, int]],
        max_num_seqs: int = 16,
    ):
        super().__init__(depths, verify_sizes, feature_names)
        self.table = tuple(sorted(tuple(int(x) for x in row) for row in table))
        if not self.table or self.table[0][0] != 1:
            raise ValueError(f"table={list(self.table)} must start at batch size 1, e.g. ((1, 1, 6), (2, 16, 2)).")
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs={max_num_seqs} must be >= 1.")
        self.max_num_seqs = int(max_num_seqs)
        self.require_feature("running")
        self.budget = max(self.verify_sizes)

    @classmethod
    def for_env(cls, env: Any, /, **kwargs: Any) -> DynamicSD:
        """As ``Policy.for_env``; ``max_num_seqs`` from ``env.unwrapped.config``."""
        kwargs.setdefault("max_num_seqs", env.unwrapped.config.max_num_seqs)
        return super().for_env(env, **kwargs)

    def act(self, observation: np.ndarray) -> tuple[int, int]:
        running = max(1, round(self.feature(observation, "running") * self.max_num_seqs))
        k = next((k for start, end, k in self.table if start <= running <= end), self.table[-1][2])
        return self.snap_depth(k), self.budget


class UCBBandit(Policy):
    """UCB over ``(depth, verify_size)`` arms, rewarded by observed tokens per second (BanditSpec).

    Each arm's value is its throughput, total tokens / total seconds of the rounds it played. The
    arm played is the one maximising ``value + exploration * sigma * sqrt(2 ln t / n_arm)``, where
    ``sigma`` is the pooled standard deviation of per-round throughput around each arm's value and
    ``t`` the number of rounds played; every arm is tried once first. With ``discount < 1`` all
    statistics decay by that factor per round (discounted UCB, for drifting workloads).
    Statistics persist across episodes; ``forget()`` clears them.

    :param exploration: scale of the confidence bonus; 0 = greedy after the first pass.
    :param discount: per-round decay of the statistics, in (0, 1].
    :param arms: ``(depth, verify_size)`` pairs to choose from; None = the whole grid.
    """

    name = "bandit"

    def __init__(
        self,
        depths: Sequence[int],
        verify_sizes: Sequence[int],
        feature_names: Sequence[str],
        exploration: float = 1.0,
        discount: float = 1.0,
        arms: Sequence[tuple[int, int]] | None = None,
    ):
        super().__init__(depths, verify_sizes, feature_names)
        if exploration < 0:
            raise ValueError(f"exploration={exploration!r} must be >= 0.")
        if not 0.0 < discount <= 1.0:
            raise ValueError(f"discount={discount!r} must be in (0, 1].")
        self.exploration = float(exploration)
        self.discount = float(discount)
        self.arms: list[tuple[int, int]] = (
            [(d, v) for d in self.depths for v in self.verify_sizes] if arms is None else [tuple(a) for a in arms]
        )
        for depth, verify_size in self.arms:
            self.to_action(depth, verify_size)
        self.forget()

    def forget(self) -> None:
        """Clear every arm's statistics."""
        k = len(self.arms)
        self.num_pulls = np.zeros(k)  # [num_arms], discounted
        self.tokens = np.zeros(k)  # [num_arms]
        self.seconds = np.zeros(k)  # [num_arms]
        self.sum_sq = np.zeros(k)  # [num_arms] sum of squared per-round throughput
        self.sum_rate = np.zeros(k)  # [num_arms] sum of per-round throughput
        self._last_arm: int | None = None

    def values(self) -> np.ndarray:
        """Throughput estimate of each arm (tokens / second), 0 for arms never played."""
        return np.divide(self.tokens, self.seconds, out=np.zeros_like(self.tokens), where=self.seconds > 0)

    def best_arm(self) -> tuple[int, int]:
        """The arm with the highest estimated throughput so far."""
        return self.arms[int(np.argmax(self.values()))]

    def act(self, observation: np.ndarray) -> tuple[int, int]:
        untried = np.flatnonzero(self.num_pulls <= 0)
        if untried.size:
            arm = int(untried[0])
        else:
            values = self.values()
            # pooled variance of per-round throughput around each arm's value
            resid = self.sum_sq - 2 * values * self.sum_rate + values**2 * self.num_pulls
            sigma = math.sqrt(max(resid.sum(), 0.0) / max(self.num_pulls.sum(), 1.0))
            t = self.num_pulls.sum()
            bonus = self.exploration * sigma * np.sqrt(2.0 * math.log(max(t, 1.0)) / self.num_pulls)
            arm = int(np.argmax(values + bonus))
        self._last_arm = arm
        return self.arms[arm]

    def observe(self, info: Mapping[str, Any]) -> None:
        if self._last_arm is None:
            return
        seconds = float(info["seconds"])
        rate = float(info["num_emitted"]) / seconds if seconds > 0 else 0.0
        if self.discount < 1.0:
            for stat in (self.num_pulls, self.tokens, self.seconds, self.sum_sq, self.sum_rate):
                stat *= self.discount
        arm = self._last_arm
        self.num_pulls[arm] += 1.0
        self.tokens[arm] += float(info["num_emitted"])
        self.seconds[arm] += seconds
        self.sum_rate[arm] += rate
        self.sum_sq[arm] += rate * rate
        self._last_arm = None


class LookAhead(Policy):
    """The per-round best setting given what only the environment knows: the upper bound.

    If the env provides ``env.unwrapped.lookahead_action()`` (an action, i.e. indices, for the
    coming round, computed from hidden state such as a trace's true acceptance), ``act`` returns
    it. Otherwise the env must be ``draftrl/Analytic-v0``: the policy knows the coming round's
    regime ``alpha`` and plays the setting that maximises ``E(alpha, n) - rho * cost`` where
    ``rho`` is the best long-run throughput reachable with known regimes (a Dinkelbach fixed
    point over the regimes' long-run shares). This maximises total tokens / total cost, which
    per-round ``E / cost`` does not when regimes switch.

    It reads the env it was built for, so build it with ``LookAhead.for_env(env)`` and use
    it only on that env.
    """

    name = "lookahead"

    def __init__(self, depths: Sequence[int], verify_sizes: Sequence[int], feature_names: Sequence[str], env: Any):
        super().__init__(depths, verify_sizes, feature_names)
        self.env = env
        base = env.unwrapped
        self._has_hook = callable(getattr(base, "lookahead_action", None))
        if not self._has_hook:
            if not hasattr(base, "alphas") or not hasattr(base, "regime"):
                raise TypeError(
                    f"LookAhead needs env.unwrapped.lookahead_action() or the analytic env's regimes; "
                    f"{type(base).__name__} has neither."
                )
            self.regime_actions, self.rho = analytic_lookahead_table(base)

    @classmethod
    def for_env(cls, env: Any, /, **kwargs: Any) -> LookAhead:
        return super().for_env(env, env=env, **kwargs)

    def act(self, observation: np.ndarray) -> tuple[int, int]:
        base = self.env.unwrapped
        if self._has_hook:
            return self.from_action(base.lookahead_action())
        return self.regime_actions[base.regime]


def analytic_lookahead_table(base: Any, iterations: int = 50) -> tuple[list[tuple[int, int]], float]:
    """Best ``(depth, verify_size)`` per regime of an ``AnalyticEnv`` and the throughput it reaches.

    :param base: the unwrapped ``AnalyticEnv``.
    :return: ``([regime] -> (depth, verify_size), rho)`` with ``rho`` in tokens per target step.
    """
    settings = [(d, v) for d in base.depths for v in base.verify_sizes]
    tokens = np.array(
        [[expected_tokens(a, base.num_verified(d, v)) for d, v in settings] for a in base.alphas]
    )  # [num_regimes, num_settings]
    cost = np.array([sum(base.round_seconds(d, v)) for d, v in settings])  # [num_settings], target steps
    share = _stationary(base.transition, len(base.alphas))  # [num_regimes]
    rho = 1.0
    for _ in range(iterations):
        best = np.argmax(tokens - rho * cost, axis=1)  # [num_regimes]
        new_rho = float(share @ tokens[np.arange(len(best)), best] / (share @ cost[best]))
        if abs(new_rho - rho) < 1e-12:
            break
        rho = new_rho
    best = np.argmax(tokens - rho * cost, axis=1)
    return [settings[i] for i in best], rho


def _stationary(transition: np.ndarray | None, k: int) -> np.ndarray:
    """Long-run share of rounds per regime; uniform without a transition matrix."""
    if transition is None or k == 1:
        return np.full(k, 1.0 / k)
    values, vectors = np.linalg.eig(np.asarray(transition).T)
    vec = np.real(vectors[:, np.argmin(np.abs(values - 1.0))])
    vec = np.abs(vec)
    return vec / vec.sum() if vec.sum() > 0 else np.full(k, 1.0 / k)
