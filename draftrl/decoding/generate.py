"""Run whole requests on a :class:`SpeculativeDecoder` with a per-round action schedule.

The schedule is any callable that sees the engine (its history and draft-side ``features()``)
and returns ``(depth, verify_size, width)``; fixed settings, baselines and learned policies all
fit. The exactness monitor, when given, sees every emitted token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from draftrl.decoding.engine import LevelStop, RoundResult, SpeculativeDecoder

Action = tuple[int, "int | None", int]
Schedule = Callable[[SpeculativeDecoder], Action]


def fixed_schedule(depth: int, verify_size: int | None = None, width: int = 1) -> Schedule:
    """The same (depth, verify_size, width) every round."""
    return lambda engine: (depth, verify_size, width)


@dataclass
class GenerationResult:
    """One request's output and timings (wall clock, seconds; ``total_seconds`` includes the
    schedule's decisions and the monitor, so a slow policy pays for itself)."""

    token_ids: list[int]
    prefill_seconds: float
    """``engine.start``'s seconds (the prompt's forward runs in the first round; see ``generate``)"""
    rounds: list[RoundResult] = field(default_factory=list)
    total_seconds: float = 0.0
    stop_reason: str | None = None

    @property
    def num_rounds(self) -> int:
        return len(self.rounds)

    @property
    def tokens_per_second(self) -> float:
        return len(self.token_ids) / self.total_seconds if self.total_seconds > 0 else 0.0

    @property
    def mean_tokens_per_round(self) -> float:
        return len(self.token_ids) / max(1, len(self.rounds))

    @property
    def mean_verified_per_round(self) -> float:
        return float(np.mean([r.num_verified for r in self.rounds])) if self.rounds else 0.0

    @property
    def time_to_first_token(self) -> float:
        return self.prefill_seconds + (self.rounds[0].seconds if self.rounds else 0.0)

    def inter_token_latencies(self) -> np.ndarray:
        """Seconds between consecutive emitted tokens: a round's time spread over its tokens."""
        gaps = [r.seconds / r.num_emitted for r in self.rounds[1:] for _ in range(r.num_emitted)]
        return np.asarray(gaps, dtype=np.float64)

    def summary(self) -> dict:
        return {
            "num_tokens": len(self.token_ids),
            "tokens_per_second": self.tokens_per_second,
            "rounds": self.num_rounds,
            "mean_tokens_per_round": self.mean_tokens_per_round,
            "mean_verified_per_round": self.mean_verified_per_round,
            "time_to_first_token": self.time_to_first_token,
            "total_seconds": self.total_seconds,
            "draft_seconds": sum(r.draft_seconds for r in self.rounds),
            "verify_seconds": sum(r.verify_seconds for r in self.rounds),
            "sample_seconds": sum(r.sample_seconds for r in self.rounds),
            "stop_reason": self.stop_reason,
        }


def generate(
    engine: SpeculativeDecoder,
    prompt_ids: list[int],
    schedule: Schedule,
    monitor=None,
    seed: int | None = None,
    on_round: Callable[[RoundResult], None] | None = None,
    stop: LevelStop | None = None,
) -> GenerationResult:
    """Decode one request to EOS or ``max_new_tokens``; ``monitor.update`` sees every round.
    With ``stop`` (``SpeculativeDecoder.round``'s per-level stop) the schedule's depth is each round's most.

    The first round verifies its drafts inside the prefill (``engine.start(..., prefill=False)``),
    as Hugging Face prompt lookup does, so ``prefill_seconds`` is only the drafter's reset and the
    prompt's forward is charged to the first round."""
    start = engine.clock()
    prefill = engine.start(prompt_ids, seed=seed, prefill=False)
    result = GenerationResult(token_ids=[], prefill_seconds=prefill)
    while not engine.finished:
        depth, verify_size, width = schedule(engine)
        rnd = engine.round(depth, verify_size, width, stop=stop)
        result.rounds.append(rnd)
        if monitor is not None:
            monitor.update(rnd.token_stats)
        if on_round is not None:
            on_round(rnd)
    result.token_ids = engine.output_ids
    result.stop_reason = result.rounds[-1].stop_reason if result.rounds else None
    result.total_seconds = engine.clock() - start  # wall clock: policy and monitor time included
    return result
