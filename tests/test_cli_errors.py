"""The CLI's last line of defence: every failure is one line on stderr (no traceback), with
``--debug`` for the traceback; YAML mistakes name FILE:LINE:COLUMN; misspelled sections fail."""

from __future__ import annotations

from pathlib import Path

import pytest

from draftrl.cli import main


def one_error_line(capsys, argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_unexpected_error_is_one_line_with_the_debug_hint(tmp_path, capsys):
    """Finding 8: an --out below a file raised an OSError traceback; now one line, and --debug re-raises."""
    (tmp_path / "file.txt").write_text("x")
    out = str(tmp_path / "file.txt" / "traces")
    line = one_error_line(capsys, ["collect", "--out", out])
    assert line.startswith("draftrl collect: error: ") and "Error" in line and "--debug" in line
    with pytest.raises(OSError):
        main(["--debug", "collect", "--out", out])


def test_yaml_syntax_error_names_file_line_column(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("env:\n  depths: [0, 2\n  width: 1\n")
    line = one_error_line(capsys, ["collect", "--config", str(bad), "--out", str(tmp_path / "t")])
    assert f"{bad}:3:" in line and "YAML syntax error" in line
    line = one_error_line(capsys, ["train", "--config", str(bad), "--out", str(tmp_path / "run")])
    assert f"{bad}:3:" in line


def test_misspelled_section_is_refused(tmp_path, capsys):
    """Finding 3: `enviroment:` was ignored and the default 256-prompt workload ran."""
    bad = tmp_path / "typo.yaml"
    bad.write_text("enviroment:\n  max_new_tokens: 8\n")
    line = one_error_line(capsys, ["collect", "--config", str(bad), "--out", str(tmp_path / "t")])
    assert "unknown section 'enviroment'; did you mean 'env'?" in line
    assert not (tmp_path / "t").exists()


def _fake_eval(monkeypatch, calls: list):
    """``run_eval`` replaced by one that writes what the real one writes (results, report, a plot)."""

    def fake_run_eval(config, out, **kwargs):
        calls.append(out)
        for name in ("results.json", "report.md", "trajectory.png"):
            (Path(out) / name).write_text("{}")
        return {"prompts": [], "policies": {}, "exactness": {"passed": True, "monitor_overhead": {"fraction": 0}}}

    monkeypatch.setattr("draftrl.eval.evaluate.run_eval", fake_run_eval)
    monkeypatch.setattr("draftrl.cli.eval.print_policy_table", lambda *a, **k: None)


def test_eval_never_silently_replaces_earlier_results(tmp_path, capsys, monkeypatch):
    """Finding 5: `eval --out EXISTING` replaced results.json, report and plots; stale plots stayed."""
    calls = []
    _fake_eval(monkeypatch, calls)
    out = tmp_path / "e"
    argv = ["eval", "--policies", "none,heuristic", "--out", str(out), "--quiet"]
    assert main(argv) == 0
    (out / "acceptance_hist.png").write_text("stale plot of the earlier run")
    line = one_error_line(capsys, argv)
    assert "already holds the outputs of an earlier eval" in line and "--overwrite" in line
    assert len(calls) == 1 and (out / "acceptance_hist.png").exists()  # refused before any work, nothing touched
    assert main([*argv, "--overwrite"]) == 0
    assert len(calls) == 2 and not (out / "acceptance_hist.png").exists()  # no stale plot beside new results


def test_out_of_another_kind_or_unwritable_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    calls = []
    _fake_eval(monkeypatch, calls)
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("mine")
    assert "files draftrl eval did not write (thesis.tex)" in one_error_line(
        capsys, ["eval", "--policies", "none", "--out", str(foreign), "--quiet"])
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert "is not writable" in one_error_line(capsys, ["eval", "--policies", "none", "--out", str(blocker / "sub"),
                                                        "--quiet"])
    assert "is not writable" in one_error_line(capsys, ["grid", "--out", str(blocker / "sub"), "--quiet"])
    assert calls == [] and (foreign / "thesis.tex").read_text() == "mine"
