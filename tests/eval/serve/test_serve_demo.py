"""``draftrl demo --engine vllm``'s pieces that need no vLLM: the sweep summary and the resume guard
(tests/real_vllm/test_serve_demo_real.py runs the demo in vLLM)."""

from __future__ import annotations

import math

import pytest

from draftrl.config import load_config, to_dict
from draftrl.eval.metrics import kendall_tau
from draftrl.eval.serve.demo import ServeDemoConfig, run_demo, sweep_summary
from draftrl.io import plain, write_json


def _results(speedups: dict[str, dict[str, float]]) -> dict:
    """run_eval-shaped results: per rate, per policy, a speedup (tokens/s = 10 x speedup)."""
    rates = {rate: {"policies": {name: {"speedup_vs_none": x, "tokens_per_second": 10 * x,
                                        "time_to_first_token_p50": 0.1, "itl_p50": 0.05, "itl_p95": 0.08}
                                 for name, x in table.items()}}
             for rate, table in speedups.items()}
    names = list(next(iter(speedups.values())))
    return {"policies": names, "rates": rates, "exactness": {"passed": True}, "hardware": {"cpu": "x"}}


def test_sweep_summary_gives_ratios_geomean_and_tau():
    real = _results({"0.5": {"none": 1.0, "fixed:4": 1.6, "ppo:x": 1.4},
                     "8": {"none": 1.0, "fixed:4": 0.9, "ppo:x": 1.1}})
    replay = _results({"0.5": {"none": 1.0, "fixed:4": 1.5, "ppo:x": 1.3},
                       "8": {"none": 1.0, "fixed:4": 1.2, "ppo:x": 1.0}})
    out = sweep_summary(real, replay)
    assert out["rates"]["8"]["fixed:4"]["speedup_vs_none"] == 0.9
    assert out["rates"]["8"]["fixed:4"]["replay_speedup_vs_none"] == 1.2
    assert out["geomean_speedup_vs_none"]["ppo:x"] == pytest.approx(math.sqrt(1.4 * 1.1))
    # six (rate, policy) points, paired rate by rate and policy by policy
    assert out["kendall_tau"] == pytest.approx(kendall_tau([1.0, 1.6, 1.4, 1.0, 0.9, 1.1],
                                                           [1.0, 1.5, 1.3, 1.0, 1.2, 1.0]))
    assert out["kendall_tau"] < 1.0  # the replay puts fixed:4 above ppo at rate 8, vLLM below


def test_sweep_summary_gives_per_class_rows_the_best_fixed_ratio_and_the_ceiling():
    """Per rate and class: each policy's class rate over none's and over the best fixed K's; per rate
    the ratio over the best fixed K and its geometric mean; the hindsight ceiling passed through."""
    real = _results({"2": {"none": 1.0, "fixed:4": 1.5, "ppo:x": 1.2},
                     "8": {"none": 1.0, "fixed:4": 1.0, "ppo:x": 1.1}})
    replay = _results({"2": {"none": 1.0, "fixed:4": 1.4, "ppo:x": 1.3},
                       "8": {"none": 1.0, "fixed:4": 1.1, "ppo:x": 1.2}})
    for results in (real, replay):
        for entry in results["rates"].values():
            for name, p in entry["policies"].items():  # the greedy class gains 2x what the T1 class does
                p["per_sampling"] = {"T0": {"tokens_per_second": 10 * p["speedup_vs_none"] ** 2},
                                     "T1": {"tokens_per_second": 10 * p["speedup_vs_none"] ** 0.5}}
    out = sweep_summary(real, replay, best_fixed="fixed:4", hindsight={"2": 1.8, "8": 1.3})
    assert out["rates"]["8"]["ppo:x"]["speedup_vs_best_fixed"] == pytest.approx(1.1)
    assert out["geomean_speedup_vs_best_fixed"]["ppo:x"] == pytest.approx(math.sqrt(1.2 / 1.5 * 1.1))
    assert out["classes"]["2"]["T0"]["fixed:4"]["speedup_vs_none"] == pytest.approx(2.25)
    assert out["classes"]["2"]["T1"]["ppo:x"]["speedup_vs_best_fixed"] == pytest.approx((1.2 / 1.5) ** 0.5)
    assert out["classes"]["8"]["T0"]["ppo:x"]["replay_speedup_vs_none"] == pytest.approx(1.44)
    assert out["hindsight_vs_none"] == {"2": 1.8, "8": 1.3} and out["best_fixed"] == "fixed:4"
    assert sweep_summary(_results({"2": {"none": 1.0}}), _results({"2": {"none": 1.0}}))["classes"] == {}


def test_the_sweep_runs_the_searched_fixed_ks_and_table_once_each(tmp_path):
    """The sweep's policies: the configured ones, the best fixed K on the mix, each class's best K
    (a K already named runs once), the best DSD table and PPO."""
    from draftrl.eval.serve.demo import _policies

    write_json(tmp_path / "dsd_grid.json", {"best": "dsd:1-1:4,2-16:2", "fixed": {
        "best": "fixed:2", "per_class": {"T0": {"best": "fixed:6"}, "T0.7": {"best": "fixed:2"},
                                         "T1": {"best": "fixed:1"}}}})
    config = ServeDemoConfig(policies=("none", "heuristic", "vllm-ngram:4", "fixed:1"))
    assert _policies(config, tmp_path) == ["none", "heuristic", "vllm-ngram:4", "fixed:1", "fixed:2", "fixed:6",
                                           "dsd:1-1:4,2-16:2", f"ppo:{tmp_path / 'ppo_replay'}"]


def test_a_run_with_other_settings_is_refused_before_any_work(tmp_path):
    write_json(tmp_path / "serve_demo_config.json", plain(to_dict(ServeDemoConfig.quick())))
    with pytest.raises(ValueError, match="other settings.*--overwrite"):
        run_demo(ServeDemoConfig(), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["serve_demo_config.json"]


def test_a_resumed_run_may_take_another_memory_share_but_not_other_engine_settings(tmp_path, monkeypatch):
    """A serve demo stopped for GPU memory resumes with a smaller --gpu-memory-utilization (it changes no
    result); --enforce-eager changes what the calibration measures, so it is another run."""
    import dataclasses

    import draftrl.replay.serve_calibrate as calibrate

    class Resumed(Exception):
        pass

    def reached(*args, **kwargs):
        raise Resumed(kwargs["gpu_memory_utilization"])

    monkeypatch.setattr(calibrate, "calibrate_model", reached)
    quick = ServeDemoConfig.quick()
    with pytest.raises(Resumed):  # the first run: settings written, then its calibrate step starts
        run_demo(quick, tmp_path)
    with pytest.raises(Resumed, match="0.5"):  # resumed with a smaller share: past the guard, the share applied
        run_demo(dataclasses.replace(quick, gpu_memory_utilization=0.5), tmp_path)
    with pytest.raises(ValueError, match="other settings.*--overwrite"):
        run_demo(dataclasses.replace(quick, enforce_eager=True), tmp_path)


def test_a_missing_training_recipe_names_the_setting(tmp_path):
    with pytest.raises(FileNotFoundError, match="train_config=nowhere.yaml"):
        run_demo(ServeDemoConfig(train_config="nowhere.yaml"), tmp_path)


def test_the_sweep_is_logged_against_the_arrival_rate(tmp_path, monkeypatch):
    """The serving sweep's wandb run: speedup over no speculation per policy against the rate (vLLM and
    the replay, one line each), a table per rate, each policy's geometric mean in the summary."""
    pytest.importorskip("wandb")
    from wandb_records import read_runs

    from draftrl.config.wandb import WandbConfig, logged_run
    from draftrl.eval.wandb_log import log_sweep

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    real = _results({"0.5": {"none": 1.0, "fixed:4": 1.6, "ppo:x": 1.4},
                     "8": {"none": 1.0, "fixed:4": 0.9, "ppo:x": 1.1}})
    replay = _results({"0.5": {"none": 1.0, "fixed:4": 1.5, "ppo:x": 1.3},
                       "8": {"none": 1.0, "fixed:4": 1.2, "ppo:x": 1.0}})
    with logged_run(WandbConfig(), tmp_path / "sweep", job_type="sweep") as run:
        log_sweep(run, real, replay)
    (read,) = read_runs(tmp_path / "sweep" / "wandb")  # a command's runs land in its --out
    assert read.job_type == "sweep" and read.exit_code == 0
    for key, results in (("sweep/speedup_vs_none", real), ("sweep/replay_speedup_vs_none", replay)):
        assert read.chart(key)["panel_config"]["panelDefId"] == "wandb/lineseries/v0"
        columns, points = read.table(f"{key}_table")
        lines = {(row[1], row[0]): row[2] for row in points}  # (policy, rate) -> speedup
        assert lines == {(name, float(rate)): p["speedup_vs_none"] for rate, entry in results["rates"].items()
                         for name, p in entry["policies"].items()}
    columns, rows = read.table("sweep/rate_0_5")
    assert {row[0]: (row[1], row[2]) for row in rows} == {"none": (1.0, 1.0), "fixed:4": (1.6, 1.5),
                                                          "ppo:x": (1.4, 1.3)}
    assert read.table("sweep/rate_8")[1]
    assert read.summary["policy/ppo:x/geomean_speedup_vs_none"] == pytest.approx(math.sqrt(1.4 * 1.1))
    assert read.summary["policy/fixed:4/speedup_vs_none/rate_8"] == 0.9


def test_eval_engine_vllm_logs_its_sweep_in_the_given_group(tmp_path, monkeypatch):
    """``draftrl eval --engine vllm --wandb-group G``: the sweep's run (job_type eval) in --out/wandb."""
    pytest.importorskip("wandb")
    from wandb_records import read_runs

    from draftrl.cli import main

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    out = tmp_path / "out"

    def fake_run(out_dir, **kwargs):  # the sweep's results, without vLLM
        (out / "report.md").write_text("report\n")
        return {**_results({"2": {"none": 1.0, "fixed:4": 1.3}}), "config": {"max_new_tokens": 8}}

    monkeypatch.setattr("draftrl.eval.serve.compare.run_eval", fake_run)
    assert main(["eval", "--engine", "vllm", "--policies", "none,fixed:4", "--rates", "2", "--out", str(out),
                 "--quiet", "--wandb-group", "serving-ab"]) == 0
    (run,) = read_runs(out / "wandb")
    assert (run.job_type, run.group, run.exit_code) == ("eval", "serving-ab", 0)
    assert {row[0]: row[1] for row in run.table("sweep/rate_2")[1]} == {"none": 1.0, "fixed:4": 1.3}


def test_a_demo_on_a_temperature_mix_records_trains_and_sweeps_it(tmp_path):
    """``temperature_mix`` reaches the recordings' and the sweep's workload (and ``continuations`` the
    recordings), and the training replay's env; a malformed mix is refused before any step."""
    from draftrl.eval.serve.demo import _serve_config, _train_config

    config = ServeDemoConfig(temperature_mix={0: 0.3, 0.7: 0.4, 1.0: 0.3}, continuations=3)
    for split in ("tune", "heldout"):
        assert [c.label for c in _serve_config(config, split=split).sampling_classes] == ["T0", "T0.7", "T1"]
    train = _train_config(config, tmp_path)
    assert [(c.label, c.weight) for c in train.env.serve.sampling_classes] == [("T0", 0.3), ("T0.7", 0.4),
                                                                              ("T1", 0.3)]
    # the mix is the default; --set temperature_mix=null keeps a greedy demo
    assert _train_config(ServeDemoConfig(), tmp_path).env.serve.mixed
    greedy = load_config(ServeDemoConfig, None, ["temperature_mix=null"])
    assert greedy.temperature_mix is None and not _train_config(greedy, tmp_path).env.serve.mixed
    assert [c.label for c in _serve_config(greedy, split="heldout").sampling_classes] == ["T0"]
    with pytest.raises(ValueError, match="temperature_mix"):
        ServeDemoConfig(temperature_mix={"hot": 1.0})
    with pytest.raises(ValueError, match="continuations=0"):
        ServeDemoConfig(continuations=0)
