"""``CostTable``: lookups, files, and the values it refuses."""

from __future__ import annotations

import math

import numpy as np
import pytest
from cost_tables import synthetic_table

from draftrl.signals.costs import CostTable


def test_cost_table_lookup_and_roundtrip(tmp_path):
    table = synthetic_table()
    assert table.verify(1, 64) == pytest.approx(0.02)
    assert table.verify(1, 544) == pytest.approx(0.03)  # halfway in context
    assert table.verify(100, 64) == pytest.approx(0.02 * 1.8)  # clamped past the grid
    assert table.draft(3, 1) == pytest.approx(0.0005 + 3 * 0.001)
    table.save(tmp_path / "t.json")
    again = CostTable.load(tmp_path / "t.json")
    assert np.array_equal(again.verify_seconds, table.verify_seconds) and again.draft_base_seconds == 0.0005
    with pytest.raises(FileNotFoundError, match="draftrl calibrate"):
        CostTable.load(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="must start at 1"):
        CostTable(num_tokens=[2, 4], context_lens=[8], verify_seconds=[[1, 2]], draft_widths=[1],
                  draft_level_seconds=[0])


def table_dict(**verify) -> dict:
    """A valid table's JSON, with ``verify`` keys replaced."""
    data = CostTable(num_tokens=[1, 2], context_lens=[64], verify_seconds=[[0.02, 0.021]], draft_widths=[1],
                     draft_level_seconds=[1e-4]).to_dict()
    data["verify"].update(verify)
    return data


@pytest.mark.parametrize("where", ["verify", "draft", "noise"])
def test_cost_table_refuses_non_finite_values(where):
    data = table_dict()
    if where == "verify":
        data["verify"]["seconds"] = [[0.02, math.inf]]
    elif where == "draft":
        data["draft"]["level_seconds"] = [float("nan")]
    else:
        data["noise"] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        CostTable.from_dict(data)
