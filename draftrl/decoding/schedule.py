"""Hugging Face's ``num_assistant_tokens_schedule="heuristic"``: the one implementation of its rule.

The serving proposers apply it per request (``draftrl.decoding.admission.RequestAcceptance``) and
the ``HFHeuristic`` policy per round (``draftrl.policies.baselines``).
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
