"""The CLI's last line of defence: every failure is one line on stderr (no traceback), with
``--debug`` for the traceback; YAML mistakes name FILE:LINE:COLUMN; misspelled sections fail."""

from __future__ import annotations

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
