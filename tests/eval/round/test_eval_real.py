"""Grid and eval on the real SmolLM2 model, kept short: 2 prompts per split, 16 tokens.

They check the files and their documented keys, the report and plots, greedy identity against
plain decoding and HF generate, and that a PPO policy directory runs through SpecDecode-v2.
"""

from __future__ import annotations

import json

import pytest
import yaml
from eval_helpers import CONFIGS, assert_png

from draftrl.config import load_config
from draftrl.eval.round.config import EvalConfig

OVERRIDES = [
    "env.languages=[en]",  # 2 prompts per split (code_edit, chat)
    "env.max_new_tokens=16",
    "grid.depths=[0,3]",
    "grid.repeats=1",
    "eval.greedy_reference=1",
    "eval.anchor_gammas=[2]",  # anchors: stock HF generate and prompt lookup at gamma 2
    "threads=1",
]


@pytest.fixture(autouse=True)
def _no_wandb(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")


@pytest.fixture(scope="module")
def config() -> EvalConfig:
    return load_config(EvalConfig, CONFIGS / "eval_tiny_cpu.yaml", OVERRIDES)


@pytest.fixture(scope="module")
def grid_dir(smollm2, config, tmp_path_factory):
    from draftrl.eval.round.grid import run_grid

    out = tmp_path_factory.mktemp("grid")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "disabled")
        run_grid(config, out, target=smollm2, config_path="configs/eval_tiny_cpu.yaml")
    return out


@pytest.fixture(scope="module")
def untrained_ppo(smollm2, config, tmp_path_factory):
    """A PPO policy directory (policy.zip + policy.json) for SpecDecode-v2, weights untrained."""
    from stable_baselines3 import PPO

    from draftrl.envs.spec_decode import SpecDecodeEnv
    from draftrl.eval.round.config import env_for_split
    from draftrl.policies.ppo import write_manifest

    out = tmp_path_factory.mktemp("ppo")
    env = SpecDecodeEnv(env_for_split(config.env, "heldout"), target=smollm2)
    model = PPO("MlpPolicy", env, n_steps=8, batch_size=8, seed=0, device="cpu")
    model.save(out / "policy.zip")
    base = env.unwrapped
    write_manifest(out, kind="size", env_id="draftrl/SpecDecode-v2", depths=base.depths,
                   verify_sizes=base.verify_sizes, feature_names=base.feature_names)
    return out


def test_grid_writes_the_documented_files(grid_dir, config, smollm2):
    grid = json.loads((grid_dir / "grid.json").read_text())
    assert grid["split"] == "tune" and grid["reference"] == "d0_v0_w1"
    assert set(grid["cells"]) == {"d0_v0_w1", "d3_v0_w1"}
    for cell in grid["cells"].values():
        for key in ("depth", "verify_size", "width", "tokens_per_second", "speedup_vs_none", "mean_tokens_per_round",
                    "per_language", "per_task", "noise"):
            assert key in cell
        assert cell["tokens_per_second"] > 0
        assert set(cell["per_language"]) == {"en"} and set(cell["per_task"]) == {"code_edit", "chat"}
    assert grid["cells"]["d0_v0_w1"]["speedup_vs_none"] == pytest.approx(1.0)
    assert grid["cells"]["d0_v0_w1"]["mean_tokens_per_round"] == pytest.approx(1.0)
    assert grid["best"]["name"] in grid["cells"]
    assert grid["kernels"]["layout"] == smollm2.kernels.layout  # the kernels the cells ran with
    anchors = grid["anchors"]
    assert set(anchors["methods"]) == {"hf", "hf-lookup:2"} and anchors["best_lookup"] == "hf-lookup:2"
    assert all(a["tokens_per_second"] > 0 and a["num_requests"] == 2 for a in anchors["methods"].values())
    for cell in grid["cells"].values():
        hf = anchors["methods"]["hf"]["tokens_per_second"]
        assert cell["speedup_vs_hf"] == pytest.approx(cell["tokens_per_second"] / hf)
        assert cell["speedup_vs_hf_lookup"] > 0
    assert grid["exactness"]["passed"] and grid["exactness"]["greedy_identity"]["checked"]
    assert_png(grid_dir / "grid_heatmap.png")
    sweep = yaml.safe_load((grid_dir / "sweep.yaml").read_text())
    assert sweep["method"] == "grid" and sweep["parameters"]["depth"]["values"] == [0, 3]


def test_eval_writes_results_report_and_plots(smollm2, config, grid_dir, untrained_ppo, tmp_path):
    from draftrl.eval.round.compare import run_eval

    policies = f"none,best-grid,heuristic,threshold,bandit,ppo:{untrained_ppo},lookahead"
    results = run_eval(config, tmp_path, policies=policies, grid_path=grid_dir / "grid.json", target=smollm2)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["policies"].keys() == results["policies"].keys()
    assert list(saved["policies"]) == ["none", "best-grid", "heuristic", "threshold", "bandit", "ppo", "lookahead"]
    for name, p in saved["policies"].items():
        for key in ("tokens_per_second", "speedup_vs_none", "time_to_first_token_mean", "itl_p50", "itl_p95", "itl_p99",
                    "peak_memory_bytes", "tokens_per_round_histogram", "acceptance_by_position", "per_language",
                    "per_task", "mean_tokens_per_round"):
            assert key in p, (name, key)
        assert p["tokens_per_second"] > 0
        assert set(p["per_language"]) == {"en"} and set(p["per_task"]) == {"code_edit", "chat"}
        assert p["num_tokens"] == saved["policies"]["none"]["num_tokens"]  # greedy: the same output
    assert saved["policies"]["none"]["speedup_vs_none"] == pytest.approx(1.0)
    assert (saved["kernels"]["layout"] == smollm2.kernels.layout
            and saved["kernels"]["source"] in ("probe", "cache", "busy"))
    # anchors: only the grid's best prompt-lookup gamma is timed again, on the same requests
    assert set(saved["anchors"]["methods"]) == {"hf", "hf-lookup:2"}
    assert all(a["identical_to_none"] == "2/2" for a in saved["anchors"]["methods"].values())  # greedy
    for name, p in saved["policies"].items():
        assert p["speedup_vs_hf"] > 0 and p["speedup_vs_hf_lookup"] > 0
        for ref in ("none", "hf", "hf_lookup", "best_fixed"):
            ci = p[f"ci_vs_{ref}"]
            # a reference against itself: no interval
            if (name, ref) in (("none", "none"), ("best-grid", "best_fixed")):
                assert ci == {"ratio": 1.0, "reference": True}
                continue
            assert ci["num_requests"] == 2 and ci["low"] <= ci["ratio"] <= ci["high"], (name, ref)
    assert saved["policies"]["none"]["tokens_per_round_histogram"] == {"1": saved["policies"]["none"]["num_rounds"]}
    # the lookahead never drafts a token that is rejected
    assert all(r in (None, 1.0) for r in saved["policies"]["lookahead"]["acceptance_by_position"]["rate"])
    ex = saved["exactness"]
    assert ex["passed"] is True
    assert ex["greedy_identity"]["checked"] and ex["greedy_identity"]["passed"]
    assert ex["hf_reference"]["checked"] == 1 and ex["hf_reference"]["passed"]
    assert 0 <= ex["monitor_overhead"]["fraction"] < 0.03
    assert set(ex["monitor"]) == set(saved["policies"])
    assert saved["best_grid"]["name"] in json.loads((grid_dir / "grid.json").read_text())["cells"]
    report = (tmp_path / "report.md").read_text()
    assert "| ppo |" in report and "| lookahead |" in report and "Verdict: PASSED" in report
    assert "vs HF generate" in report and "`hf-lookup:2` (best)" in report and "not resolved" in report
    for png in ("grid_heatmap.png", "trajectory.png", "acceptance_hist.png", "pit_hist.png",
                "speedup_vs_best_fixed.png"):
        assert_png(tmp_path / png)
    assert set(saved["trajectories"]["policies"]) == {"heuristic", "threshold", "bandit", "ppo", "lookahead"}


def test_eval_cli_fails_loudly_on_an_exactness_violation(monkeypatch, tmp_path, capsys):
    """The CLI path of a violation: exit 3, the evidence on stderr (the real detection is tested
    in test_eval_monitor_real.py)."""
    from draftrl.cli import main
    from draftrl.decoding.monitor import ExactnessViolation

    failure = {"statistic": "agreement", "what": "log_e_value", "value": 9.1, "p_value": 1e-4, "threshold": 2.5e-4,
               "rule": "time-uniform e-process", "num_tokens": 201, "num_informative": 200,
               "hint": "drafted tokens are emitted more often than the exact rule allows"}

    def fake_run_eval(*args, **kwargs):
        raise ExactnessViolation([failure], 201)

    monkeypatch.setattr("draftrl.eval.round.compare.run_eval", fake_run_eval)
    code = main(["eval", "--policies", "none,heuristic", "--out", str(tmp_path), "--quiet"])
    err = capsys.readouterr().err
    assert code == 3
    assert "EXACTNESS VIOLATION" in err and "agreement" in err and "201" in err


@pytest.mark.slow  # ~1 minute a case on SmolLM2; the keyed identity's fast tests: tests/decoding/test_keyed_sampling.py
@pytest.mark.parametrize("sampler, identical", [("correct", True), ("off-by-one", False)])
def test_keyed_sampled_cells_equal_plain_decoding_token_for_token(smollm2, config, sampler, identical, monkeypatch):
    """At T = 0.7 with ``env.keyed``, every grid cell's output equals plain decoding's on every request (float32),
    so a sampled grid is checked like a greedy one; the off-by-one rule (control) breaks the identity."""
    import dataclasses

    import draftrl.decoding.build as build
    from draftrl.eval.exactness import GreedyMismatch
    from draftrl.eval.round.grid import Cell, measure_cells

    real = build.build_engine
    monkeypatch.setattr(build, "build_engine", lambda *a, **k: real(*a, **{**k, "sampler": sampler}))
    env = dataclasses.replace(config.env, temperature=0.7, keyed=True, max_new_tokens=24)
    keyed = dataclasses.replace(config, env=env, eval=dataclasses.replace(config.eval, monitor=False))
    cells = [Cell(depth, 0, 1) for depth in (0, 2, 4)]
    try:
        _, exactness = measure_cells(keyed, cells, target=smollm2)
    except GreedyMismatch:
        assert not identical
        return
    identity = exactness["greedy_identity"]
    assert identity["passed"] is identical and "keyed stream" in identity["reference"] and identity["requests"] == 2


@pytest.mark.slow  # a SmolLM2 eval at T = 0.7
def test_lookahead_bound_at_temperature_with_keyed_sampling(smollm2, config, tmp_path):
    """With ``env.keyed`` the lookahead bound is well defined at T = 0.7: plain decoding's keyed continuation is
    every policy's output, so the lookahead drafts only what the target accepts (acceptance 1 at every position
    it drafts) and its output equals plain decoding's; without keyed sampling it is refused in one line."""
    import dataclasses

    from draftrl.eval.round.compare import run_eval

    env = dataclasses.replace(config.env, temperature=0.7, keyed=True, max_new_tokens=24)
    keyed = dataclasses.replace(config, env=env, eval=dataclasses.replace(config.eval, anchors=False, monitor=False))
    results = run_eval(keyed, tmp_path / "eval", policies="none,lookahead", target=smollm2)
    identity = results["exactness"]["greedy_identity"]
    assert identity["passed"] and "keyed stream" in identity["reference"]
    ahead = results["policies"]["lookahead"]["acceptance_by_position"]
    assert ahead["trials"][0] > 0 and all(rate == 1.0 for rate, n in zip(ahead["rate"], ahead["trials"]) if n)
    plain = dataclasses.replace(keyed, env=dataclasses.replace(env, keyed=False))
    with pytest.raises(ValueError, match="lookahead needs temperature 0 or keyed sampling"):
        run_eval(plain, tmp_path / "eval2", policies="none,lookahead", target=smollm2)
