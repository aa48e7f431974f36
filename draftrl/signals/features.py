"""The observation of the speculative-decoding envs: features known BEFORE the target verifies.

One builder serves ``SpecDecode-v2``, ``SpecDecodeDepth-v2``, ``TraceReplay-v1`` and
``TraceReplayDepth-v1`` so that a policy trained on replayed traces sees the same vector, in the
same order, on the real engine. Six groups (the class docstring of
:class:`~draftrl.envs.spec_decode.SpecDecodeEnv` has the table with bounds):

- **draft**: the drafter's own signals for the coming round (``engine.features()``): top-1
  probability and entropy of the draft's next-token distribution (model drafters), length of
  the matched suffix n-gram and number of earlier matches (n-gram drafter); 0 where a drafter
  does not produce one.
- **history**: tokens emitted by each of the last ``history`` rounds, their bias-corrected EMA,
  and per-position conditional acceptance estimates for positions 1..4 (Jeffreys-smoothed,
  exponentially discounted counts: P(position i accepted | positions < i accepted and a node at
  depth i verified)). Reset at each episode.
- **context**: context length (k tokens), generated length (fraction of the episode budget),
  remaining budget (capped at 16 tokens, the engine's deepest round).
- **costs**: running averages of verify seconds per bucket of verified nodes and of draft
  seconds per round and per level, each divided by the running plain-step (AR) time, so the
  features are ratios that carry across machines (a policy can adapt to its hardware). They
  persist across episodes (hardware does not change with the prompt) and start from the cost
  table when one is given.
- **request**: the request's sampling, fixed for the episode (``start_episode(sampling=...)``):
  ``temperature`` (0 = greedy, saturating at 2), ``top_k`` as ``min(top_k, 100) / 100`` with
  top-k off (0) read as 1 (keep every token: the largest cut-off), ``top_p`` (1 = off). A policy
  trained on a temperature mix tells a greedy request from a sampled one by these.
- **target**: what the last round's verification forward already computed about the target's
  uncertainty (``RoundResult.target_features``, :data:`TARGET_FEATURES`; no extra sync):
  ``target_top1_prob`` and ``target_entropy`` (nats) of the raw (T = 1) softmax of the row that
  emitted the round's last token, and ``accepted_mean_p``, the mean of the transformed target
  probability of the round's accepted draft tokens (0 when none was accepted). Before the first
  round, and after a round whose engine does not report them (an empty dict), all three are
  :data:`TARGET_UNKNOWN` (0, 0, 0): a real top-1 probability is at least 1 / vocab > 0, so
  ``target_top1_prob = 0`` marks "unknown".

The request and target groups sit after the cost features, so entries 0..24 (``history=4``) keep
the indices they had in ``SpecDecode-v2`` / ``TraceReplay-v1``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from draftrl.signals.costs import CostTable

#: Draft-side signals, named as the drafters name them (``Drafter.features``).
DRAFT_FEATURES: tuple[str, ...] = ("draft_top1_prob", "draft_entropy", "ngram_match_len", "ngram_num_matches")
#: What the target's verification forward already computed about the round (``RoundResult.target_features``,
#: filled by the live engine and by the trace replay alike): top-1 probability and entropy (nats) of the raw
#: softmax (temperature 1, no top-k/top-p) at the row that emitted the round's last token, and the mean p
#: (after temperature/top-k/top-p) of the round's accepted draft tokens (0.0 when none was accepted).
TARGET_FEATURES: tuple[str, ...] = ("target_top1_prob", "target_entropy", "accepted_mean_p")
#: Positions with a conditional acceptance estimate.
ACCEPT_POSITIONS: int = 4
#: Verified-node buckets of the cost features: bucket b covers [2^(b-1), 2^b) nodes, the last one 64+.
VERIFY_BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
#: ``remaining_len`` saturates here: no round drafts deeper than ``EngineConfig.max_depth`` = 16.
REMAINING_SCALE: int = 16
#: ``context_len`` unit (tokens).
CONTEXT_SCALE: int = 1024
#: The request's sampling (``start_episode(sampling=...)``), constant within an episode.
REQUEST_FEATURES: tuple[str, ...] = ("temperature", "top_k", "top_p")
#: ``top_k`` unit: ``min(top_k, TOP_K_SCALE) / TOP_K_SCALE``; top-k off (0) reads as 1.
TOP_K_SCALE: int = 100
#: The target's signals from the last verification (``RoundResult.target_features`` keys).
TARGET_FEATURES: tuple[str, ...] = ("target_top1_prob", "target_entropy", "accepted_mean_p")
#: ``TARGET_FEATURES`` before the first round and after a round whose engine reports none.
TARGET_UNKNOWN: tuple[float, ...] = (0.0, 0.0, 0.0)
#: Draft-level signals appended by ``SpecDecodeDepth-v2`` (``TreeBuilder.level_features``).
LEVEL_FEATURES: tuple[str, ...] = ("level", "level_best_prob", "level_num_nodes")

_BOUNDS = {
    "draft_top1_prob": 1.0,
    "draft_entropy": 20.0,
    "ngram_match_len": 64.0,
    "ngram_num_matches": 1024.0,
    "ema_tokens": 64.0,
    "context_len": 1024.0,
    "generated_len": 1.0,
    "remaining_len": 1.0,
    "temperature": 2.0,
    "top_k": 1.0,
    "top_p": 1.0,
    "target_top1_prob": 1.0,
    "target_entropy": 20.0,
    "accepted_mean_p": 1.0,
    "level": 64.0,
    "level_best_prob": 1.0,
    "level_num_nodes": 1024.0,
}
_COST_BOUND = 1e4


def feature_names(history: int = 4) -> tuple[str, ...]:
    """Names of the observation entries, in order, for ``EnvConfig.history = history``."""
    return (
        DRAFT_FEATURES
        + tuple(f"last_tokens_{k}" for k in range(1, history + 1))
        + ("ema_tokens",)
        + tuple(f"accept_rate_{i}" for i in range(1, ACCEPT_POSITIONS + 1))
        + ("context_len", "generated_len", "remaining_len")
        + tuple(f"verify_cost_{n}" for n in VERIFY_BUCKETS)
        + ("draft_cost_round", "draft_cost_level")
        + REQUEST_FEATURES
        + TARGET_FEATURES
    )


def stale_features_message(names, where: str = "the policy") -> str | None:
    """The one-line refusal of a policy that reads this builder's features as they were before issue 45
    (no request or target group: trained on ``TraceReplay-v0`` / ``SpecDecode-v1`` or their depth ids),
    or None for any other feature list."""
    names = tuple(names)
    if names[: len(DRAFT_FEATURES)] != DRAFT_FEATURES or set(REQUEST_FEATURES + TARGET_FEATURES) <= set(names):
        return None
    return (f"{where} was trained on the observation before issue 45, without the request's sampling and the "
            f"target's signals ({', '.join(REQUEST_FEATURES + TARGET_FEATURES)}); train it again with draftrl train "
            "on draftrl/TraceReplay-v1 or draftrl/SpecDecode-v2 (depth policies: draftrl/TraceReplayDepth-v1 or "
            "draftrl/SpecDecodeDepth-v2), then export it again.")


def request_values(sampling=None) -> list[float]:
    """``REQUEST_FEATURES`` of a request sampled with ``sampling`` (anything with ``temperature``,
    ``top_k`` and ``top_p``: a ``SamplingClass`` or ``SamplingParams``; None = greedy)."""
    if sampling is None:
        return [0.0, 1.0, 1.0]
    top_k = int(sampling.top_k)
    return [float(sampling.temperature), min(top_k, TOP_K_SCALE) / TOP_K_SCALE if top_k > 0 else 1.0,
            float(sampling.top_p)]


def target_values(target_features: dict[str, float] | None) -> list[float]:
    """``TARGET_FEATURES`` of a round's ``target_features``; :data:`TARGET_UNKNOWN` for what it lacks."""
    target_features = target_features or {}
    return [float(target_features.get(name, unknown)) for name, unknown in zip(TARGET_FEATURES, TARGET_UNKNOWN)]


def feature_bounds(names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) float32 arrays of the observation Box for ``names``."""
    high = []
    for name in names:
        if name.startswith("last_tokens_"):
            high.append(64.0)
        elif name.startswith("accept_rate_"):
            high.append(1.0)
        elif name.startswith(("verify_cost_", "draft_cost_")):
            high.append(_COST_BOUND)
        else:
            high.append(_BOUNDS[name])
    high_arr = np.asarray(high, dtype=np.float32)
    return np.zeros_like(high_arr), high_arr


@dataclass
class RoundSummary:
    """What the features and rewards need from one finished round (real or replayed)."""

    num_emitted: int
    num_accepted: int
    num_verified: int
    verified_depth: int
    levels: int
    """draft levels built (0 = plain target step)"""
    draft_seconds: float
    verify_seconds: float
    sample_seconds: float
    prompt_fed: bool = False
    """the round's verification also fed the prompt: its ``verify_seconds`` are not a verify cost"""
    target_features: dict[str, float] = field(default_factory=dict)
    """``RoundResult.target_features`` (:data:`TARGET_FEATURES`); empty = not reported"""

    @property
    def seconds(self) -> float:
        return self.draft_seconds + self.verify_seconds + self.sample_seconds

    @classmethod
    def from_round(cls, rnd, levels: int) -> RoundSummary:
        """The summary of an engine ``RoundResult`` that drafted ``levels`` levels."""
        return cls(
            num_emitted=rnd.num_emitted,
            num_accepted=rnd.num_accepted,
            num_verified=rnd.num_verified,
            verified_depth=rnd.verified_depth,
            levels=levels,
            draft_seconds=rnd.draft_seconds,
            verify_seconds=rnd.verify_seconds,
            sample_seconds=rnd.sample_seconds,
            prompt_fed=rnd.prompt_fed,
            target_features=dict(getattr(rnd, "target_features", None) or {}),
        )


def verify_bucket(num_verified: int) -> int:
    """0 for a plain step, else 1 + floor(log2(n)) capped at ``len(VERIFY_BUCKETS)``."""
    if num_verified <= 0:
        return 0
    return min(num_verified.bit_length(), len(VERIFY_BUCKETS))


class CostTracker:
    """Running averages of measured seconds, reported in units of the running plain-step time.

    Each average starts from the cost table (at its median context length) when one is given;
    otherwise it is unknown until observed. An unknown bucket borrows its nearest known
    neighbour's value (g = 1 if it is the AR unit's), and with nothing known every ratio is 1
    and the draft costs 0.
    """

    def __init__(self, table: CostTable | None, decay: float, width: int = 1):
        self.table, self.decay, self.width = table, decay, width
        self.reset()

    def reset(self) -> None:
        """Forget every measurement (back to the cost table's values, or unknown)."""
        n_buckets = len(VERIFY_BUCKETS) + 1
        self.verify: list[float | None] = [None] * n_buckets
        self.draft_base: float | None = None
        self.draft_level: float | None = None
        table = self.table
        if table is not None:
            ctx = float(np.median(table.context_lens))
            self.verify[0] = table.verify(1, ctx)
            for b, n in enumerate(VERIFY_BUCKETS, start=1):
                self.verify[b] = table.verify(n + 1, ctx)
            self.draft_base = table.draft_base_seconds
            self.draft_level = table.draft_level(self.width)
        self._cache: list[float] | None = None

    def _ema(self, old: float | None, new: float) -> float:
        return new if old is None else self.decay * old + (1.0 - self.decay) * new

    def observe(self, summary: RoundSummary) -> None:
        b = verify_bucket(summary.num_verified)
        if not summary.prompt_fed:  # a fused prefill's seconds would pass the prompt's cost off as a verify cost
            self.verify[b] = self._ema(self.verify[b], summary.verify_seconds)
        if summary.levels == 0:
            self.draft_base = self._ema(self.draft_base, summary.draft_seconds)
        else:
            per_level = max(summary.draft_seconds - (self.draft_base or 0.0), 0.0) / summary.levels
            self.draft_level = self._ema(self.draft_level, per_level)
        self._cache = None

    def ar_seconds(self) -> float | None:
        """The running plain-step time (or its best stand-in)."""
        return self._filled()[0]

    def _filled(self) -> list[float | None]:
        known = [i for i, v in enumerate(self.verify) if v is not None]
        if not known:
            return [None] * len(self.verify)
        return [v if v is not None else self.verify[min(known, key=lambda k: (abs(k - i), k))] for i, v in
                enumerate(self.verify)]

    def features(self) -> list[float]:
        """``verify_cost_*`` (one per bucket), ``draft_cost_round``, ``draft_cost_level``."""
        if self._cache is None:
            filled = self._filled()
            ar = filled[0]
            if ar is None or ar <= 0:
                self._cache = [1.0] * len(VERIFY_BUCKETS) + [0.0, 0.0]
            else:
                ratios = [v / ar for v in filled[1:]]
                self._cache = ratios + [(self.draft_base or 0.0) / ar, (self.draft_level or 0.0) / ar]
        return self._cache


class FeatureBuilder:
    """Builds observation vectors (see the module docstring) from round summaries.

    Lifecycle: ``start_episode`` at reset, ``observation`` before each round, ``observe_round``
    after it. ``reset_costs`` on a seeded reset makes seeded episodes reproducible.
    """

    def __init__(self, history: int, ema_decay: float, cost_tracker: CostTracker):
        self.history = history
        self.ema_decay = ema_decay
        self.costs = cost_tracker
        self.names = feature_names(history)
        self.low, self.high = feature_bounds(self.names)
        self.start_episode(max_new_tokens=1)

    def reset_costs(self) -> None:
        self.costs.reset()

    def start_episode(self, max_new_tokens: int, sampling=None) -> None:
        """A new request of ``max_new_tokens`` tokens sampled with ``sampling`` (a ``SamplingClass`` or
        ``SamplingParams``; None = greedy): history and target signals restart, costs persist."""
        self.max_new_tokens = max_new_tokens
        self._request = request_values(sampling)
        self._target = list(TARGET_UNKNOWN)
        self._last = [0.0] * self.history  # most recent first
        self._ema_num = 0.0
        self._ema_den = 0.0
        self._successes = [0.0] * ACCEPT_POSITIONS
        self._trials = [0.0] * ACCEPT_POSITIONS

    def observe_round(self, summary: RoundSummary) -> None:
        self._last = [float(summary.num_emitted)] + self._last[:-1]
        self._ema_num = self.ema_decay * self._ema_num + summary.num_emitted
        self._ema_den = self.ema_decay * self._ema_den + 1.0
        for i in range(ACCEPT_POSITIONS):
            self._successes[i] *= self.ema_decay
            self._trials[i] *= self.ema_decay
            position = i + 1
            if summary.verified_depth >= position and summary.num_accepted >= position - 1:
                self._trials[i] += 1.0
                self._successes[i] += float(summary.num_accepted >= position)
        self._target = target_values(summary.target_features)
        self.costs.observe(summary)

    def observation(self, draft_features: dict[str, float], context_len: int, num_generated: int) -> np.ndarray:
        """The float32 observation for the coming round."""
        remaining = self.max_new_tokens - num_generated
        values = (
            [float(draft_features.get(name, 0.0)) for name in DRAFT_FEATURES]
            + self._last
            + [self._ema_num / self._ema_den if self._ema_den > 0 else 0.0]
            + [(s + 0.5) / (t + 1.0) for s, t in zip(self._successes, self._trials)]
            + [
                context_len / CONTEXT_SCALE,
                num_generated / self.max_new_tokens,
                min(max(remaining, 0), REMAINING_SCALE) / REMAINING_SCALE,
            ]
            + self.costs.features()
            + self._request
            + self._target
        )
        obs = np.asarray(values, dtype=np.float32)
        if not np.all(np.isfinite(obs)):
            obs = np.nan_to_num(obs, nan=0.0, posinf=0.0, neginf=0.0)
        return np.clip(obs, self.low, self.high)


def level_observation(base: np.ndarray, level_features: dict[str, float]) -> np.ndarray:
    """``base`` followed by the current draft level's signals (``LEVEL_FEATURES``)."""
    extra = np.asarray([float(level_features.get(name, 0.0)) for name in LEVEL_FEATURES], dtype=np.float32)
    low, high = feature_bounds(LEVEL_FEATURES)
    return np.concatenate([base, np.clip(extra, low, high)])


def tree_level_features(depths: list[int], scores: list[float], level: int) -> dict[str, float]:
    """``TreeBuilder.level_features`` computed from a stored tree cut at ``level`` levels."""
    if level <= 0:
        return {"level": 0.0, "level_best_prob": 0.0, "level_num_nodes": 0.0}
    at_level = [s for s, d in zip(scores, depths) if d == level]
    return {
        "level": float(level),
        "level_best_prob": math.exp(max(at_level)) if at_level else 0.0,
        "level_num_nodes": float(len(at_level)),
    }
