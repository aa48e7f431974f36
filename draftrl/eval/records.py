"""What a timed request records, whichever track or anchor decoded it: the records the shared
metrics (:mod:`draftrl.eval.metrics`) and reports read. The round track fills them
(:mod:`draftrl.eval.round.rollout`, :mod:`draftrl.eval.round.anchors`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class DecodedRequest:
    """What every timed request records, whoever decoded it (draftrl's engine or an anchor)."""

    policy: str
    prompt_id: str
    language: str
    task: str
    repeat: int
    token_ids: list[int]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class RequestRun(DecodedRequest):
    """One request decoded under one setting by draftrl's engine; arrays have one entry per round."""

    num_prompt_tokens: int
    prefill_seconds: float
    total_seconds: float
    """wall clock of the whole request: prefill, decisions, features, rounds, monitor"""
    round_seconds: np.ndarray
    """[R] wall clock per round (decision included)"""
    round_tokens: np.ndarray
    """[R] emitted tokens per round (accepted + recovered/bonus)"""
    round_accepted: np.ndarray
    """[R] accepted draft tokens per round"""
    round_depth: np.ndarray
    """[R] depth asked for"""
    round_verify_size: np.ndarray
    """[R] verify size asked for (0 = all drafted nodes)"""
    round_verified_depth: np.ndarray
    """[R] deepest verified draft level (0 = plain step)"""
    round_num_verified: np.ndarray
    """[R] draft nodes the target verified"""
    excluded_seconds: float = 0.0
    """policy time not charged (the lookahead policy reading the reference)"""
    monitor_seconds: float = 0.0
    """time spent in ExactnessMonitor.update (included in total_seconds)"""
    peak_memory_bytes: int = 0
    """peak memory above the request's start (see draftrl.eval.memory)"""
    peak_memory_total_bytes: int = 0
    """absolute peak (RSS or CUDA allocated)"""
    stop_reason: str | None = None
    token_stats: list = field(default_factory=list, repr=False)
    """the rounds' TokenStats, kept only when asked (for monitors run after timing)"""

    @property
    def num_rounds(self) -> int:
        return int(self.round_tokens.shape[0])

    @property
    def seconds(self) -> float:
        """Charged wall clock: ``total_seconds - excluded_seconds``."""
        return self.total_seconds - self.excluded_seconds

    @property
    def time_to_first_token(self) -> float:
        """Prefill plus the first round (its decision included)."""
        return self.prefill_seconds + (float(self.round_seconds[0]) if self.num_rounds else 0.0)

    def inter_token_latencies(self) -> np.ndarray:
        """Seconds per emitted token after the first round: each round's time spread over its
        tokens (the convention of ``GenerationResult.inter_token_latencies``)."""
        if self.num_rounds < 2:
            return np.zeros(0)
        return np.repeat(self.round_seconds[1:] / self.round_tokens[1:], self.round_tokens[1:].astype(int))
