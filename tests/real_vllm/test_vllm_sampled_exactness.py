"""Exactness at temperature > 0 inside real vLLM: the monitor on the tokens vLLM emitted, with p from
the raw logprobs it returned, accepts draftrl's proposer and rejects tokens sampled flatter than the
p it is given (the negative control), and ``draftrl eval --engine vllm`` reports the verdict."""

from __future__ import annotations

import json

import pytest

from draftrl.cli import main
from draftrl.decoding.admission import StepAction
from draftrl.decoding.monitor import MonitorConfig
from draftrl.decoding.vllm.engine import VLLMEngineConfig, shared_engine
from draftrl.eval.exactness import SampledStreamCheck

TOKENS = 48


def _sampled_steps(mixed_prompts, runs: dict[str, tuple[float, int]]) -> list:
    """Every engine step's requests: the four mixed prompts once per ``runs`` entry
    (``name: (temperature, seed)``), all in one batch, draftrl's proposer drafting up to 4 tokens."""
    engine = shared_engine(VLLMEngineConfig(method="draftrl"))
    for name, (temperature, seed) in runs.items():
        for pid, ids in mixed_prompts:
            engine.add_request(f"{name}/{pid}", ids, TOKENS, temperature=temperature, seed=seed)
    steps = []
    while engine.has_unfinished_requests():
        steps.append(engine.step(StepAction(4, None)).requests)
    return steps


def _verdict(steps: list, prefixes: tuple[str, ...], temperature: float = 1.0) -> dict:
    """The monitor on the requests whose id starts with one of ``prefixes``, p read at ``temperature``."""
    check = SampledStreamCheck(temperature, 0, 1.0, VLLMEngineConfig().max_logprobs, MonitorConfig(min_tokens=100))
    for requests in steps:
        check.observe([r for r in requests if r.request_id.startswith(prefixes)])
    return check.verdict()


def test_monitor_passes_the_proposer_and_rejects_a_flatter_sampler(mixed_prompts):
    runs = {"a": (1.0, 0), "b": (1.0, 1), "flat": (1.5, 2)}
    steps = _sampled_steps(mixed_prompts, runs)
    exact = _verdict(steps, ("a/", "b/"))
    assert exact["verdict"] == "passed", exact
    assert exact["num_informative"] >= 200 and exact["num_drafted_positions"] > 0  # the proposer speculated
    print(f"exact: {exact['num_informative']} informative tokens, {exact['num_drafted_positions']} drafted")
    # negative control, the same engine, batch and logprobs: tokens sampled at temperature 1.5 read as
    # drawn at temperature 1 (a sampler that misses part of the temperature); 0.5 read as 1 needs more tokens
    wrong = _verdict(steps, ("flat/",))
    assert wrong["verdict"] == "failed", wrong
    print(f"negative control: failed after {wrong['failures'][0]['num_tokens']} of {wrong['num_tokens']} tokens "
          f"({wrong['failures'][0]['statistic']})")


def test_eval_reports_the_monitor_verdict_at_temperature_one(tmp_path):
    out = tmp_path / "sampled"
    code = main(["eval", "--engine", "vllm", "--policies", "none,fixed:4", "--concurrency", "4",
                 "--set", "env.num_requests=4", "--set", f"env.max_new_tokens={TOKENS}", "--set", "env.temperature=1.0",
                 "--out", str(out), "--quiet"])
    assert code == 0
    ex = json.loads((out / "results.json").read_text())["exactness"]
    assert ex["passed"] is True and ex["greedy_identity"]["checked"] is False and ex["monitor"]["checked"] is True
    for name in ("none", "fixed:4"):
        verdict = ex["monitor"]["policies"][name]
        assert verdict["verdict"] in ("passed", "inconclusive") and verdict["num_informative"] > 100, verdict
        assert verdict["p_from"] == "raw_logprobs" and verdict["num_logprobs"] == 20


@pytest.mark.slow
def test_monitor_catches_vllm_cpu_expand_bug_without_the_guard(mixed_prompts, monkeypatch):
    """vLLM 0.32's own CPU expand kernel (see draftrl.decoding.vllm.guards) verifies drafts under
    garbage temperatures: the monitor must reject what it emits."""
    from vllm.platforms import current_platform
    from vllm.v1.sample import rejection_sampler

    if not current_platform.is_cpu():
        pytest.skip("the bug is in vLLM's CPU kernel override")
    shared_engine(VLLMEngineConfig(method="draftrl"))  # built (and guarded) before the kernel is swapped back
    kernel = rejection_sampler.expand_kernel
    shipped = kernel._impl.shipped
    monkeypatch.setattr(kernel, "_impl", shipped)
    monkeypatch.setattr(kernel, "func", shipped)
    steps = _sampled_steps(mixed_prompts, {"a": (1.0, 3), "b": (1.0, 4)})
    assert _verdict(steps, ("a/", "b/"))["verdict"] == "failed"
