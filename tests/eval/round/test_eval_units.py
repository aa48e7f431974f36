"""Evaluation pieces without a model: policy names, metrics, grid cells, sweep file, plots, report."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from eval_helpers import CONFIGS, assert_png, fake_results

from draftrl.cli import main
from draftrl.config import load_config
from draftrl.eval.metrics import acceptance_by_position, add_speedups, median_runs, summarize_with_groups
from draftrl.eval.policy_names import parse_policies
from draftrl.eval.records import RequestRun
from draftrl.eval.round.config import EvalConfig, GridConfig
from draftrl.eval.round.grid import REFERENCE, Cell, grid_cells, write_sweep


@pytest.fixture(autouse=True)
def _no_wandb(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")


def test_best_grid_without_grid_names_the_fix(tmp_path):
    from draftrl.eval.round.compare import run_eval

    with pytest.raises(ValueError, match="--grid"):
        run_eval(EvalConfig(), tmp_path, policies="none,best-grid")


# ----------------------------------------------------------------------------- config files
@pytest.mark.parametrize("name", ["eval_tiny_cpu.yaml", "eval_cpu.yaml"])
def test_shipped_eval_configs_load(name):
    config = load_config(EvalConfig, CONFIGS / name)
    assert 0 in config.grid.depths
    parse_policies(list(config.eval.policies))


@pytest.mark.parametrize("name", ["demo_cpu.yaml", "demo_quick_cpu.yaml"])
def test_shipped_demo_configs_match_the_builtin_defaults(name):
    from draftrl.config import to_dict
    from draftrl.eval.round.demo import DemoConfig

    config = load_config(DemoConfig, CONFIGS / name)
    builtin = DemoConfig.quick() if "quick" in name else DemoConfig()
    assert to_dict(config) == to_dict(builtin)


def test_unknown_config_key_is_refused():
    with pytest.raises(ValueError, match="grid.repeat"):
        load_config(EvalConfig, None, ["grid.repeat=3"])


# ----------------------------------------------------------------------------- grid cells and sweep
def test_grid_cells_always_include_plain_decoding_and_drop_duplicates():
    cells = grid_cells(GridConfig(depths=(2, 4), verify_sizes=(0, 2, 4), widths=(1, 2)))
    names = [c.name for c in cells]
    assert names[0] == REFERENCE
    assert "d2_v2_w1" not in names  # verifying 2 of 2 drafted nodes is "all"
    assert {"d2_v0_w1", "d2_v2_w2", "d4_v2_w1", "d4_v0_w2", "d4_v4_w2"} <= set(names)
    assert len(names) == len(set(names))
    assert Cell(0, 5, 3).name == REFERENCE


def test_sweep_file_runs_the_grid_cell_command(tmp_path):
    config = load_config(EvalConfig, CONFIGS / "eval_tiny_cpu.yaml")
    path = write_sweep(config, tmp_path, "configs/eval_tiny_cpu.yaml")
    sweep = yaml.safe_load(path.read_text())
    assert sweep["method"] == "grid" and sweep["program"] == "draftrl"
    assert set(sweep["parameters"]) == {"depth", "verify_size", "width"}
    assert sweep["parameters"]["depth"]["values"] == list(config.grid.depths)
    assert sweep["command"][:2] == ["${program}", "grid"] and "--cell" in sweep["command"]
    assert sweep["command"][-1] == "${args}"
    assert "wandb.mode=online" in sweep["command"] and "online" in path.read_text().splitlines()[2]
    # the flags wandb passes parse
    from draftrl.cli import build_parser

    args = build_parser().parse_args(["grid", "--out", "x", "--cell", "--depth=4", "--verify_size=2", "--width=1"])
    assert (args.depth, args.verify_size, args.width, args.cell) == (4, 2, 1, True)


def test_sweep_agents_run_online(monkeypatch):
    """wandb agents cannot run offline runs: inside an agent (WANDB_SWEEP_ID) offline becomes online."""
    from draftrl.config.wandb import WandbConfig, wandb_mode

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_SWEEP_ID", raising=False)
    assert wandb_mode(WandbConfig(mode="offline")) == "offline"
    monkeypatch.setenv("WANDB_SWEEP_ID", "abc123")
    assert wandb_mode(WandbConfig(mode="offline")) == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode(WandbConfig(mode="offline")) == "disabled"


# ----------------------------------------------------------------------------- metrics
def _run(policy, prompt, seconds, tokens_per_round, accepted, verified, language="en", task="chat"):
    r = len(tokens_per_round)
    return RequestRun(
        policy=policy, prompt_id=prompt, language=language, task=task, repeat=0,
        token_ids=list(range(int(sum(tokens_per_round)))), num_prompt_tokens=10, prefill_seconds=0.1,
        total_seconds=seconds, round_seconds=np.full(r, (seconds - 0.1) / r), round_tokens=np.array(tokens_per_round),
        round_accepted=np.array(accepted), round_depth=np.array(verified), round_verify_size=np.zeros(r, int),
        round_verified_depth=np.array(verified), round_num_verified=np.array(verified),
    )


def test_acceptance_by_position_is_conditional():
    # rounds: depth 3 accepting 3, 1 and 0 tokens
    run = _run("p", "a", 1.0, [4, 2, 1], [3, 1, 0], [3, 3, 3])
    acc = acceptance_by_position([run])
    # position 1: 3 trials, 2 accepted; position 2: 2 trials, 1 accepted; position 3: 1 trial, 1 accepted
    assert acc["trials"] == [3, 2, 1]
    assert acc["rate"] == pytest.approx([2 / 3, 1 / 2, 1.0])


def test_summaries_speedups_and_medians():
    ar = [_run("ar", "a", 2.0, [1] * 10, [0] * 10, [0] * 10, "en"),
          _run("ar", "b", 2.0, [1] * 10, [0] * 10, [0] * 10, "zh")]
    fast = [_run("x", "a", 1.0, [2] * 5, [1] * 5, [2] * 5, "en"),
            _run("x", "b", 2.0, [1] * 10, [0] * 10, [1] * 10, "zh")]
    slow_repeat = _run("x", "a", 9.0, [2] * 5, [1] * 5, [2] * 5, "en")
    slow_repeat.repeat = 1
    kept = median_runs(ar + fast + [slow_repeat])
    assert sorted(r.seconds for r in kept if r.policy == "x") == [1.0, 2.0]  # lower median of (1, 9)
    ref = summarize_with_groups(ar)
    s = summarize_with_groups([r for r in kept if r.policy == "x"])
    add_speedups(s, ref)
    assert s["tokens_per_second"] == pytest.approx(20 / 3.0)
    assert s["speedup_vs_none"] == pytest.approx((20 / 3.0) / (20 / 4.0))
    assert s["per_language"]["en"]["speedup_vs_none"] == pytest.approx(2.0)
    assert s["per_language"]["zh"]["speedup_vs_none"] == pytest.approx(1.0)
    assert s["tokens_per_round_histogram"] == {"1": 10, "2": 5}
    assert s["mean_tokens_per_round"] == pytest.approx(20 / 15)


# ----------------------------------------------------------------------------- plots and report
def test_report_and_plots_render(tmp_path):
    from draftrl.eval.plots import grid_heatmap
    from draftrl.eval.round.compare import write_outputs

    results, grid = fake_results()
    files = write_outputs(results, tmp_path, grid)
    for key in ("grid_heatmap", "trajectory", "acceptance_hist", "pit_hist"):
        assert_png(tmp_path / files[key])
    report = (tmp_path / "report.md").read_text()
    assert report.startswith("# draftrl evaluation")
    assert "| policy | speedup vs AR |" in report and "## Exactness" in report and "PASSED" in report
    assert "![pit_hist](pit_hist.png)" in report
    for lang in ("en", "zh"):
        assert f"| {lang} |" in report
    assert_png(grid_heatmap(grid, tmp_path / "h.png"))
    json.dumps(results)  # the fake is JSON-able like the real thing


@pytest.fixture
def offline(monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)


def test_the_grid_is_one_wandb_run_with_every_cell_and_the_best(tmp_path, offline):
    from wandb_records import read_runs

    from draftrl.eval.plots import grid_heatmap
    from draftrl.eval.round.grid import log_grid_to_wandb

    _, grid = fake_results()
    for cell in grid["cells"].values():
        cell.update({"tokens_per_second": 10.0 * cell["speedup_vs_none"],
                     "mean_tokens_per_round": 1 + cell["depth"] / 4,
                     "noise": 0.1, "itl_p50": 0.03, "itl_p99": 0.05, "per_task": {"chat": {
                         "tokens_per_second": 9.0, "speedup_vs_none": 1.0, "mean_tokens_per_round": 1.2}}})
    grid["hardware"] = {"cpu": "test"}
    grid_heatmap(grid, tmp_path / "grid_heatmap.png")
    log_grid_to_wandb(EvalConfig(), tmp_path, grid)
    (run,) = read_runs(tmp_path / "wandb")  # one run, not one per cell
    assert run.job_type == "grid" and run.group.startswith(tmp_path.name + "-") and run.exit_code == 0
    columns, rows = run.table("grid/cells")
    for column in ("depth", "verify_size", "width", "drafter", "tokens_per_second", "speedup_vs_none",
                   "acceptance_length"):
        assert column in columns
    assert sorted(row[0] for row in rows) == sorted(grid["cells"])
    assert {row[columns.index("drafter")] for row in rows} == {"none", "ngram"}
    assert run.summary["best/name"] == "d2_v0_w1" and run.summary["best/speedup_vs_none"] == 1.2
    assert run.summary["best/acceptance_length"] == 1.5 and run.summary["num_cells"] == 3
    assert_png(run.image("grid/heatmap"))
    assert len(run.table("grid/per_task")[1]) == 3


def test_the_eval_run_holds_every_policy_against_the_best_fixed_with_intervals(tmp_path, offline):
    """The comparison a user came for, on the eval run: and a policy missing from it is caught."""
    import copy

    from eval_helpers import eval_run_problems, with_intervals
    from wandb_records import read_runs

    from draftrl.eval.round.compare import log_eval_to_wandb, write_outputs

    results, grid = fake_results()
    results = with_intervals(results)
    results["files"] = write_outputs(results, tmp_path, grid)
    assert_png(tmp_path / results["files"]["speedup_vs_best_fixed"])
    log_eval_to_wandb(EvalConfig(), tmp_path, results)
    (run,) = read_runs(tmp_path / "wandb")
    assert run.job_type == "eval" and run.exit_code == 0
    assert eval_run_problems(run, results) == []
    assert run.summary["policy/best-grid/speedup_vs_best_fixed_verdict"] == "reference"
    assert run.summary["policy/ppo/speedup_vs_best_fixed"] == pytest.approx(13.0 / 12.0)
    # negative controls: a policy missing from the summary, an interval that does not hold its ratio
    broken = copy.deepcopy(run)
    broken.summary = {k: v for k, v in run.summary.items() if not k.startswith("policy/ppo/")}
    assert any("policy/ppo/speedup_vs_best_fixed" in p for p in eval_run_problems(broken, results))
    broken.summary = dict(run.summary, **{"policy/heuristic/speedup_vs_hf_low": 5.0})
    assert any("outside its interval" in p for p in eval_run_problems(broken, results))
    # a failed exactness check: the run is logged and marked failed (exit code 3, as the command)
    results["exactness"]["passed"] = False
    log_eval_to_wandb(EvalConfig(), tmp_path / "failed", results)
    (failed,) = read_runs(tmp_path / "failed" / "wandb")
    assert failed.exit_code == 3 and failed.summary["exactness/passed"] is False


# ----------------------------------------------------------------------------- demo
def test_demo_table_prints_every_policy_and_the_verdict(capsys):
    from draftrl.cli.demo import print_summary

    results, _ = fake_results()
    results["policies"]["lookahead"] = results["policies"]["ppo"]
    summary = {"results_dict": results, "steps": {"grid": {"seconds": 60.0}}, "wall_seconds": 300.0, "out": "runs/demo",
               "report": "runs/demo/eval/report.md", "results": "runs/demo/eval/results.json",
               "wandb": {"group": "demo-1a2b3c", "sync": "wandb sync runs/demo/wandb"}}
    print_summary(summary)
    out = capsys.readouterr().out
    for text in ("plain decoding", "HF heuristic", "PPO", "lookahead (upper bound)", "1.30x", "PASSED",
                 "runs/demo/eval/report.md", "monitor overhead", "group demo-1a2b3c", "wandb sync runs/demo/wandb"):
        assert text in out, text


def test_demo_refuses_to_overwrite_without_overwrite(tmp_path, capsys):
    (tmp_path / "grid").mkdir()
    code = main(["demo", "--quick", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "--overwrite" in err
    assert (tmp_path / "grid").is_dir()


def test_terminal_table_prints_ppo_labels_verbatim(capsys):
    """Finding 11: rich read ``[ppo_size]`` as markup and printed both PPO rows as ``ppo``."""
    from draftrl.cli.eval import print_policy_table

    row = {"speedup_vs_none": 1.5, "tokens_per_second": 10.0, "mean_tokens_per_round": 2.0,
           "time_to_first_token_mean": 0.1, "itl_p50": 0.01, "itl_p95": 0.02, "itl_p99": 0.03,
           "peak_memory_bytes": 2**20}
    results = {"policies": {"ar": dict(row, speedup_vs_none=1.0), "ppo[ppo_size]": row, "ppo[ppo_depth]": row}}
    print_policy_table(results, "held-out [2 requests]")
    out = capsys.readouterr().out
    assert "ppo[ppo_size]" in out and "ppo[ppo_depth]" in out and "[2 requests]" in out


def test_progress_lines_keep_a_log_alive(monkeypatch):
    """Long phases printed nothing to a non-TTY log for minutes: a heartbeat line comes at least
    every interval even when no update arrives, and updates in between are throttled."""
    import io
    import time

    from draftrl.cli._output import progress_lines

    stream = io.StringIO()
    with progress_lines("grid", interval=0.2, stream=stream) as update:
        update(1, 4, "d2_v0_w1")
        for _ in range(50):  # updates faster than the interval: not one line each
            update(1, 4, "d2_v0_w1")
        time.sleep(0.7)  # nothing updates: heartbeats
        update(4, 4, "done")
    lines = stream.getvalue().splitlines()
    assert 3 <= len(lines) <= 8, lines
    assert lines[0].startswith("[grid] 1/4 d2_v0_w1") and lines[-1].startswith("[grid] 4/4 done")


def test_a_new_phase_renames_the_progress_line():
    """The demos printed ``[decoding] 0/?`` while fetching the model and training: each step names its line."""
    import io
    import time

    from draftrl.cli._output import progress_lines

    stream = io.StringIO()
    with progress_lines("model", interval=0.2, stream=stream) as update:
        update(1, 1, "smollm2-135m")
        update.phase("train")
        time.sleep(0.5)  # training reports nothing: the heartbeat names the phase
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("[model] 1/1 smollm2-135m")
    assert lines[1:] and all(line.startswith("[train] 0/?") for line in lines[1:]), lines
    assert lines[1].endswith("(0s)")  # a phase's seconds count from its own start


def test_the_demo_names_each_step_on_its_progress_line(tmp_path, capsys, monkeypatch):
    from draftrl.eval.round import demo

    def fake_run_demo(config, out, *, step_started, step_done, progress, **kwargs):
        for i, step in enumerate(demo.STEPS):
            step_started(i, step)
            progress(1, 2, f"{step}-cell")
            step_done(i, step, 0.0, "")
        return {"results_dict": {}}

    monkeypatch.setattr(demo, "run_demo", fake_run_demo)
    monkeypatch.setattr("draftrl.cli.demo.print_summary", lambda summary: None)
    assert main(["demo", "--quick", "--out", str(tmp_path / "d")]) == 0
    err = capsys.readouterr().err
    for step in demo.STEPS:
        assert f"[{step}] 1/2 {step}-cell" in err
    assert "[decoding]" not in err


def test_grid_prints_each_cell_against_the_hf_anchors(tmp_path, capsys, monkeypatch):
    """Issue 12: every printed speed table gives the ratio over stock HF generate and HF prompt lookup too."""
    cell = {"depth": 4, "verify_size": 0, "width": 1, "tokens_per_second": 30.0, "speedup_vs_none": 1.5,
            "speedup_vs_hf": 1.2, "speedup_vs_hf_lookup": 0.9, "mean_tokens_per_round": 2.0, "noise": 0.01}
    result = {"cells": {"d4_v0_w1": cell}, "best": {"name": "d4_v0_w1"},
              "anchors": {"methods": {"hf": {"tokens_per_second": 25.0}, "hf-lookup:4": {"tokens_per_second": 33.3}},
                          "best_lookup": "hf-lookup:4"}}
    monkeypatch.setattr("draftrl.eval.round.grid.run_grid", lambda *a, **k: result)
    assert main(["grid", "--out", str(tmp_path / "g"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "speedup_vs_none=1.500x  vs_hf=1.200x  vs_hf_lookup=0.900x" in out
    assert "hf=25.00 tok/s" in out and "best prompt lookup: hf-lookup:4" in out


def test_the_wandb_exactness_table_says_what_was_checked_in_each_dtype():
    """float32 rows claim token-for-token identity; bf16/fp16 rows report the agreement rate, the
    near-ties and the violations instead (the verdict of draftrl.eval.agreement)."""
    from draftrl.eval.wandb_log import exactness_rows

    bitwise = {"greedy_identity": {"checked": True, "mode": "bitwise", "dtype": "float32", "passed": True,
                                   "requests": 4, "policies": ["heuristic"]}}
    near = {"greedy_identity": {"checked": True, "mode": "near-tie", "dtype": "bfloat16", "passed": True,
                                "requests": 4, "policies": ["heuristic", "ppo"], "identical": 7, "comparisons": 8,
                                "num_near_ties": 1, "num_violations": 0}}
    (row,) = exactness_rows(bitwise)
    assert row[0] == "greedy identity vs none" and row[3].endswith("token for token")
    rows = exactness_rows(near)
    assert [r[1] for r in rows] == ["heuristic", "ppo"]
    assert all(r[0] == "greedy agreement vs none" and "token for token" not in r[3] for r in rows)
    assert "bfloat16: 7/8 identical, 1 near-tie(s), 0 violation(s)" in rows[0][3]
