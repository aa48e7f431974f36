"""The controller's observation: verify-size buckets, cost features from a table, the running cost averages."""

from __future__ import annotations

import numpy as np
import pytest
from cost_tables import synthetic_table

from draftrl.signals.features import CostTracker, FeatureBuilder, RoundSummary, verify_bucket


def test_verify_buckets():
    assert [verify_bucket(n) for n in (0, 1, 2, 3, 4, 7, 8, 63, 64, 500)] == [0, 1, 2, 2, 3, 3, 4, 6, 7, 7]


def test_cost_features_start_from_the_table():
    table = synthetic_table()
    tracker = CostTracker(table, decay=0.9, width=1)
    builder = FeatureBuilder(4, 0.8, tracker)
    builder.start_episode(16)
    obs = builder.observation({}, 100, 0)
    names = builder.names
    g1 = obs[names.index("verify_cost_1")]
    assert g1 == pytest.approx(table.g(2), rel=1e-5)  # one node + the root: two tokens
    assert obs[names.index("draft_cost_level")] == pytest.approx(0.001 / table.ar_step(np.median([64, 1024])), rel=1e-5)
    # unknown without a table: every ratio 1, draft costs 0
    blank = FeatureBuilder(4, 0.8, CostTracker(None, 0.9)).observation({}, 10, 0)
    assert np.all(blank[16:23] == 1.0) and np.all(blank[23:25] == 0.0)


def test_a_round_that_fed_the_prompt_is_no_verify_cost_sample():
    """The first round of a fused prefill (start(prefill=False)) took the prompt's time too: the
    verify-cost averages must not take it, or every cost feature reads the prompt for a while."""
    def summary(seconds, prompt_fed):
        return RoundSummary(3, 2, 4, 4, 4, draft_seconds=0.001, verify_seconds=seconds, sample_seconds=0.0,
                            prompt_fed=prompt_fed)

    tracker = CostTracker(None, decay=0.5)
    tracker.observe(summary(1.0, prompt_fed=True))  # a 1 s prefill + verify
    assert tracker.verify[verify_bucket(4)] is None
    tracker.observe(summary(0.06, prompt_fed=False))
    tracker.observe(summary(1.0, prompt_fed=True))
    assert tracker.verify[verify_bucket(4)] == pytest.approx(0.06)
    tracker.observe(summary(0.08, prompt_fed=False))  # the control: an ordinary round moves the average
    assert tracker.verify[verify_bucket(4)] == pytest.approx(0.07)
