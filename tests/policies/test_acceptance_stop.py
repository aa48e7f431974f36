"""SpecDec++'s stop: the acceptance predictor recovers a known model from chains cut at their first
rejection (a fit that also labels the never-judged levels fails the same check), the stop ends a
chain where the predicted rejection probability first exceeds the threshold, and the model file
round-trips or is refused."""

from __future__ import annotations

import math

import numpy as np
import pytest

from draftrl.policies.acceptance_stop import (
    FEATURES,
    AcceptanceModel,
    AcceptanceStop,
    features,
    fit_acceptance,
    fit_logistic,
    judged_levels,
)
from draftrl.policies.confidence_stop import CumulativeConfidenceStop

TRUE = np.array([0.3, 0.8, 0.2, -0.6])  # over FEATURES: acceptance rises with confidence, falls with depth
DEPTH = 6


def chains(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` recorded rounds of ``DEPTH`` levels: each token's probability q ~ Beta(2, 1.5); level k is
    accepted (given the earlier ones were) with probability sigmoid(TRUE . features); the round's
    accepted count is where the first rejection falls."""
    rng = np.random.default_rng(seed)
    q = rng.beta(2.0, 1.5, size=(n, DEPTH))
    path = np.cumprod(q, axis=1)
    matched = np.full(n, DEPTH)
    for i in range(n):
        for k in range(1, DEPTH + 1):
            z = float(TRUE @ features(k, q[i, k - 1], path[i, k - 1]))
            if rng.random() >= 1 / (1 + math.exp(-z)):
                matched[i] = k - 1
                break
    return path, matched


def standard_errors(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The fitted weights' standard errors (the inverse Fisher information at ``w``)."""
    p = 1 / (1 + np.exp(-(x @ w)))
    return np.sqrt(np.diag(np.linalg.inv((x * (p * (1 - p))[:, None]).T @ x)))


def assert_recovers(fit) -> None:
    """Every fitted weight within 4.5 standard errors of the true one (all four together: a false
    alarm has probability below 3e-5)."""
    path, matched = chains(6000)
    w = np.asarray(fit(path, matched))
    x, _ = judged_levels(path, matched)
    se = standard_errors(x, TRUE)
    assert np.all(np.abs(w - TRUE) < 4.5 * se), (w, TRUE, se)


def test_the_fit_recovers_the_acceptance_model_that_made_the_chains():
    assert_recovers(lambda path, matched: fit_acceptance(path, matched, l2=1e-6).weights)


def test_a_fit_that_labels_levels_after_the_first_rejection_is_caught():
    """Negative control: counting the levels past the first rejection as rejections (they were never
    judged) biases acceptance down with depth; the same check rejects it."""

    def wrong(path, matched):
        rows, labels = [], []
        for p, m in zip(path, matched):
            q = p / np.r_[1.0, p[:-1]]
            for k in range(1, DEPTH + 1):
                rows.append(features(k, q[k - 1], p[k - 1]))
                labels.append(k <= m)
        return fit_logistic(np.stack(rows), np.asarray(labels, dtype=float), l2=1e-6)

    with pytest.raises(AssertionError):
        assert_recovers(wrong)


def test_judged_levels_stop_at_the_first_rejection_and_at_the_trees_end():
    path = np.array([[0.9, 0.45, 0.09], [0.5, np.nan, np.nan], [0.8, 0.4, 0.2]])
    x, y = judged_levels(path, np.array([1, 1, 3]))
    assert y.tolist() == [1, 0, 1, 1, 1, 1]  # round 1: accepted then rejected; round 2's tree ends; round 3 all
    assert x[1] == pytest.approx(features(2, 0.5, 0.45))  # the token's own probability: 0.45 / 0.9
    with pytest.raises(ValueError, match="needs both"):
        fit_acceptance(path[:2], np.array([0, 0]) - 0)  # two levels, both rejected


def test_with_the_identity_model_the_stop_is_eagle2s_cumulative_stop():
    """A model that predicts acceptance = the token's probability makes 1 - prod a = 1 - path: SpecDec++
    at threshold h then stops where EAGLE-2's cumulative stop at 1 - h does."""
    identity = AcceptanceModel((0.0, 1.0, 0.0, 0.0))
    rng = np.random.default_rng(3)
    for _ in range(200):
        q = rng.uniform(0.05, 1.0, DEPTH)
        h = float(rng.uniform(0.1, 0.9))
        levels = [{"level": float(k + 1), "level_best_prob": float(np.prod(q[: k + 1])), "level_num_nodes": 1.0}
                  for k in range(DEPTH)]
        specdec, cum = AcceptanceStop(identity, h), CumulativeConfidenceStop(1 - h)
        first = [next((k for k, f in enumerate(levels) if rule(f)), None) for rule in (specdec, cum)]
        assert first[0] == first[1]


def test_a_stricter_threshold_never_drafts_deeper():
    model = AcceptanceModel(tuple(TRUE))
    path, _ = chains(300, seed=5)
    for p in path:
        levels = [{"level": float(k + 1), "level_best_prob": float(p[k]), "level_num_nodes": 1.0} for k in range(DEPTH)]
        depth = [next((k + 1 for k, f in enumerate(levels) if AcceptanceStop(model, h)(f)), DEPTH)
                 for h in (0.2, 0.5, 0.8)]
        assert depth == sorted(depth)


def test_the_model_file_round_trips_and_a_foreign_file_is_refused(tmp_path):
    model = fit_acceptance(*chains(500))
    assert AcceptanceModel.load(model.save(tmp_path / "m.json")) == model
    (tmp_path / "other.json").write_text('{"format": "something-else", "weights": [1]}')
    with pytest.raises(ValueError, match="draftrl-acceptance-model/1"):
        AcceptanceModel.load(tmp_path / "other.json")
    with pytest.raises(FileNotFoundError, match="acceptance model"):
        AcceptanceModel.load(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="in \\(0, 1\\)"):
        AcceptanceStop(model, 1.0)
    assert len(model.weights) == len(FEATURES)
