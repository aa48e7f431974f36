"""The head proposer's per-level stops cut a chain where each rule says, and nowhere else, and
stop drafting at the level that decides."""

from __future__ import annotations

import math

import pytest

from draftrl.decoding.vllm.control import stop_rule
from draftrl.decoding.vllm.head_proposer import chain_end


def _scores(probs: list[float]) -> list[float]:
    """Cumulative log probabilities of a chain whose drafts have ``probs``."""
    out, total = [], 0.0
    for p in probs:
        total += math.log(p)
        out.append(total)
    return out


def stop_after(rule, scores):
    """(kept drafts, levels drafted) of a chain with ``scores`` grown level by level under ``rule``."""
    for level in range(1, len(scores) + 1):
        end = chain_end(rule, scores[:level])
        if end is not None:
            return end, level
    return len(scores), len(scores)


@pytest.mark.parametrize("probs, confidence, cumulative", [
    ([0.9, 0.8, 0.3, 0.9], 3, 2),   # 0.3 < 0.4: HF keeps that draft; chain 0.216 < 0.25: EAGLE-2 drops it
    ([0.9, 0.5, 0.5, 0.9], 4, 2),   # no draft below 0.4, but the chain falls to 0.225 at the third
    ([0.2, 0.9], 1, 0),             # the first draft already fails both
    ([1.0, 1.0, 1.0], 3, 3),        # lookup drafts (probability 1) never stop
])
def test_each_rule_keeps_the_drafts_it_should(probs, confidence, cumulative):
    scores = _scores(probs)
    kept, drafted = stop_after(("confidence", 0.4), scores)
    assert kept == confidence and drafted == confidence  # the draft below T is the last one drafted
    kept, drafted = stop_after(("cumulative", 0.25), scores)
    assert kept == cumulative and drafted == min(cumulative + 1, len(scores))  # the failing draft is dropped


def test_the_rules_differ_so_a_swapped_rule_is_caught():
    """Negative control: on a chain where the rules disagree, each rule's answer is the other's wrong one."""
    scores = _scores([0.9, 0.5, 0.5, 0.9])
    assert stop_after(("confidence", 0.4), scores) != stop_after(("cumulative", 0.4), scores)


def test_rules_parse_and_bad_thresholds_are_refused_in_one_line():
    assert stop_rule("confidence:0.4") == ("confidence", 0.4)
    assert stop_rule("cumulative:0.25") == ("cumulative", 0.25)
    assert stop_rule("match") is None and stop_rule("heuristic") is None
    for bad in ("confidence:1.5", "cumulative:x", "confidence:"):
        with pytest.raises(ValueError, match="threshold in \\(0, 1\\)") as err:
            stop_rule(bad)
        assert "\n" not in str(err.value)


def test_the_load_part_parses_and_bad_ones_are_refused_in_one_line():
    from draftrl.decoding.vllm.control import split_load

    assert split_load("confidence:0.6|batch:1") == ("confidence:0.6", 1)
    assert split_load("match|batch:4") == ("match", 4) and split_load("cumulative:0.3") == ("cumulative:0.3", None)
    for bad in ("match|batch:0", "match|batch:x", "heuristic|batch:2"):
        with pytest.raises(ValueError, match="RULE\\|batch:B") as err:
            split_load(bad)
        assert "\n" not in str(err.value)
