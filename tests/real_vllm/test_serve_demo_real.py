"""``draftrl demo --engine vllm --quick`` end to end in real vLLM: every step writes its output, the
sweep table and plot exist, exactness passes, and a second run skips every finished step."""

from __future__ import annotations

import json

import pytest

from draftrl.cli import main
from draftrl.eval.serve_demo import STEPS


@pytest.mark.slow
def test_quick_serve_demo_runs_end_to_end_and_resumes(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    out = tmp_path / "demo"
    assert main(["demo", "--engine", "vllm", "--quick", "--out", str(out)]) == 0
    summary = json.loads((out / "serve_demo_summary.json").read_text())
    assert list(summary["steps"]) == list(STEPS)
    assert summary["exactness"]["passed"] is True
    rows = summary["rates"]["2"]
    assert {"none", "fixed:2"} <= set(rows) and any(name.startswith("dsd:") for name in rows)
    assert rows["none"]["speedup_vs_none"] == 1.0 and all(r["tokens_per_second"] > 0 for r in rows.values())
    assert all(r["sim_speedup_vs_none"] is not None for name, r in rows.items())
    assert (out / "sweep" / "sweep.png").stat().st_size > 0 and (out / "sweep" / "report.md").exists()
    printed = capsys.readouterr().out
    assert "vs none (vLLM)" in printed and "Poisson 2 requests/s" in printed

    assert main(["demo", "--engine", "vllm", "--quick", "--out", str(out), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert all(step["note"].startswith("skipped") for step in again["steps"].values())
    assert again["rates"] == summary["rates"]
