"""How the best speculation depth shrinks as the batch grows: the cost model of docs/design.md at batch B.

With acceptance ``alpha``, a draft level costing ``c`` target steps and verification of ``n``
drafts costing ``g(n)`` target steps at batch 1, a round of depth ``d`` yields
``E(alpha, d) / (g_B(d) + c d)`` tokens per step (``d = 0``: 1). Larger batches make
verification relatively dearer: a forward over ``T`` tokens costs ``max(1, T / S)`` units (flat
while memory-bound, linear once ``T`` passes the saturation size ``S``), so

    g_B(n) = max(g(n), max(1, B (n + 1) / S) / max(1, B / S)).

``k*(B)`` is the best depth of ``0..max_depth`` under that model, made non-increasing in B.
A policy's batch-1 depth ``k1`` is carried to batch B by the factor ``k*(B) / k*(1)``, snapped
down to the policy's grid (``draftrl.export.engine_config`` writes the result as vLLM's and
SGLang's per-batch-size tables). Pure numpy, costs in target steps, as in :mod:`.speedup`.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from draftrl.signals.costs import CostTable
from draftrl.signals.speedup import expected_tokens, num_verified

#: ``S``, tokens one forward can take before it stops being memory-bound (calibrate it on the serving GPU).
DEFAULT_SATURATION_TOKENS = 256
RULE = (
    "k(B) = k1 * k*(B) / k*(1) snapped down to the policy's depth grid, non-increasing in B; "
    "k1 = median per-round depth of the policy; k*(B) = argmax over d = 0..max depth of "
    "E(alpha, d) / (g_B(d) + c d), with g_B(n) = max(g(n), max(1, B (n+1) / S) / max(1, B / S))"
)


def fit_alpha(hist: Mapping[int, int], mean_tokens: float, verify_size: int = 0) -> float:
    """The i.i.d. acceptance that reproduces ``mean_tokens`` per round under the depth histogram
    ``{depth: rounds}`` (bisection; 0 when no alpha emits more than one token, 1 past alpha = 1)."""
    total = sum(hist.values())

    def mean(alpha: float) -> float:
        return sum(w * expected_tokens(alpha, num_verified(d, verify_size)) for d, w in hist.items()) / total

    if total == 0 or mean(1.0) <= 1.0 or mean_tokens <= 1.0:
        return 0.0
    if mean_tokens >= mean(1.0):
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if mean(mid) < mean_tokens else (low, mid)
    return (low + high) / 2


def relative_costs(table: CostTable, width: int, max_depth: int) -> tuple[float, list[float]]:
    """``(c, [g(0)=1, g(1), ..., g(max_depth)])`` of a measured cost table at its median context,
    in plain target steps (``g(n)``: one forward over ``n + 1`` tokens)."""
    ctx = float(np.median(table.context_lens))
    return table.draft_level(width) / table.ar_step(ctx), [1.0] + [table.g(n + 1, ctx) for n in range(1, max_depth + 1)]


def verify_cost_at_batch(g: list[float], n: int, batch: int, saturation: float) -> float:
    """``g_B(n)``: verification of ``n`` drafts per sequence at batch ``B``, in batch-B plain steps."""
    if n <= 0:
        return 1.0
    roofline = max(1.0, batch * (n + 1) / saturation) / max(1.0, batch / saturation)
    return max(g[min(n, len(g) - 1)], roofline)


def best_depth(depths: list[int], alpha: float, c: float, g: list[float], batch: int, saturation: float,
               verify_size: int = 0) -> int:
    """``k*(B)``: the grid depth with the most modelled tokens per step at batch ``B``."""
    def rate(d: int) -> float:
        if d == 0:
            return 1.0
        n = num_verified(d, verify_size)
        return expected_tokens(alpha, n) / (verify_cost_at_batch(g, n, batch, saturation) + c * d)

    return max(sorted(depths), key=rate)  # max() keeps the first (shallowest) of equal rates


def depth_scale(max_depth: int, alpha: float, c: float, g: list[float], saturation: float, max_batch: int,
                verify_size: int = 0) -> tuple[list[float], list[int]]:
    """``([k*(B) / k*(1) for B = 1..max_batch], [k*(B)])``, ``k*`` over every depth ``0..max_depth``.

    ``k*`` is made non-increasing in B. When the model says "do not speculate" already at batch 1
    (``k*(1) = 0``) while the policy does, the factor is 1 while a round of the deepest depth
    stays memory-bound (``B (max_depth + 1) <= S``) and 0 beyond.
    """
    grid = list(range(max_depth + 1))
    k_star, previous = [], max_depth
    for b in range(1, max_batch + 1):
        previous = min(previous, best_depth(grid, alpha, c, g, b, saturation, verify_size))
        k_star.append(previous)
    if k_star[0] == 0:
        return [1.0 if b * (max_depth + 1) <= saturation else 0.0 for b in range(1, max_batch + 1)], k_star
    return [k / k_star[0] for k in k_star], k_star


def depth_by_batch(k_top: int, depths: list[int], scale: list[float]) -> list[int]:
    """``[k(1), ..., k(max_batch)]``: ``k_top * scale(B)`` snapped down to the grid, non-increasing."""
    grid = sorted(depths)
    out, previous = [], k_top
    for f in scale:
        k = k_top * f + 1e-9
        previous = min(previous, max([d for d in grid if d <= k], default=0))
        out.append(previous)
    return out
