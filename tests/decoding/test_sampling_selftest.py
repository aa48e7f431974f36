"""``draftrl selftest``: output formats and exit codes (the 200,000-trial run is in test_sampling_exactness)."""

from __future__ import annotations

import argparse
import json

import pytest

from draftrl.cli import selftest
from draftrl.decoding.selftest import VECTORS, check_frequencies


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="draftrl")
    selftest.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["selftest", *argv])
    return args.func(args)


def test_json_report_passes_and_exits_0(capsys):
    assert run_cli(["--trials", "20000", "--seed", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] is True and report["method"] == "correct" and report["trials"] == 20000
    assert "4 standard errors" in report["criterion"]
    names = [v["name"] for v in report["vectors"]]
    assert names == [v.name for v in VECTORS]
    for v in report["vectors"]:
        assert {"name", "expected", "observed", "passed", "stderr", "z", "agree"} <= set(v)
        assert len(v["observed"]) == len(v["expected"]) and v["passed"] is True


def test_negative_control_fails_and_exits_1(capsys):
    assert run_cli(["--trials", "20000", "--method", "resample-from-p", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] is False
    assert not next(v for v in report["vectors"] if v["name"] == "three-symbols")["passed"]


def test_text_report(capsys):
    assert run_cli(["--trials", "5000"]) == 0
    out = capsys.readouterr().out
    assert "within 4 standard errors" in out and "three-symbols" in out and "PASS: 7/7" in out


def test_bad_trials_is_a_value_error():
    with pytest.raises(ValueError, match="trials=0"):
        run_cli(["--trials", "0"])


def test_check_frequencies_zero_probability_cells_must_be_empty():
    assert check_frequencies([10, 0], [1.0, 0.0], 10)["passed"]
    result = check_frequencies([9, 1], [1.0, 0.0], 10)
    assert not result["passed"] and result["z"][1] == float("inf")
