"""Per-level draft stops on the drafter's confidence: Hugging Face's threshold and EAGLE-2's path value.

Each rule is a ``stop`` for :meth:`draftrl.decoding.engine.SpeculativeDecoder.round` (or
:func:`draftrl.decoding.generate.generate`): after every drafted level it reads
``TreeBuilder.level_features()`` and answers True to stop drafting there, the round's depth being
the most levels it may draft. The level that fails the test is kept and verified, as in Hugging
Face's assisted generation (its ``ConfidenceCriteria`` is checked after the token is appended).
The rules read draft-side signals only, so exactness holds whatever they answer.

Confidences come from ``level_best_prob``, the exp of the newest level's best cumulative draft
log-probability. On a chain (width 1, what Hugging Face drafts) that is the product of the drafted
tokens' probabilities, and the newest token's own probability is its ratio to the previous level's.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np

from draftrl.decoding.engine import RoundResult


class LevelStopRule(ABC):
    """A per-level stop with per-request state; ``generate(..., stop=rule, on_round=rule.on_round)``."""

    #: short name used in reports
    name: str = "stop"

    def __init__(self) -> None:
        self.confidences: list[float] = []
        """this round's drafted tokens' probabilities, one per level so far"""
        self._path = 1.0

    def start(self) -> None:
        """Before each request."""

    def on_round(self, rnd: RoundResult) -> None:
        """After each round of the engine (``generate(..., on_round=rule.on_round)``)."""
        self.observe(rnd.num_accepted)

    def observe(self, num_accepted: int) -> None:
        """After each round, with how many of its drafted tokens the target accepted (the engine's
        ``on_round`` or a replay of recorded rounds)."""

    def __call__(self, features: dict[str, float]) -> bool:
        path = float(features["level_best_prob"])
        if features["level"] <= 1:
            self.confidences, self._path = [], 1.0
        self.confidences.append(path / self._path if self._path > 0 else 0.0)
        self._path = path
        return self.stops(path)

    @abstractmethod
    def stops(self, path: float) -> bool:
        """True to stop after the newest level (``self.confidences[-1]`` its token's probability;
        ``path`` the chain's cumulative probability)."""


class ConfidenceStop(LevelStopRule):
    """Hugging Face's ``assistant_confidence_threshold``: stop after the first drafted token whose
    draft probability is below ``threshold`` (transformers' default is 0.4)."""

    def __init__(self, threshold: float = 0.4):
        super().__init__()
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold={threshold} is a probability; choose it in [0, 1].")
        self.threshold = threshold
        self.name = f"hf-threshold:{threshold:g}"

    def stops(self, path: float) -> bool:
        return self.confidences[-1] < self.threshold


class RocConfidenceStop(ConfidenceStop):
    """:class:`ConfidenceStop` whose threshold is re-fitted after every round, as transformers'
    ``AssistedCandidateGenerator`` does, from every (confidence, accepted?) pair of the request so far.

    A round labels its drafted tokens up to the first rejection (accepted 1, that rejected one 0);
    later tokens were never judged and are dropped. Once at least ``min_samples`` pairs hold both
    labels, the threshold becomes :func:`roc_threshold`'s. The pairs and the threshold start afresh
    with each request, as transformers' code does (it builds a new candidate generator per
    ``generate`` call; its docs say the threshold persists, but the re-fit goes to a copy).
    """

    def __init__(self, threshold: float = 0.4, *, min_samples: int = 6, fp_cost: float = 1.0, fn_cost: float = 3.0):
        super().__init__(threshold)
        if min_samples < 2:
            raise ValueError(f"min_samples={min_samples} cannot hold both labels; use at least 2 (transformers: 6).")
        if fp_cost <= 0 or fn_cost <= 0:
            raise ValueError(f"fp_cost={fp_cost} and fn_cost={fn_cost} must be positive (transformers: 1 and 3).")
        self.initial, self.min_samples, self.fp_cost, self.fn_cost = threshold, min_samples, fp_cost, fn_cost
        self.name = "hf-roc"
        self.seen: list[float] = []
        self.accepted: list[bool] = []

    def start(self) -> None:
        self.threshold, self.seen, self.accepted, self.confidences = self.initial, [], [], []

    def observe(self, num_accepted: int) -> None:
        judged = min(len(self.confidences), num_accepted + 1)
        self.seen += self.confidences[:judged]
        self.accepted += [i < num_accepted for i in range(judged)]
        self.confidences = []
        if len(self.seen) >= self.min_samples and len(set(self.accepted)) == 2:
            self.threshold = roc_threshold(self.seen, self.accepted, self.fp_cost, self.fn_cost)


def roc_threshold(confidences: Sequence[float], accepted: Sequence[bool], fp_cost: float = 1.0,
                  fn_cost: float = 3.0) -> float:
    """The ROC threshold minimising ``fp_cost * FPR + fn_cost * FNR`` (transformers: 1 and 3).

    A threshold t keeps drafting on a confidence ``>= t``: a false positive is a rejected token
    drafted on, a false negative an accepted one stopped at. The candidates are the observed
    confidences and +inf; ties go to the highest threshold, as ``argmin`` over sklearn's
    ``roc_curve`` (highest first) picks.
    """
    if len(confidences) != len(accepted):
        raise ValueError(f"{len(confidences)} confidences but {len(accepted)} labels; give one label per confidence.")
    conf, label = np.asarray(confidences, dtype=np.float64), np.asarray(accepted, dtype=bool)
    num_pos = int(label.sum())
    num_neg = len(label) - num_pos
    if not num_pos or not num_neg:
        raise ValueError(f"the ROC needs accepted and rejected tokens; got {num_pos} accepted, {num_neg} rejected.")
    order = np.argsort(-conf, kind="stable")
    conf, label = conf[order], label[order]
    last = np.r_[conf[1:] != conf[:-1], True]  # the last of each distinct confidence, highest first
    tp, fp = np.cumsum(label)[last], np.cumsum(~label)[last]  # drafted on at threshold conf[last]
    cost = fp_cost * fp / num_neg + fn_cost * (1.0 - tp / num_pos)
    i = int(np.argmin(cost))
    return float(conf[last][i]) if cost[i] < fn_cost else math.inf  # +inf: FPR 0, FNR 1


class CumulativeConfidenceStop(LevelStopRule):
    """EAGLE-2's path value as a depth stop: keep drafting while the product of the drafted tokens'
    probabilities (the best path's, on a tree) stays at or above ``threshold``."""

    def __init__(self, threshold: float):
        super().__init__()
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold={threshold} is a path probability; choose it in (0, 1].")
        self.threshold = threshold
        self.name = f"eagle2-cum:{threshold:g}"

    def stops(self, path: float) -> bool:
        return path < self.threshold
