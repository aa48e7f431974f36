"""Per-round (drafter, depth) choices driving draftrl's real engine over a :class:`MixedDrafter`.

A chooser (a PPO policy trained on ``draftrl/TraceChoice-v0``, or any callable) maps the observation
of :class:`draftrl.signals.choice.ChoiceFeatures` to an arm index; :class:`ChoiceSchedule` builds that
observation from the engine's own draft signals before each round, forces the mixed drafter's choice
and answers the round's depth, then records what the round emitted. It plugs into
:func:`draftrl.decoding.generate.generate` as its ``schedule`` and ``on_round``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from draftrl.decoding.engine import RoundResult, SpeculativeDecoder
from draftrl.signals.choice import ChoiceFeatures

#: Which features of ``MixedDrafter.features`` each of its drafters provides.
_LOOKUP_KEYS = ("ngram_match_len", "ngram_num_matches")
_MODEL_KEYS = ("draft_top1_prob", "draft_entropy")


class ChoiceSchedule:
    """``generate``'s schedule for per-round (drafter, depth) arms.

    :param drafter: the engine's ``draftrl.drafters.mixed.MixedDrafter`` (its ``forced`` is set each round).
    :param arms: ``(drafter name, depth)`` per action, ``("none", 0)`` first (``TraceChoiceEnv.arms``).
    :param lookup: the name the arms give the mixed drafter's n-gram lookup; ``model`` its head's.
    :param choose: observation -> arm index.
    """

    def __init__(self, drafter: Any, arms: Sequence[tuple[str, int]], choose: Callable[[np.ndarray], int],
                 *, lookup: str = "ngram", model: str = "eagle3", history: int = 4, ema_decay: float = 0.7):
        unknown = {name for name, _ in arms} - {"none", lookup, model}
        if unknown:
            raise ValueError(f"arms name drafters {sorted(unknown)}; this mixed drafter has {lookup!r} (lookup) and "
                             f"{model!r} (model): train on traces of those two.")
        self.drafter, self.arms, self.choose = drafter, list(arms), choose
        self.lookup, self.model = lookup, model
        names = []
        for name, _ in arms:
            if name != "none" and name not in names:
                names.append(name)
        self.features = ChoiceFeatures(names, history, ema_decay)
        self.played: list[tuple[str, int]] = []
        self._arm: tuple[str, int] = ("none", 0)

    def start(self, max_new_tokens: int) -> None:
        """Before each request."""
        self.features.start(max_new_tokens)
        self.played = []

    def __call__(self, engine: SpeculativeDecoder) -> tuple[int, None, int]:
        merged = engine.features()
        rows = {self.lookup: {k: merged[k] for k in _LOOKUP_KEYS if k in merged},
                self.model: {k: merged[k] for k in _MODEL_KEYS if k in merged}}
        a = int(self.choose(self.features.observation(rows, len(engine.output_ids))))
        if not 0 <= a < len(self.arms):
            raise ValueError(f"the chooser answered arm {a}; there are {len(self.arms)} arms.")
        name, depth = self._arm = self.arms[a]
        self.drafter.forced = "lookup" if name == self.lookup else "model"
        self.played.append(self._arm)
        return (0 if name == "none" else depth), None, 1

    def on_round(self, rnd: RoundResult) -> None:
        name, depth = self._arm
        self.features.observe(name, depth, rnd.num_emitted)
