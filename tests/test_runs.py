"""``draftrl.runs``: a run's config stores paths relative to the run directory and reads them back absolute."""

from __future__ import annotations

import json
from pathlib import Path

from draftrl.config import load_config
from draftrl.runs import read_run_config
from draftrl.train.config import TrainConfig
from draftrl.train.state import open_run


def test_saved_config_paths_resolve_from_the_run_directory(tmp_path, monkeypatch):
    """A path stored as given (``traces: runs/demo/traces``, relative to where training ran) would
    silently drop the training cost table when evaluated from another directory. Paths are stored
    relative to the run directory and read back absolute from anywhere; a resume with the same
    config, given from the same place, still matches."""
    project = tmp_path / "project"
    (project / "runs" / "traces").mkdir(parents=True)
    (project / "runs" / "traces" / "cost_table.json").write_text("{}")
    monkeypatch.chdir(project)
    cfg = load_config(TrainConfig, None, ["env.traces=runs/traces", "env.cost_table=runs/traces/cost_table.json"])
    open_run(cfg, Path("runs/ppo"), resume=False)
    saved = json.loads((project / "runs" / "ppo" / "config.json").read_text())
    assert {k: saved["env"][k] for k in ("traces", "cost_table")} == {
        "traces": "../traces", "cost_table": "../traces/cost_table.json"}
    assert open_run(cfg, Path("runs/ppo"), resume=True)["sessions"] == 2  # the same config, given as before
    monkeypatch.chdir(tmp_path)  # evaluate from elsewhere
    kwargs = read_run_config(project / "runs" / "ppo")["env"]
    assert {k: kwargs[k] for k in ("traces", "cost_table")} == {"traces": str(project / "runs" / "traces"),
                      "cost_table": str(project / "runs" / "traces" / "cost_table.json")}
    moved = tmp_path / "moved"  # the whole tree moves: the run still finds its traces
    (project / "runs").rename(moved)
    assert read_run_config(moved / "ppo")["env"]["traces"] == str(moved / "traces")

