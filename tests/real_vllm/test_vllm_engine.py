"""vLLM with draftrl's proposer against vLLM without speculation: float32 greedy identity,
the budget and the depth cap as vLLM executes them, and budget 0 = the no-speculation schedule."""

from __future__ import annotations

import pytest

from draftrl.decoding.admission import StepAction
from draftrl.decoding.interface import ServingEngine
from draftrl.decoding.vllm.control import rule_controller
from draftrl.decoding.vllm.engine import VLLMEngine, VLLMEngineConfig, shared_engine

TOKENS = 32


@pytest.fixture
def plain():  # per test: shared_engine caches it, and rebuilds it after an engine was closed
    return shared_engine(VLLMEngineConfig(method="none"))


@pytest.fixture
def drafting():
    return shared_engine(VLLMEngineConfig(method="draftrl"))


def run(engine, prompts, action=None, concurrency=None, tokens=TOKENS):
    """Decode ``prompts`` keeping ``concurrency`` in flight; returns outputs, per-step records."""
    queue = list(prompts)
    concurrency = concurrency or len(queue)
    outputs, steps, records = {}, [], []
    proposer = getattr(engine, "proposer", None)
    if proposer is not None:
        proposer.history = records
    in_flight = 0
    while queue or engine.has_unfinished_requests():
        while queue and in_flight < concurrency:
            rid, ids = queue.pop(0)
            engine.add_request(rid, ids, tokens)
            in_flight += 1
        step = engine.step(action)
        steps.append(step)
        for r in step.requests:
            outputs.setdefault(r.request_id, []).extend(r.token_ids)
            in_flight -= r.finished
    if proposer is not None:
        proposer.history = None
    return outputs, steps, records


@pytest.fixture(scope="module")
def reference(mixed_prompts):
    return run(shared_engine(VLLMEngineConfig(method="none")), mixed_prompts)


def test_engines_satisfy_the_interface(plain, drafting):
    assert isinstance(plain, ServingEngine) and isinstance(drafting, ServingEngine)
    assert drafting.action_lag == 1 and drafting.max_depth == 8


@pytest.mark.parametrize("concurrency,action,rule", [
    (1, StepAction(4), "match"),
    (4, StepAction(4), "match"),
    (4, StepAction(8, 6), "match"),
    (4, StepAction(8), "heuristic"),
])
def test_float32_greedy_identity_with_the_policy_proposer(drafting, reference, mixed_prompts, concurrency, action,
                                                          rule):
    drafting.set_controller(rule_controller(rule))
    try:
        outputs, steps, _ = run(drafting, mixed_prompts, action, concurrency)
    finally:
        drafting.set_controller(rule_controller("match"))
    expected = reference[0]
    assert sorted(outputs) == sorted(expected)
    for rid in expected:
        assert outputs[rid] == expected[rid], f"{rid} differs from vLLM without speculation"
    assert sum(s.num_accepted for s in steps) > 0, "the drafter never got a token accepted: nothing was tested"


def test_budget_and_depth_never_exceeded_as_vllm_executes_them(drafting, mixed_prompts):
    action = StepAction(6, 3)
    outputs, steps, records = run(drafting, mixed_prompts, action)
    assert records and max(int(r.admitted.sum()) for r in records) == 3  # the budget binds
    for record in records:
        assert record.admitted.sum() <= 3 and record.admitted.max(initial=0) <= 6
    # vLLM's side: a request never gains more than (drafts proposed for it one step earlier) + 1
    for before, after in zip(steps, steps[1:]):
        proposed = {r.request_id: r.num_verified for r in after.requests}
        assert sum(proposed.values()) <= 3
        for r in after.requests:
            assert len(r.token_ids) <= r.num_verified + 1
    assert sum(s.num_accepted for s in steps) > 0


def test_budget_zero_gives_exactly_the_no_speculation_schedule(drafting, reference, mixed_prompts):
    outputs, steps, records = run(drafting, mixed_prompts, StepAction(8, 0))
    expected_outputs, expected_steps, _ = reference
    assert outputs == expected_outputs
    schedule = [{r.request_id: len(r.token_ids) for r in s.requests} for s in steps]
    expected = [{r.request_id: len(r.token_ids) for r in s.requests} for s in expected_steps]
    assert schedule == expected
    assert all(int(r.admitted.sum()) == 0 for r in records)
    outputs, steps, _ = run(drafting, mixed_prompts, StepAction(0))
    assert [{r.request_id: len(r.token_ids) for r in s.requests} for s in steps] == expected


def test_closing_an_engine_takes_the_shared_ones_along_and_they_rebuild(reference, mixed_prompts):
    # vLLM's shutdown tears down the process-wide parallel state: a shared engine kept across it
    # failed its next step ("pipeline model parallel group is not initialized")
    before = shared_engine(VLLMEngineConfig(method="none"))
    VLLMEngine(VLLMEngineConfig(method="none", max_model_len=512)).close()
    after = shared_engine(VLLMEngineConfig(method="none"))
    assert after is not before
    assert run(after, mixed_prompts)[0] == reference[0]


def test_seeded_sampled_prompts_beyond_one_step_budget_are_never_split():
    """vLLM 0.32 rewinds a seeded request's generator after a partial prefill, which a CPU generator
    refuses ("CPU Generator does not use offset"): 16 seeded T=0.7 prompts of 300 tokens added at once
    (4800 tokens, above vLLM's 2048-token step) crashed vLLM's ngram engine. On CPU the engine
    schedules whole prompts only: they all finish, and no step prefills more than fits."""
    from draftrl.decoding.vllm.engine import on_gpu, whole_prompts

    config = VLLMEngineConfig(method="ngram", num_speculative_tokens=4)
    if not on_gpu():
        assert whole_prompts(config) == {"enable_chunked_prefill": False, "max_num_batched_tokens": 2048}
    engine = shared_engine(config)
    for i in range(16):
        engine.add_request(f"seeded{i}", [(7 * i + j) % 5000 + 100 for j in range(300)], 8, temperature=0.7, seed=i)
    finished, steps = set(), 0
    while engine.has_unfinished_requests() and steps < 200:
        result = engine.step(StepAction(0))
        finished |= {r.request_id for r in result.requests if r.finished}
        steps += 1
    assert finished == {f"seeded{i}" for i in range(16)}
