"""Training recipes: PPO beats grid search on the analytic regime workload; resume; configs; CLI.

Every test here runs with ``WANDB_MODE=disabled`` (``.ci/run`` sets it too) except the ones that
read the offline run back.
"""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3.common.callbacks import BaseCallback
from wandb_records import read_run

import draftrl.envs  # noqa: F401  registers the env ids (gymnasium.register_envs idiom)
from draftrl.cli import main
from draftrl.config import load_config, to_dict
from draftrl.envs.ids import make_kwargs
from draftrl.policies import ConfidenceThreshold, PPOPolicy, evaluate_policy, paired_difference
from draftrl.train import ppo_size
from draftrl.train.config import TrainConfig
from draftrl.train.envs import make_env

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
ANALYTIC = CONFIGS / "analytic_regimes.yaml"


@pytest.fixture(autouse=True)
def _no_wandb(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")


def tiny(*overrides: str) -> TrainConfig:
    """The analytic config shrunk to seconds: 1,024 steps in rollouts of 256, few eval episodes."""
    return load_config(
        TrainConfig,
        ANALYTIC,
        [
            "total_timesteps=1024",
            "ppo.n_steps=64",
            "ppo.batch_size=64",
            "checkpoint_every=256",
            "eval_episodes=3",
            "baselines=[heuristic]",
            "progress_bar=false",
            *overrides,
        ],
    )


# ----------------------------------------------------------------------------- the headline
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """PPO trained on the regime-switching analytic workload (alphas 0.9 / 0.2, draft_cost 0.1)."""
    cfg = load_config(
        TrainConfig, ANALYTIC, ["total_timesteps=12288", "eval_episodes=60", "progress_bar=false", "seed=0"]
    )
    out = tmp_path_factory.mktemp("analytic")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "disabled")
        return out, ppo_size.train(cfg, out)


def test_ppo_beats_every_fixed_depth_beyond_noise(trained):
    out, summary = trained
    evaluation = summary["evaluation"]
    results = evaluation["results"]
    ppo = results["ppo"]
    fixed = {name: res for name, res in results.items() if name.startswith("fixed")}
    assert len(fixed) == 13  # every depth 0..12 on the same 60 episodes
    for name, res in fixed.items():
        diff = paired_difference(ppo["episode_throughputs"], res["episode_throughputs"])
        assert diff["mean"] > 3 * diff["se"], (name, diff)
    best = fixed[evaluation["best_fixed"]]
    assert ppo["throughput"] > 1.1 * best["throughput"]
    # the lookahead is the upper bound, and PPO captures most of its gain over grid search
    lookahead = results["lookahead"]
    diff = paired_difference(lookahead["episode_throughputs"], ppo["episode_throughputs"])
    assert diff["mean"] > -2 * diff["se"]
    assert evaluation["lookahead_gain_captured"] > 0.5
    # it adapts: at least two depths, far apart, each chosen in more than 10% of the rounds
    common = [d for d, n in ppo["depth_histogram"].items() if n > 0.1 * ppo["num_rounds"]]
    assert len(common) >= 2 and max(common) - min(common) >= 4, ppo["depth_histogram"]


def test_train_writes_policy_summary_and_checkpoints(trained):
    out, summary = trained
    for name in ("policy.zip", "vecnormalize.pkl", "policy.json", "train_summary.json", "config.json",
                 "run_state.json"):
        assert (out / name).is_file(), name
    on_disk = json.loads((out / "train_summary.json").read_text())
    assert on_disk["run_id"] == summary["run_id"]
    assert on_disk["config"]["total_timesteps"] == 12288 and on_disk["seeds"]["train"] == 0
    assert set(on_disk["versions"]) >= {"draftrl", "torch", "stable_baselines3", "gymnasium"}
    assert on_disk["wall_seconds"]["training"] > 0
    assert on_disk["num_timesteps"] == 12288
    assert on_disk["evaluation"]["best_fixed"].startswith("fixed(")
    steps = sorted(int(p.name.split("_")[1]) for p in (out / "checkpoints").glob("ppo_*_steps.zip"))
    assert steps[-1] == 12288 and len(steps) >= 2
    assert (out / "checkpoints" / "ppo_vecnormalize_12288_steps.pkl").is_file()
    assert list((out / "logs").glob("progress_*.csv"))
    with (out / "vecnormalize.pkl").open("rb") as f:  # the scale floor that travels with the policy
        assert pickle.load(f).epsilon == on_disk["config"]["ppo"]["obs_epsilon"] == 1e-2


def test_ppo_policy_reads_features_by_name(trained):
    """The saved policy acts the same on an env whose features come in another order."""
    out, _ = trained
    env = gym.make("draftrl/Analytic-v0", regimes=(0.9, 0.2), draft_cost=0.1, signal_noise=0.15, regime_switch=0.1)
    policy = PPOPolicy.load(out, env)
    order = np.array([5, 3, 0, 1, 4, 2])
    names = tuple(env.unwrapped.feature_names[i] for i in order)
    shuffled = PPOPolicy.load(out)
    shuffled = PPOPolicy(shuffled.model, shuffled.manifest, names, shuffled.obs_normalizer)
    rng = np.random.default_rng(0)
    for _ in range(50):
        obs = env.observation_space.sample().astype(np.float32)
        obs[0] = rng.integers(0, 14)
        assert policy.act(obs) == shuffled.act(obs[order])
    with pytest.raises(ValueError, match="draft_confidence"):
        PPOPolicy(shuffled.model, shuffled.manifest, names[1:])


def test_ppo_policy_refuses_another_grid(trained):
    out, _ = trained
    with pytest.raises(ValueError, match="trained for depths"):
        PPOPolicy.load(out, gym.make("draftrl/Analytic-v0", depths=(0, 2, 4)))
    with pytest.raises(FileNotFoundError, match="policy.zip"):
        PPOPolicy.load(out / "nowhere")
    with pytest.raises(ValueError, match="'size' policy"):
        PPOPolicy.load(out).act_step(np.zeros(6, dtype=np.float32))


# ----------------------------------------------------------------------------- resume
class StopAt(BaseCallback):
    """Stops the session once ``num_timesteps`` reaches ``steps`` (a simulated interruption)."""

    def __init__(self, steps: int):
        super().__init__()
        self.steps = steps

    def _on_step(self) -> bool:
        return self.num_timesteps < self.steps


def test_resume_continues_the_same_run(tmp_path):
    cfg = tiny()
    assert ppo_size.train(cfg, tmp_path, callbacks=[StopAt(600)]) is None  # interrupted mid-rollout
    state = json.loads((tmp_path / "run_state.json").read_text())
    assert state["num_timesteps"] == 512 and not state["completed"]  # last checkpoint: a rollout boundary
    assert not (tmp_path / "policy.zip").exists()
    with pytest.raises(ValueError, match="--resume"):
        ppo_size.train(cfg, tmp_path)  # a fresh run refuses a directory holding one
    summary = ppo_size.train(cfg, tmp_path, resume=True)
    assert summary["num_timesteps"] == 1024  # exactly the configured total, nothing lost or repeated
    assert summary["run_id"] == state["run_id"] and summary["sessions"] == 2
    assert sorted(p.name for p in (tmp_path / "logs").glob("*.csv")) == ["progress_0.csv", "progress_512.csv"]
    fresh = ppo_size.train(cfg, tmp_path / "fresh")
    assert fresh["num_timesteps"] == summary["num_timesteps"]


class CtrlCAt(BaseCallback):
    """Raises KeyboardInterrupt (what SIGINT does) once ``num_timesteps`` reaches ``steps``."""

    def __init__(self, steps: int):
        super().__init__()
        self.steps = steps

    def _on_step(self) -> bool:
        if self.num_timesteps >= self.steps:
            raise KeyboardInterrupt
        return True


def test_ctrl_c_saves_a_checkpoint_and_the_cli_prints_the_resume_command(tmp_path, monkeypatch, capsys):
    """Ctrl-C mid-rollout keeps what was learnt (the checkpoint at the rollout's start: the weights
    have seen nothing after it) and says how to continue; --resume then trains exactly the total."""
    from draftrl.train import loop

    cfg = tiny()
    with pytest.raises(loop.TrainingInterrupted, match="checkpoint saved at 512 steps"):
        ppo_size.train(cfg, tmp_path / "lib", callbacks=[CtrlCAt(700)])
    assert json.loads((tmp_path / "lib" / "run_state.json").read_text())["num_timesteps"] == 512
    assert ppo_size.train(cfg, tmp_path / "lib", resume=True)["num_timesteps"] == 1024

    real_learn = loop.PPO.learn

    def interrupted_learn(self, *args, **kwargs):
        kwargs["callback"] = [*kwargs["callback"], CtrlCAt(100)]
        return real_learn(self, *args, **kwargs)

    monkeypatch.setattr(loop.PPO, "learn", interrupted_learn)
    out = tmp_path / "cli"
    argv = ["train", "--config", str(ANALYTIC), "--out", str(out), "--set", "total_timesteps=256",
            "--set", "ppo.n_steps=64", "--set", "eval_episodes=2", "--set", "progress_bar=false"]
    assert main(argv) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert "interrupted; checkpoint saved at" in err[-1] and "Traceback" not in "\n".join(err)
    assert err[-1].endswith(f"draftrl train --config {ANALYTIC} --out {out} --set total_timesteps=256 "
                           "--set ppo.n_steps=64 --set eval_episodes=2 --set progress_bar=false --resume")
    assert list((out / "checkpoints").glob("ppo_*_steps.zip"))


def test_resume_refuses_a_changed_config(tmp_path):
    ppo_size.train(tiny(), tmp_path, callbacks=[StopAt(300)])
    with pytest.raises(ValueError, match="ppo.learning_rate"):
        ppo_size.train(tiny("ppo.learning_rate=0.01"), tmp_path, resume=True)
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        ppo_size.train(tiny(), tmp_path / "empty", resume=True)


def test_resume_can_extend_a_finished_run(tmp_path):
    ppo_size.train(tiny(), tmp_path)
    summary = ppo_size.train(tiny("total_timesteps=1536"), tmp_path, resume=True)
    assert summary["num_timesteps"] == 1536 and summary["sessions"] == 2


# ----------------------------------------------------------------------------- configs and CLI
def test_mistyped_config_key_fails_with_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("ppo:\n  learnig_rate: 0.001\n")
    with pytest.raises(ValueError, match=r"unknown config key 'ppo.learnig_rate'; did you mean 'ppo.learning_rate'"):
        load_config(TrainConfig, bad)
    assert main(["train", "--config", str(bad), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "ppo.learnig_rate" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "override, message",
    [
        ("total_timesteps=many", "total_timesteps"),
        ("recipe=sac", "recipe='sac'"),
        ("ppo.batch_size=100", "does not divide"),
        ("baselines=[lookahead, magic]", "magic"),
        ("wandb.mode=cloud", "wandb.mode"),
        ("keep=first", "keep='first'"),
        ("select_episodes=0", "select_episodes"),
    ],
)
def test_config_values_are_validated(override, message):
    with pytest.raises(ValueError, match=message):
        load_config(TrainConfig, ANALYTIC, [override])


def test_keep_best_is_refused_where_two_policies_alternate():
    with pytest.raises(ValueError, match="recipe cotrain"):
        load_config(TrainConfig, ANALYTIC, ["keep=best", "recipe=cotrain"])


@pytest.mark.parametrize("override, message", [
    ("env.kwargs.target=x", "env.kwargs.target is now env.target"),
    ("env.eval_kwargs.split=heldout", "env.eval_kwargs.split is now env.eval.split"),
    ("depth_env.kwargs={traces: t, verify_size: 2}", "depth_env.kwargs.traces is now depth_env.traces"),
    ("env.kwargs.regimes=[0.5]", "env.kwargs.regimes is now env.analytic.regimes"),
])
def test_the_old_env_shape_names_the_new_key(override, message, tmp_path, capsys):
    """``{id, kwargs, eval_kwargs}`` is gone: each old key fails with one line naming its new place."""
    with pytest.raises(ValueError, match=message):
        load_config(TrainConfig, ANALYTIC, [override])
    old = tmp_path / "old.yaml"
    old.write_text("env:\n  id: draftrl/TraceReplay-v1\n  kwargs:\n    traces: runs/traces\n")
    assert main(["train", "--config", str(old), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "env.kwargs.traces is now env.traces" in err


@pytest.mark.parametrize("section", ["env", "depth_env", "finetune_env"])
def test_env_section_errors_name_their_section(section):
    """Each of the three env sections (one TrainEnvConfig class) names itself in every error, not ``env.``."""

    def fails(message: str) -> pytest.RaisesContext:  # the section's name, not a longer one ending in it
        return pytest.raises(ValueError, match=rf"(?<![\w.]){re.escape(message)}")

    for override, message in [
        (f"{section}.kwargs.target=x", f"{section}.kwargs.target is now {section}.target"),
        (f"{section}={{id: draftrl/Analytic-v0, depths: [0, 1]}}",
         f"{section}.depths is not an argument of draftrl/Analytic-v0; set {section}.analytic.depths "
         f"(its arguments are {section}.analytic.*)"),
        (f"{section}.id=draftrl/Foo-v0", f"{section}.id='draftrl/Foo-v0' is not a draftrl env id"),
        (f"{section}.id=draftrl/TraceChoice-v0",
         f"{section}.id='draftrl/TraceChoice-v0' is not made from a training env section"),
        (f"{section}.eval={{dephts: [0]}}", f"'{section}.eval.dephts'; did you mean '{section}.eval.depths'"),
        (f"{section}.kernels=fastest", f"{section}.kernels='fastest' is not a kernel choice"),
        (f"{section}.eval={{kernels: fastest}}", f"{section}.eval.kernels='fastest' is not a kernel choice"),
        (f"{section}.depths=[0,-1]", f"{section}.depths=[0, -1] must hold integers >= 0"),
        (f"{section}.eval={{depths: [0, -1]}}", f"{section}.eval.depths=[0, -1] must hold integers >= 0"),
        (f"{section}.eval={{history: 0}}", f"{section}.eval.history=0 must be >= 1 round"),
    ]:
        with fails(message):
            load_config(TrainConfig, None, [override])
    def made(override: str) -> dict:
        return make_kwargs(to_dict(getattr(load_config(TrainConfig, None, [override]), section)), section)

    with fails(f"{section}.traces is not set; draftrl/TraceReplay-v1 needs traces: a directory written by "
               "draftrl collect"):
        made(f"{section}.id=draftrl/TraceReplay-v1")
    with fails(f"{section}.serve.recordings and {section}.serve.calibration are not set; draftrl/ServeReplay-v1 "
               "needs serve.recordings"):
        made(f"{section}.id=draftrl/ServeReplay-v1")
    with fails(f"{section}.id='draftrl/Foo-v0' is not a draftrl env id"):  # a saved run's section, read back
        make_kwargs({"id": "draftrl/Foo-v0"}, section)


def test_train_env_section_is_typed_like_every_commands():
    """The EnvConfig keys are env's own (--target, --set env.target and YAML agree); the id's own
    arguments are typed sections; env.eval keys are checked when the config loads."""
    from draftrl.cli import build_parser
    from draftrl.cli.train import config

    cfg = config(build_parser().parse_args(["train", "--out", "o", "--target", "m", "--set", "env.depths=[0,2]"]))
    assert (cfg.env.target, cfg.env.depths, cfg.env.env_config().target) == ("m", (0, 2), "m")
    with pytest.raises(ValueError, match="unknown config key 'env.eval.dephts'; did you mean 'env.eval.depths'"):
        load_config(TrainConfig, None, ["env.eval={dephts: [0]}"])
    with pytest.raises(ValueError,
                       match="env.depths is not an argument of draftrl/Analytic-v0; set env.analytic.depths"):
        load_config(TrainConfig, ANALYTIC, ["env.depths=[0,1]"])
    with pytest.raises(ValueError, match="env.analytic.alpha"):
        load_config(TrainConfig, ANALYTIC, ["env.analytic.alpha=high"])
    spec = load_config(TrainConfig, CONFIGS / "cpu_default.yaml").env
    assert make_kwargs(to_dict(spec)) == {"traces": "runs/traces/cpu_tune", "config": spec.env_config()}
    held_out = spec.evaluation()
    assert (held_out.traces, held_out.cost_noise, held_out.cost_jitter, held_out.eval) == (
        "runs/traces/cpu_heldout", 0.0, 0.0, {})


TRAIN_CONFIGS = ("analytic_regimes.yaml", "cpu_default.yaml", "qwen3_8b_0.6b.yaml", "llama31_8b_32_1b.yaml")


@pytest.mark.parametrize("name", TRAIN_CONFIGS)
def test_shipped_configs_load(name):
    """Every shipped config loads, and its env arguments are real EnvConfig fields (checked without models)."""
    from draftrl.config import resolve
    from draftrl.config.env import EnvConfig

    cfg = load_config(TrainConfig, CONFIGS / name)
    assert cfg.env.id.startswith("draftrl/")
    if cfg.env.id == "draftrl/Analytic-v0":
        return
    for spec in (cfg.env, cfg.depth_env, cfg.finetune_env):
        for section in (spec, spec.evaluation()):
            resolve(EnvConfig, section.env_config(), {})


@pytest.mark.parametrize("name, target, drafter", [
    ("qwen3_8b_0.6b.yaml", "Qwen/Qwen3-8B", "Qwen/Qwen3-0.6B"),
    ("llama31_8b_32_1b.yaml", "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.2-1B-Instruct"),
])
def test_gpu_configs_name_same_tokenizer_pairs_on_cuda(name, target, drafter):
    cfg = load_config(TrainConfig, CONFIGS / name)
    for spec in (cfg.env, cfg.depth_env):
        assert (spec.target, spec.drafter, spec.device, spec.dtype) == (target, drafter, "cuda", "bfloat16")
    assert cfg.ppo.device == "cpu"  # the policy MLP stays on the CPU while the models use the GPU
    assert cfg.env.eval == {"split": "heldout"}


def test_trace_replay_without_traces_says_how_to_record_them(tmp_path):
    cfg = load_config(TrainConfig, None, ["progress_bar=false"])
    assert cfg.env.id == "draftrl/TraceReplay-v1"  # the default
    with pytest.raises(ValueError, match="draftrl collect"):
        ppo_size.train(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()  # nothing written: the same command works once traces exist


def test_cli_smoke_end_to_end(tmp_path, capsys):
    """CleanRL-style: the real command on the analytic config for a few hundred steps."""
    out = tmp_path / "run"
    argv = ["train", "--config", str(ANALYTIC), "--out", str(out), "--set", "total_timesteps=256",
            "--set", "ppo.n_steps=64", "--set", "eval_episodes=2", "--set", "progress_bar=false"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "<- best fixed" in printed and "ppo" in printed
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["num_timesteps"] == 256
    assert {"ppo", "heuristic", "threshold(t=0.35)", "bandit", "lookahead"} <= set(summary["evaluation"]["table"])
    assert main(argv) == 2  # the directory now holds a run
    assert "--resume" in capsys.readouterr().err


def test_wandb_offline_run_directory_is_written(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    summary = ppo_size.train(tiny("total_timesteps=512"), tmp_path / "run")
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and runs[0].name.endswith(summary["run_id"])
    run = read_run(runs[0])
    assert (run.job_type, run.name, run.exit_code) == ("train", "train-run", 0)
    # the learning curve beside the best fixed setting measured on the same env
    reference = summary["reference_best_fixed"]
    assert (reference["name"] in summary["evaluation"]["table"]
            and reference["throughput"] == max(reference["scores"].values()))
    rows = [row for row in run.history if "rollout/episode_throughput" in row]
    assert rows and all(row["rollout/best_fixed_throughput"] == pytest.approx(reference["throughput"]) for row in rows)
    assert all(row["rollout/throughput_vs_best_fixed"] == pytest.approx(
        row["rollout/episode_throughput"] / reference["throughput"]) for row in rows)
    chart = run.chart("rollout/learning_curve")
    assert chart["panel_config"]["panelDefId"] == "wandb/lineseries/v0"
    columns, points = run.table("rollout/learning_curve_table")
    assert {p[columns.index("lineKey")] for p in points} == {"PPO (episode throughput)",
                                                         f"best fixed {reference['name']} (same env)"}
    assert run.summary["reference/best_fixed_throughput"] == pytest.approx(reference["throughput"])


def test_a_failed_training_run_is_marked_failed(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")

    class Broken(BaseCallback):
        def _on_step(self) -> bool:
            raise RuntimeError("the env broke")

    with pytest.raises(RuntimeError, match="the env broke"):
        ppo_size.train(tiny("total_timesteps=256"), tmp_path / "run", callbacks=[Broken()])
    (folder,) = (tmp_path / "wandb").glob("offline-run-*")
    assert read_run(folder).exit_code == 1


def test_baselines_and_ppo_share_episodes(trained):
    out, summary = trained
    env = gym.make("draftrl/Analytic-v0", regimes=(0.9, 0.2), draft_cost=0.1, signal_noise=0.15, regime_switch=0.1)
    again = evaluate_policy(ConfidenceThreshold.for_env(env), env, 60, summary["evaluation"]["seed"])
    assert again == summary["evaluation"]["results"]["threshold(t=0.35)"]


def test_finetune_phase_continues_the_same_policy(tmp_path):
    """finetune_real_timesteps: more steps on a second env (here another analytic workload)."""
    cfg = tiny("total_timesteps=512", "finetune_real_timesteps=512", "finetune_env.id=draftrl/Analytic-v0",
               "finetune_env.analytic={regimes: [0.8, 0.3], draft_cost: 0.1}")
    summary = ppo_size.train(cfg, tmp_path)
    assert summary["num_timesteps"] == 1024
    steps = sorted(int(p.name.split("_")[1]) for p in (tmp_path / "checkpoints").glob("ppo_*_steps.zip"))
    assert 512 in steps and steps[-1] == 1024
    assert summary["evaluation"]["env"]["analytic"]["regimes"] == [0.9, 0.2]  # evaluated on the main workload


def test_finetune_env_must_share_grids(tmp_path):
    cfg = tiny("total_timesteps=256", "finetune_real_timesteps=256", "finetune_env.id=draftrl/Analytic-v0",
               "finetune_env.analytic={depths: [0, 2, 4]}")
    with pytest.raises(ValueError, match="phase 'finetune'"):
        ppo_size.train(cfg, tmp_path)


def test_env_sections_keep_their_own_default_ids():
    """A section given in YAML without an id keeps that section's default env, not env's."""
    cfg = load_config(TrainConfig, CONFIGS / "cpu_default.yaml")
    assert (cfg.env.id, cfg.depth_env.id, cfg.finetune_env.id) == (
        "draftrl/TraceReplay-v1", "draftrl/TraceReplayDepth-v1", "draftrl/SpecDecode-v2")


def test_recipe_refuses_an_env_of_the_other_kind(tmp_path):
    with pytest.raises(ValueError, match="round-level env"):
        ppo_size.train(tiny("env.id=tests/AnalyticDepth-v0"), tmp_path)


def test_obs_epsilon_must_be_positive():
    with pytest.raises(ValueError, match="ppo.obs_epsilon"):
        load_config(TrainConfig, ANALYTIC, ["ppo.obs_epsilon=0"])


def test_gamma_defaults_per_policy_kind(tmp_path):
    cfg = load_config(TrainConfig, ANALYTIC)
    assert (cfg.ppo.gamma_for("size"), cfg.ppo.gamma_for("depth")) == (0.5, 0.99)
    assert load_config(TrainConfig, ANALYTIC, ["ppo.gamma=0.9"]).ppo.gamma_for("depth") == 0.9
    assert load_config(TrainConfig, ANALYTIC, ["ppo.gamma=9e-1"]).ppo.gamma_for("size") == 0.9
    with pytest.raises(ValueError, match="ppo.gamma"):
        load_config(TrainConfig, ANALYTIC, ["ppo.gamma=high"])
    summary = ppo_size.train(tiny("total_timesteps=256"), tmp_path)
    from stable_baselines3 import PPO

    assert PPO.load(tmp_path / "policy.zip").gamma == 0.5 and summary["config"]["ppo"]["gamma"] is None


@pytest.mark.parametrize("damage", ["truncated zip", "missing statistics"])
def test_resume_skips_a_damaged_newest_checkpoint(tmp_path, capsys, damage):
    """A truncated newest checkpoint blocked --resume, and one without its VecNormalize file resumed
    with fresh statistics; now --resume falls back to the previous checkpoint with a warning."""
    cfg = tiny()
    assert ppo_size.train(cfg, tmp_path, callbacks=[StopAt(600)]) is None
    newest = tmp_path / "checkpoints" / "ppo_512_steps.zip"
    if damage == "truncated zip":
        newest.write_bytes(newest.read_bytes()[:2000])
    else:
        (tmp_path / "checkpoints" / "ppo_vecnormalize_512_steps.pkl").unlink()
    capsys.readouterr()
    summary = ppo_size.train(cfg, tmp_path, resume=True)
    assert summary["num_timesteps"] == 1024
    warning = capsys.readouterr().err
    assert "skipping checkpoint" in warning and "ppo_512_steps.zip" in warning
    for path in (tmp_path / "checkpoints").glob("ppo_*_steps.zip"):
        path.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="no usable checkpoint"):
        ppo_size.train(cfg, tmp_path, resume=True)


def test_keep_best_keeps_the_checkpoint_that_scores_best_on_fresh_training_episodes(tmp_path):
    cfg = tiny("keep=best", "select_episodes=3")
    summary = ppo_size.train(cfg, tmp_path / "run")
    selection = summary["selection"]
    steps = sorted(int(s) for s in selection["scores"])
    assert steps == [256, 512, 768, 1024]  # every checkpoint, the final one included
    best = max(steps, key=lambda s: (selection["scores"][str(s)], s))
    assert selection["best"] == best
    manifest = json.loads((tmp_path / "run" / "policy.json").read_text())
    assert manifest["num_timesteps"] == best and summary["num_timesteps"] == 1024  # the policy's steps; the run's
    # the kept policy is that checkpoint, and its score reproduces on the same episodes
    env = make_env(cfg.env)  # the training env: what selection scores on
    kept = evaluate_policy(PPOPolicy.load(tmp_path / "run", env), env, 3, cfg.select_seed)
    score = float(np.exp(np.mean(np.log(kept["episode_throughputs"]))))
    assert score == pytest.approx(selection["scores"][str(best)], rel=1e-9)
    last = evaluate_policy(PPOPolicy.load(tmp_path / "run" / "checkpoints" / "ppo_1024_steps.zip", env),
                                  env, 3, cfg.select_seed)
    assert float(np.exp(np.mean(np.log(last["episode_throughputs"])))) == pytest.approx(selection["scores"]["1024"])
    assert "selection" not in ppo_size.train(tiny(), tmp_path / "last")  # keep=last (the default) scores nothing
