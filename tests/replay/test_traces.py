"""``Traces``: one collection per directory, consistent arrays, saves that replace the whole unit."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from draftrl.replay.traces import Traces
from draftrl.runs import stored_cost_table_path
from draftrl.signals.costs import CostTable


def test_traces_of_two_collections_are_refused(tmp_path, tiny_traces):
    """A trace.json of one collection beside the trace.npz of another is refused (it once trained, exit 0)."""
    tiny_traces(7).save(tmp_path / "a")
    tiny_traces(9).save(tmp_path / "b")
    assert Traces.load(tmp_path / "a").continuation[0] == 7
    shutil.copyfile(tmp_path / "b" / "trace.npz", tmp_path / "a" / "trace.npz")
    with pytest.raises(ValueError, match="come from different collections.*--overwrite"):
        Traces.load(tmp_path / "a")


def test_traces_with_inconsistent_arrays_are_refused(tmp_path, tiny_traces):
    traces = tiny_traces()
    traces.cu_num_positions = np.array([0, 5])  # more positions than the continuation holds
    traces.save(tmp_path / "t")
    with pytest.raises(ValueError, match="cu_num_positions does not index continuation"):
        Traces.load(tmp_path / "t")


def test_saving_traces_replaces_the_unit_and_its_cost_table(tmp_path, tiny_traces):
    """A new save drops the earlier cost table; a cost table of another collection is refused."""
    table = CostTable(num_tokens=[1, 2], context_lens=[64], verify_seconds=[[0.02, 0.021]], draft_widths=[1],
                      draft_level_seconds=[1e-4])
    first = tiny_traces(7).save(tmp_path / "t", cost_table=table)
    assert stored_cost_table_path(first) == first / "cost_table.json"
    stale = (first / "cost_table.json").read_text()
    tiny_traces(9).save(tmp_path / "t")  # no cost table this time: none may remain
    assert not (first / "cost_table.json").exists() and Traces.load(first).continuation[0] == 9
    (first / "cost_table.json").write_text(stale)  # a stale copy put back by hand
    with pytest.raises(ValueError, match="belongs to another collection"):
        stored_cost_table_path(first)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]  # no temporary directories left behind


def test_traces_never_replace_a_foreign_directory(tmp_path, tiny_traces):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "results.json").write_text("{}")
    with pytest.raises(ValueError, match="results.json, not traces"):
        tiny_traces().save(tmp_path / "t")
    assert (tmp_path / "t" / "results.json").read_text() == "{}"
