"""``draftrl.eval.serving.run_serving_eval`` on the serving simulator (``make_env``): the runner of
``draftrl eval --engine vllm`` and ``benchmarks/serve_sweep.py``, without vLLM."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from draftrl.config.serve import ServeConfig
from draftrl.envs.serve_replay import ServeReplayEnv
from draftrl.eval.serving import run_serving_eval

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "envs"))
from test_serve_replay import COST, TOKENS, synthetic_recordings  # noqa: E402


def test_policies_in_the_simulator_under_load(tmp_path):
    recordings = synthetic_recordings(8)
    config = ServeConfig(max_new_tokens=TOKENS, shuffle=False, seed=0)
    results = run_serving_eval(tmp_path, policies="none,fixed:1,fixed:4:4,heuristic,dsd", concurrency=[1, 4],
                               rates=[3.0], repeats=2, config=config,
                               make_env=lambda cfg, spec: ServeReplayEnv(recordings, COST, cfg))
    assert results["exactness"]["passed"]  # every policy emitted the recorded continuations
    for section, key in (("concurrency", "1"), ("concurrency", "4"), ("rates", "3")):
        table = results[section][key]["policies"]
        assert set(table) == {"none", "fixed:1", "fixed:4:4", "heuristic", "dsd"}
        assert table["none"]["speedup_vs_none"] == 1.0 and table["none"]["num_drafted"] == 0
        assert table["fixed:1"]["num_drafted"] > 0
        assert all(t["num_tokens"] == table["none"]["num_tokens"] for t in table.values())
    four = results["concurrency"]["4"]["policies"]
    assert four["fixed:4:4"]["num_drafted"] <= 4 * four["fixed:4:4"]["num_steps"]  # the budget binds
    assert results["concurrency"]["4"]["policies"]["none"]["mean_batch"] > \
        results["concurrency"]["1"]["policies"]["none"]["mean_batch"] == pytest.approx(1.0)
