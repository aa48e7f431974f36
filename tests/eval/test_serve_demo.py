"""``draftrl demo --engine vllm``'s pieces that need no vLLM: the sweep summary and the resume guard
(tests/real_vllm/test_serve_demo_real.py runs the demo in vLLM)."""

from __future__ import annotations

import math

import pytest

from draftrl.eval.metrics import kendall_tau
from draftrl.eval.serve_demo import ServeDemoConfig, run_serve_demo, sweep_summary
from draftrl.io import plain, write_json
from draftrl.config import to_dict


def _results(speedups: dict[str, dict[str, float]]) -> dict:
    """run_serving_eval-shaped results: per rate, per policy, a speedup (tokens/s = 10 x speedup)."""
    rates = {rate: {"policies": {name: {"speedup_vs_none": x, "tokens_per_second": 10 * x,
                                        "time_to_first_token_p50": 0.1, "itl_p50": 0.05, "itl_p95": 0.08}
                                 for name, x in table.items()}}
             for rate, table in speedups.items()}
    names = list(next(iter(speedups.values())))
    return {"policies": names, "rates": rates, "exactness": {"passed": True}, "hardware": {"cpu": "x"}}


def test_sweep_summary_gives_ratios_geomean_and_tau():
    real = _results({"0.5": {"none": 1.0, "fixed:4": 1.6, "ppo:x": 1.4}, "8": {"none": 1.0, "fixed:4": 0.9, "ppo:x": 1.1}})
    sim = _results({"0.5": {"none": 1.0, "fixed:4": 1.5, "ppo:x": 1.3}, "8": {"none": 1.0, "fixed:4": 1.2, "ppo:x": 1.0}})
    out = sweep_summary(real, sim)
    assert out["rates"]["8"]["fixed:4"]["speedup_vs_none"] == 0.9
    assert out["rates"]["8"]["fixed:4"]["sim_speedup_vs_none"] == 1.2
    assert out["geomean_speedup_vs_none"]["ppo:x"] == pytest.approx(math.sqrt(1.4 * 1.1))
    # six (rate, policy) points, paired rate by rate and policy by policy
    assert out["kendall_tau"] == pytest.approx(kendall_tau([1.0, 1.6, 1.4, 1.0, 0.9, 1.1], [1.0, 1.5, 1.3, 1.0, 1.2, 1.0]))
    assert out["kendall_tau"] < 1.0  # the simulator puts fixed:4 above ppo at rate 8, vLLM below


def test_a_run_with_other_settings_is_refused_before_any_work(tmp_path):
    write_json(tmp_path / "serve_demo_config.json", plain(to_dict(ServeDemoConfig.quick())))
    with pytest.raises(ValueError, match="other settings.*--overwrite"):
        run_serve_demo(ServeDemoConfig(), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["serve_demo_config.json"]


def test_a_missing_training_recipe_names_the_setting(tmp_path):
    with pytest.raises(FileNotFoundError, match="train_config=nowhere.yaml"):
        run_serve_demo(ServeDemoConfig(train_config="nowhere.yaml"), tmp_path)
