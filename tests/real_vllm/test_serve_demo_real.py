"""``draftrl demo --engine vllm --quick`` end to end in real vLLM: every step writes its output, the
sweep table and plot exist, exactness passes, every step's offline wandb run stands in one group
(the sweep's speedup against the arrival rate beside calibration, training and the DSD search), and
a second run skips every finished step without a second run of any."""

from __future__ import annotations

import json

import pytest
from wandb_records import read_runs

from draftrl.cli import main
from draftrl.eval.serve.demo import STEPS


@pytest.mark.slow
def test_quick_serve_demo_runs_end_to_end_and_resumes(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    out = tmp_path / "demo"
    assert main(["demo", "--engine", "vllm", "--quick", "--out", str(out)]) == 0
    summary = json.loads((out / "serve_demo_summary.json").read_text())
    assert list(summary["steps"]) == list(STEPS)
    assert summary["exactness"]["passed"] is True
    rows = summary["rates"]["2"]
    assert {"none", "fixed:2"} <= set(rows) and any(name.startswith("dsd:") for name in rows)
    assert rows["none"]["speedup_vs_none"] == 1.0 and all(r["tokens_per_second"] > 0 for r in rows.values())
    assert all(r["replay_speedup_vs_none"] is not None for name, r in rows.items())
    assert (out / "sweep" / "sweep.png").stat().st_size > 0 and (out / "sweep" / "report.md").exists()
    # on the default mix: the searched fixed K is swept, per-class rows, the replay's ceiling per rate
    assert summary["best_fixed"] in rows and rows[summary["best_fixed"]]["speedup_vs_best_fixed"] == 1.0
    assert set(summary["hindsight_vs_none"]) == {"2"} and summary["hindsight_vs_none"]["2"] > 0
    assert summary["classes"]["2"] and all(set(c) <= set(rows) for c in summary["classes"]["2"].values())
    printed = capsys.readouterr().out
    assert "vs none (vLLM)" in printed and "Poisson 2 requests/s" in printed
    assert f"wandb sync {out / 'wandb'}" in printed
    runs = read_runs(out / "wandb")
    assert [r.job_type for r in runs] == list(STEPS) and {r.group for r in runs} == {summary["wandb"]["group"]}
    assert all(r.exit_code == 0 for r in runs)
    sweep = runs[-1]
    columns, points = sweep.table("sweep/speedup_vs_none_table")
    assert {(row[1], row[0]) for row in points} == {(name, 2.0) for name in rows}
    assert {row[0] for row in sweep.table("sweep/rate_2")[1]} == set(rows)

    assert main(["demo", "--engine", "vllm", "--quick", "--out", str(out), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert all(step["note"].startswith("skipped") for step in again["steps"].values())
    assert again["rates"] == summary["rates"]
    assert len(read_runs(out / "wandb")) == len(STEPS)  # skipped steps log nothing
