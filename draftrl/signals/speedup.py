"""The article's cost model in closed form: expected tokens per round and expected speedup.

Pure numpy, no env: ``draftrl/Analytic-v0`` simulates it, the baselines' lookahead and
:mod:`.batch_scaling` (the engine configs' depth per batch size) evaluate it (docs/design.md, "Cost model").
Acceptance is i.i.d.
with probability ``alpha``; costs are in units of one plain target step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np


def num_verified(depth: int, verify_size: int) -> int:
    """Drafted tokens the target verifies in a chain: ``min(depth, verify_size)``, all when ``verify_size=0``."""
    return depth if verify_size == 0 else min(depth, verify_size)


def expected_tokens(alpha: float, depth: int) -> float:
    """Expected tokens emitted by one round that drafts and verifies ``depth`` tokens.

    ``E = 1 + alpha + ... + alpha^depth = (1 - alpha^(depth+1)) / (1 - alpha)``: the i-th term is
    the probability that the first i drafts are all accepted, and the leading 1 is the target's
    correction or bonus token. ``depth=0`` gives 1 (plain decoding), ``alpha=1`` gives ``depth+1``.
    Summed term by term, which is exact at ``alpha=1`` and stable near it.

    :param alpha: per-token acceptance probability, in [0, 1].
    :param depth: number of drafted (and verified) tokens, >= 0.
    :return: expected tokens per round, in [1, depth + 1].
    """
    check_alpha(alpha, "alpha")
    if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or depth < 0:
        raise ValueError(f"depth={depth!r} must be a non-negative integer.")
    return math.fsum(alpha**i for i in range(int(depth) + 1))


def expected_speedup(alpha: float, depth: int, draft_cost: float, verify_cost: float = 1.0) -> float:
    """Expected speedup over plain decoding: ``E / (verify_cost + draft_cost * depth)``.

    Plain decoding emits one token per target step, so the speedup is expected tokens per unit of
    cost. ``depth=0`` is plain decoding itself and gives exactly 1, whatever ``verify_cost``.

    :param alpha: per-token acceptance probability, in [0, 1].
    :param depth: number of drafted (and verified) tokens, >= 0.
    :param draft_cost: cost of one draft step, in target steps (the article's ``c``), >= 0.
    :param verify_cost: cost of verifying the ``depth`` drafted tokens, in target steps
        (the article's ``g(depth)``), > 0.
    :return: expected speedup (> 1 means speculation pays).
    """
    tokens = expected_tokens(alpha, depth)
    if depth == 0:
        return 1.0
    check_cost(draft_cost, "draft_cost", allow_zero=True)
    check_cost(verify_cost, "verify_cost", allow_zero=False)
    return tokens / (verify_cost + draft_cost * depth)


def check_alpha(alpha: Any, name: str) -> None:
    """Raise unless ``alpha`` is a number in [0, 1] (``name`` is the argument it came from)."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name}={alpha!r} must be a number in [0, 1].")
    if not 0.0 <= float(alpha) <= 1.0:
        raise ValueError(f"{name}={alpha!r} is not a probability; pass a value in [0, 1].")


#: The article's default costs (``draftrl/Analytic-v0``'s defaults): a draft step and a
#: verification of any size, in target steps.
DRAFT_COST = 0.05
VERIFY_COST = 1.0

#: ``g(n)``, the seconds of verifying ``n >= 1`` drafted tokens in target steps: one number for
#: every ``n``, ``{n: cost}`` or a function of ``n``.
VerifyCost = float | Mapping[int, float] | Callable[[int], float]


def verify_cost_table(verify_cost: VerifyCost, max_size: int, reach: str = "") -> np.ndarray:
    """``g`` tabulated for ``n = 0..max_size`` (entry 0 = a plain target step, 1), each checked.

    :param reach: what makes ``max_size`` reachable, for the error of a mapping that lacks sizes.
    """
    sizes = range(1, max_size + 1)
    if callable(verify_cost):
        costs = {n: verify_cost(n) for n in sizes}
    elif isinstance(verify_cost, Mapping):
        missing = [n for n in sizes if n not in verify_cost]
        if missing:
            raise ValueError(f"verify_cost mapping lacks sizes {missing}{' reachable with ' + reach if reach else ''}; "
                             "give a cost for each or pass a callable n -> cost.")
        costs = {n: verify_cost[n] for n in sizes}
    else:
        costs = {n: verify_cost for n in sizes}
    for n, cost in costs.items():
        check_cost(cost, f"verify_cost({n})", allow_zero=False)
    return np.array([1.0] + [float(costs[n]) for n in sizes])


def check_cost(cost: Any, name: str, *, allow_zero: bool) -> None:
    """Raise unless ``cost`` is a finite number > 0 (>= 0 with ``allow_zero``), in target steps."""
    if isinstance(cost, bool) or not isinstance(cost, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name}={cost!r} must be a number (in target steps).")
    low_ok = cost >= 0 if allow_zero else cost > 0
    if not (math.isfinite(cost) and low_ok):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name}={cost!r} must be finite and {bound} (in target steps).")
