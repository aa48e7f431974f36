"""Serving evaluation: drafting policies inside vLLM under concurrent load, interleaved.

Every policy decodes the same held-out requests (``ServeConfig``: the 16-request mixed workload
by default, file order) through ``draftrl/ServeVLLM-v0`` at each load: a fixed concurrency
(``concurrency``: that many requests in flight) or Poisson arrivals (``rates``: requests per
second of engine time). Loads run one after the other; within a load the policies run back to
back in an order rotated by one per load and repeat, so drift on a shared machine spreads over
all of them. Each vLLM speculative config is its own engine, built once per process.

Policies (``parse_serving_policies``):

- ``none``: vLLM without speculation (the reference of speedups and of exactness);
- ``fixed:D`` / ``fixed:D:B``: draftrl's n-gram drafter, depth cap D every step (and budget B);
- ``heuristic``: Hugging Face's +2 / -1 depth per request inside the proposer, cap 8;
- ``ngram:K``: vLLM's own prompt lookup (``method: ngram``), K tokens;
- ``class:MODULE.Class:K``: vLLM with another ``custom_class`` proposer, K tokens (a reference
  such as ``benchmarks/ref_lookup.py``; the module must be importable);
- ``dsd`` / ``dsd:S-E:K,...``: vLLM's Dynamic SD schedule (K per batch-size range), applied as the
  depth cap of draftrl's drafter from the running batch size each step;
- ``ppo:PATH``: an SB3 policy trained on ``draftrl/ServeVLLM-v0`` (``policy.zip`` + ``policy.json``
  with its depth and budget grids).

Metrics per (load, policy): ``tokens_per_second`` (tokens / engine seconds, idle excluded),
``speedup_vs_none``, ``tokens_per_cpu_second`` and ``cpu_speedup_vs_none`` (the same in the engine
thread's CPU time, vLLM only: with one thread other processes cannot skew it, so where the wall
and CPU ratios differ the difference is load), ``time_to_first_token_mean/p50/p95`` (arrival to first token), ``itl_p50/p95/p99``
(a step's time spread over the tokens a request gained in it), ``mean_tokens_per_step`` per
decoding request, ``acceptance`` (accepted / verified, draftrl's proposer), ``per_language`` and
``per_task`` (tokens / request latency). Exactness at temperature 0: every policy's tokens equal
``none``'s on every request (float32 by default: bf16 verification rounds differently). At
temperature > 0: the streaming monitor's tests on each policy's tokens, pooled over all loads
and passes, with p rebuilt from the raw logprobs vLLM returned (``draftrl.eval.exactness.
SampledStreamCheck``; top_k <= 16, or temperature 1 with top_k 0, else reported unchecked).
Each pass then draws its own request seeds (and arrivals), so the pooled streams are independent.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

FORMAT = "draftrl-serve-eval/1"
#: Dynamic SD schedule used by ``dsd`` without a table: (batch start, batch end, K).
DEFAULT_DSD = ((1, 1, 6), (2, 4, 4), (5, 8, 2), (9, 1024, 1))
MAX_DEPTH = 8
KINDS = ("none", "fixed", "heuristic", "ngram", "class", "dsd", "ppo")


class ServingMismatch(RuntimeError):
    """A policy failed an exactness check: greedy tokens that differ from vLLM's without speculation,
    or a sampled stream the monitor rejects (the message lists which)."""


@dataclass(frozen=True)
class ServingPolicySpec:
    """One policy of a serving evaluation, as named on the command line."""

    label: str
    kind: str
    depth: int = 0
    budget: int | None = None
    dsd: tuple[tuple[int, int, int], ...] = ()
    path: str | None = None


def _bad(item: str, why: str) -> ValueError:
    return ValueError(f"serving policy {item!r} {why}; use none, fixed:D[:B], heuristic, ngram:K, "
                      "class:MODULE.Class:K, dsd[:S-E:K,...] or ppo:PATH.")


def parse_dsd(text: str, item: str) -> tuple[tuple[int, int, int], ...]:
    """``"1-1:6,2-4:4"`` -> ((1, 1, 6), (2, 4, 4))."""
    table = []
    for part in text.split(","):
        ranges, _, k = part.partition(":")
        start, _, end = ranges.partition("-")
        if not (start.isdigit() and end.isdigit() and k.isdigit()):
            raise _bad(item, "needs entries START-END:K, e.g. dsd:1-1:6,2-4:4,5-16:1")
        table.append((int(start), int(end), int(k)))
    table.sort()
    if table[0][0] != 1:
        raise _bad(item, "must start at batch size 1")
    return tuple(table)


def parse_serving_policies(items: list[str] | str) -> list[ServingPolicySpec]:
    """Specs in the order given, ``none`` first (added when missing)."""
    if isinstance(items, str):
        items = _split(items)
    specs = []
    for item in items:
        kind, _, arg = item.partition(":")
        if kind not in KINDS:
            raise _bad(item, "is unknown")
        if kind in ("none", "heuristic") and arg:
            raise _bad(item, "takes no argument")
        if kind == "fixed":
            parts = arg.split(":")
            if not 1 <= len(parts) <= 2 or not all(p.isdigit() for p in parts) or int(parts[0]) > MAX_DEPTH:
                raise _bad(item, f"must look like fixed:D or fixed:D:B with 0 <= D <= {MAX_DEPTH}")
            specs.append(ServingPolicySpec(item, kind, int(parts[0]), int(parts[1]) if len(parts) > 1 else None))
        elif kind == "ngram":
            if not arg.isdigit() or not 1 <= int(arg) <= 16:
                raise _bad(item, "must look like ngram:K with 1 <= K <= 16")
            specs.append(ServingPolicySpec(item, kind, int(arg)))
        elif kind == "class":
            path, _, k = arg.rpartition(":")
            if "." not in path or not k.isdigit() or not 1 <= int(k) <= 16:
                raise _bad(item, "must look like class:MODULE.Class:K with 1 <= K <= 16")
            specs.append(ServingPolicySpec(item, kind, int(k), path=path))
        elif kind == "dsd":
            specs.append(ServingPolicySpec(item, kind, dsd=parse_dsd(arg, item) if arg else DEFAULT_DSD))
        elif kind == "ppo":
            if not arg:
                raise _bad(item, "needs a path (ppo:DIR with policy.zip)")
            specs.append(ServingPolicySpec(item, kind, path=arg))
        else:
            specs.append(ServingPolicySpec(item, kind, MAX_DEPTH if kind == "heuristic" else 0))
    labels = [s.label for s in specs]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise ValueError(f"serving policies {dup} are listed twice; list each once.")
    if "none" not in labels:
        specs.insert(0, ServingPolicySpec("none", "none"))
    return specs


def _split(text: str) -> list[str]:
    """Split a policy list where a dsd table has commas of its own: ``none,dsd:1-1:6,2-4:2,fixed:4``."""
    out: list[str] = []
    for part in text.split(","):
        if out and out[-1].startswith("dsd:") and part[:1].isdigit() and "-" in part.partition(":")[0]:
            out[-1] += "," + part
        elif part:
            out.append(part)
    return out


def serve_config(path: str | None, overrides: list[str], threads: int | None = None, **defaults: Any):
    """The evaluation's :class:`ServeConfig`: held-out split, file order, seed 0 (or ``defaults``),
    then a YAML file of ServeConfig fields (``path``) and ``key=value`` overrides."""
    import yaml

    from draftrl.config import from_dict
    from draftrl.config.serve import ServeConfig

    data: dict[str, Any] = {"split": "heldout", "shuffle": False, "seed": 0, **defaults}
    if path:
        data.update(yaml.safe_load(Path(path).read_text()) or {})
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r} must look like key=value, e.g. --set max_new_tokens=48")
        data[key.strip()] = yaml.safe_load(value)
    if threads is not None:
        data["threads"] = threads
    return from_dict(ServeConfig, data)


# ----------------------------------------------------------------------------- actors
class _Actor:
    """Chooses each step's action index for one policy on one env."""

    def __init__(self, spec: ServingPolicySpec, env):
        self.spec, self.env = spec, env.unwrapped
        self.policy = None
        if spec.kind == "ppo":  # observation statistics, grids and features checked (PPOPolicy.load)
            from draftrl.policies import PPOPolicy

            self.policy = PPOPolicy.load(spec.path, env)

    def _index(self, depth: int, budget: int | None) -> np.ndarray:
        u = self.env
        d = max(i for i, v in enumerate(u.depths) if v <= depth)
        b = len(u.budgets) - 1 if budget is None else max(i for i, v in enumerate(u.budgets) if v <= budget)
        return np.array([d, b])

    def act(self, obs: np.ndarray) -> np.ndarray:
        s = self.spec
        if self.policy is not None:
            return np.asarray(self.policy.to_action(*self.policy.act(obs)))
        if s.kind == "dsd":
            running = max(1, round(float(obs[0]) * self.env.config.max_num_seqs))
            k = next((k for start, end, k in s.dsd if start <= running <= end), s.dsd[-1][2])
            return self._index(k, None)
        if s.kind in ("none", "ngram", "class"):
            return self._index(0, None)  # the engine ignores it (no draftrl proposer)
        return self._index(s.depth, s.budget)


def _engine_for(spec: ServingPolicySpec, config) -> Any:
    from draftrl.decoding.vllm.engine import VLLMEngineConfig, shared_engine

    common = dict(model=config.model, dtype=config.dtype, max_num_seqs=config.max_num_seqs,
                  max_model_len=config.max_model_len, kv_cache_gib=config.kv_cache_gib, threads=config.threads)
    if spec.kind == "none":
        return shared_engine(VLLMEngineConfig(method="none", **common))
    if spec.kind == "ngram":
        return shared_engine(VLLMEngineConfig(method="ngram", num_speculative_tokens=spec.depth, **common))
    if spec.kind == "class":
        return shared_engine(VLLMEngineConfig(method="custom_class", proposer=spec.path, num_speculative_tokens=spec.depth,
                                              **common))
    return shared_engine(VLLMEngineConfig(method="draftrl", num_speculative_tokens=MAX_DEPTH, **common))


# ----------------------------------------------------------------------------- metrics
def summarize(requests: list, steps: list[dict]) -> dict:
    """Throughput and latency of one (load, policy) episode (module docstring)."""
    tokens = sum(len(r.token_ids) for r in requests)
    seconds = sum(s["seconds"] for s in steps)
    ttft = np.array([r.ttft for r in requests if r.ttft is not None])
    itl = []
    for r in requests:
        times = np.asarray(r.token_times)
        if times.size < 2:
            continue
        change = np.flatnonzero(np.diff(times) > 0) + 1  # first token of each later step
        bounds = np.append(change, times.size)
        for start, end in zip(bounds[:-1], bounds[1:]):
            gap = times[start] - times[start - 1]
            itl.extend([gap / (end - start)] * int(end - start))
    itl = np.asarray(itl)
    verified = sum(s["num_verified"] for s in steps)
    accepted = sum(s["num_accepted"] for s in steps)
    decoding = sum(s["decoding"] for s in steps)
    cpu = [s.get("cpu_seconds") for s in steps]
    cpu_seconds = float(sum(cpu)) if cpu and None not in cpu else None

    def pct(a: np.ndarray, q: float) -> float | None:
        return float(np.percentile(a, q)) if a.size else None

    return {
        "num_requests": len(requests),
        "num_tokens": int(tokens),
        "seconds": float(seconds),
        "num_steps": len(steps),
        "tokens_per_second": tokens / seconds if seconds > 0 else 0.0,
        "cpu_seconds": cpu_seconds,
        "tokens_per_cpu_second": tokens / cpu_seconds if cpu_seconds else None,
        "mean_tokens_per_step": tokens / decoding if decoding else 0.0,
        "mean_batch": decoding / len(steps) if steps else 0.0,
        "num_verified": int(verified),
        "num_accepted": int(accepted),
        "acceptance": accepted / verified if verified else None,
        "time_to_first_token_mean": float(ttft.mean()) if ttft.size else None,
        "time_to_first_token_p50": pct(ttft, 50),
        "time_to_first_token_p95": pct(ttft, 95),
        "itl_p50": pct(itl, 50),
        "itl_p95": pct(itl, 95),
        "itl_p99": pct(itl, 99),
    }


def _group_rate(requests: list) -> dict:
    tokens = sum(len(r.token_ids) for r in requests)
    latency = sum(r.token_times[-1] - r.admitted for r in requests if r.token_times)
    return {"num_requests": len(requests), "num_tokens": int(tokens),
            "tokens_per_second": tokens / latency if latency > 0 else 0.0}


def _groups(requests: list, key: str) -> dict:
    out: dict[str, list] = {}
    for r in requests:
        out.setdefault(getattr(r, key), []).append(r)
    return {k: _group_rate(v) for k, v in sorted(out.items())}


# ----------------------------------------------------------------------------- the run
def run_episode(env, actor: _Actor, prompt_ids: list[str], seed: int = 0,
                check: Any = None) -> tuple[list, list[dict]]:
    """One episode over ``prompt_ids``; returns the request timelines and per-step records.
    ``check`` (a ``SampledStreamCheck``) observes every step's requests."""
    obs, _ = env.reset(seed=seed, options={"prompt_ids": prompt_ids})
    steps, done, info = [], False, {}
    while not done:
        obs, _, terminated, truncated, info = env.step(actor.act(obs))
        if check is not None:
            check.observe(info["request_steps"])
        steps.append({"seconds": info["seconds"], "cpu_seconds": info.get("cpu_seconds"), "tokens": info["tokens"],
                      "num_verified": info["num_verified"],
                      "num_accepted": info["num_accepted"], "depth": info["depth"], "budget": info["budget"],
                      "decoding": info["decoding"]})
        done = terminated or truncated
    return info["requests"], steps


def episode_throughput(env, actor: Any, prompt_ids: list[str], seed: int = 0) -> float:
    """Tokens per engine second of one :func:`run_episode` (``actor.act(obs)`` choosing each action)."""
    requests, steps = run_episode(env, actor, prompt_ids, seed=seed)
    return sum(len(r.token_ids) for r in requests) / sum(st["seconds"] for st in steps)


def kendall_tau(a: list[float], b: list[float]) -> float | None:
    """Tau-a: (concordant - discordant) / pairs; a pair tied in either list counts as neither."""
    import itertools

    pairs = list(itertools.combinations(range(len(a)), 2))
    if not pairs:
        return None
    sign = lambda x: (x > 0) - (x < 0)  # noqa: E731
    return sum(sign(a[i] - a[j]) * sign(b[i] - b[j]) for i, j in pairs) / len(pairs)


def loads_of(results: dict) -> list[tuple[str, str]]:
    """``(section, key)`` of every load in :func:`run_serving_eval`'s results, in run order."""
    return [(section, key) for section in ("concurrency", "rates") for key in results.get(section, {})]


def dsd_label(table: tuple[tuple[int, int, int], ...]) -> str:
    """The policy spec of a Dynamic SD table: ``dsd:1-1:6,2-4:4,...``."""
    return "dsd:" + ",".join(f"{s}-{e}:{k}" for s, e, k in table)


def search_dsd(make_env: Callable[[Any, ServingPolicySpec], Any], config, loads: list[dict[str, Any]], *,
               ranges: tuple[tuple[int, int], ...] = ((1, 1), (2, 4), (5, 8), (9, 16)),
               ks: tuple[int, ...] = (0, 1, 2, 3, 4, 6, 8), monotone: bool = True,
               progress: Callable[[int, int], None] | None = None) -> list[dict[str, Any]]:
    """Grid-search vLLM's Dynamic SD schedule (one K per batch-size range) on ``make_env``'s env
    (the simulator, on the tuning split): every table of ``ks`` over ``ranges`` (with
    ``monotone``, only tables whose K never grows with the batch, as vLLM's examples and the cost
    of verification suggest), scored by the geometric mean over ``loads`` (dicts of arrival fields)
    of its throughput over no speculation's. Returns every table's score, best first:
    ``[{"label": "dsd:1-1:8,...", "table": ..., "score": 1.31, "speedups": {load: x}}, ...]``."""
    import itertools

    if ranges[0][0] != 1 or any(a[1] + 1 != b[0] for a, b in zip(ranges, ranges[1:])):
        raise ValueError(f"ranges={ranges} must start at batch size 1 and be contiguous, e.g. ((1, 1), (2, 4)).")
    tables = [tuple((s, e, k) for (s, e), k in zip(ranges, combo))
              for combo in itertools.product(sorted(ks, reverse=True), repeat=len(ranges))
              if not monotone or all(a >= b for a, b in zip(combo, combo[1:]))]
    envs = [make_env(dataclasses.replace(config, **load), ServingPolicySpec("dsd", "dsd")) for load in loads]
    prompt_ids = [[p.id for p in env.workload.prompts][: config.num_requests or None] for env in envs]
    seed = config.seed if config.seed is not None else 0

    def throughput(spec: ServingPolicySpec, i: int) -> float:
        return episode_throughput(envs[i], _Actor(spec, envs[i]), prompt_ids[i], seed=seed)

    plain = [throughput(ServingPolicySpec("none", "none"), i) for i in range(len(envs))]
    names = [",".join(f"{k}={v}" for k, v in load.items()) for load in loads]
    scored = []
    for n, table in enumerate(tables):
        spec = ServingPolicySpec(dsd_label(table), "dsd", dsd=table)
        speedups = [throughput(spec, i) / plain[i] for i in range(len(envs))]
        scored.append({"label": spec.label, "table": [list(t) for t in table],
                       "score": float(np.exp(np.mean(np.log(speedups)))),
                       "speedups": dict(zip(names, map(float, speedups)))})
        if progress:
            progress(n + 1, len(tables))
    return sorted(scored, key=lambda r: -r["score"])


def run_serving_eval(out: str | Path, *, policies: list[str] | str, concurrency: list[int] = (1, 4, 16),
                     rates: list[float] = (), repeats: int = 1, config=None, tokenizer=None,
                     progress: Callable[[int, int, str], None] | None = None,
                     make_env: Callable[[Any, ServingPolicySpec], Any] | None = None) -> dict:
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
    from draftrl.io import write_json

    specs = parse_serving_policies(policies)
    config = config or ServeConfig(split="heldout", shuffle=False, seed=0)
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
        engines = {s.label: _engine_for(s, config) for s in specs}
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
                env = make_env(dataclasses.replace(load_cfg, rule="heuristic" if spec.kind == "heuristic" else "match"),
                               spec)
                prompt_ids = [p.id for p in env.workload.prompts][: config.num_requests or None]
                seed = config.seed if config.seed is not None else 0
                if config.temperature > 0:  # independent sampled streams for the pooled check
                    seed += 1000 * li + repeat
                requests, steps = run_episode(env, _Actor(spec, env), prompt_ids, seed=seed,
                                              check=checks.get(spec.label))
                per_policy[spec.label].append((requests, steps))
                done += 1
                if progress:
                    progress(done, total, f"{section}={key} {spec.label}")
        section_out = results.setdefault(section, {})
        table = {}
        for spec in specs:
            runs = per_policy[spec.label]
            best = sorted(runs, key=lambda rs: sum(s["seconds"] for s in rs[1]))[(len(runs) - 1) // 2]
            requests, steps = best
            summary = summarize(requests, steps)
            summary["per_language"] = _groups(requests, "language")
            summary["per_task"] = _groups(requests, "task")
            summary["depth_histogram"] = _hist(s["depth"] for s in steps)
            table[spec.label] = summary
            tokens = {r.prompt_id: list(r.token_ids) for r in requests}
            if spec.kind == "none":
                reference_tokens[f"{section}={key}"] = tokens
            elif config.temperature == 0:
                ref = reference_tokens[f"{section}={key}"]
                bad = [pid for pid in ref if tokens.get(pid) != ref[pid]]
                summary["greedy_identical_requests"] = len(ref) - len(bad)
                mismatches += [f"{spec.label} at {section}={key} on {pid}" for pid in bad]
        ref, ref_cpu = table["none"]["tokens_per_second"], table["none"]["tokens_per_cpu_second"]
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
    (out / "report.md").write_text(render_report(results))
    if failures:
        raise ServingMismatch(f"{len(failures)} exactness failure(s): " + "; ".join(failures[:5]))
    return results


def _hist(values) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[str(v)] = out.get(str(v), 0) + 1
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def render_report(results: dict) -> str:
    """A markdown table per load: ratios first."""
    lines = ["# Serving evaluation (vLLM)", ""]
    hw = results.get("hardware", {})
    for section in ("concurrency", "rates"):
        for key, entry in results.get(section, {}).items():
            lines += [f"## {section} = {key}", "",
                      "| policy | speedup vs none | tokens/s | tokens/step | acceptance | TTFT p50 s | ITL p50 ms | ITL p95 ms | ITL p99 ms |",
                      "|---|---|---|---|---|---|---|---|---|"]
            for name, p in entry["policies"].items():
                fmt = lambda v, m=1.0, f="{:.2f}": "-" if v is None else f.format(v * m)  # noqa: E731
                lines.append(f"| {name} | {fmt(p['speedup_vs_none'])}x | {p['tokens_per_second']:.1f} | "
                             f"{p['mean_tokens_per_step']:.2f} | {fmt(p['acceptance'])} | "
                             f"{fmt(p['time_to_first_token_p50'])} | {fmt(p['itl_p50'], 1e3, '{:.1f}')} | "
                             f"{fmt(p['itl_p95'], 1e3, '{:.1f}')} | {fmt(p['itl_p99'], 1e3, '{:.1f}')} |")
            lines.append("")
    ex = results["exactness"]
    if ex["greedy_identity"]["checked"]:
        how = f"greedy identity, reference {ex['greedy_identity']['reference']}"
    else:
        how = "monitor on the sampled streams: " + ", ".join(
            f"{name} {v['verdict']}" + (f" on {v['num_informative']} tokens" if "num_informative" in v else "")
            for name, v in ex["monitor"]["policies"].items())
    lines.append(f"Exactness: {'PASSED' if ex['passed'] else 'FAILED'} (temperature {ex['temperature']}, "
                 f"{ex['dtype']}, {how}).")
    lines.append(f"Hardware: {hw.get('cpu')} ({hw.get('cpu_count')} cores). Timings are wall clock on that machine.")
    return "\n".join(lines) + "\n"
