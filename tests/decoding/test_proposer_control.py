"""The controller contract of draftrl's vLLM proposers (``draftrl.decoding.vllm.control``), no vLLM
needed: the built-in rules parse back to their names and decide what their names say, the proposer
follows a decision's padding and refuses a rule it cannot follow, and what is not a controller."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from draftrl.decoding.admission import StepAction
from draftrl.decoding.vllm.control import (
    FillRule,
    HeuristicRule,
    MatchRule,
    StepView,
    StopRule,
    rule_controller,
)
from draftrl.decoding.vllm.proposer import DraftrlProposer

IDS = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2]  # "1 2" continues as "3 5 1 2" (its latest occurrence), then nothing


def vllm_config(k: int = 4):
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                           model_config=SimpleNamespace(max_model_len=64, dtype="float32", enforce_eager=True),
                           cache_config=SimpleNamespace(block_size=16))


def view(num: int, max_depth: int = 8, memory=None) -> StepView:
    """A step in which ``num`` requests decoded, each gaining 3 tokens after 4 verified drafts."""
    return StepView(list(range(num)), [f"r{i}" for i in range(num)], [False] * num, [20] * num,
                    np.full(num, 3), np.full(num, 4), np.full(num, 2), 0, 0, max_depth,
                    memory if memory is not None else [{} for _ in range(num)])


@pytest.mark.parametrize("rule,cls", [("match", MatchRule), ("heuristic", HeuristicRule), ("fill", FillRule),
                                      ("confidence:0.6", StopRule), ("cumulative:0.25|batch:2", StopRule),
                                      ("match|batch:1", MatchRule)])
def test_every_built_in_rule_parses_back_to_its_name(rule, cls):
    controller = rule_controller(rule)
    assert type(controller) is cls and controller.rule == rule
    assert controller.needs_head == ("|batch:" in rule or rule.startswith(("confidence", "cumulative")))


def test_an_unknown_rule_is_refused_in_one_line():
    for bad, why in (("hindsight", "rule='hindsight' is unknown"), ("policy", "is unknown"),
                     ("heuristic|batch:2", "RULE\\|batch:B")):
        with pytest.raises(ValueError, match=why) as err:
            rule_controller(bad)
        assert "\n" not in str(err.value)


def test_decisions_say_what_the_rules_say():
    assert rule_controller("match").decide(view(2)).action == StepAction(8)  # no action set: the proposer's K
    fixed = rule_controller("fill", StepAction(3, 5)).decide(view(2))
    assert fixed.action == StepAction(3, 5) and fixed.fill and fixed.depths is None and fixed.head
    stop = rule_controller("confidence:0.6|batch:2")
    assert stop.decide(view(2)).stop == ("confidence", 0.6) and stop.decide(view(2)).head
    assert not stop.decide(view(3)).head  # a step of 3 decoding requests: lookup only
    # heuristic: 4 verified, 2 accepted -> one less than the start, per request, kept in its memory
    memory = [{}, {"heuristic_depth": 6.0}]
    assert HeuristicRule(initial_depth=5).decide(view(2, memory=memory)).depths == [4, 5]
    assert memory == [{"heuristic_depth": 4.0}, {"heuristic_depth": 5.0}]


def drafts(proposer: DraftrlProposer) -> list[int]:
    return proposer.propose([[IDS[-1]]], np.array([len(IDS)]), np.array([IDS]))[0]


def test_the_proposer_pads_to_the_cap_only_under_fill():
    """``fill`` drafts exactly the cap, the match's 4 tokens padded with the last; the control:
    ``match`` on the same history drafts the 4 tokens alone."""
    proposer = DraftrlProposer(vllm_config(6))
    proposer.set_controller(FillRule(StepAction(6)))
    assert drafts(proposer) == [3, 5, 1, 2, 2, 2]
    proposer = DraftrlProposer(vllm_config(6))
    proposer.set_controller(MatchRule(StepAction(6)))
    assert drafts(proposer) == [3, 5, 1, 2]


def test_a_head_rule_needs_a_head_proposer_and_a_controller_needs_its_verbs():
    from draftrl.decoding.vllm.head_proposer import HeadProposer

    with pytest.raises(ValueError, match="stops or limits an EAGLE-3 head's chain") as err:
        DraftrlProposer(vllm_config()).set_controller(rule_controller("confidence:0.6"))
    assert "\n" not in str(err.value)
    HeadProposer(vllm_config()).set_controller(rule_controller("confidence:0.6|batch:1"))  # the control
    with pytest.raises(TypeError, match="decide\\(view\\) and drafted\\(view, record\\)"):
        DraftrlProposer(vllm_config()).set_controller(object())


def test_another_controller_starts_every_request_afresh():
    proposer = DraftrlProposer(vllm_config())
    proposer.set_controller(HeuristicRule(StepAction(8), initial_depth=2))
    drafts(proposer)
    (request,) = proposer.requests.values()
    assert request.memory == {"heuristic_depth": 2.0}
    proposer.set_controller(HeuristicRule(StepAction(8), initial_depth=2))
    assert request.memory == {}
