"""Shared helpers of the evaluation tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def assert_png(path) -> None:
    """``path`` exists and is a readable PNG image of sensible size."""
    import matplotlib.image as mpimg

    path = Path(path)
    assert path.is_file(), f"{path} was not written"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100, img.shape
    assert float(np.std(img)) > 0.01, f"{path} is blank"


def _policy(tps: float, speedup: float, hist: dict) -> dict:
    group = {"tokens_per_second": tps, "speedup_vs_none": speedup, "mean_tokens_per_round": 1.5, "num_tokens": 64,
             "seconds": 64 / tps, "num_requests": 2}
    return {
        "spec": "x", "tokens_per_second": tps, "speedup_vs_none": speedup,
        "paired_speedup": {"median": speedup, "p10": speedup, "p90": speedup, "num_requests": 2},
        "mean_tokens_per_round": 1.5, "num_tokens": 64, "num_rounds": 40, "num_requests": 2,
        "time_to_first_token_mean": 0.2, "time_to_first_token_p50": 0.2,
        "itl_p50": 0.03, "itl_p95": 0.05, "itl_p99": 0.08, "peak_memory_bytes": 3 * 2**20,
        "tokens_per_round_histogram": hist, "depth_histogram": {"0": 10, "4": 30},
        "acceptance_by_position": {"rate": [0.6, 0.5, None], "trials": [30, 18, 0]},
        "per_language": {"en": dict(group), "zh": dict(group)},
        "per_task": {"chat": dict(group), "code_edit": dict(group)},
    }


def fake_results() -> tuple[dict, dict]:
    """A results.json-shaped dict and a grid.json-shaped dict, as the real runs write them."""
    grid = {
        "split": "tune", "repeats": 2, "prompts": ["a", "b"], "hardware": {"cpu": "test", "threads": 1},
        "config": {"env": {"drafter": "ngram"}},
        "cells": {
            "d0_v0_w1": {"depth": 0, "verify_size": 0, "width": 1, "speedup_vs_none": 1.0},
            "d2_v0_w1": {"depth": 2, "verify_size": 0, "width": 1, "speedup_vs_none": 1.2},
            "d4_v0_w1": {"depth": 4, "verify_size": 0, "width": 1, "speedup_vs_none": 0.9},
        },
        "best": {"name": "d2_v0_w1", "depth": 2, "verify_size": 0, "width": 1, "speedup_vs_none": 1.2},
    }
    rng = np.random.default_rng(0)
    results = {
        "format": "draftrl-eval/1", "split": "heldout", "prompts": ["en-chat-003", "zh-chat-003"], "repeats": 1,
        "reference": "none", "wall_seconds": 10.0, "hardware": {"cpu": "test", "threads": 1, "torch": "x"},
        "config": {"env": {"target": "smollm2-135m", "drafter": "ngram", "temperature": 1.0, "languages": ["en", "zh"],
                           "tasks": ["chat"], "max_new_tokens": 32}},
        "policies": {"none": _policy(10.0, 1.0, {"1": 64}), "heuristic": _policy(12.0, 1.2, {"1": 20, "2": 12, "5": 4}),
                     "ppo": _policy(13.0, 1.3, {"1": 10, "3": 18})},
        "best_grid": grid["best"],
        "exactness": {
            "passed": True, "temperature": 1.0, "sampler": "correct",
            "greedy_identity": {"checked": False, "why": "temperature > 0"}, "hf_reference": {"checked": 0},
            "monitor": {name: {"passed": True, "num_tokens": 640, "num_informative": 600, "num_drafted_positions": 300,
                               "tests": {}, "pit_histogram": rng.multinomial(600, [0.05] * 20).tolist(), "failures": []}
                        for name in ("none", "heuristic", "ppo")},
            "monitor_overhead": {"fraction": 0.004, "seconds": 0.01, "run_seconds": 2.5, "target": 0.03, "note": ""},
        },
        "trajectories": {"prompt_id": "en-chat-003", "policies": {
            "heuristic": {"depth": [4, 6, 5, 4, 3], "verify_size": [0] * 5, "tokens": [5, 2, 1, 3, 1]},
            "ppo": {"depth": [2, 2, 0, 4], "verify_size": [0] * 4, "tokens": [3, 3, 1, 5]}}},
    }
    return results, grid


def with_intervals(results: dict) -> dict:
    """``results`` with the paired intervals ``add_anchors`` writes: ``best-grid`` is the best fixed
    reference; every policy's ratio over it, plain decoding, HF generate and HF prompt lookup."""
    best = results["policies"]["best-grid"] = dict(results["policies"]["heuristic"], spec="best-grid")
    for name, p in results["policies"].items():
        for ref, base in (("none", results["policies"]["none"]), ("best_fixed", best)):
            if p is base:
                p[f"ci_vs_{ref}"] = {"ratio": 1.0, "reference": True}
                continue
            ratio = p["tokens_per_second"] / base["tokens_per_second"]
            p[f"ci_vs_{ref}"] = {"ratio": ratio, "low": ratio * 0.9, "high": ratio * 1.1, "confidence": 0.95,
                                 "num_requests": 2, "resolved": False, "verdict": "not resolved"}
        for ref, tps in (("hf", 9.0), ("hf_lookup", 11.0)):
            ratio = p["tokens_per_second"] / tps
            p[f"speedup_vs_{ref}"] = ratio
            p[f"ci_vs_{ref}"] = {"ratio": ratio, "low": ratio * 0.95, "high": ratio * 1.05, "confidence": 0.95,
                                 "num_requests": 2, "resolved": True, "verdict": "faster" if ratio > 1 else "slower"}
    return results


def eval_run_problems(run, results: dict) -> list[str]:
    """What a user would not find on the evaluation's wandb run (``wandb_records.OfflineRun``) after
    ``wandb sync``, against the results.json it logged: every policy's summary scalars under
    ``policy/<name>/`` (tokens/s, acceptance length, ITL, the speedups over plain decoding, the best
    fixed setting, HF generate and HF prompt lookup, each interval's ends around its ratio), the
    policies, per-language and per-task tables, the bar chart, the exactness verdict and table."""
    import pytest

    from draftrl.eval.wandb_log import key_part

    problems = []
    summary = run.summary
    for name, p in results["policies"].items():
        k = f"policy/{key_part(name)}"
        expected = {"tokens_per_second": p["tokens_per_second"], "acceptance_length": p["mean_tokens_per_round"],
                    "itl_p50_ms": p["itl_p50"] * 1e3, "itl_p99_ms": p["itl_p99"] * 1e3,
                    "speedup_vs_none": p["speedup_vs_none"]}
        for ref in ("best_fixed", "hf", "hf_lookup"):
            ci = p.get(f"ci_vs_{ref}")
            if ci and ci.get("ratio") is not None:
                expected[f"speedup_vs_{ref}"] = ci["ratio"]
                expected[f"speedup_vs_{ref}_low"] = 1.0 if ci.get("reference") else ci["low"]
                expected[f"speedup_vs_{ref}_high"] = 1.0 if ci.get("reference") else ci["high"]
        for metric, value in expected.items():
            got = summary.get(f"{k}/{metric}")
            if got is None or got != pytest.approx(value):
                problems.append(f"{k}/{metric} is {got}, results.json says {value}")
        for ref in ("best_fixed", "hf", "hf_lookup"):
            low, ratio, high = (summary.get(f"{k}/speedup_vs_{ref}{s}") for s in ("_low", "", "_high"))
            if None not in (low, ratio, high) and not low <= ratio <= high:
                problems.append(f"{k}/speedup_vs_{ref} = {ratio} lies outside its interval [{low}, {high}]")
    tables = {}
    for key in ("compare/policies", "compare/per_language", "compare/per_task", "exactness/checks"):
        try:
            tables[key] = run.table(key)
        except KeyError as err:
            problems.append(str(err))
    if "compare/policies" in tables:
        columns, rows = tables["compare/policies"]
        missing = set(results["policies"]) - {row[columns.index("policy")] for row in rows}
        problems += [f"compare/policies has no row for {name}" for name in sorted(missing)]
    for key, group in (("compare/per_language", "per_language"), ("compare/per_task", "per_task")):
        if key in tables:
            columns, rows = tables[key]
            seen = {(row[0], row[1]) for row in rows}
            want = {(name, value) for name, p in results["policies"].items() for value in p[group]}
            problems += [f"{key} has no row for {pair}" for pair in sorted(want - seen)]
    if any(p.get("ci_vs_best_fixed") for p in results["policies"].values()):
        try:
            assert_png(run.image("compare/speedup_vs_best_fixed"))
        except (KeyError, AssertionError) as err:
            problems.append(f"the bar chart compare/speedup_vs_best_fixed: {err}")
    if summary.get("exactness/passed") is not results["exactness"]["passed"]:
        problems.append(f"exactness/passed is {summary.get('exactness/passed')}")
    return problems
