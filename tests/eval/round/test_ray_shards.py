"""``draftrl grid --ray`` and ``draftrl eval --ray`` (issue 47, item 2) on one local Ray cluster bound to
127.0.0.1 with two workers, shared by the module: the requests' tokens, rounds, exactness verdicts and
request ids are the one-process run's, every request exactly once (the rounds of a policy whose state
carries over between requests, the heuristic, follow its worker's own requests: its tokens only). Skipped without Ray
(``pip install "draftrl[ray]"``), except the merge's negative controls and the one-line refusals.

A random 8-layer Llama (``tests/byo/byo_models.py``), four requests per split of 12 tokens, n-gram
drafting, one repeat. ``slow`` (about 3 minutes on a busy 2-core machine: a cluster start, two grids,
two evaluations, three pairs of worker loads): ``pytest -m slow tests/eval/round/test_ray_shards.py``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from draftrl.cli import main
from draftrl.eval.round.config import EvalConfig

ROOT = Path(__file__).resolve().parents[3]


def common(target: Path, out: Path) -> list[str]:
    return ["--config", str(ROOT / "configs" / "eval_tiny_cpu.yaml"), "--target", str(target), "--threads", "1",
            "--set", "env.max_new_tokens=12", "--set", "env.kernels=stock", "--set", "grid.depths=[0,2,4]",
            "--set", "grid.repeats=1", "--set", "eval.repeats=1", "--set", "eval.anchor_gammas=[2]",
            "--set", "eval.greedy_reference=4", "--out", str(out), "--quiet"]


def grid_argv(target: Path, out: Path, *extra: str) -> list[str]:
    return ["grid", *common(target, out), *extra]


def eval_argv(target: Path, out: Path, *extra: str) -> list[str]:
    return ["eval", *common(target, out), "--policies", "none,fixed:2,heuristic,lookahead", *extra]


@pytest.fixture(autouse=True)
def _no_wandb(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    sys.path.insert(0, str(ROOT / "tests" / "byo"))
    from byo_models import build_target

    return build_target(tmp_path_factory.mktemp("byo") / "my-target")


@pytest.fixture(scope="module")
def cluster():
    """One local cluster for the module (the commands join it and leave it running); Ray's presence is
    checked without importing it (draftrl's local cluster sets what Ray reads at import)."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip('Ray is not installed; run pip install "draftrl[ray]"')
    from draftrl.cluster import LOCAL, start

    ray = start(LOCAL, 2)
    yield ray
    ray.shutdown()


def runs_of(grid_or_eval: dict, table: str) -> dict:
    """The deterministic part of each cell's or policy's summary: tokens, rounds, acceptance, requests."""
    keys = ("num_tokens", "num_requests", "mean_tokens_per_round", "mean_verified_per_round", "acceptance_by_position",
            "tokens_per_round_histogram", "depth_histogram", "verify_size_histogram")
    return {name: {k: c.get(k) for k in keys} | {"per_language": {lang: g["num_tokens"]
                                                                   for lang, g in c["per_language"].items()}}
            for name, c in grid_or_eval[table].items()}


def verdict_of(exactness: dict) -> dict:
    identity = exactness["greedy_identity"]
    return {k: identity.get(k) for k in ("checked", "passed", "comparisons", "identical", "reference_tokens",
                                          "tokens_before_divergence", "requests", "per_setting", "mode")}


@pytest.mark.slow
def test_grid_on_two_workers_is_the_one_process_grid(cluster, target, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(grid_argv(target, one)) == 0
    assert main(grid_argv(target, two, "--ray", "--ray-workers", "2")) == 0
    a, b = (json.loads((d / "grid.json").read_text()) for d in (one, two))
    assert len(b["prompts"]) == len(set(b["prompts"])) == 4 and b["prompts"] == a["prompts"]
    assert runs_of(b, "cells") == runs_of(a, "cells")
    assert verdict_of(b["exactness"]) == verdict_of(a["exactness"])
    assert b["exactness"]["greedy_identity"]["passed"] and b["exactness"]["greedy_identity"]["comparisons"] == 4 * 2
    assert b["hardware"]["ray_workers"] == 2
    assert sorted(p.name for p in two.iterdir()) == sorted(p.name for p in one.iterdir())


@pytest.mark.slow
def test_eval_on_two_workers_is_the_one_process_eval(cluster, target, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(eval_argv(target, one)) == 0
    assert main(eval_argv(target, two, "--ray", "--ray-workers", "2")) == 0
    a, b = (json.loads((d / "results.json").read_text()) for d in (one, two))
    assert len(b["prompts"]) == len(set(b["prompts"])) == 4 and b["prompts"] == a["prompts"]
    stateless = ("none", "fixed:2", "lookahead")  # the heuristic's schedule carries over from request to request
    assert {k: v for k, v in runs_of(b, "policies").items() if k in stateless} == \
        {k: v for k, v in runs_of(a, "policies").items() if k in stateless}
    for k in ("num_tokens", "num_requests"):  # its tokens are plain decoding's all the same
        assert b["policies"]["heuristic"][k] == a["policies"]["heuristic"][k]
    assert verdict_of(b["exactness"]) == verdict_of(a["exactness"])
    assert b["exactness"]["passed"] and b["exactness"]["greedy_identity"]["comparisons"] == 4 * 3
    assert b["exactness"]["hf_reference"]["checked"] == a["exactness"]["hf_reference"]["checked"] == 4
    assert b["trajectories"] == a["trajectories"] | {"policies": b["trajectories"]["policies"]}
    assert b["trajectories"]["policies"].keys() == a["trajectories"]["policies"].keys()
    assert {k: v["identical_to_none"] for k, v in b["anchors"]["methods"].items()} == \
        {k: v["identical_to_none"] for k, v in a["anchors"]["methods"].items()}
    assert sorted(p.name for p in two.iterdir()) == sorted(p.name for p in one.iterdir())


@pytest.mark.slow
def test_each_request_decodes_token_for_token_as_in_one_process(cluster, target):
    """Below the summaries: every (cell, request) run's tokens and accepted lengths."""
    from draftrl.config import load_config
    from draftrl.eval.round.cells import Cell
    from draftrl.eval.round.grid import measure_cells
    from draftrl.eval.round.ray_shards import RayShards

    config = load_config(EvalConfig, ROOT / "configs" / "eval_tiny_cpu.yaml",
                         [f"env.target={target}", "env.max_new_tokens=12", "env.kernels=stock", "grid.repeats=1",
                          "threads=1", "eval.anchors=false"])
    cells = [Cell(0), Cell(3)]
    ref, _ = measure_cells(config, cells)
    with RayShards(config, "grid", workers=2) as shards:
        runs, exactness = shards.measure(config, cells)
    key = [(r.policy, r.prompt_id, r.repeat) for r in ref]
    assert [(r.policy, r.prompt_id, r.repeat) for r in runs] == key  # the one-process order, each once
    assert [r.token_ids for r in runs] == [r.token_ids for r in ref]
    assert [r.round_accepted.tolist() for r in runs] == [r.round_accepted.tolist() for r in ref]
    assert exactness["greedy_identity"]["passed"] and exactness["greedy_identity"]["requests"] == 4


def test_a_merge_that_loses_or_repeats_a_shard_is_refused():
    """The negative control of ``merge_runs``: a shard sent twice, a shard lost."""
    from draftrl.eval.round.ray_shards import merge_runs

    def run(policy: str, prompt: str) -> SimpleNamespace:
        return SimpleNamespace(policy=policy, prompt_id=prompt, repeat=0)

    order = ["a", "b", "c", "d"]
    shard0 = [run("none", "a"), run("d2", "a"), run("none", "c"), run("d2", "c")]
    shard1 = [run("d2", "b"), run("none", "b"), run("none", "d"), run("d2", "d")]
    merged = merge_runs([shard1, shard0], order)
    assert [(r.prompt_id, r.policy) for r in merged] == [("a", "none"), ("a", "d2"), ("b", "d2"), ("b", "none"),
                                                         ("c", "none"), ("c", "d2"), ("d", "none"), ("d", "d2")]
    with pytest.raises(RuntimeError, match=r"exactly once \(repeated \[\('d2', 0, 'a'\)"):
        merge_runs([shard0, shard1, shard0], order)
    with pytest.raises(RuntimeError, match=r"missing \['b', 'd'\]"):
        merge_runs([shard0], order)


def test_workers_on_two_device_kinds_are_refused_for_timing():
    from draftrl.cluster import refuse_mixed_kinds

    assert refuse_mixed_kinds(["NVIDIA H100", "NVIDIA H100"], "grid") == "NVIDIA H100"
    with pytest.raises(ValueError, match=r"2 device kinds \(NVIDIA A100; NVIDIA H100\) would pool timings"):
        refuse_mixed_kinds(["NVIDIA H100", "NVIDIA A100"], "grid")


def test_ray_refusals_are_one_line(tmp_path, capsys):
    """Before any model loads: a sweep cell with --ray, --ray with vLLM evaluations, a GPU device with no
    GPU asked of Ray."""
    def line(argv: list[str]) -> str:
        code = main(argv)
        lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
        assert code == 2 and len(lines) == 1, lines
        return lines[0]

    config = ["--config", str(ROOT / "configs" / "eval_tiny_cpu.yaml"), "--out", str(tmp_path / "o")]
    assert "a sweep cell (--cell)" in line(["grid", *config, "--ray", "--cell", "--depth", "2"])
    assert "--ray shares out --engine hf evaluations only" in line(["eval", *config, "--ray", "--engine", "vllm"])
    assert "pass --ray-gpus 1" in line(["grid", *config, "--ray", "--device", "cuda"])
