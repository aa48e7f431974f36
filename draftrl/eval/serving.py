"""Serving evaluation: drafting policies inside vLLM under concurrent load, interleaved.

Every policy decodes the same held-out requests (``ServeConfig``: the 16-request mixed workload
by default, file order) through ``draftrl/ServeVLLM-v0`` at each load: a fixed concurrency
(``concurrency``: that many requests in flight) or Poisson arrivals (``rates``: requests per
second of engine time). Loads run one after the other; within a load the policies run back to
back in an order rotated by one per load and repeat, so drift on a shared machine spreads over
all of them. Each vLLM speculative config is its own engine, built once per process.

Policies: ``draftrl.eval.policy_names`` (the grammar both engines share: ``none``, ``fixed:D[:B]``,
``heuristic``, ``ngram:K``, ``eagle3:K`` (the head folder ``config.head``), ``class:MODULE.Class:K``,
``dsd[:S-E:K,...]``, ``ppo:DIR``), each built as a
``draftrl.policies.Policy`` on its engine by ``draftrl.eval.serve_policies``; episodes run through
``draftrl.eval.rollout.run_episode``, are summarised by ``draftrl.eval.metrics.summarize_serving`` and
reported by ``draftrl.eval.report.render_serving_report``. ``draftrl.eval.dsd_search`` tunes the
Dynamic SD table in the simulator.

Metrics per (load, policy): ``tokens_per_second`` (tokens / engine seconds, idle excluded),
``speedup_vs_none``, ``tokens_per_cpu_second`` and ``cpu_speedup_vs_none`` (the same in the engine
thread's CPU time, vLLM only: with one thread other processes cannot skew it, so where the wall
and CPU ratios differ the difference is load), ``time_to_first_token_mean/p50/p95`` (arrival to first token), ``itl_p50/p95/p99``
(a step's time spread over the tokens a request gained in it), ``decode_step_seconds`` (the mean
time between a request's token-gaining steps after its first: at concurrency 1, one decode step),
``mean_tokens_per_step`` per decoding request, ``acceptance`` (accepted / verified, draftrl's
proposer), ``spec_decoding`` (vLLM's own counts over the episode, every speculative method:
``num_drafts``, ``num_draft_tokens``, ``num_accepted``, ``num_accepted_per_pos`` and
``acceptance_length``, the bonus token counted: :mod:`draftrl.decoding.vllm.counts`; None under
``make_env``), ``per_language`` and ``per_task`` (tokens / request latency). Exactness at temperature 0: every policy's tokens equal
``none``'s on every request (float32 by default: bf16 verification rounds differently). At
temperature > 0: the streaming monitor's tests on each policy's tokens, pooled over all loads
and passes, with p rebuilt from the raw logprobs vLLM returned (``draftrl.eval.exactness.
SampledStreamCheck``; top_k <= 16, or temperature 1 with top_k 0, else reported unchecked).
Each pass then draws its own request seeds (and arrivals), so the pooled streams are independent.
"""


from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable

from draftrl.eval.metrics import histogram, serving_groups, summarize_serving
from draftrl.eval.policy_names import REFERENCE, PolicySpec, parse_policies
from draftrl.eval.report import render_serving_report
from draftrl.eval.rollout import run_episode
from draftrl.eval.serve_policies import build_serving_policy, check_policies, engine_for, proposer_rule

FORMAT = "draftrl-serve-eval/1"


class ServingMismatch(RuntimeError):
    """A policy failed an exactness check: greedy tokens that differ from vLLM's without speculation,
    or a sampled stream the monitor rejects (the message lists which)."""


def loads_of(results: dict) -> list[tuple[str, str]]:
    """``(section, key)`` of every load in :func:`run_serving_eval`'s results, in run order."""
    return [(section, key) for section in ("concurrency", "rates") for key in results.get(section, {})]


def run_serving_eval(out: str | Path, *, policies: list[str] | str, concurrency: list[int] = (1, 4, 16),
                     rates: list[float] = (), repeats: int = 1, config=None, tokenizer=None,
                     progress: Callable[[int, int, str], None] | None = None,
                     make_env: Callable[[Any, PolicySpec], Any] | None = None) -> dict:
    """Evaluate ``policies`` at each load; write ``out/results.json`` and return it.

    ``make_env(load_config, spec)`` builds each (load, policy) episode's env instead of
    ``ServeVLLM-v0`` on vLLM (e.g. ``ServeReplay-v0``, the simulator: ``benchmarks/serve_sweep.py``).

    ``results["concurrency"]["4"]["policies"]["fixed:4"]["tokens_per_second"]``; Poisson loads
    under ``results["rates"]["8"]``. Raises :class:`ServingMismatch` (after writing the results) when a
    policy's tokens differ from ``none``'s at temperature 0.
    """
    from draftrl.signals.costs import hardware_info
    from draftrl.envs.serve_vllm import ServeVLLMEnv
    from draftrl.config.serve import ServeConfig
    from draftrl.io import atomic_write_text, write_json

    specs = parse_policies(policies, engine="vllm")
    config = config or ServeConfig(split="heldout", shuffle=False, seed=0)
    check_policies(specs, config)
    loads = [("concurrency", str(c), {"arrival": "fixed", "concurrency": int(c)}) for c in concurrency]
    loads += [("rates", f"{r:g}", {"arrival": "poisson", "rate": float(r)}) for r in rates]
    if not loads:
        raise ValueError("no load to evaluate: give --concurrency and/or --rates.")
    if repeats < 1:
        raise ValueError(f"repeats={repeats} must be >= 1 (episodes per load and policy; the median-time one is kept).")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    envs: dict[str, Any] = {}
    engines: dict[str, Any] = {}
    if make_env is None:
        engines = {s.label: engine_for(s, config) for s in specs}
        for engine in {id(e): e for e in engines.values()}.values():
            engine.warm_up()  # one-time costs (numba's compile in vLLM's ngram) outside the timed episodes

        def make_env(cfg, spec):
            env = ServeVLLMEnv(cfg, engine=engines[spec.label], tokenizer=tokenizer or envs.get("tokenizer"))
            envs.setdefault("tokenizer", env.tokenizer)
            return env
    results: dict[str, Any] = {"format": FORMAT, "engine": "vllm", "config": dataclasses.asdict(config),
                               "policies": [s.label for s in specs], "repeats": repeats}
    mismatches: list[str] = []
    checks = {}
    if config.temperature > 0:
        from draftrl.decoding.vllm.engine import VLLMEngineConfig
        from draftrl.eval.exactness import SampledStreamCheck

        max_logprobs = VLLMEngineConfig().max_logprobs
        checks = {s.label: SampledStreamCheck(config.temperature, config.top_k, config.top_p, max_logprobs)
                  for s in specs}
    total, done = len(loads) * len(specs) * repeats, 0
    reference_tokens: dict[str, dict[str, list[int]]] = {}
    for li, (section, key, arrival) in enumerate(loads):
        load_cfg = dataclasses.replace(config, **arrival)
        per_policy: dict[str, list] = {s.label: [] for s in specs}
        for repeat in range(repeats):
            shift = li + repeat
            order = specs[shift % len(specs):] + specs[: shift % len(specs)]
            for spec in order:
                env = make_env(dataclasses.replace(load_cfg, rule=proposer_rule(spec)), spec)
                prompt_ids = [p.id for p in env.workload.prompts][: config.num_requests or None]
                seed = config.seed if config.seed is not None else 0
                if config.temperature > 0:  # independent sampled streams for the pooled check
                    seed += 1000 * li + repeat
                engine = engines.get(spec.label)
                before = engine.spec_counts.snapshot() if engine is not None else None
                requests, steps = run_episode(env, build_serving_policy(spec, env), prompt_ids, seed=seed,
                                              check=checks.get(spec.label))
                counts = engine.spec_counts.since(before) if engine is not None else None
                per_policy[spec.label].append((requests, steps, counts))
                done += 1
                if progress:
                    progress(done, total, f"{section}={key} {spec.label}")
        section_out = results.setdefault(section, {})
        table = {}
        for spec in specs:
            runs = per_policy[spec.label]
            best = sorted(runs, key=lambda rs: sum(s["seconds"] for s in rs[1]))[(len(runs) - 1) // 2]
            requests, steps, counts = best
            summary = summarize_serving(requests, steps)
            summary["spec_decoding"] = counts.summary() if counts is not None else None
            summary["per_language"] = serving_groups(requests, "language")
            summary["per_task"] = serving_groups(requests, "task")
            summary["depth_histogram"] = histogram(s["depth"] for s in steps)
            table[spec.label] = summary
            tokens = {r.prompt_id: list(r.token_ids) for r in requests}
            if spec.kind == REFERENCE:
                reference_tokens[f"{section}={key}"] = tokens
            elif config.temperature == 0:
                ref = reference_tokens[f"{section}={key}"]
                bad = [pid for pid in ref if tokens.get(pid) != ref[pid]]
                summary["greedy_identical_requests"] = len(ref) - len(bad)
                mismatches += [f"{spec.label} at {section}={key} on {pid}" for pid in bad]
        ref, ref_cpu = table[REFERENCE]["tokens_per_second"], table[REFERENCE]["tokens_per_cpu_second"]
        for summary in table.values():
            summary["speedup_vs_none"] = summary["tokens_per_second"] / ref if ref else None
            cpu_rate = summary["tokens_per_cpu_second"]
            summary["cpu_speedup_vs_none"] = cpu_rate / ref_cpu if cpu_rate and ref_cpu else None
        section_out[key] = {"policies": table}
    monitor = {label: check.verdict() for label, check in checks.items()}
    failures = mismatches + [f"the monitor rejects {label}'s sampled stream"
                             for label, v in monitor.items() if v["verdict"] == "failed"]
    results["exactness"] = {
        "passed": not failures,
        "temperature": config.temperature,
        "dtype": config.dtype,
        "greedy_identity": {"checked": config.temperature == 0, "reference": "none (vLLM without speculation)",
                            "mismatches": mismatches},
        "monitor": {"checked": bool(checks) and all(c.checked for c in checks.values()),
                    "policies": monitor},
    }
    results["engines"] = {label: e.describe() for label, e in engines.items()} if engines else "make_env"
    results["hardware"] = hardware_info("cpu")
    results["wall_seconds"] = time.perf_counter() - started
    write_json(out / "results.json", results)
    atomic_write_text(out / "report.md", render_serving_report(results))
    if failures:
        raise ServingMismatch(f"{len(failures)} exactness failure(s): " + "; ".join(failures[:5]))
    return results
