"""The serving baselines searched in the replay on the tuning split (vLLM's Dynamic SD table, the
best fixed depth on the mix and per sampling class) and the replay's hindsight ceiling per load."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from draftrl.eval.metrics import serving_groups
from draftrl.eval.policy_names import REFERENCE, PolicyName, dsd_label
from draftrl.eval.serve.policies import build_serving_policy
from draftrl.eval.serve.rollout import episode_throughput, run_episode


def search_dsd(make_env: Callable[[Any, PolicyName], Any], config, loads: list[dict[str, Any]], *,
               ranges: tuple[tuple[int, int], ...] = ((1, 1), (2, 4), (5, 8), (9, 16)),
               ks: tuple[int, ...] = (0, 1, 2, 3, 4, 6, 8), monotone: bool = True,
               progress: Callable[[int, int], None] | None = None) -> list[dict[str, Any]]:
    """Grid-search vLLM's Dynamic SD schedule (one K per batch-size range) on ``make_env``'s env
    (the replay, on the tuning split): every table of ``ks`` over ``ranges`` (with
    ``monotone``, only tables whose K never grows with the batch, as vLLM's examples and the cost
    of verification suggest), scored by the geometric mean over ``loads`` (dicts of arrival fields)
    of its throughput over no speculation's. Returns every table's score, best first:
    ``[{"label": "dsd:1-1:8,...", "table": ..., "score": 1.31, "speedups": {load: x}}, ...]``."""
    if ranges[0][0] != 1 or any(a[1] + 1 != b[0] for a, b in zip(ranges, ranges[1:])):
        raise ValueError(f"ranges={ranges} must start at batch size 1 and be contiguous, e.g. ((1, 1), (2, 4)).")
    tables = [tuple((s, e, k) for (s, e), k in zip(ranges, combo))
              for combo in itertools.product(sorted(ks, reverse=True), repeat=len(ranges))
              if not monotone or all(a >= b for a, b in zip(combo, combo[1:]))]
    envs = [make_env(dataclasses.replace(config, **load), PolicyName("dsd", "dsd")) for load in loads]
    prompt_ids = [[p.id for p in env.workload.prompts][: config.num_requests or None] for env in envs]
    seed = config.seed if config.seed is not None else 0

    def throughput(spec: PolicyName, i: int) -> float:
        return episode_throughput(envs[i], build_serving_policy(spec, envs[i]), prompt_ids[i], seed=seed)

    plain = [throughput(PolicyName(REFERENCE, REFERENCE), i) for i in range(len(envs))]
    scored = []
    for n, table in enumerate(tables):
        spec = PolicyName("dsd", dsd_label(table), dsd=table)
        speedups = [throughput(spec, i) / plain[i] for i in range(len(envs))]
        scored.append({"label": spec.label, "table": [list(t) for t in table], "score": _geomean(speedups),
                       "speedups": dict(zip(map(_load_name, loads), map(float, speedups)))})
        if progress:
            progress(n + 1, len(tables))
    return sorted(scored, key=lambda r: -r["score"])


def _load_name(load: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in load.items())


def _geomean(values: list[float]) -> float:
    return float(np.exp(np.mean(np.log(values))))


def search_fixed(make_env: Callable[[Any, PolicyName], Any], config, loads: list[dict[str, Any]], *,
                 ks: tuple[int, ...] = (1, 2, 3, 4, 6, 8)) -> dict[str, Any]:
    """The best single depth ``fixed:K`` (no budget) on ``make_env``'s env (the replay on the tuning
    split, the workload's temperature mix), scored as :func:`search_dsd` scores a table, and the
    best K per sampling class (each class's tokens / request latency over no speculation's, in the
    same mixed episodes: what a class gains from K where the batch mixes classes). Why both: the
    issue asks fixed K searched on the mix and per temperature, and a per-class K beating the mix's
    K says a policy that tells classes apart has something to win.
    Returns ``{"best": "fixed:4", "score": 1.3, "per_class": {"T0.7": {"best": "fixed:2", "score": ...}},
    "scores": [{"label", "score", "speedups", "class_scores"}, ...]}`` (best first)."""
    envs = [make_env(dataclasses.replace(config, **load), PolicyName("fixed", "fixed")) for load in loads]
    prompt_ids = [[p.id for p in env.workload.prompts][: config.num_requests or None] for env in envs]
    seed = config.seed if config.seed is not None else 0

    def episode(spec: PolicyName, i: int) -> tuple[float, dict[str, float]]:
        requests, steps = run_episode(envs[i], build_serving_policy(spec, envs[i]), prompt_ids[i], seed=seed)
        groups = serving_groups(requests, "sampling_label")
        overall = sum(len(r.token_ids) for r in requests) / sum(st["seconds"] for st in steps)
        return overall, {c: g["tokens_per_second"] for c, g in groups.items()}

    plain = [episode(PolicyName(REFERENCE, REFERENCE), i) for i in range(len(envs))]
    scores = []
    for k in ks:
        runs = [episode(PolicyName("fixed", f"fixed:{k}", depth=k), i) for i in range(len(envs))]
        speedups = [run[0] / base[0] for run, base in zip(runs, plain)]
        classes = sorted(set().union(*(run[1] for run in runs)))
        class_scores = {c: _geomean([run[1][c] / base[1][c] for run, base in zip(runs, plain)
                                     if c in run[1] and base[1].get(c)]) for c in classes}
        scores.append({"label": f"fixed:{k}", "score": _geomean(speedups),
                       "speedups": dict(zip(map(_load_name, loads), speedups)), "class_scores": class_scores})
    scores.sort(key=lambda r: -r["score"])
    classes = sorted(set().union(*(r["class_scores"] for r in scores)))
    per_class = {}
    for c in classes:
        best = max(scores, key=lambda r: r["class_scores"].get(c, 0.0))
        per_class[c] = {"best": best["label"], "score": best["class_scores"][c]}
    return {"best": scores[0]["label"], "score": scores[0]["score"], "per_class": per_class, "scores": scores}


def hindsight_bound(make_env: Callable[[Any, PolicyName], Any], config,
                    loads: list[dict[str, Any]]) -> dict[str, float]:
    """Per load, the replay's ceiling over no speculation: every request drafts just the tokens its
    continuation will accept (rule ``hindsight``, the drafter's proposals), at the best depth cap
    and budget of the serving grid (at high load the deepest cap without a budget verifies so many
    rows that a smaller one is faster: ``benchmarks/serve_headroom.py``'s ``hindsight``). Why: a
    policy short of a goal at a load is short of this ceiling, or the ceiling is short of the goal;
    the two say which."""
    out = {}
    seed = config.seed if config.seed is not None else 0
    for load in loads:
        cfg = dataclasses.replace(config, **load)
        reference = make_env(cfg, PolicyName(REFERENCE, REFERENCE))
        bound = make_env(dataclasses.replace(cfg, rule="hindsight"), PolicyName("fixed", "hindsight"))
        ids = [p.id for p in reference.workload.prompts][: config.num_requests or None]
        plain = episode_throughput(reference, build_serving_policy(PolicyName(REFERENCE, REFERENCE), reference),
                                   ids, seed=seed)
        out[_load_name(load)] = max(
            episode_throughput(bound, build_serving_policy(PolicyName("fixed", f"hindsight:{d}:{b}", depth=d,
                                                                      verify_size=b), bound), ids, seed=seed)
            for d in config.depths if d > 0 for b in config.budgets if b > 0) / plain
    return out
