"""Grid-search vLLM's Dynamic SD schedule, the strongest hand-made serving baseline, in the replay."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from draftrl.eval.policy_names import REFERENCE, PolicyName, dsd_label
from draftrl.eval.serve.policies import build_serving_policy
from draftrl.eval.serve.rollout import episode_throughput


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
    names = [",".join(f"{k}={v}" for k, v in load.items()) for load in loads]
    scored = []
    for n, table in enumerate(tables):
        spec = PolicyName("dsd", dsd_label(table), dsd=table)
        speedups = [throughput(spec, i) / plain[i] for i in range(len(envs))]
        scored.append({"label": spec.label, "table": [list(t) for t in table],
                       "score": float(np.exp(np.mean(np.log(speedups)))),
                       "speedups": dict(zip(names, map(float, speedups)))})
        if progress:
            progress(n + 1, len(tables))
    return sorted(scored, key=lambda r: -r["score"])
