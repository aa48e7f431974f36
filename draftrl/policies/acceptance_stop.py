"""SpecDec++'s stop: a trained acceptance predictor, and drafting ends once a rejection is likely.

SpecDec++ (Huang et al., 2024) trains a head that predicts, for each drafted token, the probability
that the target accepts it given that every earlier one was accepted, and stops drafting once the
predicted probability that *some* drafted token is rejected, ``1 - prod_k a_k``, exceeds a threshold
``h``. Its head reads the draft model's hidden state; this one is a logistic regression over the
per-level signals every :class:`~draftrl.drafters.base.TreeBuilder` exposes (the drafted token's
probability, the chain's, the level), fitted on the tune split's recorded rounds. It needs no change
to the drafter, is fitted in a second, and corrects what the raw confidence gets wrong: a head that
is over- or under-confident, and acceptance that falls with depth at equal confidence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from draftrl.io import read_json, write_json
from draftrl.policies.confidence_stop import LevelStopRule

FORMAT = "draftrl-acceptance-model/1"
#: The predictor's inputs, after a constant: logit of the drafted token's probability, log of the
#: chain's probability, log of the level.
FEATURES = ("bias", "logit_token_prob", "log_path_prob", "log_level")
_EPS = 1e-6


def features(level: int, token_prob: float, path_prob: float) -> np.ndarray:
    """The predictor's input row for one drafted level (``FEATURES``)."""
    q = min(max(token_prob, _EPS), 1.0 - _EPS)
    return np.array([1.0, math.log(q / (1.0 - q)), math.log(max(path_prob, _EPS)), math.log(level)])


@dataclass(frozen=True)
class AcceptanceModel:
    """``P(level k accepted | levels < k accepted) = sigmoid(weights . features)``."""

    weights: tuple[float, ...]
    num_samples: int = 0
    """judged levels it was fitted on"""

    def probability(self, level: int, token_prob: float, path_prob: float) -> float:
        z = float(np.dot(self.weights, features(level, token_prob, path_prob)))
        return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))

    def save(self, path: str | Path) -> Path:
        return write_json(path, {"format": FORMAT, "features": list(FEATURES), "weights": list(self.weights),
                                 "num_samples": self.num_samples})

    @classmethod
    def load(cls, path: str | Path) -> AcceptanceModel:
        data = read_json(path, "acceptance model")
        if data.get("format") != FORMAT or data.get("features") != list(FEATURES):
            raise ValueError(f"{path} is not a {FORMAT} file over {FEATURES}; fit one with fit_acceptance.")
        return cls(tuple(float(w) for w in data["weights"]), int(data.get("num_samples", 0)))


def judged_levels(path_probs: np.ndarray, matched: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (features, accepted) rows of recorded chains: each round's levels up to its first
    rejection (accepted 1, the rejected one 0; later levels were never judged).

    :param path_probs: float [N, D]: each round's chain probability per level (NaN past its end).
    :param matched: int [N]: how many of each round's drafted tokens the target accepted.
    """
    rows, labels = [], []
    for path, m in zip(np.asarray(path_probs, dtype=np.float64), np.asarray(matched).tolist()):
        previous = 1.0
        for k, p in enumerate(path.tolist(), start=1):
            if not np.isfinite(p) or k > m + 1:
                break
            rows.append(features(k, p / previous if previous > 0 else 0.0, p))
            labels.append(k <= m)
            previous = p
    if not rows:
        raise ValueError("no drafted levels to fit on; give rounds of a model drafter (traces with depth >= 1).")
    return np.stack(rows), np.asarray(labels, dtype=np.float64)


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1e-3, iterations: int = 50) -> np.ndarray:
    """Weights of an L2-penalised logistic regression (Newton's method; the bias is penalised too,
    by ``l2`` per sample, which only keeps separable data finite)."""
    n, d = x.shape
    w = np.zeros(d)
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-np.clip(x @ w, -30, 30)))
        grad = x.T @ (p - y) / n + l2 * w
        hess = (x * (p * (1 - p))[:, None]).T @ x / n + l2 * np.eye(d)
        step = np.linalg.solve(hess, grad)
        w -= step
        if float(np.abs(step).max()) < 1e-9:
            break
    return w


def fit_acceptance(path_probs: np.ndarray, matched: np.ndarray, l2: float = 1e-3) -> AcceptanceModel:
    """Fit the acceptance predictor on recorded rounds (:func:`judged_levels`); e.g. from traces,
    ``fit_acceptance(level_path_probs(traces, D), match_depths(traces))``."""
    x, y = judged_levels(path_probs, matched)
    if y.min() == y.max():
        raise ValueError(f"all {len(y)} judged levels were {'accepted' if y[0] else 'rejected'}; the predictor "
                         "needs both: record more rounds or deeper drafts.")
    return AcceptanceModel(tuple(float(w) for w in fit_logistic(x, y, l2)), len(y))


class AcceptanceStop(LevelStopRule):
    """Stop after the level at which the predicted probability that some token drafted this round
    is rejected exceeds ``threshold`` (SpecDec++'s rule, with :class:`AcceptanceModel`)."""

    def __init__(self, model: AcceptanceModel, threshold: float):
        super().__init__()
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"threshold={threshold} is a probability of a rejection; choose it in (0, 1).")
        self.model, self.threshold = model, threshold
        self.name = f"specdec:{threshold:g}"
        self.all_accepted = 1.0
        """predicted probability that every token drafted so far this round is accepted"""

    def stops(self, path: float) -> bool:
        level = len(self.confidences)
        if level == 1:
            self.all_accepted = 1.0
        self.all_accepted *= self.model.probability(level, self.confidences[-1], path)
        return 1.0 - self.all_accepted > self.threshold
