"""draftrl models list / fetch through the real CLI entry point."""

from __future__ import annotations

import pytest

from draftrl.cli import main


def test_list_shows_cached_default(smollm2, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m" in out and "yes" in out


def test_fetch_cached_prints_path(smollm2, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "fetch"]) == 0
    assert "smollm2-135m" in capsys.readouterr().out


def test_fetch_unknown_name_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "fetch", "nope"]) == 2
    err = capsys.readouterr().err
    assert err == "draftrl models: error: unknown model name 'nope'; known names: smollm2-135m\n"
