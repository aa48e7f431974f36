"""Grid search over fixed (depth, verify_size, width) settings on the tune split, in wall clock.

Every cell decodes every tune prompt with the real engine. Cells are interleaved: for each
repeat and each prompt, all cells run back to back in an order rotated by one per prompt (so
no cell always runs first after a slow neighbour), then the next prompt. Each (cell, prompt)
keeps its median-time repeat; a cell's throughput is its total tokens over the sum of those
median seconds, and its speedup is that over plain decoding's (depth 0, always in the grid).
Each prompt gets one sampling seed shared by every cell and repeat, so at temperature 0 every
cell must reproduce plain decoding token for token (checked), and at any temperature the
exactness monitor checks each cell's first-repeat stream after timing (outside the clock).

Outputs in ``DIR``: ``grid.json`` (below), ``grid_heatmap.png``, ``sweep.yaml`` (the same grid as
a wandb sweep: ``wandb sweep DIR/sweep.yaml`` then ``wandb agent ID`` on every GPU), and one
wandb run (``job_type`` grid: every cell in one table, the heatmap, the best setting; opened after
all timing is done, so wandb's own process does not share the CPU with timed decoding).

``grid.json``: ``format``, ``split``, ``config`` (resolved), ``hardware``, ``prompts``,
``repeats``, ``reference`` (the plain-decoding cell), ``cells`` {name: {``depth``,
``verify_size``, ``width``, ``tokens_per_second``, ``speedup_vs_none``, ``mean_tokens_per_round``,
``num_tokens``, ``seconds``, ``noise``, ``time_to_first_token_mean``, ``itl_p50/p95/p99``,
``per_language`` {lang: {...}}, ``per_task`` {task: {...}}, ``speedup_vs_hf``,
``speedup_vs_hf_lookup``}}, ``best`` (name, depth, verify_size, width, tokens_per_second,
speedup_vs_none, speedup_vs_hf, speedup_vs_hf_lookup), ``anchors`` (stock HF generate and its
prompt lookup per gamma, timed interleaved with the cells: ``draftrl.eval.round.anchors``; None at
temperature > 0), ``exactness``, ``files``, ``wall_seconds``.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from draftrl.config import to_dict
from draftrl.eval.agreement import raise_first_violation
from draftrl.eval.metrics import add_speedups, grouped, median_runs, summarize_with_groups
from draftrl.eval.records import RequestRun
from draftrl.eval.round.anchors import run_anchor
from draftrl.eval.round.cells import Cell, cell_name
from draftrl.eval.round.classes import best_mix_cell, class_config, mix_cells
from draftrl.eval.round.config import EvalConfig, GridConfig, env_for_split
from draftrl.eval.round.ranking import RankingSource, ReplayRanking, ranked_cells
from draftrl.eval.round.rollout import run_fixed
from draftrl.runs import WANDB_FILE

FORMAT = "draftrl-grid/1"
GRID_FILE = "grid.json"
SWEEP_FILE = "sweep.yaml"
HEATMAP_FILE = "grid_heatmap.png"
#: what ``draftrl grid`` writes in its --out (``--overwrite`` removes these first)
OUTPUTS: tuple[str, ...] = (GRID_FILE, SWEEP_FILE, HEATMAP_FILE, "grid_heatmap_*.png", "sweep_cells", "wandb",
                            WANDB_FILE)
#: Keys of each cell's per-language / per-task entries.
COMPACT_KEYS = ("tokens_per_second", "speedup_vs_none", "mean_tokens_per_round", "num_tokens", "seconds",
                "num_requests", "time_to_first_token_mean", "itl_p50", "itl_p95", "itl_p99")


REFERENCE = cell_name(0)


def grid_cells(settings: GridConfig) -> list[Cell]:
    """Plain decoding first, then every distinct setting, depth-major.

    Depth 0 ignores verify size and width (one cell). A verify size at or above the number of
    drafted nodes (``depth * width``) verifies everything, like 0, so such cells are dropped.
    """
    cells = [Cell(0)]
    for depth in sorted(d for d in settings.depths if d > 0):
        for width in sorted(settings.widths):
            for verify_size in sorted(settings.verify_sizes):
                if verify_size >= depth * width:
                    continue
                cells.append(Cell(depth, verify_size, width))
    return cells


def compact(summary: dict) -> dict:
    return {k: summary.get(k) for k in COMPACT_KEYS}


def _noise(runs: list[RequestRun]) -> float | None:
    """Median over prompts of (max - min) / median of the repeats' seconds: the timing spread."""
    spreads = []
    for items in grouped(runs, lambda r: r.prompt_id).values():
        secs = np.array([r.seconds for r in items])
        if secs.size > 1 and np.median(secs) > 0:
            spreads.append((secs.max() - secs.min()) / np.median(secs))
    return float(np.median(spreads)) if spreads else None


def measure_cells(config: EvalConfig, cells: list[Cell], *, target=None, split: str = "tune",
                  progress: Callable[[int, int, str], None] | None = None,
                  anchor_runs: list | None = None, indices: Sequence[int] | None = None,
                  ) -> tuple[list[RequestRun], dict]:
    """Time ``cells`` (plain decoding is added if missing) on ``split``; returns (all runs, exactness).

    ``indices``: the split's requests to time (default all; a Ray worker's shard,
    ``draftrl.eval.round.ray_shards``). Seeds and the order of the cells follow each request's index
    in the whole split, so a shard's outputs are the one-process run's.

    With a list as ``anchor_runs`` (and ``eval.anchors`` on), stock HF ``generate``, its prompt lookup
    at every ``eval.anchor_gammas`` and, with a draft model as the drafter, its assisted generation
    are timed in the same interleaved order (sampled at temperature > 0 with the engine's
    temperature, top-k and top-p and each request's seed) and their
    :class:`~draftrl.eval.round.anchors.AnchorRun` records appended to it.

    At temperature 0 every cell's first-repeat output is compared with plain decoding's
    (``draftrl.eval.agreement``): in float32 a difference raises
    ``draftrl.eval.exactness.GreedyMismatch`` here; in bfloat16/float16 the verdict (agreement rate,
    divergences with their margins) goes into ``exactness["greedy_identity"]`` and a violation is
    left for the caller to raise after writing (``raise_first_violation``). A failed monitor test
    raises ``ExactnessViolation``, and the engine's per-token argmax check its ``ArgmaxViolation``.
    """
    import torch

    from draftrl.decoding.build import build_engine, load_target
    from draftrl.decoding.monitor import ExactnessMonitor
    from draftrl.decoding.workload import Workload
    from draftrl.eval.agreement import GreedyAgreement
    from draftrl.eval.exactness import monitor_verdict

    if config.env.temperature_mix is not None:  # the engine would sample with the scalar fields, not the mix
        raise ValueError(f"measure_cells times one sampling; env.temperature_mix has "
                         f"{[c.label for c in config.env.sampling_classes]}: time each class on "
                         "draftrl.eval.round.classes.class_config(config, class) (run_grid does).")
    settings = config.grid
    if config.threads:
        torch.set_num_threads(config.threads)
    if all(c.depth != 0 for c in cells):
        cells = [Cell(0), *cells]
    env = env_for_split(config.env, split, settings.limit_per_group)
    env.depths = tuple(sorted({0, *env.depths, *(c.depth for c in cells)}))
    env.width = max([env.width, *(c.width for c in cells)])
    target = target if target is not None else load_target(env)
    engine, tokenizer = build_engine(env, target)
    workload = Workload(env, tokenizer)
    indices = list(range(len(workload)) if indices is None else indices)
    requests = [workload.request(i) for i in indices]
    seeds = {i: config.seed * 100_003 + i for i in indices}
    greedy = env.temperature == 0
    anchors: list = []
    sampling = engine.config.sampling  # the anchors sample with the engine's own params (greedy at 0)
    assistant = None
    if anchor_runs is not None and config.eval.anchors:
        from draftrl.eval.round.anchors import anchor_ngram, anchors_for, assistant_of

        assistant = assistant_of(engine)
        anchors = anchors_for(config.eval.anchor_gammas, anchor_ngram(env.drafter), assisted=assistant is not None)
    methods: list = [*cells, *anchors]

    if settings.warmup:  # untimed: a few tokens with every cell and anchor
        first = requests[0]
        short = type(first)(first.prompt, first.prompt_ids, min(8, first.max_new_tokens))
        for cell in cells:
            run_fixed(engine, short, cell.depth, cell.verify_size, cell.width, seed=0, label=cell.name,
                      device=env.device)
        for anchor in anchors:
            run_anchor(target.model, anchor, short, eos_token_ids=sorted(engine.eos_token_ids), device=env.device,
                       sampling=sampling, assistant=assistant)

    runs: list[RequestRun] = []
    first_outputs: dict[tuple[str, str], list[int]] = {}
    monitors = {cell.name: ExactnessMonitor() for cell in cells} if config.eval.monitor and not greedy else {}
    engine.config.token_stats = bool(monitors)  # the statistics' float64 passes only when a monitor reads them
    total, done = settings.repeats * len(requests) * len(methods), 0
    for repeat in range(settings.repeats):
        for i, request in zip(indices, requests):
            shift = (i + repeat * len(workload)) % len(methods)
            for cell in methods[shift:] + methods[:shift]:
                if not isinstance(cell, Cell):  # an anchor
                    anchor_runs.append(run_anchor(target.model, cell, request, repeat=repeat,
                                                  eos_token_ids=sorted(engine.eos_token_ids), device=env.device,
                                                  sampling=sampling, seed=seeds[i], assistant=assistant))
                    done += 1
                    if progress:
                        progress(done, total, f"{cell.label} {request.prompt.id}")
                    continue
                run = run_fixed(engine, request, cell.depth, cell.verify_size, cell.width, seed=seeds[i],
                                label=cell.name, repeat=repeat, keep_stats=repeat == 0 and bool(monitors),
                                device=env.device)
                if repeat == 0:
                    first_outputs[cell.name, request.prompt.id] = run.token_ids
                    for stats in run.token_stats:  # outside the timed region
                        monitors[cell.name].update(stats)
                    run.token_stats = []
                runs.append(run)
                done += 1
                if progress:
                    progress(done, total, f"{cell.name} {request.prompt.id}")
    identity = {"checked": False}
    # float32: bitwise identity (raises); bfloat16/float16: a rate, near-ties reported (after timing); at T > 0
    # with keyed sampling (env.keyed) every cell draws from plain decoding's keyed stream: float32 identity holds too
    if greedy or (env.keyed and env.dtype == "float32"):
        agreement = GreedyAgreement(target.model, env.dtype, config.eval.near_tie_ulps, raise_at_once=False,
                                    tokenizer=tokenizer)
        prompt_ids = {r.prompt.id: r.prompt_ids for r in requests}
        for (name, prompt_id), tokens in first_outputs.items():
            if name != REFERENCE:
                agreement.compare(name, prompt_id, prompt_ids[prompt_id], first_outputs[REFERENCE, prompt_id], tokens,
                                  what=f"grid cell {name}")
        identity = {**agreement.verdict(), "requests": len(requests), "cells": len(cells),
                    "reference": "plain decoding (depth 0) on the same engine"
                                 + ("" if greedy else ", the same keyed stream (env.keyed)")}
    exactness = {
        "passed": identity.get("passed", True),
        "temperature": env.temperature,
        "greedy_identity": identity,
        "monitor": {name: monitor_verdict(m) for name, m in monitors.items()},
    }
    return runs, exactness


def summarize_cells(runs: list[RequestRun], cells: list[Cell]) -> dict[str, dict]:
    """Per-cell summaries (median repeat per prompt) with speedups against plain decoding."""
    by_cell = grouped(median_runs(runs), lambda r: r.policy)
    all_by_cell = grouped(runs, lambda r: r.policy)
    ref = summarize_with_groups(by_cell[REFERENCE])
    out = {}
    for cell in cells:
        if cell.name not in by_cell:
            continue
        s = summarize_with_groups(by_cell[cell.name])
        add_speedups(s, ref)
        out[cell.name] = {
            "depth": cell.depth, "verify_size": cell.verify_size, "width": cell.width,
            **compact(s),
            "mean_verified_per_round": s["mean_verified_per_round"],
            "acceptance_by_position": s["acceptance_by_position"]["rate"],
            "noise": _noise(all_by_cell[cell.name]),
            "per_language": {k: compact(v) for k, v in s["per_language"].items()},
            "per_task": {k: compact(v) for k, v in s["per_task"].items()},
        }
    return out


def target_kernels(config: EvalConfig, target=None) -> dict | None:
    """The few-token kernel plan the grid's target ran with (``draftrl.models.kernels``)."""
    from draftrl.decoding.build import load_target

    loaded = target if target is not None else load_target(config.env)
    return loaded.kernels.to_dict() if loaded.kernels is not None else None


def add_grid_anchors(table: dict[str, dict], anchor_runs: list) -> dict | None:
    """The anchors' summary (``draftrl.eval.round.anchors.summarize_anchors``); sets every cell's
    ``speedup_vs_hf`` and ``speedup_vs_hf_lookup`` (over HF prompt lookup at its best gamma)."""
    from draftrl.eval.round.anchors import summarize_anchors

    if not anchor_runs:
        return None
    anchors = summarize_anchors(anchor_runs)
    methods, best = anchors["methods"], anchors["best_lookup"]
    assisted = ("speedup_vs_hf_assisted", "hf-assisted") if "hf-assisted" in methods else None
    for cell in table.values():
        for key, label in (("speedup_vs_hf", "hf"), ("speedup_vs_hf_lookup", best), *([assisted] if assisted else [])):
            ref = methods.get(label) if label else None
            cell[key] = (cell["tokens_per_second"] / ref["tokens_per_second"]
                         if ref and ref["tokens_per_second"] else None)
    return anchors


def best_cell(cells: dict[str, dict]) -> dict:
    name = max(cells, key=lambda n: cells[n]["tokens_per_second"])
    c = cells[name]
    return {"name": name, "depth": c["depth"], "verify_size": c["verify_size"], "width": c["width"],
            "tokens_per_second": c["tokens_per_second"], "speedup_vs_none": c["speedup_vs_none"],
            "speedup_vs_hf": c.get("speedup_vs_hf"), "speedup_vs_hf_lookup": c.get("speedup_vs_hf_lookup")}


def grid_result(config: EvalConfig, cells: list[Cell], *, target=None,
                progress: Callable[[int, int, str], None] | None = None, ranking: RankingSource | None = None,
                top_cells: int | None = None, shards=None) -> dict:
    """One workload's (one sampling class's) grid: the cells timed live (after ``ranking``), their
    summaries, the anchors, the best cell and the exactness verdict (no files). ``shards``: Ray workers
    timing the requests (``draftrl.eval.round.ray_shards.RayShards``), else this process."""
    timed, ranked = ranked_cells(config, cells, ranking, top_cells, target=target)
    anchor_runs: list = []
    if shards is not None:
        runs, exactness = shards.measure(config, timed, progress=progress, anchor_runs=anchor_runs)
    else:
        runs, exactness = measure_cells(config, timed, target=target, progress=progress, anchor_runs=anchor_runs)
    table = summarize_cells(runs, timed)
    anchors = add_grid_anchors(table, anchor_runs)
    out = {"prompts": sorted({r.prompt_id for r in runs}), "cells": table, "best": best_cell(table),
           "exactness": exactness, "anchors": anchors}
    if ranked is not None:
        out["ranking"] = ranked
    return out


def heatmap_caption(result: dict, what: str) -> str:
    """The caption of a mix's heatmap (the mix's or one class's): ``what``, then the grid's context."""
    hw = result.get("hardware", {})
    return (f"{what}; tune split, {len(result.get('prompts', []))} prompts, median of {result.get('repeats')} "
            f"interleaved repeats; drafter {result['config']['env'].get('drafter')}; "
            f"{hw.get('gpu') or hw.get('cpu') or ''}, {hw.get('threads', '?')} threads. Box = best cell.")


def run_grid(config: EvalConfig, out: str | Path, *, target=None, config_path: str | None = None,
             progress: Callable[[int, int, str], None] | None = None, ranking: RankingSource | None = None,
             top_cells: int | None = None, shards=None) -> dict:
    """Run the grid of ``config.grid`` and write ``grid.json``, the heatmap, ``sweep.yaml`` and wandb runs.

    ``shards`` (``draftrl.eval.round.ray_shards.RayShards``): the tune requests timed on Ray workers,
    each loading the target once; the files are the ones this process would write, ``hardware``
    the workers' (one device kind).

    A temperature mix (``env.temperature_mix`` with several classes) is searched at each class
    (:func:`class_config`, the same tune prompts and seeds at every class, classes one after the
    other): ``grid.json`` then has ``classes`` {label: {``sampling``, ``weight``, ``cells``, ``best``,
    ``anchors``, ``exactness``, ``prompts``}}, ``mix`` {``cells`` (:func:`mix_cells`), ``best``}, and
    ``best`` is the mix's best (what ``best-grid`` plays when no class is named); the heatmap is the
    mix's, ``grid_heatmap_<label>.png`` each class's."""
    from draftrl.eval.plots import grid_heatmap
    from draftrl.io import write_json
    from draftrl.signals.costs import hardware_info

    if ranking is None and config.grid.replay_rank:
        if not config.grid.traces:
            raise ValueError("grid.replay_rank needs grid.traces: a draftrl collect directory (greedy traces of the "
                             "tune prompts with their cost table), e.g. --set grid.traces=runs/demo/traces.")
        ranking = ReplayRanking(config.grid.traces, config.env.cost_table)
        top_cells = top_cells or config.grid.top_cells
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    cells = grid_cells(config.grid)
    classes = config.env.sampling_classes
    result = {
        "format": FORMAT,
        "split": "tune",
        "config": to_dict(config),
        "hardware": shards.hardware if shards is not None else hardware_info(config.env.device),
    }
    heatmaps = {}
    if len(classes) == 1:
        one = grid_result(class_config(config, classes[0]) if config.env.temperature_mix else config, cells,
                          target=target, progress=progress, ranking=ranking, top_cells=top_cells, shards=shards)
        result.update({"prompts": one["prompts"], "repeats": config.grid.repeats, "reference": REFERENCE,
                       "cells": one["cells"], "best": one["best"], "exactness": one["exactness"],
                       "anchors": one["anchors"]})
        if "ranking" in one:
            result["ranking"] = one["ranking"]
    else:
        per: dict[str, dict] = {}
        for c in classes:
            one = grid_result(class_config(config, c), cells, target=target, progress=progress, ranking=ranking,
                              top_cells=top_cells, shards=shards)
            per[c.label] = {"sampling": {"temperature": c.temperature, "top_k": c.top_k, "top_p": c.top_p},
                            "weight": c.weight, **one}
            heatmaps[c.label] = f"grid_heatmap_{c.label.replace(':', '_')}.png"
        mixed = mix_cells(per, {c.label: c.weight for c in classes})
        result.update({"prompts": sorted({p for c in per.values() for p in c["prompts"]}),
                       "repeats": config.grid.repeats, "reference": REFERENCE, "classes": per,
                       "mix": {"cells": mixed, "best": best_mix_cell(mixed),
                               "how": "speedup_vs_none = sum over classes of weight * the class's speedup_vs_none"},
                       "best": best_mix_cell(mixed),
                       "exactness": {"passed": all(c["exactness"]["passed"] for c in per.values()),
                                     "temperature": [c.temperature for c in classes],
                                     "per_class": {label: c["exactness"] for label, c in per.items()}}})
    result["kernels"] = shards.kernels if shards is not None else target_kernels(config, target)
    result["files"] = {"heatmap": HEATMAP_FILE, "sweep": SWEEP_FILE,
                       **{f"heatmap_{label}": name for label, name in heatmaps.items()}}
    result["wall_seconds"] = time.perf_counter() - started
    write_json(out / GRID_FILE, result)
    if "classes" in result:
        mix = " + ".join(f"{c.weight:.2f} x {c.label}" for c in classes)
        grid_heatmap({**result, "cells": result["mix"]["cells"]}, out / HEATMAP_FILE,
                     title=heatmap_caption(result, f"temperature mix {mix}: each cell's speedup is the weight-averaged "
                                                   "speedup of the classes"))
        for c in classes:
            what = (f"{c.label} (temperature {c.temperature:g}, top-k {c.top_k or 'off'}, top-p {c.top_p:g}, "
                    f"weight {c.weight:.2f})")
            grid_heatmap({**result["classes"][c.label], "config": result["config"]}, out / heatmaps[c.label],
                         title=heatmap_caption(result, what))
    else:
        grid_heatmap(result, out / HEATMAP_FILE)
    write_sweep(config, out, config_path)
    log_grid_to_wandb(config, out, result)
    for verdict in ([c["exactness"] for c in result["classes"].values()] if "classes" in result
                    else [result["exactness"]]):
        raise_first_violation(verdict["greedy_identity"])  # a low-precision violation, after the files
    return result


def write_sweep(config: EvalConfig, out: Path, config_path: str | None) -> Path:
    """``DIR/sweep.yaml``: the same grid as a wandb grid sweep of ``draftrl grid --cell`` runs."""
    import yaml

    settings = config.grid
    sweep = {
        "program": "draftrl",
        "name": f"draftrl-grid-{out.name}",
        "method": "grid",
        "metric": {"name": "speedup_vs_none", "goal": "maximize"},
        "parameters": {
            "depth": {"values": list(settings.depths)},
            "verify_size": {"values": list(settings.verify_sizes)},
            "width": {"values": list(settings.widths)},
        },
        # wandb passes the parameters as --depth=D --verify_size=V --width=W; every agent times
        # its cell interleaved with plain decoding on its own machine and logs speedup_vs_none
        # wandb agents cannot run offline runs (wandb/wandb#6234): the cells log online
        "command": ["${program}", "grid", "--config", str(config_path or "CONFIG.yaml"), "--out",
                    str(out / "sweep_cells"), "--set", "wandb.mode=online", "--cell", "${args}"],
    }
    from draftrl.io import atomic_write_text

    path = out / SWEEP_FILE
    return atomic_write_text(path,
        "# wandb sweep of the draftrl grid: `wandb sweep " + str(path) + "`, then `wandb agent ENTITY/PROJECT/ID` on\n"
        "# every machine. Speedups are measured against plain decoding on the agent's own machine.\n"
        "# The cells run with wandb.mode=online: a sweep agent's runs cannot be offline (wandb/wandb#6234).\n"
        + yaml.safe_dump(sweep, sort_keys=False)
    )


def log_grid_to_wandb(config: EvalConfig, out: Path, result: dict) -> None:
    """The grid as one wandb run (``job_type`` grid) in the pipeline's group: the table of every cell,
    the heatmap and the chosen best fixed setting (``draftrl.eval.wandb_log.log_grid``)."""
    from draftrl.config.wandb import logged_run
    from draftrl.eval.wandb_log import log_grid, log_grid_mix

    with logged_run(config.wandb, out, job_type="grid",
                    config={**result["config"], "hardware": result["hardware"]}) as run:
        if "classes" in result:
            log_grid_mix(run, result, out)
        else:
            log_grid(run, result, out / HEATMAP_FILE)


def run_cell(config: EvalConfig, out: str | Path, cell: Cell, *, target=None) -> dict:
    """A single sweep cell, timed interleaved with plain decoding; writes ``DIR/cell_<name>.json``
    and logs to the current wandb run (the sweep agent's)."""
    from draftrl.config.wandb import logged_run
    from draftrl.io import write_json

    classes = config.env.sampling_classes
    if len(classes) > 1:
        raise ValueError(f"a sweep cell times one sampling; env.temperature_mix has {[c.label for c in classes]}: run "
                         "one sweep per class (--set env.temperature_mix=null --set env.temperature=T).")
    if config.env.temperature_mix is not None:
        config = class_config(config, classes[0])
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cells = [Cell(0)] if cell.depth == 0 else [Cell(0), cell]
    runs, exactness = measure_cells(config, cells, target=target)
    table = summarize_cells(runs, cells)
    result = {"format": FORMAT + "-cell", "cell": table[cell.name], "reference": table[REFERENCE],
              "exactness": exactness, "config": to_dict(config)}
    write_json(out / f"cell_{cell.name}.json", result)
    # the agent sets the run's id; every agent's cell joins one group per sweep, whatever its machine's folder
    group = config.wandb.group or f"sweep-{os.environ.get('WANDB_SWEEP_ID', 'cells')}"
    with logged_run(dataclasses.replace(config.wandb, group=group), out, job_type="grid-cell", name=cell.name,
                    resume=False,
                    config={"depth": cell.depth, "verify_size": cell.verify_size, "width": cell.width}) as run:
        if run is not None:
            run.summary.update({k: v for k, v in table[cell.name].items() if isinstance(v, (int, float))})
    raise_first_violation(exactness["greedy_identity"])  # a low-precision violation, after the files
    return result
