"""Route (b): draftrl's vLLM proposer running an EAGLE-3 head itself (hidden states from hooks).

Pins vLLM 0.32's ``custom_class`` interface as ``draftrl.decoding.vllm.head_proposer`` uses it:
the hooks' features, each request's rows, the prefix-cache restore and the runner found from
``load_model``. At the same K its drafts equal stock ``eagle3``'s token for token, at concurrency 1
and 4 (the concurrency-4 round hits the prefix cache for every prompt, the restore path), with both
heads of the ``eagle3_head`` fixture; a proposer fed the wrong features (the residual left out)
drafts otherwise, so the comparison can fail.
"""

from __future__ import annotations

import pytest

from draftrl.decoding.admission import StepAction
from draftrl.decoding.vllm import head_proposer
from draftrl.decoding.vllm.control import rule_controller
from draftrl.decoding.vllm.engine import VLLMEngine, VLLMEngineConfig

K = 3
TOKENS = 16


def _phases(engine: VLLMEngine, prompts: list[list[int]], action: StepAction | None = None) -> dict[str, list[int]]:
    """Each prompt alone (``c1-i``), then all together (``c4-i``): request id -> output tokens."""
    outputs: dict[str, list[int]] = {}
    for phase, batches in (("c1", [[i] for i in range(len(prompts))]), ("c4", [list(range(len(prompts)))])):
        for batch in batches:
            for i in batch:
                engine.add_request(f"{phase}-{i}", prompts[i], TOKENS)
            while engine.has_unfinished_requests():
                for req in engine.step(action).requests:
                    outputs.setdefault(req.request_id, []).extend(req.token_ids)
    return outputs


def _close(engine: VLLMEngine) -> None:
    """Free the engine's ~2 GB now (several are built here, one at a time); the shared ones go too."""
    engine.close()


def _runner(engine: VLLMEngine):
    return engine.llm.engine_core.engine_core.model_executor.driver_worker.worker.model_runner


def _streams(steps: list[dict[str, list[int]]]) -> dict[str, list[list[int]]]:
    """Per external request id, the drafts proposed for it at every step (vLLM's internal ids are ``ID-suffix``)."""
    out: dict[str, list[list[int]]] = {}
    for step in steps:
        for internal, drafts in step.items():
            out.setdefault(internal.rsplit("-", 1)[0], []).append([int(t) for t in drafts])
    return out


def _stock_eagle3(head: str, prompts):
    config = VLLMEngineConfig(method="eagle3", head=head, num_speculative_tokens=K, max_model_len=512)
    engine = VLLMEngine(config)
    runner, steps = _runner(engine), []
    propose = runner.drafter.propose

    def recording(*args, **kwargs):
        drafts = propose(*args, **kwargs)
        rows = drafts.tolist() if hasattr(drafts, "tolist") else drafts
        steps.append(dict(zip(list(runner.input_batch.req_ids), rows)))
        return drafts

    runner.drafter.propose = recording
    try:
        return _phases(engine, prompts), _streams(steps)
    finally:
        _close(engine)


def _route_b(drafter: str, prompts, action: StepAction | None = None):
    config = VLLMEngineConfig(method="draftrl", drafter=drafter, num_speculative_tokens=K, max_model_len=512)
    engine = VLLMEngine(config)
    assert isinstance(engine.proposer, head_proposer.HeadProposer)
    engine.proposer.history = []
    outputs = _phases(engine, prompts, action)
    history = engine.proposer.history
    streams = _streams([dict(zip(r.keys, r.draft_ids)) for r in history])
    unseen, counts = engine.proposer.unseen_prefixes, engine.spec_counts
    _close(engine)
    return outputs, streams, history, unseen, counts


@pytest.fixture(scope="module")
def plain(mixed_prompts):
    engine = VLLMEngine(VLLMEngineConfig(method="none", max_model_len=512))
    out = _phases(engine, [ids for _, ids in mixed_prompts])
    _close(engine)
    return out


def test_route_b_drafts_what_stock_eagle3_drafts_at_the_same_k(mixed_prompts, eagle3_head, plain, monkeypatch):
    prompts = [ids for _, ids in mixed_prompts]
    stock_out, stock = _stock_eagle3(eagle3_head, prompts)
    out, ours, history, unseen, _ = _route_b(f"eagle3:{eagle3_head}", prompts)
    assert stock_out == plain and out == plain
    assert unseen == 0  # the concurrency-4 prefills hit vLLM's prefix cache: features came back from the store
    assert set(ours) == set(stock) == set(plain)
    assert sum(len(d) for s in ours.values() for d in s) > 0
    for rid in stock:
        assert ours[rid] == stock[rid], rid
    if "heads" in eagle3_head:  # the shipped head drafts from its features (the built one always drafts a newline)
        monkeypatch.setattr(head_proposer, "aux_value", lambda hidden, residual: hidden.clone())
        _, wrong, *_ = _route_b(f"eagle3:{eagle3_head}", prompts)
        assert any(wrong[rid] != stock[rid] for rid in stock)


def test_route_b_keeps_the_budget_and_output_and_none_reproduces_no_speculation(mixed_prompts, plain):
    """SAM's per-request mix (lookup on a 2-token match, else the shipped head) under a step budget
    of 2 drafts: never more, every token as without speculation; depth 0 every step drafts nothing."""
    prompts = [ids for _, ids in mixed_prompts]
    out, streams, history, _, _ = _route_b("sam:2", prompts, StepAction(K, 2))
    assert out == plain
    assert all(int(r.admitted.sum()) <= 2 for r in history)
    assert any(int(r.admitted.sum()) == 2 for r in history)
    assert all(len(d) <= K for s in streams.values() for d in s)
    out, streams, history, _, counts = _route_b("sam:2", prompts, StepAction(0))
    assert out == plain
    assert all(int(r.admitted.sum()) == 0 for r in history) and counts.num_drafts == 0


def test_the_load_part_keeps_the_head_to_small_steps(mixed_prompts, plain, monkeypatch):
    """``match|batch:1``: the head drafts while one request decodes and never in a step of more
    (n-gram lookup drafts there); the same engine without the load part drafts the 4 requests of
    a step in one batched head call."""
    from draftrl.drafters.packaged import packaged_head

    prompts = [ids for _, ids in mixed_prompts]
    engine = VLLMEngine(VLLMEngineConfig(method="draftrl", drafter=f"eagle3:{packaged_head('smollm2-135m')}",
                                         num_speculative_tokens=K, max_model_len=512))
    proposer, head_calls, draft_chains = engine.proposer, [], head_proposer.draft_chains

    def counting(drafters, *args, **kwargs):
        if drafters:
            head_calls.append(len(drafters))
        return draft_chains(drafters, *args, **kwargs)

    monkeypatch.setattr(head_proposer, "draft_chains", counting)
    try:
        proposer.history = []
        engine.set_controller(rule_controller("match|batch:1"))
        assert proposer.controller.head_max_batch == 1
        out = _phases(engine, prompts)
        assert out == plain
        assert head_calls and set(head_calls) == {1}
        assert any(len(r.keys) > 1 and int(r.admitted.sum()) > 0 for r in proposer.history)  # lookup drafted there
        head_calls.clear()
        engine.set_controller(rule_controller("match"))
        assert _phases(engine, prompts) == plain
        assert max(head_calls) == len(prompts)
    finally:
        _close(engine)


def test_calibration_times_the_heads_drafting_beside_lookup(monkeypatch):
    """``draftrl calibrate --engine vllm --drafter eagle3`` on a real route (b) engine: every decode
    cell with d >= 1 also as a head cell, the head's batched forward running only there, and what
    it adds to a step positive; the proposer's controller (and so its load part) is restored afterwards."""
    from draftrl.drafters.packaged import packaged_head
    from draftrl.replay.serve_calibrate import StepCostModel, calibrate

    engine = VLLMEngine(VLLMEngineConfig(method="draftrl", drafter=f"eagle3:{packaged_head('smollm2-135m')}",
                                         num_speculative_tokens=2, max_model_len=512, max_num_seqs=4))
    proposer, calls, draft_chains = engine.proposer, [], head_proposer.draft_chains

    def counting(drafters, *args, **kwargs):
        if drafters:
            calls.append(proposer.controller.head_max_batch)
        return draft_chains(drafters, *args, **kwargs)

    monkeypatch.setattr(head_proposer, "draft_chains", counting)
    try:
        result = calibrate(engine, batch_sizes=(1,), depths=(0, 2), steps=4, warmup=1, prefill_lens=(32,),
                           prefill_batch_sizes=(1,), rounds=2)
        cells = {(p["kind"], p["num_seqs"], p["depth"]) for p in result["points"] if p["kind"] != "prefill"}
        assert cells == {("decode", 1, 0), ("decode", 1, 2), ("head", 1, 2)}
        assert calls and set(calls) == {None}  # the head drafted, and only while no step limit kept it idle
        assert result["head"]["1"]["levels"] == [2]
        assert StepCostModel.from_calibration(result).head_seconds(1, 2) > 0
        assert proposer.controller.rule == "match" and proposer.controller.head_max_batch is None
    finally:
        _close(engine)
