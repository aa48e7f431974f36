"""vLLM's own speculative-decoding counts of one engine, read through its stat-logger interface.

vLLM's scheduler counts, every step, what each request's drafts did (``SpecDecodingStats``,
``vllm/v1/spec_decode/metrics.py``) and hands the counts to the engine's stat loggers. An engine
built with :func:`stat_logger` among its ``stat_loggers`` adds them to one
:class:`SpecDecodingCounts`, for every method (``ngram``, ``eagle3``, ``custom_class``), so a
method whose proposals draftrl never sees still reports its acceptance.

Terms are vLLM's: a *draft* is one request's proposal in one step; the acceptance length is
``1 + num_accepted / num_drafts`` tokens per draft, the bonus (or recovered) token included.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SpecDecodingCounts:
    """Cumulative counts of one engine since it was built (subtract two snapshots for a span)."""

    num_drafts: int = 0
    """request-steps that verified drafts"""
    num_draft_tokens: int = 0
    """draft tokens verified"""
    num_accepted: int = 0
    """of which accepted"""
    num_accepted_per_pos: list[int] = field(default_factory=list)
    """[K] drafts whose position i was accepted"""

    def observe(self, stats: Any) -> None:
        """Add one step's ``vllm.v1.spec_decode.metrics.SpecDecodingStats``."""
        self.num_drafts += stats.num_drafts
        self.num_draft_tokens += stats.num_draft_tokens
        self.num_accepted += stats.num_accepted_tokens
        per_pos = list(stats.num_accepted_tokens_per_pos)
        if len(self.num_accepted_per_pos) < len(per_pos):
            self.num_accepted_per_pos += [0] * (len(per_pos) - len(self.num_accepted_per_pos))
        for i, n in enumerate(per_pos):
            self.num_accepted_per_pos[i] += n

    def snapshot(self) -> SpecDecodingCounts:
        return SpecDecodingCounts(self.num_drafts, self.num_draft_tokens, self.num_accepted,
                                  list(self.num_accepted_per_pos))

    def since(self, earlier: SpecDecodingCounts) -> SpecDecodingCounts:
        """The counts added after the snapshot ``earlier``."""
        per_pos = [n - (earlier.num_accepted_per_pos[i] if i < len(earlier.num_accepted_per_pos) else 0)
                   for i, n in enumerate(self.num_accepted_per_pos)]
        return SpecDecodingCounts(self.num_drafts - earlier.num_drafts,
                                  self.num_draft_tokens - earlier.num_draft_tokens,
                                  self.num_accepted - earlier.num_accepted, per_pos)

    @property
    def acceptance_length(self) -> float | None:
        """Tokens per draft, the bonus token included; None without drafts."""
        return 1 + self.num_accepted / self.num_drafts if self.num_drafts else None

    def summary(self) -> dict[str, Any]:
        """The counts and the acceptance length, for result files."""
        return {"num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
                "num_accepted": self.num_accepted, "num_accepted_per_pos": list(self.num_accepted_per_pos),
                "acceptance_length": self.acceptance_length}


def stat_logger(counts: SpecDecodingCounts) -> type:
    """A per-engine stat logger class (``LLMEngine.from_engine_args(..., stat_loggers=[it])``) that
    adds every step's speculative-decoding counts to ``counts``. Imports vLLM."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class SpecDecodingCounter(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0):
            self.counts = counts

        def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
                   engine_idx: int = 0) -> None:
            stats = getattr(scheduler_stats, "spec_decoding_stats", None)
            if stats is not None:
                self.counts.observe(stats)

        def log_engine_initialized(self) -> None:
            pass

    return SpecDecodingCounter
