"""The observation of a per-round drafter choice, built the same way on traces and in the real engine.

Each drafter contributes its own pre-round signals (:data:`~draftrl.signals.features.DRAFT_FEATURES`
from its ``features()``: a model head's top-1 probability and entropy, the n-gram lookup's match length
and count) and its recent acceptance (an EMA of accepted / drafted over the rounds it drafted); then
the tokens the last rounds emitted and where the request stands against its budget.
``draftrl/TraceChoice-v0`` and the real-engine runner (:mod:`draftrl.eval.choice`) both build
observations with this class, so a policy trained on traces reads the same numbers in the engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from draftrl.signals.features import DRAFT_FEATURES

_HIGH = {"draft_top1_prob": 1.0, "draft_entropy": 20.0, "ngram_match_len": 64.0, "ngram_num_matches": 1024.0}
#: ``remaining_len`` saturates here (tokens).
REMAINING_SCALE = 16


class ChoiceFeatures:
    """Observation builder for choosing among ``drafters`` each round.

    :param drafters: drafter names, in observation order.
    :param history: rounds of emitted tokens kept.
    :param ema_decay: decay of each drafter's running acceptance (starts at 0.5).
    """

    def __init__(self, drafters: Sequence[str], history: int = 4, ema_decay: float = 0.7):
        if not 0.0 <= ema_decay < 1.0:
            raise ValueError(f"ema_decay={ema_decay} must be in [0, 1).")
        self.drafters, self.history, self.ema_decay = tuple(drafters), int(history), float(ema_decay)
        self.names: tuple[str, ...] = (
            tuple(f"{d}.{f}" for d in self.drafters for f in DRAFT_FEATURES)
            + tuple(f"{d}.accept_rate" for d in self.drafters)
            + tuple(f"last_tokens_{k}" for k in range(1, self.history + 1))
            + ("generated_len", "remaining_len")
        )
        self.high = np.array([_HIGH[n.split(".", 1)[1]] if n.endswith(DRAFT_FEATURES) else
                              (1.0 if n.endswith(("accept_rate", "_len")) else 64.0) for n in self.names],
                             dtype=np.float32)
        self.low = np.zeros_like(self.high)
        self.start(1)

    def start(self, budget: int) -> None:
        """A new request that may emit ``budget`` tokens."""
        self.budget = max(int(budget), 1)
        self.last = [0.0] * self.history
        self.accept = {d: 0.5 for d in self.drafters}

    def observe(self, drafter: str, depth: int, emitted: int) -> None:
        """A round ``drafter`` drafted ``depth`` levels for (``none`` / 0: no speculation) emitted ``emitted``."""
        if depth > 0 and drafter in self.accept:
            accepted = max(emitted - 1, 0) / depth
            self.accept[drafter] = self.ema_decay * self.accept[drafter] + (1 - self.ema_decay) * accepted
        self.last = [float(emitted)] + self.last[:-1]

    def observation(self, draft: Mapping[str, Mapping[str, float] | Sequence[float]], generated: int) -> np.ndarray:
        """float32 [len(names)]: ``draft[d]`` is drafter ``d``'s ``features()`` (a dict, missing keys 0, or
        the DRAFT_FEATURES row a trace stores); ``generated`` the tokens emitted so far."""
        values: list[float] = []
        for d in self.drafters:
            row = draft.get(d, {})
            if isinstance(row, Mapping):
                values += [float(row.get(f, 0.0)) for f in DRAFT_FEATURES]
            else:
                values += [float(v) for v in row]
        values += [self.accept[d] for d in self.drafters] + self.last
        values += [generated / self.budget, min(self.budget - generated, REMAINING_SCALE) / REMAINING_SCALE]
        return np.clip(np.asarray(values, dtype=np.float32), self.low, self.high)
