"""Shared helpers of the evaluation tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


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
