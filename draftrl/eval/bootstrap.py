"""Paired bootstrap confidence intervals for throughput ratios over requests.

Why: a speed table built from a handful of requests cannot tell a 5% difference from noise
(the previous demo ranked PPO 7% above the best fixed setting on 8 requests, and below it on
another set). Every ratio the evaluation reports against a reference gets an interval, and an
interval that covers 1.0 is reported as "not resolved".

The statistic is the one the tables print: throughput ratio = (sum of A's tokens / sum of A's
seconds) / (sum of B's tokens / sum of B's seconds) over the requests both decoded. Requests
are resampled with replacement, *paired* (A and B keep the same request in every resample), so
the interval reflects how much the ratio depends on which requests were drawn, while
per-request difficulty cancels. Percentile interval, ``num_resamples`` draws, fixed seed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: Bootstrap draws per interval (the interval's own Monte Carlo error is ~0.2% of its width).
NUM_RESAMPLES = 4000
#: Two-sided confidence level.
CONFIDENCE = 0.95


def paired_ratio_ci(tokens_a: Sequence[float], seconds_a: Sequence[float], tokens_b: Sequence[float],
                    seconds_b: Sequence[float], *, num_resamples: int = NUM_RESAMPLES,
                    confidence: float = CONFIDENCE, seed: int = 0) -> dict:
    """The throughput ratio A / B over paired requests (index i of every array = request i) with
    its percentile bootstrap interval.

    :return: ``ratio``, ``low``, ``high``, ``confidence``, ``num_requests``, ``resolved`` (the
        interval excludes 1.0) and ``verdict``: ``faster``, ``slower`` or ``not resolved``.
    """
    ta, sa, tb, sb = (np.asarray(v, dtype=np.float64) for v in (tokens_a, seconds_a, tokens_b, seconds_b))
    n = ta.size
    if not (sa.size == tb.size == sb.size == n):
        raise ValueError(f"paired arrays differ in length: {ta.size}, {sa.size}, {tb.size}, {sb.size}")
    if n == 0 or sa.sum() <= 0 or sb.sum() <= 0 or tb.sum() <= 0:
        return {"ratio": None, "low": None, "high": None, "confidence": confidence, "num_requests": int(n),
                "resolved": False, "verdict": "not resolved"}
    ratio = (ta.sum() / sa.sum()) / (tb.sum() / sb.sum())
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(num_resamples, n))  # [num_resamples, n] request draws
    num = ta[idx].sum(1) / sa[idx].sum(1)
    den = tb[idx].sum(1) / sb[idx].sum(1)
    draws = num / den
    alpha = (1.0 - confidence) / 2.0
    low, high = (float(v) for v in np.quantile(draws, [alpha, 1.0 - alpha]))
    resolved = not (low <= 1.0 <= high) and n > 1
    verdict = "not resolved" if not resolved else ("faster" if low > 1.0 else "slower")
    return {"ratio": float(ratio), "low": low, "high": high, "confidence": confidence, "num_requests": int(n),
            "resolved": resolved, "verdict": verdict}


def compare(runs_a: Sequence, runs_b: Sequence, **kwargs) -> dict:
    """:func:`paired_ratio_ci` for two lists of per-request records (``prompt_id``, ``num_tokens``,
    ``seconds``), paired by ``prompt_id`` (requests only one side decoded are left out)."""
    b = {r.prompt_id: r for r in runs_b}
    pairs = [(r, b[r.prompt_id]) for r in runs_a if r.prompt_id in b]
    return paired_ratio_ci([x.num_tokens for x, _ in pairs], [x.seconds for x, _ in pairs],
                           [y.num_tokens for _, y in pairs], [y.seconds for _, y in pairs], **kwargs)


def format_ci(ci: dict | None) -> str:
    """``1.07x [1.02, 1.12]``, ``1.03x [0.97, 1.09] not resolved``, ``1.00x (reference)`` for the
    reference's own row, ``-`` when missing."""
    if not ci or ci.get("ratio") is None:
        return "-"
    if ci.get("reference"):
        return f"{ci['ratio']:.2f}x (reference)"
    text = f"{ci['ratio']:.2f}x [{ci['low']:.2f}, {ci['high']:.2f}]"
    return text if ci["resolved"] else text + " not resolved"


def requests_needed(log_ratio_sd: float, difference: float = 0.05, confidence_z: float = 1.96) -> int:
    """Requests needed for a paired interval of half-width ``difference`` (relative) when the
    per-request log time ratio has standard deviation ``log_ratio_sd``: n = (z * sd / log(1 + d))^2.

    A normal approximation used to size evaluations; the bootstrap above is what reports.
    """
    if log_ratio_sd <= 0:
        return 2
    return max(2, int(np.ceil((confidence_z * log_ratio_sd / np.log1p(difference)) ** 2)))
