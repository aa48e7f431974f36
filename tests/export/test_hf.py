"""An exported policy inside transformers' assisted generation (transformers 5.24, CPU, SmolLM2):
greedy output token-identical to transformers' own greedy decoding, features as in training."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from draftrl.decoding.build import build_engine
from draftrl.export.controller import PolicyController
from draftrl.export.hf import PolicyCandidateGenerator, policy_generate
from draftrl.export.schedule import PolicySchedule

MAX_NEW_TOKENS = 24
PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):",
    "List the days of the week, one per line: Monday, Tuesday, Wednesday,",
]


class ScriptedController:
    """The real manifest, a fixed cycle of depths; records the observations it was given."""

    def __init__(self, controller: PolicyController, depths: list[int]):
        self.script, self.seen = depths, []
        for name in ("kind", "manifest", "feature_names", "width", "depths", "verify_sizes", "path"):
            setattr(self, name, getattr(controller, name))

    def act(self, obs: np.ndarray) -> tuple[int, int]:
        self.seen.append(np.array(obs))
        return self.script[(len(self.seen) - 1) % len(self.script)], 0


def encode(target, prompt: str) -> torch.Tensor:
    return torch.tensor([target.tokenizer(prompt, add_special_tokens=False)["input_ids"]])


def hf_greedy(target, ids: torch.Tensor) -> list[int]:
    out = target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW_TOKENS,
                                do_sample=False)
    return out[0, ids.shape[1]:].tolist()


@pytest.fixture(scope="module")
def references(shared_target) -> list[list[int]]:
    torch.set_num_threads(1)
    return [hf_greedy(shared_target, encode(shared_target, p)) for p in PROMPTS]


@pytest.mark.parametrize("which", range(len(PROMPTS)))
def test_policy_generate_is_token_identical_to_hf_greedy(which, shared_target, replay_exports, references):
    ids = encode(shared_target, PROMPTS[which])
    controller = PolicyController(replay_exports["onnx"])
    out, generator = policy_generate(shared_target.model, ids, controller, max_new_tokens=MAX_NEW_TOKENS,
                                     attention_mask=torch.ones_like(ids))
    assert out[0, ids.shape[1]:].tolist() == references[which]
    assert isinstance(generator, PolicyCandidateGenerator)
    assert sum(r["num_emitted"] for r in generator.rounds) == len(references[which])
    # speculation actually happens and stays exact: scripted depths, draftrl's and transformers' proposals
    for proposer in ("draftrl", "hf"):
        scripted = ScriptedController(controller, [4, 2, 4, 1])
        out, generator = policy_generate(shared_target.model, ids, scripted, max_new_tokens=MAX_NEW_TOKENS,
                                         attention_mask=torch.ones_like(ids), proposer=proposer)
        assert out[0, ids.shape[1]:].tolist() == references[which], proposer
        assert sum(r["num_candidates"] for r in generator.rounds) > 0
        assert all(r["num_candidates"] <= r["depth"] for r in generator.rounds)
        assert all(r["num_emitted"] == r["num_accepted"] + 1 for r in generator.rounds[:-1])
        if which == 0:  # repetitive code: n-gram drafts get accepted
            assert sum(r["num_accepted"] for r in generator.rounds) > 0, proposer
    assert "_get_candidate_generator" not in vars(shared_target.model)  # the override lived for the call only


def test_hf_adapter_features_match_draftrl_engine(shared_target, replay_config, replay_exports):
    """Same scripted depths: the observations built inside transformers equal the ones draftrl's
    engine builds (history, n-gram and context features; cost features follow measured time)."""
    ids = encode(shared_target, PROMPTS[0])
    base = PolicyController(replay_exports["onnx"])
    in_hf = ScriptedController(base, [4, 0, 2, 4, 1])
    policy_generate(shared_target.model, ids, in_hf, max_new_tokens=MAX_NEW_TOKENS, attention_mask=torch.ones_like(ids))
    in_engine = ScriptedController(base, [4, 0, 2, 4, 1])
    engine, _ = build_engine(replay_config, shared_target)
    engine.config.max_new_tokens = MAX_NEW_TOKENS
    PolicySchedule(in_engine).generate(engine, ids[0].tolist())
    names = list(base.feature_names)
    compared = [i for i, n in enumerate(names) if not n.startswith(("verify_cost", "draft_cost"))]
    assert len(in_hf.seen) == len(in_engine.seen)
    np.testing.assert_allclose(np.stack(in_hf.seen)[:, compared], np.stack(in_engine.seen)[:, compared])


def test_hf_adapter_refuses_policies_it_cannot_feed(shared_target, analytic_exports):
    ids = encode(shared_target, PROMPTS[0])
    with pytest.raises(ValueError, match="cannot drive an engine"):
        policy_generate(shared_target.model, ids, PolicyController(analytic_exports["onnx"]), max_new_tokens=4)


def test_policy_generate_keeps_the_streamer(shared_target, replay_exports, references):
    """transformers drops ``streamer`` for a callable ``custom_generate``; policy_generate passes it
    through, so a streamer sees the prompt and then every generated token, in order."""
    from transformers.generation.streamers import BaseStreamer

    class Recorder(BaseStreamer):
        def __init__(self):
            self.chunks, self.ended = [], False

        def put(self, value):
            self.chunks.append(value.reshape(-1).tolist())

        def end(self):
            self.ended = True

    ids = encode(shared_target, PROMPTS[0])
    streamer = Recorder()
    out, _ = policy_generate(shared_target.model, ids, PolicyController(replay_exports["onnx"]),
                             max_new_tokens=MAX_NEW_TOKENS, attention_mask=torch.ones_like(ids), streamer=streamer)
    assert streamer.chunks[0] == ids[0].tolist() and streamer.ended
    assert [t for chunk in streamer.chunks[1:] for t in chunk] == out[0, ids.shape[1]:].tolist() == references[0]
