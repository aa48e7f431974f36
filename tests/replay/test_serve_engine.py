"""The serving replay's engine (``draftrl.replay.serve_engine.ReplayEngine``) without vLLM: admission
identical to the vLLM proposer's code on the same steps, recordings that round-trip, refusals that
name the fix (the env around it: ``tests/envs/test_serve_replay.py``)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from serve_recordings import COST, TOKENS, synthetic_recordings

from draftrl.decoding.admission import StepAction
from draftrl.decoding.vllm.control import rule_controller
from draftrl.decoding.vllm.proposer import DraftrlProposer
from draftrl.replay.recordings import Recordings
from draftrl.replay.serve_engine import ReplayEngine


@pytest.fixture(scope="module")
def recordings():
    return synthetic_recordings()


def test_admission_equals_the_vllm_proposers_on_the_same_steps(recordings):
    """Drive draftrl's vLLM proposer class with the replay's batches, both deciding with the same rule
    controllers: every request's drafts, acceptance estimates and match lengths are the replay's."""
    for rule in ("match", "heuristic"):
        engine = ReplayEngine(recordings, COST, max_depth=8, max_num_seqs=6, rule=rule)
        proposer = DraftrlProposer(SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=8),
                                                   model_config=SimpleNamespace(max_model_len=1024)))
        proposer.set_controller(rule_controller(rule))
        for i, r in enumerate(recordings.requests):
            engine.add_request(f"r{i}", r.prompt_ids, TOKENS)
        prompts = {f"r{i}": r.prompt_ids for i, r in enumerate(recordings.requests)}
        outputs: dict[str, list[int]] = {k: [] for k in prompts}
        rng = np.random.default_rng(1)
        expected: dict[str, int] = {}
        while engine.has_unfinished_requests():
            action = StepAction(int(rng.choice([0, 1, 2, 4, 8])), [None, 0, 3, 8][int(rng.integers(4))])
            result = engine.step(action)
            sampled = []
            for r in result.requests:
                assert r.num_verified == expected.pop(r.request_id, 0)
                index, n = int(r.request_id[1:]), len(outputs[r.request_id])
                rec = recordings.requests[index].token_ids
                if r.finished and n:  # vLLM's proposer sees every token the last step verified, past the limit
                    sampled.append(rec[n: n + min(min(engine.proposals.accepted[index][n], r.num_verified) + 1,
                                                  len(rec) - n)])
                else:
                    sampled.append(r.token_ids)
                outputs[r.request_id].extend(sampled[-1])
            rows = [r.request_id for r in result.requests]
            contexts = [prompts[k] + outputs[k] for k in rows]
            token_ids = np.zeros((len(rows), max(map(len, contexts))), dtype=np.int64)
            for row, ctx in enumerate(contexts):
                token_ids[row, :len(ctx)] = ctx
            proposer.runner = SimpleNamespace(input_batch=SimpleNamespace(req_ids=rows))
            proposer.controller.action = action
            drafts = proposer.propose(sampled, np.array(list(map(len, contexts))),
                                      token_ids)
            assert sum(map(len, drafts)) == result.num_proposed
            expected = {k: len(d) for k, d in zip(rows, drafts) if d}
            acceptance, match = engine.request_signals()
            np.testing.assert_allclose(acceptance, proposer.last.acceptance)
            assert match.tolist() == proposer.last.match_len.tolist()
            for k, d in zip(rows, drafts):  # the replay's acceptance = the proposer's drafts vs the recording
                index, n = int(k[1:]), len(outputs[k])
                rec = recordings.requests[index].token_ids
                agree = 0
                while agree < len(d) and n + agree < len(rec) and d[agree] == rec[n + agree]:
                    agree += 1
                assert agree == min(len(d), engine.proposals.accepted[index][n])


def test_recordings_round_trip(recordings, tmp_path):
    recordings.save(tmp_path)
    loaded = Recordings.load(tmp_path)
    assert [(r.prompt, r.prompt_ids, r.token_ids) for r in loaded.requests] == \
        [(r.prompt, r.prompt_ids, r.token_ids) for r in recordings.requests]


def test_requests_outside_the_recordings_are_refused(recordings):
    with pytest.raises(ValueError, match="record"):
        ReplayEngine(recordings, COST).add_request("x", [1, 2, 3], 8)
    with pytest.raises(ValueError, match="max_new_tokens_cap"):
        ReplayEngine(recordings, COST).add_request("x", recordings.requests[1].prompt_ids, TOKENS + 1)


def test_the_replay_follows_only_the_rules_it_can_replay(recordings):
    """``match``, ``heuristic`` and ``hindsight``; padding (``fill``) and the head's stop and load parts
    need what no recording holds, and are refused in one line, by name or as a controller."""
    from draftrl.decoding.vllm.control import FillRule, HeuristicRule
    from draftrl.replay.serve_engine import HindsightRule

    for rule in ("fill", "confidence:0.6", "match|batch:1", "policy"):
        with pytest.raises(ValueError, match=f"rule='{rule}' cannot be replayed") as err:
            ReplayEngine(recordings, COST, rule=rule)
        assert "\n" not in str(err.value)
    engine = ReplayEngine(recordings, COST, rule="hindsight")
    assert type(engine.controller) is HindsightRule
    engine.set_controller(HeuristicRule())
    with pytest.raises(ValueError, match="rule='fill' cannot be replayed"):
        engine.set_controller(FillRule())
