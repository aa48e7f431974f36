"""Compare drafting policies on the held-out split with the real engine, interleaved per request.

Every policy decodes the same held-out requests with the same sampling seeds. For each request
all policies run back to back, in an order rotated by one per request (plain decoding always
runs before the lookahead, which reads its output), then the next request; so load on a shared
machine spreads over all policies. Policies act through their own ``draftrl/SpecDecode-v2``
env on a prebuilt engine (``draftrl.eval.round.policies``): the observation is the envs' own.

Exactness runs throughout: the streaming monitor sees every emitted token of every policy
(``--no-monitor`` turns it off), at temperature 0 every policy's output must equal plain
decoding's token for token and plain decoding must equal Hugging Face greedy ``generate`` on a
sample of requests. A failure stops the run with the evidence (``results.json`` is still
written, with ``exactness.passed = false``).

``results.json``: ``format``, ``split``, ``config``, ``hardware``, ``prompts``, ``reference``
(``none``), ``policies`` {name: {``spec``, ``tokens_per_second``, ``speedup_vs_none``,
``paired_speedup``, ``mean_tokens_per_round``, ``time_to_first_token_mean/p50``,
``itl_p50/p95/p99``, ``peak_memory_bytes``, ``tokens_per_round_histogram``,
``acceptance_by_position``, ``depth_histogram``, ``verify_size_histogram``, ``per_language``,
``per_task``, ...}}, ``best_grid`` (when a grid was given), ``exactness`` {``passed``,
``temperature``, ``sampler``, ``greedy_identity``, ``hf_reference``, ``monitor`` {name:
verdict}, ``monitor_overhead``, ``power``}, ``trajectories``, ``files``, ``wall_seconds``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from draftrl.config import SAMPLERS, to_dict
from draftrl.eval.metrics import add_speedups, grouped, median_runs, paired_speedup, summarize_with_groups
from draftrl.eval.policy_names import REFERENCE
from draftrl.eval.records import RequestRun
from draftrl.eval.round.anchors import anchor_ngram, anchors_for, run_anchor
from draftrl.eval.round.classes import CLASSES_DIR, class_dir, class_grid, class_specs, mix_policies, t0_grid_note
from draftrl.eval.round.config import EvalConfig, env_for_split
from draftrl.eval.round.rollout import run_fixed, run_policy
from draftrl.runs import WANDB_FILE

FORMAT = "draftrl-eval/1"
RESULTS_FILE = "results.json"
REPORT_FILE = "report.md"
#: what ``draftrl eval`` writes in its --out (``--overwrite`` removes these first)
OUTPUTS: tuple[str, ...] = (RESULTS_FILE, REPORT_FILE, "*.png", "classes", "wandb", WANDB_FILE)
#: Target share of the run's time spent in the exactness monitor.
MONITOR_OVERHEAD_TARGET = 0.03
ADAPTIVE = ("heuristic", "threshold", "bandit", "ppo", "lookahead")


def eval_anchors(config: EvalConfig, grid: dict | None, assisted: bool = False) -> list:
    """The anchors to time: ``hf`` and, with a grid result that timed them, only its best
    prompt-lookup gamma; else every ``eval.anchor_gammas``; ``hf-assisted`` with ``assisted`` (the
    drafter is a draft model). None when ``eval.anchors`` is off."""
    if not config.eval.anchors:
        return []
    ngram = anchor_ngram(config.env.drafter)
    best = ((grid or {}).get("anchors") or {}).get("best_lookup")
    if best:
        return anchors_for((int(best.rsplit(":", 1)[1]),), ngram, assisted)
    return anchors_for(config.eval.anchor_gammas, ngram, assisted)


def add_anchors(results: dict, runs: list[RequestRun], anchor_runs: list, references: dict[str, list[int]],
                best_fixed: str | None) -> None:
    """Put the anchors' summary in ``results["anchors"]`` and, for every policy, its speedups over
    stock HF generate and HF prompt lookup at its best gamma, with paired bootstrap intervals over
    requests (``ci_vs_none``, ``ci_vs_hf``, ``ci_vs_hf_lookup``, ``ci_vs_best_fixed``; with a draft model
    as the drafter also ``ci_vs_hf_assisted``, ``speedup_vs_hf_assisted``)."""
    from draftrl.eval.bootstrap import compare
    from draftrl.eval.round.anchors import median_anchor_runs, summarize_anchors

    kept = median_runs(runs)
    by_policy = grouped(kept, lambda r: r.policy)
    refs: dict[str, list] = {REFERENCE: by_policy.get(REFERENCE, [])}
    if best_fixed and best_fixed in by_policy:
        refs["best_fixed"] = by_policy[best_fixed]
    if anchor_runs:
        summary = summarize_anchors(anchor_runs)
        kept_anchors = grouped(median_anchor_runs(anchor_runs), lambda r: r.policy)
        for label, items in kept_anchors.items():  # sampled (T > 0) from another generator: no identity to count
            if results["exactness"]["temperature"] == 0:
                same = sum(r.token_ids == references.get(r.prompt_id) for r in items)
                summary["methods"][label]["identical_to_none"] = f"{same}/{len(items)}"
        refs["hf"] = kept_anchors.get("hf", [])
        if summary["best_lookup"]:
            refs["hf_lookup"] = kept_anchors[summary["best_lookup"]]
        if "hf-assisted" in kept_anchors:  # HF assisted generation with the run's draft model
            refs["hf_assisted"] = kept_anchors["hf-assisted"]
        results["anchors"] = summary
    for name, p in results["policies"].items():
        for ref, ref_runs in refs.items():
            if not ref_runs:
                continue
            if by_policy.get(name) is ref_runs:  # the reference itself: 1.00 by definition, no interval
                p[f"ci_vs_{ref}"] = {"ratio": 1.0, "reference": True}
                continue
            ci = compare(by_policy.get(name, []), ref_runs)
            p[f"ci_vs_{ref}"] = ci
            if ref in ("hf", "hf_lookup", "hf_assisted"):
                p[f"speedup_vs_{ref}"] = ci["ratio"]


def _order(labels: list[str], shift: int) -> list[str]:
    order = labels[shift % len(labels):] + labels[: shift % len(labels)]
    if "lookahead" in order and order.index("lookahead") < order.index(REFERENCE):
        order.remove("lookahead")
        order.insert(order.index(REFERENCE) + 1, "lookahead")
    return order


def run_eval(config: EvalConfig, out: str | Path, *, policies: list[str] | str | None = None,
             grid_path: str | Path | None = None, target=None, config_path: str | None = None,
             progress: Callable[[int, int, str], None] | None = None, shards=None) -> dict:
    """Evaluate ``policies`` (default ``config.eval.policies``) and write results.json, report.md, plots.

    A temperature mix (``env.temperature_mix``, several classes) is evaluated class by class
    (:func:`run_eval_mix`): every held-out request at every class, the envs seeded alike at every
    class, so each class's table is paired and the classes share their requests.

    ``shards`` (``draftrl.eval.round.ray_shards.RayShards``): the requests played on Ray workers (each
    loads the target once), merged into the files this process would write.

    :raises ExactnessViolation / GreedyMismatch: after writing the partial results.
    """
    import torch

    from draftrl.eval.policy_names import parse_policies
    from draftrl.eval.round.classes import class_config
    from draftrl.io import read_json, write_json

    specs = parse_policies(policies if policies is not None else list(config.eval.policies))
    grid = read_json(grid_path, "grid result (--grid)") if grid_path else None
    if any(s.kind == "best-grid" for s in specs) and grid is None:
        raise ValueError("policy best-grid needs a grid search result: pass --grid DIR/grid.json "
                         "(written by draftrl grid --config C --out DIR).")
    if config.threads:
        torch.set_num_threads(config.threads)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    classes = config.env.sampling_classes
    if len(classes) > 1:
        return run_eval_mix(config, out, specs, grid, target=target, progress=progress, shards=shards)
    started = time.perf_counter()
    one = class_config(config, classes[0]) if config.env.temperature_mix is not None else config
    if any(s.kind == "lookahead" for s in specs) and one.env.temperature != 0 and not one.env.keyed:
        raise ValueError(f"policy lookahead needs temperature 0 or keyed sampling (got temperature "
                         f"{one.env.temperature}); set env.keyed=true or drop it from --policies.")
    grid = class_grid(grid, classes[0].label)  # a mixed grid: its search at this sampling, where it has one
    results, error = evaluate_class(one, specs, grid, target=target, progress=progress, shards=shards)
    results["wall_seconds"] = time.perf_counter() - started
    results["files"] = write_outputs(results, out, grid)
    write_json(out / RESULTS_FILE, results)
    log_eval_to_wandb(config, out, results)
    if error is not None:
        raise error
    return results


def identity_checked(env_cfg, bitwise: bool) -> bool:
    """Whether every policy's output must equal plain decoding's: at temperature 0, and at temperature > 0
    with keyed sampling in float32 (``bitwise``: each position drawn from the same keyed stream:
    docs/design.md, "Keyed sampling"); in bfloat16/float16 keyed runs the monitor alone judges the law."""
    return env_cfg.temperature == 0 or (env_cfg.keyed and bitwise)


@dataclass
class Played:
    """What :func:`play_class` measured of one sampling class (in one process, or one Ray worker's
    shard of the requests): the runs and the verdicts, before any summary."""

    runs: list[RequestRun]
    anchor_runs: list
    references: dict[str, list[int]]
    """plain decoding's first-pass output per request id"""
    trajectories: dict[str, dict]
    traj_prompt: str
    monitor: dict[str, dict]
    """``monitor_verdict`` per policy label ({} with the monitor off)"""
    identity: dict
    """``GreedyAgreement.verdict()`` of the policies against plain decoding"""
    bitwise: bool
    hf: dict
    failure: dict | None
    error: Exception | None
    kernels: dict | None
    power: dict | None = None
    anchor_seeds: dict[str, int] | None = None


def evaluate_class(config: EvalConfig, specs: list, grid: dict | None, *, target=None,
                   progress: Callable[[int, int, str], None] | None = None, seed_offset: int = 0,
                   shards=None) -> tuple[dict, Exception | None]:
    """One workload of one sampling class: every policy of ``specs`` (and the anchors) on the held-out
    requests, interleaved per request, exactness throughout; the results dict (no files, no
    ``wall_seconds``) and the exactness failure that stopped it, if any. ``seed_offset`` shifts the
    envs' and the anchors' seeds (0: the seeds a single-class run uses). ``shards``
    (``draftrl.eval.round.ray_shards.RayShards``): the requests played on Ray workers, merged."""
    from draftrl.signals.costs import hardware_info

    env_cfg = env_for_split(config.env, "heldout", config.eval.limit_per_group)
    if shards is not None:
        played = shards.play(config, specs, grid, seed_offset=seed_offset, progress=progress)
    else:
        played = play_class(config, specs, grid, target=target, progress=progress, seed_offset=seed_offset)
    results = _results(config, specs, played.runs, grid, env_cfg, played.monitor, played.references, played.hf,
                       played.failure, played.identity, played.bitwise)
    labels = [s.label for s in specs]
    add_anchors(results, played.runs, played.anchor_runs, played.references,
                best_fixed="best-grid" if "best-grid" in labels else None)
    results["hardware"] = shards.hardware if shards is not None else hardware_info(env_cfg.device)
    results["kernels"] = played.kernels
    results["trajectories"] = {"prompt_id": played.traj_prompt, "policies": played.trajectories}
    if played.power is not None:
        results["exactness"]["power"] = played.power
    if played.anchor_seeds is not None:
        results["anchor_seeds"] = played.anchor_seeds  # torch.manual_seed of each request's sampled anchors
    return results, played.error


def play_class(config: EvalConfig, specs: list, grid: dict | None, *, target=None,
               progress: Callable[[int, int, str], None] | None = None, seed_offset: int = 0,
               prompt_ids: Sequence[str] | None = None) -> Played:
    """Play :func:`evaluate_class`'s requests (default all held-out requests; ``prompt_ids``: a Ray
    worker's shard, anchors seeded by each request's index in the whole split) and check exactness."""
    from draftrl.decoding.build import build_engine, load_target
    from draftrl.decoding.monitor import ExactnessMonitor, ExactnessViolation
    from draftrl.decoding.workload import Workload
    from draftrl.eval.agreement import GreedyAgreement
    from draftrl.eval.exactness import GreedyMismatch, TimedMonitor, hf_greedy, monitor_verdict
    from draftrl.eval.round.anchors import assistant_of
    from draftrl.eval.round.policies import build_policy

    settings = config.eval
    env_cfg = env_for_split(config.env, "heldout", settings.limit_per_group)
    mine = set(prompt_ids) if prompt_ids is not None else None

    target = target if target is not None else load_target(env_cfg)
    references: dict[str, list[int]] = {}
    built = {s.label: build_policy(s, env_cfg, target, grid=grid, references=references) for s in specs}
    for env, _ in built.values():
        env.unwrapped.engine.config.sampler = settings.sampler
        env.unwrapped.engine.config.token_stats = settings.monitor  # the envs run no monitor: this one does
    labels = [s.label for s in specs]
    prompts = [p.id for p in built[REFERENCE][0].unwrapped.workload.prompts]
    reference_env = built[REFERENCE][0].unwrapped
    sampling = reference_env.engine.config.sampling  # the anchors sample as the engine does (greedy at 0)
    assistant = assistant_of(reference_env.engine) or next(
        (a for a in (assistant_of(env.unwrapped.engine) for env, _ in built.values()) if a is not None), None)
    anchors = {a.label: a for a in eval_anchors(config, grid, assisted=assistant is not None)}
    anchor_seeds = {p: (config.seed + seed_offset) * 100_003 + i for i, p in enumerate(prompts)}
    traj_prompt = prompts[0]
    greedy_checked = prompts[: settings.greedy_reference]
    position = {p: i for i, p in enumerate(prompts)}  # the order of the policies follows the whole split's
    if mine is not None:
        prompts = [p for p in prompts if p in mine]

    # untimed warm-up of the shared model: plain and drafted rounds on a spare engine
    warm_engine, tokenizer = build_engine(env_cfg, target, token_stats=settings.monitor)
    warm = Workload(env_cfg, tokenizer).request(0)
    warm = type(warm)(warm.prompt, warm.prompt_ids, min(8, warm.max_new_tokens))
    for depth in sorted({0, max(env_cfg.depths)}):
        run_fixed(warm_engine, warm, depth if warm_engine.drafter is not None else 0, 0, env_cfg.width, seed=0,
                  label="warmup", device=env_cfg.device)
    for anchor in anchors.values():
        run_anchor(target.model, anchor, warm, eos_token_ids=sorted(warm_engine.eos_token_ids), device=env_cfg.device,
                   sampling=sampling, assistant=assistant)

    monitors = {label: TimedMonitor(ExactnessMonitor()) for label in labels} if settings.monitor else {}
    # temperature 0: float32 demands bitwise identity with plain decoding; bfloat16/float16 a rate with near-ties
    agreement = GreedyAgreement(target.model, env_cfg.dtype, settings.near_tie_ulps, tokenizer=tokenizer)
    hf_agreement = GreedyAgreement(target.model, env_cfg.dtype, settings.near_tie_ulps, tokenizer=tokenizer)
    trajectories: dict[str, dict] = {}
    adaptive = {s.label for s in specs if s.kind in ADAPTIVE}
    runs: list[RequestRun] = []
    anchor_runs: list = []
    seeded: set[str] = set()
    failure: dict | None = None
    error: Exception | None = None
    total, done = settings.repeats * len(prompts) * (len(labels) + len(anchors)), 0
    try:
        for repeat in range(settings.repeats):
            for prompt_id in prompts:
                for label in _order(labels + list(anchors), position[prompt_id] + repeat * len(position)):
                    if label in anchors:
                        request = reference_env.workload.request(reference_env.workload.index_of(prompt_id))
                        anchor_runs.append(run_anchor(target.model, anchors[label], request, repeat=repeat,
                                                      eos_token_ids=sorted(reference_env.engine.eos_token_ids),
                                                      device=env_cfg.device, sampling=sampling,
                                                      seed=anchor_seeds[prompt_id], assistant=assistant))
                        done += 1
                        if progress:
                            progress(done, total, f"{label} {prompt_id}")
                        continue
                    env, policy = built[label]
                    record = None
                    if repeat == 0 and prompt_id == traj_prompt and built[label][1].name in adaptive:
                        record = trajectories.setdefault(label, {"depth": [], "verify_size": [], "tokens": []})
                    on_round = None if record is None else (lambda info, r=record: (
                        r["depth"].append(int(info["depth"])), r["verify_size"].append(int(info.get("verify_size", 0))),
                        r["tokens"].append(int(info["num_emitted"]))))
                    try:
                        run = run_policy(env, policy, prompt_id, label=label, repeat=repeat,
                                         seed=None if label in seeded else config.seed + seed_offset,
                                         monitor=monitors.get(label),
                                         device=env_cfg.device, on_round=on_round)
                    except ExactnessViolation as err:  # say whose stream failed
                        err.policy, err.prompt_id = label, prompt_id
                        err.args = (f"policy {label} on request {prompt_id} (pass {repeat + 1}): {err}",)
                        raise
                    seeded.add(label)
                    runs.append(run)
                    if label == REFERENCE and repeat == 0:
                        references[prompt_id] = run.token_ids
                    done += 1
                    if progress:
                        progress(done, total, f"{label} {prompt_id}")
                # every policy of this request against plain decoding (low precision: once, the rates count requests);
                # at T > 0 with keyed sampling every policy draws from plain decoding's keyed stream (float32 only)
                if identity_checked(env_cfg, agreement.bitwise) and (repeat == 0 or agreement.bitwise):
                    request = reference_env.workload.request(reference_env.workload.index_of(prompt_id))
                    for run in runs[-len(labels):]:
                        if run.policy != REFERENCE:
                            agreement.compare(run.policy, prompt_id, request.prompt_ids, references[prompt_id],
                                              run.token_ids, what=f"policy {run.policy}")
        hf = {"checked": 0}
        if env_cfg.temperature == 0 and settings.greedy_reference:
            for prompt_id in [p for p in greedy_checked if p in prompts]:
                request = reference_env.workload.request(reference_env.workload.index_of(prompt_id))
                ref = hf_greedy(target.model, request.prompt_ids, request.max_new_tokens,
                                sorted(reference_env.engine.eos_token_ids))
                hf_agreement.compare("none", prompt_id, request.prompt_ids, ref, references[prompt_id],
                                     what="plain decoding (none) vs Hugging Face generate(do_sample=False)")
                hf["checked"] += 1
            hf.update({**hf_agreement.verdict(), "checked": hf["checked"]})
    except (ExactnessViolation, GreedyMismatch) as err:
        error = err
        failure = {"error": type(err).__name__, "message": str(err),
                   "evidence": getattr(err, "evidence", None) or getattr(err, "failures", None)}
        hf = {"checked": 0, "skipped": "stopped at the first exactness failure"}

    power = None
    if settings.power_tokens and failure is None and (mine is None or traj_prompt in mine):  # once: the first shard
        from draftrl.eval.exactness import monitor_power

        power = monitor_power(target, settings.power_tokens, seed=config.seed)
    return Played(runs=runs, anchor_runs=anchor_runs, references=references, trajectories=trajectories,
                  traj_prompt=traj_prompt, monitor={label: monitor_verdict(m) for label, m in monitors.items()},
                  identity=agreement.verdict(), bitwise=agreement.bitwise, hf=hf, failure=failure, error=error,
                  kernels=target.kernels.to_dict() if target.kernels is not None else None, power=power,
                  anchor_seeds=anchor_seeds if anchors and sampling.temperature > 0 else None)


def run_eval_mix(config: EvalConfig, out: Path, specs: list, grid: dict | None, *, target=None,
                 progress: Callable[[int, int, str], None] | None = None, shards=None) -> dict:
    """A temperature mix, class by class (:func:`evaluate_class` on :func:`~draftrl.eval.round.classes.class_config`):
    every held-out request at every class with the same seeds (so every class's table is paired, and
    the classes share requests), the policies of :func:`class_specs`, ``best-grid`` the class's own
    search (:func:`class_grid`); then the mix (:func:`mix_policies`). Writes each class's report and
    plots to ``DIR/classes/<label>/`` and, in ``DIR``, results.json (``classes`` {label: {``sampling``,
    ``weight``, the single-class results}}, ``mix``, ``exactness`` over all classes) and report.md."""
    from draftrl.config import to_dict
    from draftrl.decoding.build import load_target
    from draftrl.eval.round.classes import class_config
    from draftrl.io import write_json
    from draftrl.signals.costs import hardware_info

    started = time.perf_counter()
    env = config.env
    if shards is None:
        target = target if target is not None else load_target(env)
    per: dict[str, dict] = {}
    error: Exception | None = None
    for c in env.sampling_classes:
        one, cgrid = class_config(config, c), class_grid(grid, c.label)
        cspecs = class_specs(specs, c, grid, keyed=env.keyed)
        results, error = evaluate_class(one, cspecs, cgrid, target=target, progress=progress, shards=shards)
        results["t0_grid"] = t0_grid_note(grid, c, [s.label for s in cspecs])
        folder = out / CLASSES_DIR / class_dir(c.label)
        folder.mkdir(parents=True, exist_ok=True)
        results["files"] = write_outputs(results, folder, cgrid)
        per[c.label] = {"sampling": {"temperature": c.temperature, "top_k": c.top_k, "top_p": c.top_p},
                        "weight": c.weight, "seed": config.seed, **results}
        if error is not None:  # stop at the first exactness failure, the classes so far written
            break
    overhead = [c["exactness"]["monitor_overhead"] for c in per.values()]
    run_seconds = sum(o["run_seconds"] for o in overhead)
    results = {
        "format": FORMAT,
        "split": "heldout",
        "config": to_dict(config),
        "hardware": shards.hardware if shards is not None else hardware_info(env.device),
        "prompts": sorted({p for c in per.values() for p in c["prompts"]}),
        "repeats": config.eval.repeats,
        "reference": REFERENCE,
        "classes": per,
        "mix": {"weights": {label: c["weight"] for label, c in per.items()}, "policies": mix_policies(per),
                "how": "each ratio = sum over classes of weight * the class's ratio (classes timed apart)"},
        "exactness": {
            "passed": error is None and all(c["exactness"]["passed"] for c in per.values()),
            "temperature": [c["sampling"]["temperature"] for c in per.values()],
            "sampler": config.eval.sampler,
            "greedy_identity": next((c["exactness"]["greedy_identity"] for c in per.values()
                                     if c["sampling"]["temperature"] == 0),
                                    {"checked": False, "why": "no greedy class"}),
            "hf_reference": next((c["exactness"]["hf_reference"] for c in per.values()
                                  if c["sampling"]["temperature"] == 0), {"checked": 0}),
            "monitor_overhead": {"fraction": sum(o["seconds"] for o in overhead) / run_seconds if run_seconds else None,
                                 "seconds": sum(o["seconds"] for o in overhead), "run_seconds": run_seconds,
                                 "target": MONITOR_OVERHEAD_TARGET},
            "per_class": {label: c["exactness"] for label, c in per.items()},
        },
    }
    if grid is not None:
        results["best_grid"] = grid["best"]
    results["wall_seconds"] = time.perf_counter() - started
    results["files"] = write_mix_outputs(results, out)
    write_json(out / RESULTS_FILE, results)
    log_eval_to_wandb(config, out, results)
    if error is not None:
        raise error
    return results


def write_mix_outputs(results: dict, out: Path) -> dict[str, str]:
    """report.md of a temperature mix (:func:`draftrl.eval.report.render_mix_report`); returns {what: file name}."""
    from draftrl.eval.report import render_mix_report
    from draftrl.io import atomic_write_text

    files = {"report": REPORT_FILE, "results": RESULTS_FILE,
             **{f"class_{label}": f"{CLASSES_DIR}/{class_dir(label)}" for label in results["classes"]}}
    atomic_write_text(out / REPORT_FILE, render_mix_report(results))
    return files


def _results(config, specs, runs, grid, env_cfg, verdicts, references, hf, failure, identity_verdict,
             bitwise) -> dict:
    kept = median_runs(runs)
    by_policy = grouped(kept, lambda r: r.policy)
    reference = summarize_with_groups(by_policy[REFERENCE]) if REFERENCE in by_policy else None
    table = {}
    for spec in specs:
        if spec.label not in by_policy:
            continue
        s = summarize_with_groups(by_policy[spec.label])
        if reference is not None:
            add_speedups(s, reference)
            s["paired_speedup"] = paired_speedup(by_policy[spec.label], by_policy[REFERENCE])
        s["spec"] = spec.text
        table[spec.label] = s
    monitor_seconds = sum(r.monitor_seconds for r in runs)
    run_seconds = sum(r.total_seconds for r in runs)
    identity = {"checked": False, "why": "temperature > 0: the monitor checks the distribution instead (env.keyed "
                                         "in float32 checks token identity too)"}
    if identity_checked(env_cfg, bitwise):
        verdict = identity_verdict
        identity = {**verdict, "passed": failure is None and verdict["passed"], "requests": len(references),
                    "policies": [s.label for s in specs if s.label != REFERENCE],
                    "reference": "plain decoding (none, depth 0) on the same requests"
                                 + ("" if env_cfg.temperature == 0 else ", the same keyed stream (env.keyed)")}
    exactness = {
        "passed": failure is None and all(v["passed"] for v in verdicts.values()),
        "temperature": env_cfg.temperature,
        "sampler": config.eval.sampler,
        "greedy_identity": identity,
        "hf_reference": hf,
        "monitor": verdicts if verdicts else {"enabled": False},
        "monitor_overhead": {
            "fraction": monitor_seconds / run_seconds if run_seconds > 0 else None,
            "seconds": monitor_seconds,
            "run_seconds": run_seconds,
            "target": MONITOR_OVERHEAD_TARGET,
            "note": "at temperature 0 every emitted token has p = 1 and the monitor skips it; see power.correct "
                    "for the overhead at a temperature where it tests every token" if env_cfg.temperature == 0 else "",
        },
    }
    if failure is not None:
        exactness["failure"] = failure
    if grid is not None and grid.get("exactness", {}).get("greedy_identity", {}).get("checked"):
        exactness["grid_greedy_identity"] = grid["exactness"]["greedy_identity"]  # the tune split's verdict
    out = {
        "format": FORMAT,
        "split": "heldout",
        "config": to_dict(config),
        "prompts": sorted({r.prompt_id for r in runs}),
        "repeats": config.eval.repeats,
        "reference": REFERENCE,
        "policies": table,
        "exactness": exactness,
    }
    if grid is not None:
        out["best_grid"] = grid["best"]
    return out


def write_outputs(results: dict, out: Path, grid: dict | None) -> dict[str, str]:
    """The plots and report.md; returns {what: file name}."""
    from draftrl.eval import plots
    from draftrl.eval.report import render_report
    from draftrl.io import atomic_write_text

    files: dict[str, str] = {}
    if grid is not None:
        plots.grid_heatmap(grid, out / "grid_heatmap.png")
        files["grid_heatmap"] = "grid_heatmap.png"
    traj = results.get("trajectories", {}).get("policies", {})
    if traj:
        plots.policy_trajectory(traj, out / "trajectory.png", results["trajectories"]["prompt_id"])
        files["trajectory"] = "trajectory.png"
    if plots.speedup_bars(results, out / "speedup_vs_best_fixed.png") is not None:
        files["speedup_vs_best_fixed"] = "speedup_vs_best_fixed.png"
    hists = {name: p["tokens_per_round_histogram"] for name, p in results["policies"].items()
             if p.get("tokens_per_round_histogram")}
    if hists:
        plots.acceptance_histograms(hists, out / "acceptance_hist.png")
        files["acceptance_hist"] = "acceptance_hist.png"
    monitor = results["exactness"]["monitor"]
    pooled = [v["pit_histogram"] for v in monitor.values() if isinstance(v, dict) and "pit_histogram" in v]
    temperature = results["exactness"]["temperature"]
    pit = {f"evaluation (temperature {temperature:g}), all policies": np.sum(pooled, axis=0).tolist()} if pooled else {}
    power = results["exactness"].get("power")
    if power:
        for sampler in SAMPLERS:
            if sampler in power:
                pit[f"power run (temperature {power['setting']['temperature']:g}), {sampler}"] = \
                    power[sampler]["pit_histogram"]
    plots.pit_histogram(pit, out / "pit_hist.png")
    files["pit_hist"] = "pit_hist.png"
    files["report"] = REPORT_FILE
    files["results"] = RESULTS_FILE
    atomic_write_text(out / REPORT_FILE, render_report(results, files))
    return files


def log_eval_to_wandb(config: EvalConfig, out: Path, results: dict) -> None:
    """One wandb run (``job_type`` eval) in the pipeline's group: every policy's summary scalars
    against plain decoding, the best fixed setting and the HF anchors with their intervals, the bar
    chart, per-language and per-task tables, the exactness verdict and its table
    (``draftrl.eval.wandb_log.log_eval``). A failed exactness check ends the run failed (exit code 3)."""
    from draftrl.config.wandb import EXACTNESS_FAILED, logged_run
    from draftrl.eval.wandb_log import log_eval, log_eval_mix

    with logged_run(config.wandb, out, job_type="eval", code=0 if results["exactness"]["passed"] else EXACTNESS_FAILED,
                    config={**results["config"], "hardware": results.get("hardware"),
                            "best_grid": results.get("best_grid")}) as run:
        if "classes" in results:
            log_eval_mix(run, results, out)
        else:
            log_eval(run, results, out)
