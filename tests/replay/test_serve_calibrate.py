"""``StepCostModel``: vLLM's measured step seconds (``draftrl calibrate --engine vllm``) as the
serving replay's cost, refitted from synthetic calibrations whose coefficients are known."""

from __future__ import annotations

import numpy as np
import pytest
from serve_recordings import synthetic_calibration

from draftrl.replay.serve_calibrate import FORMAT, StepCostModel, fit


@pytest.mark.parametrize("coef,prefill", [((0.040, 0.0015, 0.0006), None), ((0.012, 0.004, 0.0002), None),
                                          ((0.040, 0.0015, 0.0006), 0.00004), ((0.012, 0.004, 0.0002), 0.0001)])
def test_cost_model_refits_known_coefficients(coef, prefill):
    model = StepCostModel.from_calibration(synthetic_calibration(coef, sd=0.002, prefill=prefill))
    for got, want, tol in zip((model.base, model.per_seq, model.per_token), coef, (1.5e-3, 2e-4, 2e-5)):
        assert abs(got - want) < tol
    # without prefill points a prompt costs its sequence only; with them the slope is recovered
    assert abs(model.per_prefill_token - (prefill or 0.0)) < 2e-6
    assert model.residual_std == pytest.approx(0.002, rel=0.15)
    assert model.mean(4, 0, 1000) - model.mean(4, 0) == pytest.approx(1000 * model.per_prefill_token)
    with pytest.raises(ValueError, match="calibrate --engine vllm"):
        StepCostModel.from_calibration({"format": "other", "points": []})


def test_cost_table_follows_the_measured_medians():
    """A step cost flat for few tokens then linear (as on a CPU): the model reproduces each
    cell's median, as measured even where more tokens cost less (vLLM's CPU runner does that at
    small batches), interpolates between cells and batch sizes, and extends past the grid with the
    fitted slopes."""
    def truth(b, tokens):
        return 0.1 + 0.002 * b + 0.004 * max(0, tokens - 6)
    points = []
    for b in (1, 4, 16):
        for d in (0, 1, 2, 4, 8):
            t = b * (d + 1)
            points.append({"num_seqs": b, "tokens_verified": t, "seconds": [truth(b, t)] * 3})
    points[1]["seconds"] = [0.045, 0.05, 0.055]  # 2 tokens cheaper than 1: kept, as measured
    model = StepCostModel.from_calibration({"format": FORMAT, "points": points})
    assert model.mean(1, 1) == pytest.approx(truth(1, 1)) and model.mean(1, 2) == pytest.approx(0.05)
    for b, t in ((1, 9), (4, 20), (16, 80), (16, 144)):
        assert model.mean(b, t) == pytest.approx(truth(b, t))
    assert model.mean(4, 16) == pytest.approx((truth(4, 12) + truth(4, 20)) / 2)  # between cells
    assert model.mean(10, 40) == pytest.approx((model.mean(4, 40) + model.mean(16, 40)) / 2)  # between batch sizes
    assert model.mean(16, 200) - model.mean(16, 144) == pytest.approx(56 * model.per_token)  # past the grid
    assert model.mean(32, 32) - model.mean(16, 32) == pytest.approx(16 * model.per_seq)
    assert model.residual_std == pytest.approx(np.std([-0.005, 0.0, 0.005] + [0.0] * 42))  # spread around the cells


def test_a_burst_of_load_in_one_round_leaves_the_fit_alone():
    """One sample of every cell taken during a burst (another job's 200 ms): the medians drop it,
    so the known coefficients come back and nothing is flagged."""
    calibration = synthetic_calibration((0.040, 0.0015, 0.0006), sd=0.001)
    for p in calibration["points"]:
        p["seconds"][3] += 0.2
    f = fit(calibration["points"])
    for term, want, tol in (("base", 0.040, 1.5e-3), ("per_seq", 0.0015, 2e-4), ("per_token", 0.0006, 2e-5)):
        assert abs(f[term] - want) < tol
    assert f["problem"] is None


def test_a_negative_base_is_flagged_and_held_at_zero():
    """Negative control: cells measured under load whose ordinary fit has a negative per-step base
    (the small batches ran fast, the large ones slow) are flagged in one line naming the fix, and the
    cost model the replay uses keeps every term >= 0 and every step's cost positive."""
    rng = np.random.default_rng(3)
    points = [{"kind": "decode", "num_seqs": b, "depth": d, "tokens_verified": b * (d + 1), "prompt_tokens": 0,
               "seconds": (-0.005 + 0.008 * b + 0.0005 * b * (d + 1) + 0.0005 * rng.standard_normal(4)).tolist()}
              for b in (1, 2, 4, 8, 16) for d in (0, 1, 2, 4)]
    f = fit(points)
    assert f["unconstrained"]["base"] < -0.003
    assert "base" in f["problem"] and "idle machine" in f["problem"] and "--steps" in f["problem"]
    assert "per_seq" not in f["problem"]
    assert min(f["base"], f["per_seq"], f["per_token"]) >= 0
    model = StepCostModel.from_calibration({"format": FORMAT, "points": points})
    assert model.base >= 0 and all(model.mean(b, b) > 0 for b in (1, 3, 32))


def test_a_low_quantile_keeps_the_costs_shape_under_sustained_load():
    """Other jobs add time to a step, never take it away: cells whose samples carry a load that
    differs cell by cell (as at load average 9 on 2 cores) bend the medians' table, while each
    cell's 10% quantile stays near the truth; the quantile is refused outside [0, 1]."""
    rng = np.random.default_rng(5)

    def truth(b, tokens):
        return 0.04 + 0.002 * b + 0.003 * tokens

    points = [{"kind": "decode", "num_seqs": b, "depth": d, "tokens_verified": b * (d + 1), "prompt_tokens": 0,
               "seconds": (truth(b, b * (d + 1)) + rng.exponential(rng.uniform(0.0, 0.06), 8)).tolist()}
              for b in (1, 4, 16) for d in (0, 1, 2, 4, 8)]
    calibration = {"format": FORMAT, "points": points}
    errors = {}
    for q in (0.5, 0.1):
        model = StepCostModel.from_calibration(calibration, quantile=q)
        errors[q] = np.mean([abs(model.mean(b, t) - truth(b, t))
                             for b, t in ((p["num_seqs"], p["tokens_verified"]) for p in points)])
    assert errors[0.1] < 0.5 * errors[0.5] and errors[0.1] < 0.015
    with pytest.raises(ValueError, match="quantile=1.5"):
        StepCostModel.from_calibration(calibration, quantile=1.5)


def head_cells(calibration, added, sd=0.0, seed=1):
    """The calibration plus ``head`` cells: each decode cell with d >= 1 costing ``added(b, d)`` more."""
    rng = np.random.default_rng(seed)
    heads = []
    for p in calibration["points"]:
        if p.get("kind") == "decode" and p["depth"] >= 1:
            s = (np.asarray(p["seconds"]) + added(p["num_seqs"], p["depth"])
                 + sd * rng.standard_normal(len(p["seconds"])))
            heads.append({**p, "kind": "head", "seconds": s.tolist()})
    return {**calibration, "points": calibration["points"] + heads}


def test_head_cells_give_the_heads_added_seconds_and_leave_the_fit_alone():
    """What the head's drafting adds to a step is the head cell's median minus the decode cell's,
    interpolated over levels and head-drafting batch sizes, extended past the grid; the decode fit
    and table ignore head cells (mixed in, they would price every decode step as a head step)."""
    coef = (0.040, 0.0015, 0.0006)
    plain = synthetic_calibration(coef, sd=0.0)
    added = lambda b, d: 0.001 + 0.005 * d + 0.0004 * b * d  # noqa: E731
    model = StepCostModel.from_calibration(head_cells(plain, added))
    without = StepCostModel.from_calibration(plain)
    assert (model.base, model.per_seq, model.per_token) == pytest.approx((without.base, without.per_seq,
                                                                          without.per_token))
    assert model.table == without.table and without.head is None
    assert model.residual_std == without.residual_std  # the noise is the decode cells' spread, head cells apart
    for b, d in ((1, 1), (4, 2), (16, 8), (2, 4)):
        assert model.head_seconds(b, d) == pytest.approx(added(b, d))
    assert model.head_seconds(1, 3) == pytest.approx((added(1, 2) + added(1, 4)) / 2)  # between levels 2 and 4
    assert model.head_seconds(1, 10) == pytest.approx(added(1, 8) + 2 * (added(1, 8) - added(1, 1)) / 7)
    assert model.head_seconds(0, 4) == 0.0 and model.head_seconds(4, 0) == 0.0
    # the head's seconds join a step's, under the machine jitter of the decode part
    assert model.mean(4, 12, 0, (2, 3)) - model.mean(4, 12) == pytest.approx(model.head_seconds(2, 3))
    with pytest.raises(ValueError, match="--drafter eagle3"):  # a calibration without head cells says how to make them
        without.head_seconds(1, 2)
