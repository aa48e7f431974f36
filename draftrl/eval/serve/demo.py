"""``draftrl demo --engine vllm``: learning under load, end to end, in real vLLM.

Steps, each through the owning package's public Python API, each writing under ``DIR``:

1. **calibrate**: vLLM step seconds vs sequences and tokens verified, and prefill seconds
   (``draftrl.replay.serve_calibrate.calibrate_model``) -> ``DIR/vllm_costs.json``;
2. **collect**: every tune and held-out request's continuations in vLLM (greedy; with ``temperature_mix``
   ``continuations`` seeded ones per sampled class)
   (``draftrl.replay.recordings.record_workload``) -> ``DIR/rec_tune/``, ``DIR/rec_heldout/``;
3. **train**: batch-aware PPO on the serving replay ``draftrl/ServeReplay-v1`` with the
   recipe of ``configs/serve_replay_cpu.yaml`` (``draftrl.train.ppo_size``) -> ``DIR/ppo_replay/``;
4. **dsd**: vLLM's Dynamic SD table grid-searched in the replay on the tune split, the
   strongest hand-made baseline (``draftrl.eval.serve.dsd_search.search_dsd``) -> ``DIR/dsd_grid.json``;
5. **sweep**: every policy in real vLLM at each Poisson arrival rate, interleaved, exactness
   checked, and the same sweep in the replay (``draftrl.eval.serve.compare.run_eval``) ->
   ``DIR/sweep/`` (``results.json``, ``report.md``, ``sweep.png``, ``replay/results.json``).

``DIR/serve_demo_summary.json`` holds each step's seconds and, per rate and policy, the speedup
over no speculation in vLLM and in the replay. Each step logs one wandb run (``job_type`` the
step) in one group, offline in ``DIR/wandb/``: the sweep's speedup against the arrival rate per
policy and its per-rate tables beside the calibration, training and DSD search they came from. A step whose
output is already in ``DIR``
(from an interrupted run with the same settings, ``DIR/serve_demo_config.json``) is skipped.
The default (``ServeDemoConfig()``, the temperature mix) took about 20 minutes on 2 shared CPU cores;
``ServeDemoConfig.quick()`` runs in a few.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftrl.config.wandb import WandbConfig
from draftrl.replay.serve_calibrate import CalibrationSizes
from draftrl.runs import WANDB_FILE

STEPS: tuple[str, ...] = ("calibrate", "collect", "train", "dsd", "sweep")
#: ``ServeDemoConfig`` fields a resumed demo may change (they change no result)
RESUMABLE_CHANGES: tuple[str, ...] = ("wandb", "gpu_memory_utilization")
#: What the demo writes in DIR (``--overwrite`` removes only these).
OUTPUTS: tuple[str, ...] = ("serve_demo_config.json", "vllm_costs.json", "rec_tune", "rec_heldout", "ppo_replay",
                            "dsd_grid.json", "sweep", "logs", "serve_demo_summary.json", "wandb", WANDB_FILE)


@dataclass
class ServeDemoConfig:
    """Sizes of ``draftrl demo --engine vllm`` (defaults: about 20 minutes on 2 shared CPU cores, the mix)."""

    calibrate: CalibrationSizes = field(default_factory=CalibrationSizes)
    """the step-cost measurement (``draftrl calibrate --engine vllm``'s cells)"""
    max_new_tokens: int = 32
    """tokens per request in the recordings, the replay and the sweep"""
    temperature_mix: Any = field(default_factory=lambda: {0.0: 0.3, 0.7: 0.4, 1.0: 0.3})
    """each request's sampling class in the recordings, the training replay and the sweep
    (``WorkloadConfig.temperature_mix``): greedy tool calls beside chat at 0.7 and vLLM's default 1.0,
    as a served batch mixes them (the round demo's mix); null (``--set temperature_mix=null``): every
    request greedy"""
    continuations: int = 4
    """sampled continuations recorded per request and sampled class (``draftrl collect --engine vllm
    --continuations``); a greedy class records one"""
    train_config: str = "configs/serve_replay_cpu.yaml"
    """the training recipe (relative paths are read from the working directory, else the repository)"""
    total_timesteps: int = 90_000
    """replayed engine steps of PPO training (about 2 minutes; the recipe's own default)"""
    train_overrides: tuple[str, ...] = ()
    """more TrainConfig overrides, as for draftrl train --set"""
    dsd_ks: tuple[int, ...] = (0, 1, 2, 3, 4, 6, 8)
    """depths each batch-size range of the Dynamic SD table may take, and (those above 0) the fixed
    depths searched on the mix and per sampling class"""
    policies: tuple[str, ...] = ("none", "heuristic", "vllm-ngram:4")
    """serving policies of the sweep besides the searched ones (the best fixed K on the mix and per
    sampling class, the DSD table) and PPO (``draftrl eval --engine vllm`` names)"""
    rates: tuple[float, ...] = (0.5, 1.0, 2.0, 8.0)
    """Poisson arrival rates of the sweep, requests per second, light to saturating"""
    num_requests: int = 16
    """held-out requests per (rate, policy) episode (16: the mixed workload, 4 languages x 4 tasks)"""
    repeats: int = 1
    """interleaved passes of the sweep; the median-time pass is kept"""
    threads: int = 1
    """CPU threads of vLLM's worker"""
    seed: int = 0
    gpu_memory_utilization: float | None = None
    """the share of the GPU's memory vLLM's engine takes in every step (``ServeConfig.gpu_memory_utilization``;
    the demo holds one engine at a time); null: vLLM's 0.9. Not read on CPU, and not part of the settings a
    resumed demo must match (a run stopped for memory resumes with a smaller share)"""
    enforce_eager: bool | None = None
    """null: CUDA graphs on a GPU (what production vLLM runs, and so what the calibration measures), eager on
    CPU; true: eager everywhere (``ServeConfig.enforce_eager``)"""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """one run per step (job_type calibrate, collect, train, dsd, sweep) in one group, offline in
    DIR/wandb/ (not part of the settings a resumed demo must match)"""

    def __post_init__(self) -> None:
        from draftrl.config.workload import parse_temperature_mix
        from draftrl.decoding.vllm.engine import check_memory_share

        check_memory_share(self.gpu_memory_utilization)
        if self.temperature_mix is not None:  # refused here, before any step, when malformed
            self.temperature_mix = [dataclasses.asdict(c) for c in parse_temperature_mix(self.temperature_mix,
                                                                                           "temperature_mix")]
        if self.continuations < 1:
            raise ValueError(f"continuations={self.continuations} must be >= 1 (sampled continuations per request).")

    @classmethod
    def quick(cls) -> ServeDemoConfig:
        """A few minutes: a small calibration, 12 tokens, 2 continuations, 2048 training steps, one rate,
        2 requests."""
        return cls(calibrate=CalibrationSizes(batch_sizes=(1, 4), depths=(0, 2), steps=2, prefill_lens=(32,),
                                              prefill_batch_sizes=(1,), rounds=1),
                   max_new_tokens=12, total_timesteps=2048, dsd_ks=(0, 2, 4), continuations=2,
                   train_overrides=("eval_episodes=2", "ppo.n_steps=256", "ppo.batch_size=64", "checkpoint_every=2048"),
                   policies=("none", "fixed:2"), rates=(2.0,), num_requests=2)


def _train_config_path(path: str) -> Path:
    """``path`` as given, else under the repository draftrl runs from (an editable install)."""
    given = Path(path)
    if given.is_file():
        return given
    in_repo = Path(__file__).resolve().parents[2] / path
    if not given.is_absolute() and in_repo.is_file():
        return in_repo
    raise FileNotFoundError(f"train_config={path} does not exist; pass --set train_config=PATH to "
                            "configs/serve_replay_cpu.yaml of the draftrl repository.")


@contextlib.contextmanager
def _logged(path: Path):
    """Send a step's own prints (training tables, vLLM's messages) to ``path`` instead of the terminal."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        yield


def _train_config(config: ServeDemoConfig, out: Path):
    """The recipe of ``config.train_config`` on this demo's recordings and calibration."""
    from draftrl.config import load_config
    from draftrl.train.config import TrainConfig

    tokens = f"max_new_tokens={config.max_new_tokens}"
    return load_config(TrainConfig, _train_config_path(config.train_config), [
        f"env.serve.recordings={out / 'rec_tune'}", f"env.serve.calibration={out / 'vllm_costs.json'}",
        f"env.eval.serve.recordings={out / 'rec_heldout'}", f"env.serve.{tokens}",
        f"total_timesteps={config.total_timesteps}", "progress_bar=false", f"seed={config.seed}",
        *([f"env.serve.temperature_mix={json.dumps(config.temperature_mix)}"] if config.temperature_mix else []),
        *config.train_overrides])


def run_demo(config: ServeDemoConfig, out: str | Path, *, overwrite: bool = False,
                   step_started: Callable[[int, str], None] | None = None,
                   step_done: Callable[[int, str, float, str], None] | None = None,
                   progress: Callable[[int, int, str], None] | None = None) -> dict:
    """Run :data:`STEPS` into ``out``, skipping those whose outputs exist; returns the summary
    (also ``out/serve_demo_summary.json``).

    :param overwrite: remove the demo's own outputs (:data:`OUTPUTS`) in ``out`` first.
    :param step_started: ``(index, step)`` before each step; ``step_done(index, step, seconds, note)``
        after (``note`` starts with "skipped" for a step found done).
    :param progress: ``(done, total, label)`` inside the sweep.
    :raises ServingMismatch: (``draftrl.eval.serve.compare``) when a policy fails an exactness check in
        the sweep; its results are written first.
    """
    import dataclasses
    import importlib
    import shutil

    from draftrl.config import to_dict
    from draftrl.config.wandb import EXACTNESS_FAILED, logged_run, pipeline, sync_command
    from draftrl.eval import wandb_log
    from draftrl.io import plain, read_json, refuse_foreign, write_json

    out = Path(out)
    refuse_foreign(out, OUTPUTS, overwrite=overwrite, command="demo --engine vllm")  # before any step or model
    train_cfg = _train_config(config, out)  # a missing recipe fails before any work
    # how it is watched, and the memory share it takes, may change between a run and its resumption
    settings = plain({k: v for k, v in to_dict(config).items() if k not in RESUMABLE_CHANGES})
    if overwrite:
        for name in OUTPUTS:
            path = out / name
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    earlier = out / "serve_demo_config.json"
    if earlier.exists() and read_json(earlier, "serve demo settings") != settings:
        raise ValueError(f"{out} holds a serve demo run with other settings ({earlier}); pass --overwrite to replace "
                         "it, or another --out.")
    out.mkdir(parents=True, exist_ok=True)
    write_json(earlier, settings)
    wb = pipeline(config.wandb, out)  # every step's run in one group, in out/wandb/ (a resumed demo keeps both)
    summary: dict = {"steps": {}, "out": str(out)}
    started = time.perf_counter()

    def step(i: int, done: Path, run: Callable[[], str]) -> None:
        if step_started:
            step_started(i, STEPS[i])
        t0 = time.perf_counter()
        if done.exists():
            note = f"skipped: {done} exists"
        else:
            with _logged(out / "logs" / f"{STEPS[i]}.log"):
                note = run()
        seconds = time.perf_counter() - t0
        summary["steps"][STEPS[i]] = {"seconds": seconds, "note": note}
        if step_done:
            step_done(i, STEPS[i], seconds, note)

    def calibrate() -> str:
        from draftrl.replay.serve_calibrate import calibrate_model

        result = calibrate_model(train_cfg.env.serve.target, config.calibrate, dtype=train_cfg.env.serve.dtype,
                                 threads=config.threads, seed=config.seed,
                                 gpu_memory_utilization=config.gpu_memory_utilization,
                                 enforce_eager=config.enforce_eager)
        write_json(out / "vllm_costs.json", result)
        with logged_run(wb, out, job_type="calibrate", config={"calibrate": to_dict(config.calibrate)}) as run:
            wandb_log.log_vllm_calibration(run, result)
        f = result["fit"]
        line = f"{f['base'] * 1e3:.0f} ms + {f['per_seq'] * 1e3:.1f} ms/seq + {f['per_token'] * 1e3:.1f} ms/token"
        return f"{line}; WARNING: {f['problem']}" if f.get("problem") else line

    def collect() -> str:
        from draftrl.replay.recordings import record_workload

        notes, recorded = [], {}
        for split in ("tune", "heldout"):
            if not (out / f"rec_{split}").exists():
                recordings = record_workload(_serve_config(config, split=split), continuations=config.continuations)
                recordings.save(out / f"rec_{split}")
                notes.append(f"{split}: {len(recordings.prompts)} requests, {len(recordings)} continuations")
                recorded[split] = recordings
        with logged_run(wb, out, job_type="collect", config={"max_new_tokens": config.max_new_tokens}) as run:
            wandb_log.log_recordings(run, recorded)
        return ", ".join(notes)

    def train() -> str:
        run_dir = out / "ppo_replay"  # an interrupted run continues from its newest checkpoint
        summary_ = importlib.import_module(f"draftrl.train.{train_cfg.recipe}").train(
            dataclasses.replace(train_cfg, wandb=wb), run_dir, resume=run_dir.exists())
        table = summary_["evaluation"]["table"]
        best = max((k for k in table if k.startswith("fixed")), key=lambda k: table[k]["throughput"])
        return f"PPO {table['ppo']['throughput'] / table[best]['throughput']:.3f}x the best fixed {best} (replay)"

    def dsd() -> str:
        from draftrl.eval.serve.dsd_search import search_dsd, search_fixed

        replay_env, tune, loads = _replay_env(out, "rec_tune"), _serve_config(config, split="tune"), \
            list(train_cfg.env.serve.loads)
        fixed = search_fixed(replay_env, tune, loads, ks=tuple(k for k in config.dsd_ks if k > 0))
        scored = search_dsd(replay_env, tune, loads, ks=config.dsd_ks)
        write_json(out / "dsd_grid.json", {"best": scored[0]["label"], "tables": scored, "fixed": fixed})
        with logged_run(wb, out, job_type="dsd", config={"ks": list(config.dsd_ks)}) as run:
            wandb_log.log_dsd(run, scored)
        per_class = ", ".join(f"{c} {v['best']}" for c, v in fixed["per_class"].items())
        return (f"{scored[0]['label']} ({scored[0]['score']:.3f}x over no speculation, {len(scored)} tables); "
                f"best fixed {fixed['best']} ({fixed['score']:.3f}x), per class {per_class}")

    def sweep() -> str:
        from draftrl.eval.plots import load_sweep
        from draftrl.eval.serve.compare import ServingMismatch, run_eval
        from draftrl.eval.serve.dsd_search import hindsight_bound

        policies = _policies(config, out)
        serve = _serve_config(config, split="heldout")
        # vLLM's own methods (vllm-*) run no draftrl proposer, hence have no replay
        replayed = [p for p in policies if not p.startswith("vllm-")]
        replay = run_eval(out / "sweep" / "replay", policies=replayed, concurrency=(), rates=config.rates,
                                  repeats=config.repeats, config=serve, make_env=_replay_env(out, "rec_heldout"))
        bound = hindsight_bound(_replay_env(out, "rec_heldout"), serve,
                                [{"arrival": "poisson", "rate": float(r)} for r in config.rates])
        write_json(out / "sweep" / "replay" / "hindsight.json",
                   {f"{r:g}": x for r, x in zip(config.rates, bound.values())})
        try:
            real = run_eval(out / "sweep", policies=policies, concurrency=(), rates=config.rates,
                                    repeats=config.repeats, config=serve, progress=progress)
        except ServingMismatch:  # its results are written: logged, the run marked failed
            log_sweep(read_json(out / "sweep" / "results.json", "sweep results"), replay, None, code=EXACTNESS_FAILED)
            raise
        plot = load_sweep(real, replay, real["policies"], out / "sweep" / "sweep.png")
        log_sweep(real, replay, plot, code=0)
        return f"exactness {'passed' if real['exactness']['passed'] else 'FAILED'}"

    def log_sweep(real: dict, replay: dict, plot: Path | None, code: int) -> None:
        with logged_run(wb, out / "sweep", job_type="sweep", code=code,
                        config={"rates": list(config.rates), "policies": real["policies"]}) as run:
            wandb_log.log_sweep(run, real, replay, plot)

    step(0, out / "vllm_costs.json", calibrate)
    step(1, out / "rec_heldout", collect)  # tune is recorded first: held-out present means both are
    step(2, out / "ppo_replay" / "train_summary.json", train)
    step(3, out / "dsd_grid.json", dsd)
    step(4, out / "sweep" / "results.json", sweep)
    summary["wall_seconds"] = time.perf_counter() - started
    hindsight = out / "sweep" / "replay" / "hindsight.json"
    summary.update(sweep_summary(read_json(out / "sweep" / "results.json", "sweep results"),
                                 read_json(out / "sweep" / "replay" / "results.json", "replayed sweep results"),
                                 best_fixed=read_json(out / "dsd_grid.json", "DSD grid")["fixed"]["best"],
                                 hindsight=read_json(hindsight, "hindsight bound") if hindsight.exists() else None))
    summary["calibration_problem"] = read_json(out / "vllm_costs.json", "calibration")["fit"].get("problem")
    summary["plot"] = str(out / "sweep" / "sweep.png")
    summary["report"] = str(out / "sweep" / "report.md")
    summary["wandb"] = {"group": wb.group, "sync": sync_command(wb, out)}
    write_json(out / "serve_demo_summary.json", summary)
    return summary


def _serve_config(config: ServeDemoConfig, *, split: str):
    """The workload of the recordings and the sweep (file order, seed 0, ``config``'s sizes)."""
    from draftrl.config.serve import ServeConfig

    return ServeConfig(split=split, shuffle=False, seed=0, max_new_tokens=config.max_new_tokens, threads=config.threads,
                       num_requests=config.num_requests if split == "heldout" else None,
                       gpu_memory_utilization=config.gpu_memory_utilization, enforce_eager=config.enforce_eager,
                       temperature_mix=config.temperature_mix)


def _replay_env(out: Path, recordings: str):
    """``make_env`` for :func:`run_eval` and the searches: ``draftrl/ServeReplay-v1`` on
    ``out/recordings``, each step its expected cost (no ``cost_noise``: the noise is for training; a
    calibration under load measures a residual sd of 70 ms on 50-500 ms steps, which reorders
    policies a few percent apart)."""
    from draftrl.envs.serve_vllm import ServeVLLMEnv
    from draftrl.replay.recordings import Proposals, Recordings
    from draftrl.replay.serve_calibrate import StepCostModel

    loaded = Recordings.load(out / recordings)
    cost = StepCostModel.from_calibration(out / "vllm_costs.json")
    proposals: dict[int, Proposals] = {}

    def make_env(cfg, spec):
        if cfg.max_depth not in proposals:
            proposals[cfg.max_depth] = Proposals(loaded, cfg.max_depth)
        return ServeVLLMEnv(cfg, engine="replay", recordings=loaded, calibration=cost, cost_noise=False,
                            proposals=proposals[cfg.max_depth])
    return make_env


def _policies(config: ServeDemoConfig, out: Path) -> list[str]:
    """``config.policies``, the best fixed K searched on the mix and per sampling class, the best DSD
    table and PPO, each once."""
    from draftrl.io import read_json

    grid = read_json(out / "dsd_grid.json", "DSD grid")
    fixed = grid["fixed"]
    searched = [fixed["best"], *(v["best"] for v in fixed["per_class"].values()), grid["best"]]
    return list(dict.fromkeys([*config.policies, *searched, f"ppo:{out / 'ppo_replay'}"]))


def sweep_summary(real: dict, replay: dict, *, best_fixed: str | None = None,
                  hindsight: dict[str, float] | None = None) -> dict:
    """Per rate and policy the speedup over no speculation in vLLM and in the replay and over
    ``best_fixed`` (the fixed K searched on the mix) in vLLM; the same per rate and sampling class
    (each class's tokens / request latency in the mixed episodes, ``classes``); the geometric mean
    over rates; the replay's ``hindsight`` ceiling per rate (a goal missed at a rate is the policy's
    shortfall when the ceiling is above it, the headroom's when not); and Kendall's tau between the
    two rankings over every (rate, policy)."""
    from draftrl.eval.metrics import kendall_tau

    def ratio(a, b):
        return a / b if a and b else None

    rates: dict[str, dict] = {}
    classes: dict[str, dict] = {}
    pairs_real, pairs_replay = [], []
    for rate, entry in real.get("rates", {}).items():
        table = entry["policies"]
        replay_table = replay.get("rates", {}).get(rate, {}).get("policies", {})
        fixed = table.get(best_fixed, {}).get("tokens_per_second")
        rows = {}
        for name, p in table.items():
            s = replay_table.get(name)
            rows[name] = {"speedup_vs_none": p["speedup_vs_none"], "replay_speedup_vs_none": s and s["speedup_vs_none"],
                          "speedup_vs_best_fixed": ratio(p["tokens_per_second"], fixed),
                          "tokens_per_second": p["tokens_per_second"], "ttft_p50": p["time_to_first_token_p50"],
                          "itl_p50": p["itl_p50"], "itl_p95": p["itl_p95"]}
            if s:
                pairs_real.append(p["speedup_vs_none"])
                pairs_replay.append(s["speedup_vs_none"])
        rates[rate] = rows
        classes[rate] = {cls: {name: {"speedup_vs_none": ratio(_class_rate(table, name, cls),
                                                              _class_rate(table, "none", cls)),
                                      "speedup_vs_best_fixed": ratio(_class_rate(table, name, cls),
                                                                     _class_rate(table, best_fixed, cls)),
                                      "replay_speedup_vs_none": ratio(_class_rate(replay_table, name, cls),
                                                                      _class_rate(replay_table, "none", cls))}
                               for name in table if _class_rate(table, name, cls)}
                         for cls in table.get("none", {}).get("per_sampling") or {}}
    names = list(real.get("policies", []))

    def geomean(key: str) -> dict[str, float]:
        return {name: math.exp(sum(math.log(rates[r][name][key]) for r in rates) / len(rates))
                for name in names if rates and all(rates[r].get(name, {}).get(key) for r in rates)}

    return {"rates": rates, "classes": {r: c for r, c in classes.items() if c},
            "geomean_speedup_vs_none": geomean("speedup_vs_none"),
            "geomean_speedup_vs_best_fixed": geomean("speedup_vs_best_fixed"), "best_fixed": best_fixed,
            "hindsight_vs_none": hindsight or {}, "kendall_tau": kendall_tau(pairs_real, pairs_replay),
            "exactness": real["exactness"], "hardware": real.get("hardware", {})}


def _class_rate(table: dict, name: str | None, cls: str) -> float | None:
    """Tokens / request latency of sampling class ``cls`` under policy ``name`` in one rate's table."""
    return ((table.get(name) or {}).get("per_sampling") or {}).get(cls, {}).get("tokens_per_second")
