"""``draftrl demo`` in wandb, as a user sees it after ``wandb sync``: the offline runs read back.

The quick pipeline, shrunk (2 requests per split, 12 tokens, 2 grid cells, 512 PPO steps), runs
with ``WANDB_MODE=offline``; its ``DIR/wandb/`` must hold one group with a run per step (job types
calibrate, collect, train, grid, eval), the grid's table and best cell, every policy's summary
scalars with the interval around the best fixed setting, the bar chart and the per-language and
per-task tables. About 50 s on 2 quiet cores (2 minutes under load): marked slow; the same
logging on smaller pieces runs in tests/eval/round/test_eval_units.py, tests/train/test_train_ppo.py and
tests/config/test_wandb_runs.py.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import subprocess
import sys

import pytest
from eval_helpers import eval_run_problems
from wandb_records import read_runs

from draftrl.config.commands import CalibrationConfig
from draftrl.eval.round.config import GridConfig
from draftrl.eval.round.demo import DemoConfig, run_demo

pytestmark = pytest.mark.slow
pytest.importorskip("wandb")


def tiny_demo() -> DemoConfig:
    """``DemoConfig.quick()`` at the smallest size that still has every step and every reference."""
    cfg = DemoConfig.quick()
    cfg.env = dataclasses.replace(cfg.env, languages=("en",), tasks=("code_edit", "chat"), max_new_tokens=12,
                                  depths=(0, 1, 2))
    cfg.grid = GridConfig(depths=(0, 2), repeats=1)
    cfg.eval = dataclasses.replace(cfg.eval, policies=("none", "best-grid", "heuristic"), anchor_gammas=(2,))
    cfg.calibrate = CalibrationConfig(num_tokens=(1, 3), contexts=(128,), widths=(1,), levels=2, repeats=1)
    cfg.train = dataclasses.replace(cfg.train, recipes=("ppo_size",), total_timesteps=512, eval_episodes=2, overrides=(
        "ppo.n_envs=2", "ppo.n_steps=128", "ppo.batch_size=128", "checkpoint_every=512"))
    return cfg


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipeline") / "demo"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_SILENT", "true")
        mp.delenv("WANDB_DIR", raising=False)
        summary = run_demo(tiny_demo(), out)
    return out, summary, {r.job_type: r for r in read_runs(out / "wandb")}


def test_one_group_holds_every_step_of_the_pipeline(demo):
    out, summary, runs = demo
    assert list(runs) == ["calibrate", "collect", "train", "grid", "eval"]  # one run per step, in order
    group = summary["wandb"]["group"]
    assert group.startswith("demo-") and json.loads((out / "wandb.json").read_text())["group"] == group
    assert {r.group for r in runs.values()} == {group} and {r.project for r in runs.values()} == {"draftrl"}
    assert all(r.exit_code == 0 for r in runs.values())
    assert summary["wandb"]["sync"] == f"wandb sync {out / 'wandb'}"
    dry = subprocess.run([sys.executable, "-m", "wandb", "sync", "--dry-run", str(out / "wandb")],
                         capture_output=True, text=True, timeout=120)
    assert dry.stdout.count(".wandb") + dry.stderr.count(".wandb") == len(runs), dry.stdout + dry.stderr


def test_the_grid_run_holds_every_cell_and_the_best(demo):
    out, _, runs = demo
    grid = json.loads((out / "grid" / "grid.json").read_text())
    run = runs["grid"]
    columns, rows = run.table("grid/cells")
    assert {row[0] for row in rows} == set(grid["cells"]) == {"d0_v0_w1", "d2_v0_w1"}
    for row in rows:
        cell = grid["cells"][row[0]]
        assert row[columns.index("speedup_vs_none")] == pytest.approx(cell["speedup_vs_none"])
        assert row[columns.index("acceptance_length")] == pytest.approx(cell["mean_tokens_per_round"])
    assert run.summary["best/name"] == grid["best"]["name"]
    assert run.summary["best/speedup_vs_none"] == pytest.approx(grid["best"]["speedup_vs_none"])
    run.image("grid/heatmap")


def test_the_eval_run_compares_the_learned_policy_with_the_grids_best(demo):
    out, _, runs = demo
    results = json.loads((out / "eval" / "results.json").read_text())
    run = runs["eval"]
    assert set(results["policies"]) == {"none", "best-grid", "heuristic", "ppo"}
    assert eval_run_problems(run, results) == []
    assert run.summary["best_fixed/name"] == results["best_grid"]["name"]
    # negative control: the learned policy missing from the summary fails the same check
    broken = copy.deepcopy(run)
    broken.summary = {k: v for k, v in run.summary.items() if not k.startswith("policy/ppo/")}
    problems = eval_run_problems(broken, results)
    assert problems and all("policy/ppo/" in p for p in problems)


def test_training_draws_the_best_fixed_setting_beside_its_learning_curve(demo):
    out, _, runs = demo
    train = json.loads((out / "ppo_size" / "train_summary.json").read_text())
    run = runs["train"]
    assert run.name == "train-ppo_size"
    reference = train["reference_best_fixed"]["throughput"]
    rows = [row for row in run.history if "rollout/episode_throughput" in row]
    assert rows and all(row["rollout/best_fixed_throughput"] == pytest.approx(reference) for row in rows)
    run.chart("rollout/learning_curve")
