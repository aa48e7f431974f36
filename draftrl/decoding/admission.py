"""Batch-level draft admission: a depth cap and a verification budget shared by a whole batch.

In a serving engine one step verifies every running request's drafts in one forward, so the
cost of a step grows with the *total* number of draft tokens. A step's action is therefore

- ``depth``: the most draft tokens any one request may propose (0 = no speculation), and
- ``budget``: the most draft tokens the whole batch may verify (None = no limit, 0 = none).

Each request's draft positions are scored by their estimated survival probability: the chance
that positions 1..j are all accepted, ``c_r ** j``, with ``c_r`` the request's per-position
acceptance estimate (its recent accepted / proposed drafts, discounted, shrunk towards a prior
that grows with the length of the matched n-gram). The budget admits the best positions of the
whole batch (vLLM's ``_assign_draft_token_budget`` does the same for DSpark with its model's
confidences); scores never increase along a request, so what is admitted is a prefix of every
request's draft. Everything here is numpy and knows nothing about engines.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StepAction:
    """One engine step's batch action (see the module docstring)."""

    depth: int
    """cap on each request's draft tokens; 0 = no speculation"""
    budget: int | None = None
    """cap on the batch's draft tokens this step; None = depth x requests, 0 = no speculation"""

    def __post_init__(self) -> None:
        if self.depth < 0:
            raise ValueError(f"StepAction.depth={self.depth} must be >= 0 (0 = no speculation).")
        if self.budget is not None and self.budget < 0:
            raise ValueError(f"StepAction.budget={self.budget} must be >= 0 or None (no limit).")


#: Pseudo-counts of the acceptance prior: Beta(PRIOR_ACCEPT + match_len, PRIOR_REJECT).
PRIOR_ACCEPT = 1.0
PRIOR_REJECT = 2.0


def acceptance_estimate(num_accepted: np.ndarray, num_proposed: np.ndarray, match_len: np.ndarray) -> np.ndarray:
    """Per-position acceptance estimate ``c`` of each request, in (0, 1).

    :param num_accepted: ``[R]`` discounted accepted draft tokens of each request so far
    :param num_proposed: ``[R]`` discounted draft tokens each request had verified
    :param match_len: ``[R]`` length of the suffix n-gram matched for this step's draft (0 = none)
    :returns: ``[R]`` the posterior mean of Beta(PRIOR_ACCEPT + match_len + accepted,
        PRIOR_REJECT + proposed - accepted): a long match predicts acceptance before any history.
    """
    a = PRIOR_ACCEPT + np.asarray(match_len, dtype=np.float64) + np.asarray(num_accepted, dtype=np.float64)
    b = PRIOR_REJECT + np.asarray(num_proposed, dtype=np.float64) - np.asarray(num_accepted, dtype=np.float64)
    return a / (a + np.maximum(b, 1e-9))


def position_scores(acceptance: np.ndarray, capacity: np.ndarray, max_depth: int) -> np.ndarray:
    """Survival scores ``[R, max_depth]``: ``acceptance[r] ** (j + 1)`` for ``j < capacity[r]``,
    ``-inf`` beyond (a position the drafter cannot fill or the depth cap forbids)."""
    acceptance = np.asarray(acceptance, dtype=np.float64)
    capacity = np.asarray(capacity, dtype=np.int64)
    j = np.arange(max_depth)
    scores = acceptance[:, None] ** (j[None, :] + 1)
    return np.where(j[None, :] < capacity[:, None], scores, -np.inf)


def admit(scores: np.ndarray, budget: int | None) -> np.ndarray:
    """How many leading draft positions of each request the budget admits.

    :param scores: ``[R, D]`` per-position scores, non-increasing along each row, ``-inf`` for
        positions that do not exist
    :param budget: total positions to admit (None = every existing one)
    :returns: ``[R]`` int64 counts, ``sum <= budget``; the admitted positions are the ``budget``
        highest scores of the batch (ties: earlier position, then lower row), always a prefix
        of each row.
    """
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 2:
        raise ValueError(f"scores must be [requests, positions], got shape {scores.shape}")
    num_rows, depth = scores.shape
    exists = np.isfinite(scores)
    if budget is None or budget >= int(exists.sum()):
        return exists.sum(axis=1).astype(np.int64) if depth else np.zeros(num_rows, np.int64)
    if budget <= 0:
        return np.zeros(num_rows, dtype=np.int64)
    rows, cols = np.nonzero(exists)
    order = np.lexsort((rows, cols, -scores[rows, cols]))[:budget]
    admitted = np.zeros_like(exists)
    admitted[rows[order], cols[order]] = True
    # a prefix by construction (scores non-increasing, ties by position); count the prefix anyway
    prefix = np.cumprod(admitted, axis=1).sum(axis=1)
    return prefix.astype(np.int64)


@dataclass
class RequestAcceptance:
    """A request's discounted draft history, for :func:`acceptance_estimate`."""

    num_accepted: float = 0.0
    num_proposed: float = 0.0
    last_proposed: int = 0
    """draft tokens proposed at the last step (verified in the next one)"""

    def observe(self, num_emitted: int, decay: float) -> int:
        """The request gained ``num_emitted`` tokens (accepted + 1) verifying ``last_proposed``
        drafts; returns the accepted count."""
        proposed = self.last_proposed
        accepted = max(0, min(num_emitted - 1, proposed))
        if proposed:
            self.num_accepted = decay * self.num_accepted + accepted
            self.num_proposed = decay * self.num_proposed + proposed
        return accepted


def draft_cap(action_depth: int, own_depth: float, max_depth: int, max_model_len: int, num_tokens: int) -> int:
    """Draft tokens a request may propose: the step's cap, its own depth, the engine's largest
    depth and the room left before ``max_model_len`` (``num_tokens`` = prompt + output now)."""
    return max(0, min(int(action_depth), int(own_depth), int(max_depth), int(max_model_len) - int(num_tokens) - 1))


def admit_drafts(histories: list[RequestAcceptance], match_len: np.ndarray, wanted: np.ndarray,
                 budget: int | None) -> tuple[np.ndarray, np.ndarray]:
    """One step's admission over a batch (the vLLM proposer's and the serving replay's rule).

    :param histories: ``[A]`` the requests' draft histories; ``last_proposed`` is set to the admitted count
    :param match_len: ``[A]`` matched n-gram lengths
    :param wanted: ``[A]`` drafts each request could and would propose under the depth cap
    :param budget: the step's verification budget (None = no limit)
    :returns: ``([A] acceptance estimates, [A] admitted drafts)``
    """
    wanted = np.asarray(wanted, dtype=np.int64)
    acceptance = acceptance_estimate(np.array([h.num_accepted for h in histories]),
                                     np.array([h.num_proposed for h in histories]), match_len)
    if budget is None or budget >= int(wanted.sum()):
        admitted = wanted.copy()  # admit()'s answer when nothing binds, without scoring
    else:
        admitted = admit(position_scores(acceptance, wanted, max(1, int(wanted.max(initial=0)))), budget)
    for history, n in zip(histories, admitted.tolist()):
        history.last_proposed = n
    return acceptance, admitted
