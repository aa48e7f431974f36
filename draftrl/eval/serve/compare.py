"""Serving evaluation: drafting policies inside vLLM under concurrent load, interleaved.

Every policy decodes the same held-out requests (``ServeConfig``: the 16-request mixed workload
by default, file order) through ``draftrl/ServeVLLM-v1`` at each load: a fixed concurrency
(``concurrency``: that many requests in flight) or Poisson arrivals (``rates``: requests per
second of engine time). Loads run one after the other; within a load the policies run back to
back in an order rotated by one per load and repeat, so drift on a shared machine spreads over
all of them. Each vLLM speculative config is its own engine; policies that share one (``none``
alone, ``fixed:D``, ``heuristic``, ``dsd`` and ``ppo`` on draftrl's proposer with one drafter, each
``vllm-ngram:K``, ...) run back to back on it, and at most ``ServeConfig.max_engines`` engines (default
1) are held at once: a pass builds a group's engine, runs its policies, and frees it for the next
(:func:`pass_order`: the groups rotate back by one per pass, so each pass opens on the engine the
last one closed on). Memory then holds one engine, not one per config (measured on CPU:
docs/serving.md), and on a GPU each engine may take the whole ``gpu_memory_utilization``.

Policies: ``draftrl.eval.policy_names`` (the grammar both engines share: ``none``, ``fixed:D[:V]``,
``heuristic``, ``dsd[:S-E:K,...]``, ``stop:K:tT``, ``ppo:DIR``, each with the run's drafter
``config.drafter`` or its own ``@DRAFTER``; vLLM's own ``vllm-ngram:K``, ``vllm-eagle3:K``,
``vllm-class:MODULE.Class:K``), each built as a
``draftrl.policies.Policy`` on its engine by ``draftrl.eval.serve.policies``; episodes run through
``draftrl.eval.serve.rollout.run_episode``, are summarised by ``draftrl.eval.metrics.summarize_serving`` and
reported by ``draftrl.eval.report.render_serving_report``. ``draftrl.eval.serve.dsd_search`` tunes the
Dynamic SD table in the replay.

Metrics per (load, policy): ``tokens_per_second`` (tokens / engine seconds, idle excluded),
``speedup_vs_none``, ``tokens_per_cpu_second`` and ``cpu_speedup_vs_none`` (the same in the engine
thread's CPU time, vLLM only: with one thread other processes cannot skew it, so where the wall
and CPU ratios differ the difference is load), ``time_to_first_token_mean/p50/p95`` (arrival to first token),
``itl_p50/p95/p99``
(a step's time spread over the tokens a request gained in it), ``decode_step_seconds`` (the mean
time between a request's token-gaining steps after its first: at concurrency 1, one decode step),
``mean_tokens_per_step`` per decoding request, ``acceptance`` (accepted / verified, draftrl's
proposer), ``spec_decoding`` (vLLM's own counts over the episode, every speculative method:
``num_drafts``, ``num_draft_tokens``, ``num_accepted``, ``num_accepted_per_pos`` and
``acceptance_length``, the bonus token counted: :mod:`draftrl.decoding.vllm.counts`; None under
``make_env``), ``per_language`` and ``per_task`` (tokens / request latency). Exactness at temperature 0:
every policy's tokens equal
``none``'s on every request (float32 by default: bf16 verification rounds differently). At
temperature > 0: the streaming monitor's tests on each policy's tokens, pooled over all loads
and passes, with p rebuilt from the raw logprobs vLLM returned (``draftrl.eval.exactness.
SampledStreamCheck``; top_k <= 16, or temperature 1 with top_k 0, else reported unchecked).
Each pass then draws its own request seeds (and arrivals), so the pooled streams are independent.
With ``env.temperature_mix`` each request draws its class (the same per request for every policy:
the env's seeded draws): greedy identity on the greedy requests, one monitor per sampled class
(``ClassStreamChecks``, verdicts under ``POLICY@CLASS``), and ``per_sampling`` rows (tokens / request
latency per class).
"""


from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from draftrl.eval.metrics import histogram, serving_groups, summarize_serving
from draftrl.eval.policy_names import REFERENCE, PolicyName, parse_policies
from draftrl.eval.report import render_serving_report
from draftrl.eval.serve.policies import (
    build_serving_policy,
    check_policies,
    engine_config_for,
    policy_drafter,
    proposer_rule,
)
from draftrl.eval.serve.rollout import run_episode

FORMAT = "draftrl-serve-eval/1"


class ServingMismatch(RuntimeError):
    """A policy failed an exactness check: greedy tokens that differ from vLLM's without speculation,
    or a sampled stream the monitor rejects (the message lists which)."""


def loads_of(results: dict) -> list[tuple[str, str]]:
    """``(section, key)`` of every load in :func:`run_eval`'s results, in run order."""
    return [(section, key) for section in ("concurrency", "rates") for key in results.get(section, {})]


def engine_groups(specs: list[PolicyName], config=None) -> list[list[PolicyName]]:
    """The policies grouped by the vLLM engine each runs on (first appearance order; each policy
    alone when ``config`` is None: the replay has no engines)."""
    if config is None:
        return [[spec] for spec in specs]
    groups: dict[Any, list[PolicyName]] = {}
    for spec in specs:
        groups.setdefault(engine_config_for(spec, config), []).append(spec)
    return list(groups.values())


def pass_order(groups: list[list[PolicyName]], index: int) -> list[PolicyName]:
    """The policies of pass ``index`` (loads and repeats counted together): the engine groups
    rotated back by one per pass, so the last group of a pass opens the next (its engine is still
    built) and every group takes every place once in ``len(groups)`` passes; the policies of a
    group rotated forward by one per pass, for the same reason inside a group. Drift on a shared
    machine then spreads over all of them, as when every policy had its own engine."""
    n = len(groups)
    shift = (-index) % n
    order = []
    for group in groups[shift:] + groups[:shift]:
        k = index % len(group)
        order += group[k:] + group[:k]
    return order


class _Engines:
    """The comparison's vLLM engines, at most ``config.max_engines`` held at once
    (:func:`draftrl.decoding.vllm.engine.shared_engine`); each freshly built one is warmed up."""

    def __init__(self, config):
        self.config = config
        self.builds = 0
        """engines built (a group's engine is built again when it was freed for another)"""
        self.described: dict[str, dict] = {}

    def get(self, spec: PolicyName):
        from draftrl.decoding.vllm.engine import shared_engine

        engine = shared_engine(engine_config_for(spec, self.config), max_engines=self.config.max_engines)
        if not engine.warmed:
            engine.warm_up()  # one-time costs (numba's compile in vLLM's ngram) outside the timed episodes
            self.builds += 1
        self.described.setdefault(spec.label, engine.describe())
        return engine


def _episode(make_env, load_cfg, spec: PolicyName, config, seed: int, checks: dict, engines: _Engines | None):
    """One policy's episode at one load: ``(requests, steps, vLLM's speculative-decoding counts or
    None)``. A function of its own so that the env, and the engine it holds, are dropped when it
    returns: the next group's engine is built with this one's memory free."""
    env = make_env(dataclasses.replace(load_cfg, rule=proposer_rule(spec), drafter=policy_drafter(spec, config)), spec)
    prompt_ids = [p.id for p in env.workload.prompts][: config.num_requests or None]
    engine = env.engine if engines is not None else None
    before = engine.spec_counts.snapshot() if engine is not None else None
    requests, steps = run_episode(env, build_serving_policy(spec, env), prompt_ids, seed=seed,
                                  check=checks.get(spec.label))
    counts = engine.spec_counts.since(before) if engine is not None else None
    return requests, steps, counts


def run_eval(out: str | Path, *, policies: list[str] | str, concurrency: list[int] = (1, 4, 16),
                     rates: list[float] = (), repeats: int = 1, config=None, tokenizer=None,
                     progress: Callable[[int, int, str], None] | None = None,
                     make_env: Callable[[Any, PolicyName], Any] | None = None) -> dict:
    """Evaluate ``policies`` at each load; write ``out/results.json`` and return it.

    ``make_env(load_config, spec)`` builds each (load, policy) episode's env instead of
    ``ServeVLLM-v1`` on vLLM (e.g. ``ServeReplay-v1``, the replay: ``benchmarks/serve_sweep.py``).

    ``results["concurrency"]["4"]["policies"]["fixed:4"]["tokens_per_second"]``; Poisson loads
    under ``results["rates"]["8"]``. Raises :class:`ServingMismatch` (after writing the results) when a
    policy's tokens differ from ``none``'s at temperature 0.
    """
    from draftrl.config.serve import ServeConfig
    from draftrl.envs.serve_vllm import ServeVLLMEnv
    from draftrl.io import atomic_write_text, write_json
    from draftrl.signals.costs import hardware_info

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
    engines = _Engines(config) if make_env is None else None
    if make_env is None:
        def make_env(cfg, spec):
            env = ServeVLLMEnv(cfg, engine=engines.get(spec), tokenizer=tokenizer or envs.get("tokenizer"))
            envs.setdefault("tokenizer", env.tokenizer)
            return env
    groups = engine_groups(specs, config if engines is not None else None)
    results: dict[str, Any] = {"format": FORMAT, "engine": "vllm", "config": dataclasses.asdict(config),
                               "policies": [s.label for s in specs], "repeats": repeats,
                               "engine_groups": [[s.label for s in g] for g in groups]}
    mismatches: list[str] = []
    checks = {}
    classes = config.sampling_classes
    sampled = any(not c.greedy for c in classes)
    greedy = any(c.greedy for c in classes)
    if sampled:
        from draftrl.decoding.vllm.engine import VLLMEngineConfig
        from draftrl.eval.exactness import ClassStreamChecks, SampledStreamCheck

        max_logprobs = VLLMEngineConfig().max_logprobs
        if config.mixed:  # one monitor per sampled class of the mix; greedy requests get greedy identity
            checks = {s.label: ClassStreamChecks(classes, max_logprobs) for s in specs}
        else:
            checks = {s.label: SampledStreamCheck(config.temperature, config.top_k, config.top_p, max_logprobs)
                      for s in specs}
    total, done = len(loads) * len(specs) * repeats, 0
    reference_tokens: dict[str, dict[str, list[int]]] = {}
    for li, (section, key, arrival) in enumerate(loads):
        load_cfg = dataclasses.replace(config, **arrival)
        per_policy: dict[str, list] = {s.label: [] for s in specs}
        for repeat in range(repeats):
            seed = config.seed if config.seed is not None else 0
            if sampled:  # independent sampled streams for the pooled check
                seed += 1000 * li + repeat
            for spec in pass_order(groups, li * repeats + repeat):
                per_policy[spec.label].append(_episode(make_env, load_cfg, spec, config, seed, checks, engines))
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
            if config.mixed:
                summary["per_sampling"] = serving_groups(requests, "sampling_label")
            summary["depth_histogram"] = histogram(s["depth"] for s in steps)
            table[spec.label] = summary
            tokens = {r.prompt_id: list(r.token_ids) for r in requests}
            if spec.kind == REFERENCE:
                reference_tokens[f"{section}={key}"] = tokens
            elif greedy:  # the greedy requests (all of them without a mix) emit none's tokens
                ref = reference_tokens[f"{section}={key}"]
                greedy_ids = {r.prompt_id for r in requests if r.sampling is None or r.sampling.greedy}
                bad = [pid for pid in ref if pid in greedy_ids and tokens.get(pid) != ref[pid]]
                summary["greedy_identical_requests"] = len(greedy_ids & set(ref)) - len(bad)
                mismatches += [f"{spec.label} at {section}={key} on {pid}" for pid in bad]
        ref, ref_cpu = table[REFERENCE]["tokens_per_second"], table[REFERENCE]["tokens_per_cpu_second"]
        for summary in table.values():
            summary["speedup_vs_none"] = summary["tokens_per_second"] / ref if ref else None
            cpu_rate = summary["tokens_per_cpu_second"]
            summary["cpu_speedup_vs_none"] = cpu_rate / ref_cpu if cpu_rate and ref_cpu else None
        section_out[key] = {"policies": table}
    monitor = {}
    for label, check in checks.items():
        if hasattr(check, "verdicts"):  # a mix: one verdict per sampled class, "POLICY@CLASS"
            monitor.update({f"{label}@{cls}": v for cls, v in check.verdicts().items()})
        else:
            monitor[label] = check.verdict()
    failures = mismatches + [f"the monitor rejects {label}'s sampled stream"
                             for label, v in monitor.items() if v["verdict"] == "failed"]
    results["exactness"] = {
        "passed": not failures,
        "temperature": config.temperature,
        "sampling": [c.label for c in classes],
        "dtype": config.dtype,
        "greedy_identity": {"checked": greedy, "reference": "none (vLLM without speculation)",
                            "mismatches": mismatches},
        "monitor": {"checked": bool(checks) and all(c.checked for c in checks.values()),
                    "policies": monitor},
    }
    if engines is not None:
        results["engines"] = engines.described
        results["engine_builds"] = engines.builds
    else:
        results["engines"] = "make_env"
    results["hardware"] = hardware_info("cpu")
    results["wall_seconds"] = time.perf_counter() - started
    write_json(out / "results.json", results)
    atomic_write_text(out / "report.md", render_serving_report(results))
    if failures:
        raise ServingMismatch(f"{len(failures)} exactness failure(s): " + "; ".join(failures[:5]))
    return results
