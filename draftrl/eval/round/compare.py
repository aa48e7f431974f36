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
from collections.abc import Callable
from pathlib import Path

import numpy as np

from draftrl.config import SAMPLERS, to_dict
from draftrl.eval.metrics import add_speedups, grouped, median_runs, paired_speedup, summarize_with_groups
from draftrl.eval.policy_names import REFERENCE
from draftrl.eval.records import RequestRun
from draftrl.eval.round.anchors import anchor_ngram, anchors_for, run_anchor
from draftrl.eval.round.config import EvalConfig, env_for_split
from draftrl.eval.round.rollout import run_fixed, run_policy
from draftrl.runs import WANDB_FILE

FORMAT = "draftrl-eval/1"
RESULTS_FILE = "results.json"
REPORT_FILE = "report.md"
#: what ``draftrl eval`` writes in its --out (``--overwrite`` removes these first)
OUTPUTS: tuple[str, ...] = (RESULTS_FILE, REPORT_FILE, "*.png", "wandb", WANDB_FILE)
#: Target share of the run's time spent in the exactness monitor.
MONITOR_OVERHEAD_TARGET = 0.03
ADAPTIVE = ("heuristic", "threshold", "bandit", "ppo", "lookahead")


def eval_anchors(config: EvalConfig, grid: dict | None) -> list:
    """The anchors to time: ``hf`` and, with a grid result that timed them, only its best
    prompt-lookup gamma; else every ``eval.anchor_gammas``. None when ``eval.anchors`` is off."""
    if not config.eval.anchors:
        return []
    ngram = anchor_ngram(config.env.drafter)
    best = ((grid or {}).get("anchors") or {}).get("best_lookup")
    if best:
        return anchors_for((int(best.rsplit(":", 1)[1]),), ngram)
    return anchors_for(config.eval.anchor_gammas, ngram)


def add_anchors(results: dict, runs: list[RequestRun], anchor_runs: list, references: dict[str, list[int]],
                best_fixed: str | None) -> None:
    """Put the anchors' summary in ``results["anchors"]`` and, for every policy, its speedups over
    stock HF generate and HF prompt lookup at its best gamma, with paired bootstrap intervals over
    requests (``ci_vs_none``, ``ci_vs_hf``, ``ci_vs_hf_lookup``, ``ci_vs_best_fixed``)."""
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
        for label, items in kept_anchors.items():
            same = sum(r.token_ids == references.get(r.prompt_id) for r in items)
            summary["methods"][label]["identical_to_none"] = f"{same}/{len(items)}"
        refs["hf"] = kept_anchors.get("hf", [])
        if summary["best_lookup"]:
            refs["hf_lookup"] = kept_anchors[summary["best_lookup"]]
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
            if ref in ("hf", "hf_lookup"):
                p[f"speedup_vs_{ref}"] = ci["ratio"]


def _order(labels: list[str], shift: int) -> list[str]:
    order = labels[shift % len(labels):] + labels[: shift % len(labels)]
    if "lookahead" in order and order.index("lookahead") < order.index(REFERENCE):
        order.remove("lookahead")
        order.insert(order.index(REFERENCE) + 1, "lookahead")
    return order


def run_eval(config: EvalConfig, out: str | Path, *, policies: list[str] | str | None = None,
             grid_path: str | Path | None = None, target=None, config_path: str | None = None,
             progress: Callable[[int, int, str], None] | None = None) -> dict:
    """Evaluate ``policies`` (default ``config.eval.policies``) and write results.json, report.md, plots.

    :raises ExactnessViolation / GreedyMismatch: after writing the partial results.
    """
    import torch

    from draftrl.decoding.build import build_engine, load_target
    from draftrl.decoding.monitor import ExactnessMonitor, ExactnessViolation
    from draftrl.decoding.workload import Workload
    from draftrl.eval.agreement import GreedyAgreement
    from draftrl.eval.exactness import GreedyMismatch, TimedMonitor, hf_greedy
    from draftrl.eval.policy_names import parse_policies
    from draftrl.eval.round.policies import build_policy
    from draftrl.io import read_json, write_json
    from draftrl.signals.costs import hardware_info

    specs = parse_policies(policies if policies is not None else list(config.eval.policies))
    grid = read_json(grid_path, "grid result (--grid)") if grid_path else None
    if any(s.kind == "best-grid" for s in specs) and grid is None:
        raise ValueError("policy best-grid needs a grid search result: pass --grid DIR/grid.json "
                         "(written by draftrl grid --config C --out DIR).")
    settings = config.eval
    env_cfg = env_for_split(config.env, "heldout", settings.limit_per_group)
    if any(s.kind == "lookahead" for s in specs) and env_cfg.temperature != 0:
        raise ValueError(f"policy lookahead needs temperature 0 (got {env_cfg.temperature}); drop it from --policies.")
    if config.threads:
        torch.set_num_threads(config.threads)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    target = target if target is not None else load_target(env_cfg)
    references: dict[str, list[int]] = {}
    built = {s.label: build_policy(s, env_cfg, target, grid=grid, references=references) for s in specs}
    for env, _ in built.values():
        env.unwrapped.engine.config.sampler = settings.sampler
        env.unwrapped.engine.config.token_stats = settings.monitor  # the envs run no monitor: this one does
    labels = [s.label for s in specs]
    prompts = [p.id for p in built[REFERENCE][0].unwrapped.workload.prompts]
    anchors = {a.label: a for a in eval_anchors(config, grid)} if env_cfg.temperature == 0 else {}
    reference_env = built[REFERENCE][0].unwrapped

    # untimed warm-up of the shared model: plain and drafted rounds on a spare engine
    warm_engine, tokenizer = build_engine(env_cfg, target, token_stats=settings.monitor)
    warm = Workload(env_cfg, tokenizer).request(0)
    warm = type(warm)(warm.prompt, warm.prompt_ids, min(8, warm.max_new_tokens))
    for depth in sorted({0, max(env_cfg.depths)}):
        run_fixed(warm_engine, warm, depth if warm_engine.drafter is not None else 0, 0, env_cfg.width, seed=0,
                  label="warmup", device=env_cfg.device)
    for anchor in anchors.values():
        run_anchor(target.model, anchor, warm, eos_token_ids=sorted(warm_engine.eos_token_ids), device=env_cfg.device)

    monitors = {label: TimedMonitor(ExactnessMonitor()) for label in labels} if settings.monitor else {}
    # temperature 0: float32 demands bitwise identity with plain decoding; bfloat16/float16 a rate with near-ties
    agreement = GreedyAgreement(target.model, env_cfg.dtype, settings.near_tie_ulps, tokenizer=tokenizer)
    hf_agreement = GreedyAgreement(target.model, env_cfg.dtype, settings.near_tie_ulps, tokenizer=tokenizer)
    trajectories: dict[str, dict] = {}
    traj_prompt = prompts[0]
    adaptive = {s.label for s in specs if s.kind in ADAPTIVE}
    runs: list[RequestRun] = []
    anchor_runs: list = []
    seeded: set[str] = set()
    failure: dict | None = None
    error: Exception | None = None
    total, done = settings.repeats * len(prompts) * (len(labels) + len(anchors)), 0
    try:
        for repeat in range(settings.repeats):
            for i, prompt_id in enumerate(prompts):
                for label in _order(labels + list(anchors), i + repeat * len(prompts)):
                    if label in anchors:
                        request = reference_env.workload.request(reference_env.workload.index_of(prompt_id))
                        anchor_runs.append(run_anchor(target.model, anchors[label], request, repeat=repeat,
                                                      eos_token_ids=sorted(reference_env.engine.eos_token_ids),
                                                      device=env_cfg.device))
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
                                         seed=None if label in seeded else config.seed, monitor=monitors.get(label),
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
                # every policy of this request against plain decoding (low precision: once, the rates count requests)
                if env_cfg.temperature == 0 and (repeat == 0 or agreement.bitwise):
                    request = reference_env.workload.request(reference_env.workload.index_of(prompt_id))
                    for run in runs[-len(labels):]:
                        if run.policy != REFERENCE:
                            agreement.compare(run.policy, prompt_id, request.prompt_ids, references[prompt_id],
                                              run.token_ids, what=f"policy {run.policy}")
        hf = {"checked": 0}
        if env_cfg.temperature == 0 and settings.greedy_reference:
            for prompt_id in prompts[: settings.greedy_reference]:
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

    results = _results(config, specs, runs, grid, env_cfg, monitors, references, hf, failure, agreement)
    add_anchors(results, runs, anchor_runs, references, best_fixed="best-grid" if "best-grid" in labels else None)
    results["hardware"] = hardware_info(env_cfg.device)
    results["kernels"] = target.kernels.to_dict() if target.kernels is not None else None
    results["trajectories"] = {"prompt_id": traj_prompt, "policies": trajectories}
    if settings.power_tokens and failure is None:
        from draftrl.eval.exactness import monitor_power

        results["exactness"]["power"] = monitor_power(target, settings.power_tokens, seed=config.seed)
    results["wall_seconds"] = time.perf_counter() - started
    results["files"] = write_outputs(results, out, grid)
    write_json(out / RESULTS_FILE, results)
    log_eval_to_wandb(config, out, results)
    if error is not None:
        raise error
    return results


def _results(config, specs, runs, grid, env_cfg, monitors, references, hf, failure, agreement) -> dict:
    from draftrl.eval.exactness import monitor_verdict

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
    identity = {"checked": False, "why": "temperature > 0: the monitor checks the distribution instead"}
    if env_cfg.temperature == 0:
        verdict = agreement.verdict()
        identity = {**verdict, "passed": failure is None and verdict["passed"], "requests": len(references),
                    "policies": [s.label for s in specs if s.label != REFERENCE],
                    "reference": "plain decoding (none, depth 0) on the same requests"}
    verdicts = {label: monitor_verdict(m) for label, m in monitors.items()}
    exactness = {
        "passed": failure is None and all(v["passed"] for v in verdicts.values()),
        "temperature": env_cfg.temperature,
        "sampler": config.eval.sampler,
        "greedy_identity": identity,
        "hf_reference": hf,
        "monitor": verdicts if monitors else {"enabled": False},
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
    from draftrl.eval.wandb_log import log_eval

    with logged_run(config.wandb, out, job_type="eval", code=0 if results["exactness"]["passed"] else EXACTNESS_FAILED,
                    config={**results["config"], "hardware": results.get("hardware"),
                            "best_grid": results.get("best_grid")}) as run:
        log_eval(run, results, out)
