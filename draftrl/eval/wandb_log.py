"""What each step of a pipeline logs to its wandb run: the key names docs/eval.md lists.

The runs themselves are opened by :func:`draftrl.config.wandb.start_run` (one group per pipeline,
``job_type`` the step, offline by default); every function here takes such a run, or None when
wandb is disabled, and logs everything in one ``run.log`` call (tables, charts, images) plus the
run's summary (the scalars the group's runs table shows side by side).

- grid (:func:`log_grid`): table ``grid/cells``, ``grid/per_task``, image ``grid/heatmap``,
  summary ``best/*`` (the chosen fixed setting);
- eval (:func:`log_eval`): summary ``policy/<name>/<metric>`` (:func:`policy_scalars`), tables
  ``compare/policies``, ``compare/per_language``, ``compare/per_task``, ``exactness/checks``, the
  bar chart ``compare/speedup_vs_best_fixed`` (intervals drawn), the plots under ``plots/``;
- serving sweep (:func:`log_sweep`): line plots ``sweep/speedup_vs_none`` (vLLM) and
  ``sweep/replay_speedup_vs_none`` against the arrival rate, one table per load (``sweep/rate_<r>``);
- calibrate, collect, dsd: :func:`log_calibration`, :func:`log_traces`, :func:`log_vllm_calibration`,
  :func:`log_recordings`, :func:`log_dsd`.

``<name>`` is the policy's label (``none``, ``best-grid``, ``ppo[ppo_size]``, ...) with ``/`` and
``.`` written ``_`` (:func:`key_part`), since ``/`` separates the parts of a key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: The references every policy is compared with: ``speedup_vs_<ref>`` and the ``ci_vs_<ref>`` field of results.json.
REFERENCES: tuple[str, ...] = ("none", "best_fixed", "hf", "hf_lookup", "hf_assisted")


def key_part(text: str) -> str:
    """``text`` as one part of a wandb key: ``/`` and ``.`` become ``_`` (``rate 0.5`` -> ``0_5``)."""
    return str(text).replace("/", "_").replace(".", "_")


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def _table(columns: list[str], rows: list[list[Any]]) -> Any:
    import wandb

    return wandb.Table(columns=columns, data=rows)


def _images(images: dict[str, Path]) -> dict[str, Any]:
    import wandb

    return {key: wandb.Image(str(path)) for key, path in images.items() if path is not None and Path(path).is_file()}


def _summary(run: Any, values: dict[str, Any]) -> None:
    run.summary.update({k: v for k, v in values.items() if v is not None})


# ----------------------------------------------------------------------------- grid
GRID_COLUMNS = ["cell", "depth", "verify_size", "width", "drafter", "tokens_per_second", "speedup_vs_none",
                "speedup_vs_hf", "speedup_vs_hf_lookup", "acceptance_length", "noise", "itl_p50_ms", "itl_p99_ms"]


def log_grid(run: Any, result: dict, heatmap: Path | None = None, prefix: str = "") -> None:
    """The grid as one run: every cell in ``grid/cells`` (acceptance length = mean tokens per round,
    the bonus or recovered token included), per task in ``grid/per_task``, the heatmap, and the
    chosen best fixed setting in the summary (``best/name``, ``best/speedup_vs_none``, ...).
    ``prefix`` goes before every key (``class/T0_7/`` for one class of a temperature mix)."""
    if run is None:
        return
    drafter = (result.get("config") or {}).get("env", {}).get("drafter")
    cells = result["cells"]
    rows = [[name, c["depth"], c["verify_size"], c["width"], drafter if c["depth"] else "none",
             c["tokens_per_second"], c["speedup_vs_none"], c.get("speedup_vs_hf"), c.get("speedup_vs_hf_lookup"),
             c["mean_tokens_per_round"], c.get("noise"), _ms(c.get("itl_p50")), _ms(c.get("itl_p99"))]
            for name, c in cells.items()]
    task_rows = [[name, task, s["tokens_per_second"], s.get("speedup_vs_none"), s.get("mean_tokens_per_round")]
                 for name, c in cells.items() for task, s in c.get("per_task", {}).items()]
    run.log({f"{prefix}grid/cells": _table(GRID_COLUMNS, rows),
             f"{prefix}grid/per_task": _table(["cell", "task", "tokens_per_second", "speedup_vs_none",
                                               "acceptance_length"], task_rows),
             **_images({f"{prefix}grid/heatmap": heatmap})})
    best = result["best"]
    _summary(run, {f"{prefix}{k}": v for k, v in {
        **{f"best/{k}": best.get(k) for k in ("name", "depth", "verify_size", "width", "tokens_per_second",
                                              "speedup_vs_none", "speedup_vs_hf", "speedup_vs_hf_lookup")},
        "best/drafter": drafter, "best/acceptance_length": cells[best["name"]]["mean_tokens_per_round"],
        "num_cells": len(cells), "num_requests": len(result.get("prompts", [])),
        "exactness/passed": result.get("exactness", {}).get("passed"),
        **{f"anchor/{key_part(label)}/tokens_per_second": m.get("tokens_per_second")
           for label, m in ((result.get("anchors") or {}).get("methods") or {}).items()},
    }.items()})


def log_grid_mix(run: Any, result: dict, out: Path) -> None:
    """A temperature mix's grid (``grid.json`` with ``classes``): each class as :func:`log_grid` under
    ``class/<label>/`` (its heatmap ``class/<label>/grid/heatmap``), the mix in ``grid/mix`` (table:
    ``cell``, ``speedup_vs_none`` (weighted), one column per class) and ``grid/heatmap``, and the
    mix's best in the summary ``best/*`` (``best/<label>/speedup_vs_none`` per class)."""
    if run is None:
        return
    files = result.get("files", {})
    for label, c in result["classes"].items():
        heatmap = files.get(f"heatmap_{label}")
        log_grid(run, {**c, "config": result.get("config")}, out / heatmap if heatmap else None,
                 prefix=f"class/{key_part(label)}/")
    labels = list(result["classes"])
    rows = [[name, c["speedup_vs_none"], *[c["per_class"].get(label) for label in labels]]
            for name, c in result["mix"]["cells"].items()]
    run.log({"grid/mix": _table(["cell", "speedup_vs_none", *labels], rows),
             **_images({"grid/heatmap": out / files["heatmap"] if files.get("heatmap") else None})})
    best = result["mix"]["best"]
    _summary(run, {**{f"best/{k}": best.get(k) for k in ("name", "depth", "verify_size", "width", "speedup_vs_none")},
                   **{f"best/{key_part(label)}/speedup_vs_none": v for label, v in best["per_class"].items()},
                   "num_classes": len(labels), "exactness/passed": result["exactness"]["passed"]})


# ----------------------------------------------------------------------------- eval
def policy_scalars(name: str, p: dict) -> dict[str, float | str]:
    """``policy/<name>/<metric>`` for one policy of results.json: ``tokens_per_second``,
    ``speedup_vs_<ref>`` for each of :data:`REFERENCES` with ``speedup_vs_<ref>_low`` /
    ``_high`` (the paired bootstrap 95% interval's ends; the reference itself: 1.0 and 1.0) and
    ``_verdict`` (faster / slower / not resolved), ``acceptance_length``, ``ttft_mean_ms``,
    ``itl_p50_ms``, ``itl_p99_ms``, ``peak_memory_mb``. Missing values are left out."""
    k = f"policy/{key_part(name)}"
    out: dict[str, Any] = {
        f"{k}/tokens_per_second": p.get("tokens_per_second"),
        f"{k}/acceptance_length": p.get("mean_tokens_per_round"),
        f"{k}/ttft_mean_ms": _ms(p.get("time_to_first_token_mean")),
        f"{k}/itl_p50_ms": _ms(p.get("itl_p50")),
        f"{k}/itl_p99_ms": _ms(p.get("itl_p99")),
        f"{k}/peak_memory_mb": None if p.get("peak_memory_bytes") is None else p["peak_memory_bytes"] / 2**20,
    }
    for ref in REFERENCES:
        ci = p.get(f"ci_vs_{ref}") or {}
        ratio = p.get(f"speedup_vs_{ref}") if ref == "none" else ci.get("ratio")
        out[f"{k}/speedup_vs_{ref}"] = ratio
        if ci.get("reference"):
            out.update({f"{k}/speedup_vs_{ref}_low": 1.0, f"{k}/speedup_vs_{ref}_high": 1.0,
                        f"{k}/speedup_vs_{ref}_verdict": "reference"})
        elif ci.get("ratio") is not None:
            out.update({f"{k}/speedup_vs_{ref}_low": ci["low"], f"{k}/speedup_vs_{ref}_high": ci["high"],
                        f"{k}/speedup_vs_{ref}_verdict": ci["verdict"]})
    return {key: v for key, v in out.items() if v is not None}


POLICY_COLUMNS = ["policy", "tokens_per_second", "speedup_vs_none", "speedup_vs_best_fixed", "best_fixed_low",
                  "best_fixed_high", "verdict", "speedup_vs_hf", "speedup_vs_hf_lookup", "acceptance_length",
                  "ttft_mean_ms", "itl_p50_ms", "itl_p95_ms", "itl_p99_ms", "peak_memory_mb"]
GROUP_COLUMNS = ["policy", "{group}", "tokens_per_second", "speedup_vs_none", "speedup_vs_best_fixed",
                 "acceptance_length", "num_requests"]


def _group_rows(results: dict, group: str) -> list[list[Any]]:
    """One row per (policy, language or task); ``speedup_vs_best_fixed`` against ``best-grid``'s
    throughput on the same group (a point estimate: the intervals are over all requests)."""
    best = results["policies"].get("best-grid", {}).get(group, {})
    rows = []
    for name, p in results["policies"].items():
        for value, s in p.get(group, {}).items():
            ref = best.get(value, {}).get("tokens_per_second")
            rows.append([name, value, s["tokens_per_second"], s.get("speedup_vs_none"),
                         s["tokens_per_second"] / ref if ref else None, s.get("mean_tokens_per_round"),
                         s.get("num_requests")])
    return rows


def exactness_rows(exactness: dict) -> list[list[Any]]:
    """``exactness/checks``: one row per check (``check``, ``policy``, ``passed``, ``detail``)."""
    rows = []
    identity = exactness.get("greedy_identity") or {}
    if identity.get("checked"):
        near_tie = identity.get("mode") == "near-tie"  # bf16/fp16: agreement as a rate, near-ties reported
        check = "greedy agreement vs none" if near_tie else "greedy identity vs none"
        detail = f"{identity.get('requests')} requests, " + (
            f"{identity.get('dtype')}: {identity.get('identical')}/{identity.get('comparisons')} identical, "
            f"{identity.get('num_near_ties')} near-tie(s), {identity.get('num_violations')} violation(s)"
            if near_tie else "token for token")
        for name in identity.get("policies", []):
            rows.append([check, name, identity.get("passed"), detail])
    hf = exactness.get("hf_reference") or {}
    if hf.get("checked"):
        rows.append(["none vs HF generate(do_sample=False)", "none", hf.get("passed"), f"{hf['checked']} requests"])
    for name, v in (exactness.get("monitor") or {}).items():
        if isinstance(v, dict) and "passed" in v:
            failures = "; ".join(str(f) for f in v.get("failures", [])[:3])
            rows.append(["streaming monitor", name, v["passed"],
                         f"{v.get('num_tokens')} tokens, {v.get('num_informative')} informative"
                         + (f"; {failures}" if failures else "")])
    failure = exactness.get("failure")
    if failure:
        rows.append(["stopped at", failure.get("error"), False, failure.get("message")])
    return rows


def log_eval(run: Any, results: dict, out: Path, prefix: str = "") -> None:
    """The comparison on one page: per-policy summary scalars (:func:`policy_scalars`), the best fixed
    setting it is compared with (``best_fixed/*``, from the grid), the tables, the bar chart of the
    speedup over the best fixed setting with its intervals, the exactness verdict and its table.
    ``prefix`` goes before every key (``class/T0_7/`` for one class of a temperature mix, whose
    files lie in ``out``'s ``classes/<label>/``)."""
    if run is None:
        return
    policies = results["policies"]
    rows = []
    for name, p in policies.items():
        ci = p.get("ci_vs_best_fixed") or {}
        rows.append([name, p["tokens_per_second"], p.get("speedup_vs_none"), ci.get("ratio"),
                     1.0 if ci.get("reference") else ci.get("low"), 1.0 if ci.get("reference") else ci.get("high"),
                     "reference" if ci.get("reference") else ci.get("verdict"), p.get("speedup_vs_hf"),
                     p.get("speedup_vs_hf_lookup"), p.get("mean_tokens_per_round"),
                     _ms(p.get("time_to_first_token_mean")), _ms(p.get("itl_p50")), _ms(p.get("itl_p95")),
                     _ms(p.get("itl_p99")),
                     None if p.get("peak_memory_bytes") is None else p["peak_memory_bytes"] / 2**20])
    files = results.get("files", {})
    images = {"compare/speedup_vs_best_fixed": files.get("speedup_vs_best_fixed"),
              **{f"plots/{key}": value for key, value in files.items()
                 if value.endswith(".png") and key != "speedup_vs_best_fixed"}}
    logged = {
        "compare/policies": _table(POLICY_COLUMNS, rows),
        "compare/per_language": _table([c.format(group="language") for c in GROUP_COLUMNS],
                                       _group_rows(results, "per_language")),
        "compare/per_task": _table([c.format(group="task") for c in GROUP_COLUMNS], _group_rows(results, "per_task")),
        "exactness/checks": _table(["check", "policy", "passed", "detail"], exactness_rows(results["exactness"])),
        **_images({key: out / value for key, value in images.items() if value}),
    }
    run.log({f"{prefix}{k}": v for k, v in logged.items()})
    exactness = results["exactness"]
    best = results.get("best_grid") or {}
    _summary(run, {f"{prefix}{k}": v for k, v in {
        **{k: v for name, p in policies.items() for k, v in policy_scalars(name, p).items()},
        **{f"best_fixed/{k}": best.get(k) for k in ("name", "depth", "verify_size", "width", "speedup_vs_none")},
        "policies": ",".join(policies),
        "num_requests": len(results.get("prompts", [])),
        "exactness/passed": exactness["passed"],
        "exactness/temperature": exactness.get("temperature"),
        "exactness/monitor_overhead": (exactness.get("monitor_overhead") or {}).get("fraction"),
    }.items()})


def log_eval_mix(run: Any, results: dict, out: Path) -> None:
    """An evaluation over a temperature mix: each class as :func:`log_eval` under ``class/<label>/``
    (``class/T0_7/policy/ppo/speedup_vs_best_fixed``, ...), the mix table ``compare/mix`` (``policy``
    and the weight-averaged ratios) and its summary ``mix/policy/<name>/<ratio>``, plus
    ``exactness/passed`` and ``policies``."""
    if run is None:
        return
    for label, c in results["classes"].items():
        log_eval(run, c, out / "classes" / label.replace(":", "_"), prefix=f"class/{key_part(label)}/")
    keys = ("speedup_vs_none", "speedup_vs_best_fixed", "speedup_vs_t0_grid", "speedup_vs_hf", "speedup_vs_hf_lookup",
            "speedup_vs_hf_assisted")
    mix = results["mix"]["policies"]
    run.log({"compare/mix": _table(["policy", *keys], [[name, *[p.get(k) for k in keys]] for name, p in mix.items()])})
    _summary(run, {**{f"mix/policy/{key_part(name)}/{k}": p.get(k) for name, p in mix.items() for k in keys},
                   **{f"mix/weight/{key_part(label)}": w for label, w in results["mix"]["weights"].items()},
                   "policies": ",".join(mix), "num_requests": len(results.get("prompts", [])),
                   "exactness/passed": results["exactness"]["passed"],
                   "exactness/monitor_overhead": results["exactness"]["monitor_overhead"]["fraction"]})


# ----------------------------------------------------------------------------- serving
SWEEP_COLUMNS = ["policy", "speedup_vs_none", "replay_speedup_vs_none", "tokens_per_second", "ttft_p50_s",
                 "itl_p50_ms", "itl_p95_ms", "acceptance_length"]
#: results.json's load sections: (section, the x axis of its line plot, its table and summary key part)
LOADS = (("rates", "arrival rate (requests/s)", "rate"), ("concurrency", "requests in flight", "concurrency"))


def log_sweep(run: Any, real: dict, replay: dict | None = None, plot: Path | None = None) -> None:
    """The serving sweep (``draftrl.eval.serve.compare.run_eval`` results, vLLM and optionally the
    replay): speedup over no speculation per policy against the arrival rate (line plots
    ``sweep/speedup_vs_none`` and ``sweep/replay_speedup_vs_none``; against concurrency
    ``sweep/speedup_vs_none_by_concurrency``), one table per load (``sweep/rate_<r>``,
    ``sweep/concurrency_<c>``), the PNG (``sweep/plot``), and in the summary each policy's speedup
    per load (``policy/<name>/speedup_vs_none/rate_<r>``) and geometric mean over the rates
    (``policy/<name>/geomean_speedup_vs_none``)."""
    if run is None:
        return
    import math

    import wandb

    data: dict[str, Any] = {}
    scalars: dict[str, Any] = {}
    names = list(real.get("policies", []))
    for section, xname, part in LOADS:
        loads = sorted(real.get(section, {}), key=float)
        if not loads:
            continue
        suffix = "" if section == "rates" else "_by_concurrency"
        for which, results in (("speedup_vs_none", real), ("replay_speedup_vs_none", replay)):
            shown = [n for n in names if results and all(n in results.get(section, {}).get(x, {}).get("policies", {})
                                                         for x in loads)]
            if not shown:
                continue
            data[f"sweep/{which}{suffix}"] = wandb.plot.line_series(
                xs=[float(x) for x in loads], keys=shown,
                ys=[[results[section][x]["policies"][n]["speedup_vs_none"] for x in loads] for n in shown],
                xname=xname,
                title=f"speedup over no speculation vs {xname} ({'vLLM' if results is real else 'replay'})")
        for x in loads:
            replay_rows = ((replay or {}).get(section, {}).get(x) or {}).get("policies", {})
            rows = []
            for name, p in real[section][x]["policies"].items():
                rows.append([name, p["speedup_vs_none"], (replay_rows.get(name) or {}).get("speedup_vs_none"),
                             p["tokens_per_second"], p.get("time_to_first_token_p50"), _ms(p.get("itl_p50")),
                             _ms(p.get("itl_p95")), (p.get("spec_decoding") or {}).get("acceptance_length")])
                scalars[f"policy/{key_part(name)}/speedup_vs_none/{part}_{key_part(x)}"] = p["speedup_vs_none"]
            data[f"sweep/{part}_{key_part(x)}"] = _table(SWEEP_COLUMNS, rows)
    data.update(_images({"sweep/plot": plot}))
    run.log(data)
    rates = list(real.get("rates", {}))
    for name in names:
        values = [real["rates"][r]["policies"].get(name, {}).get("speedup_vs_none") for r in rates]
        if rates and all(v and v > 0 for v in values):
            scalars[f"policy/{key_part(name)}/geomean_speedup_vs_none"] = math.exp(
                sum(math.log(v) for v in values) / len(values))
    _summary(run, {**scalars, "policies": ",".join(names),
                   "exactness/passed": real.get("exactness", {}).get("passed")})


def log_dsd(run: Any, scored: list[dict]) -> None:
    """The Dynamic SD tables searched in the replay: ``dsd/tables`` (label, score = speedup over
    no speculation averaged over the loads) and ``best/label``, ``best/score``."""
    if run is None:
        return
    run.log({"dsd/tables": _table(["table", "score"], [[s["label"], s["score"]] for s in scored])})
    _summary(run, {"best/label": scored[0]["label"], "best/score": scored[0]["score"], "num_tables": len(scored)})


def log_vllm_calibration(run: Any, result: dict) -> None:
    """vLLM step costs: ``calibrate/points`` (kind, sequences, depth or prompt length, median
    seconds) and the fit (``fit/base_ms``, ``fit/per_seq_ms``, ``fit/per_token_ms``, ...)."""
    if run is None:
        return
    rows = [[p["kind"], p["num_seqs"], p.get("depth", p.get("prompt_len")), p["tokens_verified"],
             p["prompt_tokens"], _ms(p["seconds_median"])] for p in result["points"]]
    run.log({"calibrate/points": _table(["kind", "num_seqs", "depth_or_prompt_len", "tokens_verified",
                                         "prompt_tokens", "median_ms"], rows)})
    _summary(run, {f"fit/{k}_ms": _ms(v) for k, v in result["fit"].items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)})


def log_calibration(run: Any, table: Any) -> None:
    """The HF engine's cost table (``draftrl.signals.costs.CostTable``): ``calibrate/verify``
    (context, tokens per forward, seconds, g = seconds / a plain step's) and ``cost/*`` scalars."""
    if run is None:
        return
    rows = [[int(c), int(n), float(s), float(s / row[0])]
            for c, row in zip(table.context_lens, table.verify_seconds) for n, s in zip(table.num_tokens, row)]
    run.log({"calibrate/verify": _table(["context", "num_tokens", "seconds", "g"], rows)})
    step = float(table.verify_seconds[0][0])
    _summary(run, {"cost/plain_step_ms": step * 1e3, "cost/noise": float(table.noise),
                   "cost/draft_base_vs_step": float(table.draft_base_seconds) / step,
                   **{f"cost/draft_level_vs_step/w{int(w)}": float(s) / step
                      for w, s in zip(table.draft_widths, table.draft_level_seconds)},
                   f"cost/g{int(table.num_tokens[-1])}": float(table.verify_seconds[0][-1]) / step})


def log_traces(run: Any, traces: Any) -> None:
    """Collected greedy traces (``draftrl.replay.traces.Traces``): prompts, positions, draft nodes, seconds."""
    if run is None:
        return
    _summary(run, {"traces/prompts": len(traces), "traces/positions": int(traces.cu_num_positions[-1]),
                   "traces/nodes": len(traces.node_tokens), "traces/max_depth": traces.max_depth,
                   "traces/collect_seconds": traces.meta.get("collect_seconds")})


def log_recordings(run: Any, recordings: dict[str, Any]) -> None:
    """vLLM recordings per split (``draftrl.replay.recordings.Recordings``): requests, tokens, seconds."""
    if run is None:
        return
    _summary(run, {k: v for split, r in recordings.items() for k, v in {
        f"recordings/{split}/requests": len(r), f"recordings/{split}/tokens": sum(len(q.token_ids) for q in r.requests),
        f"recordings/{split}/seconds": r.meta.get("record_seconds")}.items()})
