"""Every command that writes a folder refuses one holding a user's own file unless ``--overwrite``
(issue 47, item 4), in one line naming the file and the fix, before any work; the user's file is
never touched. Controls: an empty folder, a folder holding only the command's own outputs (where
the command resumes) and ``--overwrite`` beside the user's file all pass the check and reach the
work (stubbed here, so each case takes well under a second; the real runs are tested elsewhere).

``collect`` (no --overwrite past a foreign file: ``Traces.save`` keeps a trace folder pure),
``eval`` and ``calibrate`` (a file) are covered in ``test_cli_errors.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from draftrl.cli import main
from draftrl.io import foreign_files, prepare_out, refuse_foreign

REACHED = "reached the work"


def reached(*args, **kwargs):
    raise RuntimeError(REACHED)


def user_folder(tmp_path: Path) -> Path:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("the user's own")
    return out


def refused(capsys, argv: list[str], out: Path) -> str:
    """Exit 2, one line naming notes.txt and both fixes; nothing written, notes.txt untouched."""
    before = sorted(p.name for p in out.iterdir())
    code = main(argv)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, lines
    assert "notes.txt" in lines[0] and "did not write" in lines[0], lines[0]
    assert "--overwrite" in lines[0] and "another --out" in lines[0], lines[0]
    assert sorted(p.name for p in out.iterdir()) == before and (out / "notes.txt").read_text() == "the user's own"
    return lines[0]


def reaches_work(capsys, argv: list[str]) -> None:
    assert main(argv) == 2
    assert REACHED in capsys.readouterr().err


# ----------------------------------------------------------------------------- the helper
def test_helper_names_the_files_and_keeps_them_with_overwrite(tmp_path):
    out = user_folder(tmp_path)
    (out / "results.json").write_text("{}")
    assert foreign_files(out, ("results.json", "*.png")) == ["notes.txt"]
    assert foreign_files(tmp_path / "absent", ("x",)) == []
    with pytest.raises(ValueError, match=r"files draftrl eval did not write \(notes.txt\); pass --overwrite"):
        refuse_foreign(out, ("results.json",), overwrite=False, command="eval")
    refuse_foreign(out, ("results.json", "notes.txt"), overwrite=False, command="eval")  # control: all its own
    refuse_foreign(tmp_path / "new", ("results.json",), overwrite=False, command="eval")  # control: no folder yet
    prepare_out(out, ("results.json",), overwrite=True, command="eval")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]  # its own earlier output gone, the user's kept
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="is a file"):
        refuse_foreign(tmp_path / "file", (), overwrite=True, command="eval")


# ----------------------------------------------------------------------------- each command
def test_demo(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("draftrl.config.wandb.pipeline", reached)  # the demo's first step after the check
    out = user_folder(tmp_path)
    refused(capsys, ["demo", "--quick", "--out", str(out)], out)
    reaches_work(capsys, ["demo", "--quick", "--out", str(tmp_path / "empty")])
    reaches_work(capsys, ["demo", "--quick", "--out", str(out), "--overwrite"])
    assert (out / "notes.txt").exists()


def test_serve_demo(tmp_path, capsys, monkeypatch):
    pytest.importorskip("vllm", reason='needs vLLM: pip install "draftrl[vllm]"')
    monkeypatch.setattr("draftrl.eval.serve.demo._train_config", reached)
    out = user_folder(tmp_path)
    refused(capsys, ["demo", "--engine", "vllm", "--quick", "--out", str(out)], out)
    reaches_work(capsys, ["demo", "--engine", "vllm", "--quick", "--out", str(tmp_path / "empty")])
    own = tmp_path / "resumed"
    own.mkdir()
    (own / "logs").mkdir()  # an interrupted demo's own folder: it resumes there
    reaches_work(capsys, ["demo", "--engine", "vllm", "--quick", "--out", str(own)])


def test_export_bundle(tmp_path, capsys):
    out = user_folder(tmp_path)
    argv = ["export", "vllm-eagle3:1-1:2,2-16:1", "--format", "vllm"]
    refused(capsys, [*argv, "--out", str(out)], out)
    assert main([*argv, "--out", str(tmp_path / "empty")]) == 0
    assert main([*argv, "--out", str(out), "--overwrite"]) == 0
    assert (out / "vllm.json").is_file() and (out / "notes.txt").read_text() == "the user's own"
    assert main([*argv, "--out", str(tmp_path / "empty"), "--overwrite"]) == 0  # its own bundle, replaced


def test_grid(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("draftrl.eval.round.grid.run_grid", reached)
    monkeypatch.setattr("draftrl.eval.round.grid.run_cell", reached)
    out = user_folder(tmp_path)
    refused(capsys, ["grid", "--out", str(out), "--quiet"], out)
    refused(capsys, ["grid", "--cell", "--depth", "2", "--out", str(out)], out)
    reaches_work(capsys, ["grid", "--out", str(out), "--quiet", "--overwrite"])
    cells = tmp_path / "cells"
    cells.mkdir()
    (cells / "cell_d2_v0_w1.json").write_text("{}")  # another sweep agent's cell: the same folder
    reaches_work(capsys, ["grid", "--cell", "--depth", "3", "--out", str(cells)])


def test_eval_overwrite_writes_beside_the_users_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("draftrl.eval.round.compare.run_eval", reached)
    out = user_folder(tmp_path)
    refused(capsys, ["eval", "--policies", "none", "--out", str(out), "--quiet"], out)
    reaches_work(capsys, ["eval", "--policies", "none", "--out", str(out), "--quiet", "--overwrite"])


def test_collect_vllm(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("draftrl.replay.recordings.record_workload", reached)
    out = user_folder(tmp_path)
    refused(capsys, ["collect", "--engine", "vllm", "--out", str(out)], out)
    reaches_work(capsys, ["collect", "--engine", "vllm", "--out", str(out), "--overwrite"])


def test_train(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("draftrl.train.ppo_size.train", reached)
    config = str(Path(__file__).parents[2] / "configs" / "analytic_regimes.yaml")
    out = user_folder(tmp_path)
    argv = ["train", "--config", config]
    refused(capsys, [*argv, "--out", str(out)], out)
    reaches_work(capsys, [*argv, "--out", str(tmp_path / "empty")])
    (out / "run_state.json").write_text("{}")  # an earlier run's files go with --overwrite, the user's stay
    (out / "checkpoints").mkdir()
    reaches_work(capsys, [*argv, "--out", str(out), "--overwrite"])
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert main([*argv, "--out", str(out), "--overwrite", "--resume"]) == 2
    assert "pass one of them" in capsys.readouterr().err
