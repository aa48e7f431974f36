"""The exactness monitor on the real model: it catches the known-wrong correction and stays quiet
on the correct one over the same number of tokens.

Setting (``draftrl.eval.exactness.PowerSetting``): the target drafts for itself with its top-1
token (q one-hot, so acceptance is p(top)), temperature 1, one draft token per round, open-ended
chat prompts: rejections are frequent, and ``resample-from-p`` puts p(x)(1 - p(x)) of extra mass
on every drafted token x, which the draft-agreement e-process sees within a few hundred tokens.
"""

from __future__ import annotations

import pytest

from draftrl.decoding.monitor import TESTS
from draftrl.eval.exactness import PowerSetting, monitor_power

BUDGET = 3000  # "within a few thousand tokens"


@pytest.fixture(scope="module")
def caught(smollm2):
    return monitor_power(smollm2, BUDGET, PowerSetting(), samplers=("resample-from-p",), until="first")


def test_monitor_catches_resample_from_p(caught):
    wrong = caught["resample-from-p"]
    assert not wrong["passed"]
    assert wrong["first_detection"] is not None and wrong["first_detection"] <= BUDGET
    fired = [name for name, at in wrong["detected_at"].items() if at is not None]
    assert "agreement" in fired  # the test aimed at this bug class


def test_monitor_stays_quiet_on_the_correct_sampler_over_the_same_run(smollm2, caught):
    tokens = max(caught["resample-from-p"]["tokens"], 200)  # the same run length (200: first checkpoint)
    right = monitor_power(smollm2, tokens, PowerSetting(), samplers=("correct",))["correct"]
    assert right["tokens"] >= tokens
    assert right["passed"], right["detected_at"]
    assert all(at is None for at in right["detected_at"].values())
    assert right["monitor_overhead"] < 0.03  # at temperature 1 every token is tested


@pytest.mark.slow
def test_every_statistic_power_and_no_false_alarm_long(smollm2):
    """Each statistic's detection point within 4000 tokens, and no alarm over 4000 correct ones."""
    out = monitor_power(smollm2, 4000, PowerSetting())
    assert out["correct"]["passed"]
    assert out["resample-from-p"]["detected_at"]["agreement"] is not None
    print({name: out["resample-from-p"]["detected_at"][name] for name in TESTS})


@pytest.mark.slow
def test_eval_cli_exits_3_on_resample_from_p(tmp_path, capsys, monkeypatch):
    """End to end: draftrl eval with the wrong sampler at temperature 1 stops with the evidence."""
    from draftrl.cli import main

    monkeypatch.setenv("WANDB_MODE", "disabled")
    code = main([
        "eval", "--policies", "none,fixed:1", "--out", str(tmp_path), "--quiet", "--sampler", "resample-from-p",
        "--set", "env.drafter=smollm2-135m", "--set", "env.temperature=1.0", "--set", "env.tasks=[chat]",
        "--set", "env.limit_per_group=2", "--set", "env.max_new_tokens=96", "--set", "eval.repeats=3",
        "--set", "threads=1",
    ])
    err = capsys.readouterr().err
    assert code == 3, err[-2000:]
    assert "EXACTNESS VIOLATION" in err and "policy fixed:1" in err and "agreement" in err
    assert (tmp_path / "results.json").is_file()
