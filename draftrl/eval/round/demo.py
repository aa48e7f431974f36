"""``draftrl demo``: the whole pipeline on the embedded CPU default, end to end.

Steps, each through the owning package's public Python API, each writing under ``DIR``:

1. **model**: fetch and load the embedded default target (``draftrl.models``);
2. **calibrate**: measure verify / draft / sample costs -> ``DIR/cost_table.json``
   (``draftrl.replay.calibrate.calibrate``);
3. **collect**: traces of the tune prompts at each temperature of ``env.temperature_mix`` (one greedy
   recording per prompt, ``continuations`` sampled ones per prompt at each T > 0) -> ``DIR/traces/``
   (``draftrl.replay.traces.collect``);
4. **train**: one PPO policy on ``draftrl/TraceReplay-v1`` over those traces, each episode drawing its
   request's sampling from the mix -> ``DIR/ppo_size/`` (and more recipes when configured)
   (``draftrl.train.<recipe>.train``);
5. **grid**: fixed settings on the tune split, wall clock -> ``DIR/grid/`` (``draftrl.eval.round.grid``);
6. **eval**: plain decoding, best fixed, heuristic, threshold, bandit, PPO and the lookahead bound
   on the held-out split, exactness checks on -> ``DIR/eval/`` (``draftrl.eval.round.compare``).

Every step from calibrate on logs one wandb run (``job_type`` the step), all in one group, offline
in ``DIR/wandb/`` (``draftrl.config.wandb``; what each holds: ``draftrl.eval.wandb_log``).
``DIR/demo_summary.json`` records each step's seconds, the final table and the wandb group with
the one ``wandb sync`` command that uploads it. The default (``DemoConfig()``) ran in about 15
minutes on 2 quiet CPU cores when greedy (its three temperatures take longer: not yet timed whole);
``DemoConfig.quick()`` in about 6 minutes (measured on 2 loaded cores).
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from draftrl.config.commands import CalibrationConfig
from draftrl.config.env import EnvConfig
from draftrl.eval.round.config import EvalConfig, GridConfig, PolicyEvalConfig
from draftrl.runs import WANDB_FILE

T = TypeVar("T")

STEPS: tuple[str, ...] = ("model", "calibrate", "collect", "train", "grid", "eval")
#: Subdirectories and files the demo writes (``--overwrite`` removes only these).
OUTPUTS: tuple[str, ...] = ("cost_table.json", "traces", "grid", "eval", "logs", "demo_summary.json", "wandb",
                             WANDB_FILE)


@contextlib.contextmanager
def _logged(path: Path):
    """Send a step's own prints (tables, progress, wandb) to ``path`` instead of the terminal."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        yield


@dataclass
class DemoTrainConfig:
    """PPO training on replayed traces (``draftrl.train``)."""

    recipes: tuple[str, ...] = ("ppo_size", "ppo_depth")
    """recipes to train, each into DIR/<recipe>/ and evaluated as ppo:DIR/<recipe>: ppo_size picks
    (depth, verify_size) per round; ppo_depth says CONTINUE/STOP after each draft level"""
    total_timesteps: int = 20_000
    """replayed rounds; a replayed round takes microseconds"""
    eval_episodes: int = 48
    """episodes of the recipe's own replayed evaluation: three passes over the 16 tune prompts, so that
    each class of the mix draws about a dozen (the per-class table; replayed episodes cost milliseconds)"""
    overrides: tuple[str, ...] = ("ppo.n_envs=4", "ppo.n_steps=256", "ppo.batch_size=256", "checkpoint_every=10000")
    """more TrainConfig overrides, as for draftrl train --set"""


def _demo_env() -> EnvConfig:
    return EnvConfig(
        split=None,
        shuffle=False,
        languages=("en", "it", "zh", "es"),
        tasks=("code_edit", "summarize", "qa_context", "chat"),  # every task: copy-heavy to open-ended
        limit_per_group=1,  # 16 requests per split: enough for a paired interval to resolve ~5% (docs/eval.md)
        max_new_tokens=32,
        drafter="sam:2",  # n-gram lookup on a 2-token match, else the EAGLE-3 head draftrl ships (drafters/heads/)
        depths=(0, 1, 2, 3, 4, 6),
        verify_sizes=(0,),
        # users serve greedy requests beside 0.6-0.7 (Qwen2.5, Llama-3.1 instruct) and 1.0 (vLLM's default):
        # one policy learns on the mix, the observation telling it each request's sampling (issue 45)
        temperature_mix={0.0: 0.3, 0.7: 0.4, 1.0: 0.3},
        # one keyed uniform per position: the same law, and at T > 0 every policy must then equal plain decoding
        # token for token (checked in float32) and the lookahead bound exists at every temperature
        keyed=True,
    )


@dataclass
class DemoConfig(EvalConfig):
    """The demo: an :class:`EvalConfig` (workload, grid, policies) plus calibration and training."""

    env: EnvConfig = field(default_factory=_demo_env)
    grid: GridConfig = field(default_factory=lambda: GridConfig(depths=(0, 1, 2, 4, 6), repeats=1))
    eval: PolicyEvalConfig = field(default_factory=lambda: PolicyEvalConfig(
        policies=("none", "best-grid", "heuristic", "threshold", "bandit", "lookahead"), power_tokens=300,
        anchor_gammas=(2, 4, 8)))
    calibrate: CalibrationConfig = field(default_factory=lambda: CalibrationConfig(
        num_tokens=(1, 2, 3, 4, 5, 7, 9), contexts=(128, 512), widths=(1,)))
    """the demo's cost table: token counts up to the deepest chain round (depth 6 feeds 7)"""
    train: DemoTrainConfig = field(default_factory=DemoTrainConfig)
    threads: int = 1
    """one torch thread: fastest per core for a 135M model on a shared machine"""
    continuations: int = 1
    """collect step: sampled continuations per tune prompt at each T > 0 of the mix (K; greedy records
    one). Collection time grows as 1 + 2K recordings per prompt on the default mix: K = 1 gives each
    class as many positions as the greedy one (3x the greedy demo's data for 3x its collection time, about
    6 minutes of the default demo on 2 quiet cores); K = 2 would make collection 5x, the longest step"""

    @classmethod
    def quick(cls) -> DemoConfig:
        """A few minutes: 4 requests per split, 24 tokens, 3 grid cells, 5k training rounds, no power run."""
        cfg = cls()
        cfg.env = dataclasses.replace(cfg.env, languages=("en", "zh"), tasks=("code_edit", "chat"), max_new_tokens=24)
        cfg.grid = GridConfig(depths=(0, 2, 4), repeats=1)
        cfg.eval = dataclasses.replace(cfg.eval, power_tokens=0, greedy_reference=1, anchor_gammas=(4,))
        cfg.calibrate = CalibrationConfig(num_tokens=(1, 3, 5), contexts=(256,), widths=(1,), repeats=2)
        cfg.train = dataclasses.replace(cfg.train, recipes=("ppo_size",), total_timesteps=4096, eval_episodes=12)
        return cfg


def _calibrate(config: DemoConfig, out: Path):
    from draftrl.config import to_dict
    from draftrl.config.wandb import logged_run
    from draftrl.eval.wandb_log import log_calibration
    from draftrl.replay.calibrate import calibrate

    table = calibrate(config.calibrate, config.env)
    table.save(out / "cost_table.json")
    with logged_run(config.wandb, out, job_type="calibrate",
                    config={"calibrate": to_dict(config.calibrate), "env": to_dict(config.env)}) as run:
        log_calibration(run, table)
    return table


def _collect(config: DemoConfig, out: Path, target) -> Path:
    from draftrl.config import to_dict
    from draftrl.config.wandb import logged_run
    from draftrl.decoding.build import build_engine
    from draftrl.eval.wandb_log import log_traces
    from draftrl.replay.traces import collect
    from draftrl.signals.costs import CostTable

    env = collect_env(config)
    engine, tokenizer = build_engine(env, target)
    traces = collect(env, engine, tokenizer, num_continuations=config.continuations)
    path = traces.save(out / "traces", cost_table=CostTable.load(out / "cost_table.json"))
    with logged_run(config.wandb, out, job_type="collect", config={"env": to_dict(env)}) as run:
        log_traces(run, traces)
    return path


def collect_env(config: DemoConfig) -> EnvConfig:
    """The env the collect step decodes: the tune split (the grid's), monitor off (the recordings' own
    decoding is not what is checked)."""
    return dataclasses.replace(config.env, split="tune", monitor=False)


def step_config(config: DemoConfig, cls: type[T]) -> T:
    """What the demo's step that ``cls``'s command runs reads from ``config``: the sections ``cls``
    declares (calibrate: ``CalibrateConfig``, collect: ``CollectConfig``, grid and eval:
    ``EvalConfig``), collect's env as :func:`collect_env`. ``draftrl calibrate --config DEMO.yaml``
    and the others rerun one step with what the demo ran it with."""
    from draftrl.config.commands import CollectConfig

    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(cls) if hasattr(config, f.name)}
    if issubclass(cls, CollectConfig):
        values["env"] = collect_env(config)
    return cls(**values)


def train_config(config: DemoConfig, recipe: str, trace_dir: str | Path):
    """The ``TrainConfig`` the train step runs ``recipe`` with, on the traces in ``trace_dir``."""
    from draftrl.config import load_config, to_dict
    from draftrl.train.config import DepthTrainEnvConfig, TrainConfig, TrainEnvConfig

    overrides = [
        f"recipe={recipe}",
        f"total_timesteps={config.train.total_timesteps}",
        f"eval_episodes={config.train.eval_episodes}",
        "progress_bar=false",
        "baselines=[heuristic,threshold,bandit,lookahead]",
        *config.train.overrides,
    ]
    # the traces' own env section; training replays other machines too (cost_jitter) so that the
    # policy reads the cost features the real engine will measure; the training summary evaluates
    # on the calibrated costs as measured
    replay = {**to_dict(config.env), "traces": str(trace_dir), "cost_noise": 0.05, "cost_jitter": 0.25,
              "eval": {"cost_noise": 0.0, "cost_jitter": 0.0}}
    cfg = load_config(TrainConfig, None, overrides, base=TrainConfig(
        env=TrainEnvConfig(id="draftrl/TraceReplay-v1", **replay),  # size policies on TraceReplay-v1
        # depth policies on its step-level twin
        depth_env=DepthTrainEnvConfig(id="draftrl/TraceReplayDepth-v1", **replay)))
    return dataclasses.replace(cfg, wandb=config.wandb)  # the pipeline's project, group and folder


def _train(config: DemoConfig, out: Path, trace_dir: Path) -> dict[str, Path]:
    import importlib

    from draftrl.train.evaluation import format_table

    dirs = {}
    for recipe in config.train.recipes:
        cfg = train_config(config, recipe, trace_dir)
        run_dir = out / recipe
        summary = importlib.import_module(f"draftrl.train.{recipe}").train(cfg, run_dir)
        print(format_table(summary["evaluation"]))  # into the step's log
        dirs[recipe] = run_dir
    return dirs


def run_demo(config: DemoConfig, out: str | Path, *, overwrite: bool = False,
             step_started: Callable[[int, str], None] | None = None,
             step_done: Callable[[int, str, float, str], None] | None = None,
             progress: Callable[[int, int, str], None] | None = None) -> dict:
    """Run :data:`STEPS` into ``out``; returns the summary (also ``out/demo_summary.json``).

    :param overwrite: remove the demo's own outputs (:data:`OUTPUTS` and the recipes' run
        directories) in ``out`` first; without it an existing demo in ``out`` is an error.
    :param step_started: ``(index, step)`` before each step; ``step_done(index, step, seconds, note)`` after.
    :param progress: ``(done, total, label)`` inside the grid and eval steps.
    """
    import torch

    from draftrl.config.wandb import pipeline, sync_command
    from draftrl.decoding.build import load_target
    from draftrl.drafters.packaged import missing_head
    from draftrl.eval.round.compare import run_eval
    from draftrl.eval.round.grid import run_grid
    from draftrl.io import refuse_foreign, write_json
    from draftrl.models import DEFAULT_MODEL, fetch_model

    missing = missing_head(config.env.drafter, config.env.target)
    if missing is not None:  # before any model loads or output is written (the CLI falls back from a default)
        raise ValueError(missing)
    out = Path(out)
    refuse_foreign(out, (*OUTPUTS, *config.train.recipes), overwrite=overwrite, command="demo")
    owned = [out / name for name in (*OUTPUTS, *config.train.recipes)]
    present = [p for p in owned if p.exists()]
    if present and not overwrite:
        raise ValueError(f"{out} already holds a demo ({', '.join(p.name for p in present)}); "
                         "pass --overwrite to replace "
                         f"it or --out NEW_DIR.")
    for p in present:
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    out.mkdir(parents=True, exist_ok=True)
    if config.threads:
        torch.set_num_threads(config.threads)
    # one wandb group for every step's run, all of them in out/wandb/ (one `wandb sync` uploads them)
    config = dataclasses.replace(config, wandb=pipeline(config.wandb, out))
    summary: dict = {"steps": {}, "out": str(out)}
    timer = {"t": 0.0}

    def begin(i: int) -> None:
        timer["t"] = time.perf_counter()
        if step_started:
            step_started(i, STEPS[i])

    def end(i: int, note: str) -> None:
        seconds = time.perf_counter() - timer["t"]
        summary["steps"][STEPS[i]] = {"seconds": seconds, "note": note}
        if step_done:
            step_done(i, STEPS[i], seconds, note)

    started = time.perf_counter()
    begin(0)
    target_name = config.env.target
    with _logged(out / "logs" / "model.log"):
        if target_name == DEFAULT_MODEL:
            fetch_model(target_name, quiet=True)
        target = load_target(config.env)
    end(0, target.name)

    begin(1)
    with _logged(out / "logs" / "calibrate.log"):
        table = _calibrate(config, out)
    g = table.g(max(table.num_tokens))
    end(1, f"g({int(max(table.num_tokens))}) = {g:.2f} plain steps")

    begin(2)
    with _logged(out / "logs" / "collect.log"):
        trace_dir = _collect(config, out, target)
    end(2, f"{trace_dir}")

    begin(3)
    with _logged(out / "logs" / "train.log"):
        policy_dirs = _train(config, out, trace_dir)
    end(3, ", ".join(f"{p} (log: {out / 'logs' / 'train.log'})" for p in policy_dirs.values()))

    begin(4)
    if config.grid.replay_rank and not config.grid.traces:  # rank in the replay of the collect step's traces
        config.grid = dataclasses.replace(config.grid, traces=str(out / "traces"))
    grid = run_grid(config, out / "grid", target=target, progress=progress)
    best = grid["best"]
    end(4, f"best fixed: depth {best['depth']} ({best['speedup_vs_none']:.2f}x on tune)")

    begin(5)
    policies = list(config.eval.policies)
    ppo = [f"ppo:{d}" for d in policy_dirs.values()]
    if "lookahead" in policies:  # keep the upper bound last in the table
        policies.remove("lookahead")
        policies += ppo + ["lookahead"]
    else:
        policies += ppo
    results = run_eval(config, out / "eval", policies=policies, grid_path=out / "grid" / "grid.json", target=target,
                       progress=progress)
    end(5, f"exactness {'passed' if results['exactness']['passed'] else 'FAILED'}")

    summary["wall_seconds"] = time.perf_counter() - started
    summary["report"] = str(out / "eval" / "report.md")
    summary["results"] = str(out / "eval" / "results.json")
    def policy_summary(policies: dict) -> dict:
        return {name: {"speedup_vs_none": p.get("speedup_vs_none"), "speedup_vs_hf": p.get("speedup_vs_hf"),
                       "speedup_vs_hf_lookup": p.get("speedup_vs_hf_lookup"),
                       "ci_vs_best_fixed": p.get("ci_vs_best_fixed"), "tokens_per_second": p["tokens_per_second"]}
                for name, p in policies.items()}

    if "classes" in results:  # a temperature mix: the mix's weighted ratios, and each class's table
        summary["policies"] = {name: {k: v for k, v in p.items() if k != "per_class"}
                               for name, p in results["mix"]["policies"].items()}
        summary["classes"] = {label: policy_summary(c["policies"]) for label, c in results["classes"].items()}
    else:
        summary["policies"] = policy_summary(results["policies"])
    summary["exactness_passed"] = results["exactness"]["passed"]
    # temperature 0: bitwise identity (float32) or the agreement rate with near-ties (bfloat16/float16)
    summary["greedy_agreement"] = {"grid": grid["exactness"].get("greedy_identity"),
                                   "eval": results["exactness"].get("greedy_identity")}
    summary["wandb"] = {"group": config.wandb.group, "sync": sync_command(config.wandb, out)}
    write_json(out / "demo_summary.json", summary)
    summary["results_dict"] = results
    return summary
