"""Hugging Face's ``num_assistant_tokens_schedule="heuristic"``: the one implementation of its rule.

The serving proposers apply it per request (``draftrl.decoding.admission.RequestAcceptance``), the
``HFHeuristic`` policy per round (``draftrl.policies.baselines``), :class:`HeuristicSchedule` as a
``generate`` schedule with no policy or features around it.
"""

from __future__ import annotations

import math


def heuristic_depth(depth: float, num_accepted: int, num_verified: int, max_depth: float = math.inf) -> float:
    """The draft length after a round that verified ``num_verified`` drafts and accepted ``num_accepted``
    of them: +2 when every one was accepted, else -1; never below 1 nor above ``max_depth``. A round
    that verified no draft is no evidence either way: ``depth`` is kept."""
    if num_verified <= 0:
        return depth
    if num_accepted >= num_verified:
        return min(depth + 2.0, float(max_depth))
    return max(1.0, depth - 1.0)


class HeuristicSchedule:
    """Hugging Face's heuristic as a :func:`draftrl.decoding.generate.generate` schedule:
    ``generate(engine, ids, schedule, on_round=schedule.on_round)`` after ``schedule.start()``.

    :param initial: the first round's depth (transformers' ``num_assistant_tokens``).
    :param max_depth: the deepest round it may ask for.
    """

    def __init__(self, initial: int, max_depth: int):
        if not 1 <= initial <= max_depth:
            raise ValueError(f"initial={initial} must be a depth in [1, max_depth={max_depth}].")
        self.initial, self.max_depth = int(initial), int(max_depth)
        self.start()

    def start(self) -> None:
        """Before each request: back to ``initial``."""
        self.depth = float(self.initial)

    def __call__(self, engine) -> tuple[int, None, int]:
        return int(self.depth), None, 1

    def on_round(self, rnd) -> None:
        self.depth = heuristic_depth(self.depth, rnd.num_accepted, rnd.num_proposed, self.max_depth)
