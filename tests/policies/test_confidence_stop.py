"""Per-level confidence stops (and SpecDec++'s, tests/policies/test_acceptance_stop.py): each rule stops
exactly where it should on hand-made chains, the ROC re-fit moves Hugging Face's threshold the right way (a
wrong fit fails the same check), and in the real engine with a tiny EAGLE-3 head the rules stop where they
say and keep greedy output exact."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from tiny_eagle3 import tiny_pair

from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
from draftrl.decoding.generate import fixed_schedule, generate
from draftrl.drafters.base import Drafter
from draftrl.drafters.eagle3 import Eagle3Drafter
from draftrl.drafters.mixed import MixedDrafter
from draftrl.drafters.ngram import NgramDrafter
from draftrl.drafters.tree import DraftTree
from draftrl.policies.acceptance_stop import AcceptanceModel, AcceptanceStop
from draftrl.policies.confidence_stop import ConfidenceStop, CumulativeConfidenceStop, RocConfidenceStop, roc_threshold

pytestmark = pytest.mark.usefixtures("one_thread")

CHAIN = [0.9, 0.5, 0.3, 0.8]  # the drafted tokens' probabilities, level by level


def levels(probs: list[float]) -> list[dict[str, float]]:
    """``TreeBuilder.level_features`` of a chain drafting tokens of these probabilities."""
    return [{"level": float(k + 1), "level_best_prob": math.prod(probs[: k + 1]), "level_num_nodes": 1.0}
            for k in range(len(probs))]


def stops_at(rule, probs: list[float]) -> int | None:
    """The level after which ``rule`` stops this chain (None: it drafts every level)."""
    return next((k + 1 for k, f in enumerate(levels(probs)) if rule(f)), None)


@pytest.mark.parametrize("threshold, level", [(0.4, 3), (0.6, 2), (0.95, 1), (0.3, None), (0.2, None)])
def test_hf_threshold_stops_after_the_first_token_below_it(threshold, level):
    # 0.3 is not below 0.3: a token at the threshold drafts on, as transformers' ConfidenceCriteria
    assert stops_at(ConfidenceStop(threshold), CHAIN) == level


@pytest.mark.parametrize("threshold, level", [(0.5, 2), (0.3, 3), (0.95, 1), (0.12, 4), (0.1, None)])
def test_cumulative_stop_ends_once_the_path_probability_drops_below_t(threshold, level):
    # paths 0.9, 0.45, 0.135, 0.108
    assert stops_at(CumulativeConfidenceStop(threshold), CHAIN) == level


def test_each_round_starts_a_new_chain():
    hf, cum = ConfidenceStop(0.4), CumulativeConfidenceStop(0.3)
    assert stops_at(hf, [0.9, 0.2]) == 2 and stops_at(cum, [0.5, 0.5]) == 2
    assert stops_at(hf, [0.9, 0.5, 0.5]) is None and stops_at(cum, [0.9, 0.9, 0.9]) is None
    assert hf.confidences == pytest.approx([0.9, 0.5, 0.5])


def test_roc_threshold_weighs_false_negatives_three_times_and_breaks_ties_high():
    conf, accepted = [0.9, 0.6, 0.5, 0.2], [True, False, True, False]
    assert roc_threshold(conf, accepted) == 0.5  # cost fpr + 3 fnr: 0.5 at 0.5, 1.5 at 0.9
    assert roc_threshold(conf, accepted, fn_cost=1.0) == 0.9  # fpr + fnr: 0.5 at both 0.9 and 0.5: the higher
    assert roc_threshold([0.9, 0.1], [False, True]) == 0.1  # draft on everything (cost 1) beats nothing (3)
    with pytest.raises(ValueError, match="accepted and rejected"):
        roc_threshold([0.5, 0.6], [True, True])


def separated(rejected_below: float, accepted_from: float, n: int = 200, seed: int = 0):
    """Synthetic pairs: rejected tokens' confidences in [0, rejected_below), accepted ones' in [accepted_from, 1)."""
    rng = np.random.default_rng(seed)
    rejected = rng.uniform(0.0, rejected_below, n).tolist()
    accepted = rng.uniform(accepted_from, 1.0, n).tolist()
    return rejected + accepted, [False] * n + [True] * n


def assert_separates(fit, rejected_below: float, accepted_from: float) -> None:
    """The fitted threshold lies between the classes: every rejected token stops, every accepted one drafts on."""
    conf, accepted = separated(rejected_below, accepted_from)
    t = fit(conf, accepted)
    rejected = [c for c, a in zip(conf, accepted) if not a]
    kept = [c for c, a in zip(conf, accepted) if a]
    assert max(rejected) < t <= min(kept), f"threshold {t} outside ({max(rejected):.3f}, {min(kept):.3f}]"


@pytest.mark.parametrize("rejected_below, accepted_from", [(0.2, 0.25), (0.7, 0.75)])
def test_roc_refit_moves_the_threshold_between_the_classes(rejected_below, accepted_from):
    assert_separates(roc_threshold, rejected_below, accepted_from)  # from 0.4 down to ~0.25, or up to ~0.75
    with pytest.raises(AssertionError):  # negative control: labels recorded the wrong way round
        assert_separates(lambda c, a: roc_threshold(c, [not x for x in a]), rejected_below, accepted_from)


def play_round(rule, probs: list[float], num_accepted: int) -> None:
    stops_at(rule, probs)
    rule.on_round(SimpleNamespace(num_accepted=num_accepted))


def test_roc_rule_labels_tokens_up_to_the_first_rejection_and_refits_per_request():
    rule = RocConfidenceStop()
    rule.start()
    play_round(rule, [0.9, 0.8, 0.3], 2)  # labels 1, 1, 0
    play_round(rule, [0.7, 0.2, 0.6], 0)  # 0.7 rejected; 0.2 and 0.6 never judged
    assert rule.seen == pytest.approx([0.9, 0.8, 0.3, 0.7]) and rule.accepted == [True, True, False, False]
    assert rule.threshold == 0.4  # 4 pairs: too few to fit
    play_round(rule, [0.95, 0.85], 2)
    assert rule.threshold == pytest.approx(0.8)  # 0.8 separates the 6 pairs: moved up from 0.4
    assert stops_at(rule, [0.9, 0.75]) == 2 and stops_at(ConfidenceStop(), [0.9, 0.75]) is None
    rule.start()
    assert rule.threshold == 0.4 and rule.seen == [] and rule.accepted == []


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


PROMPTS = [[5, 9, 13, 5, 9, 13, 5, 9], [3, 17, 41, 2, 8, 30, 11, 3, 17], [7, 7, 21, 44, 7, 21]]
RULES = [lambda: ConfidenceStop(0.4), lambda: RocConfidenceStop(), lambda: CumulativeConfidenceStop(0.3),
         lambda: CumulativeConfidenceStop(0.05), lambda: AcceptanceStop(AcceptanceModel((0.5, 1.0, 0.2, -0.6)), 0.6)]


class Recording:
    """A rule that also records, per round, how many levels it was asked about and the first it stopped at."""

    def __init__(self, rule):
        self.rule, self.asked, self.stopped = rule, [], []
        self.on_round, self.start = rule.on_round, rule.start

    def __call__(self, features):
        if features["level"] <= 1:
            self.asked.append(0)
            self.stopped.append(None)
        stop = self.rule(features)
        self.asked[-1] += 1
        if stop and self.stopped[-1] is None:
            self.stopped[-1] = self.asked[-1]
        return stop


@pytest.mark.parametrize("make", RULES,
                         ids=["hf-threshold", "hf-roc", "eagle2-cum:0.3", "eagle2-cum:0.05", "specdec:0.6"])
@pytest.mark.parametrize("mixed", [False, True], ids=["head", "mixed"])
def test_greedy_output_with_a_stop_rule_is_the_targets_and_rounds_stop_where_the_rule_says(pair, make, mixed):
    target, head = pair
    drafter = Eagle3Drafter(head, target)
    if mixed:
        drafter = MixedDrafter(NgramDrafter(1, 3, first="latest"), drafter, 2)
        drafter.forced = "model"
    budget, depth = 24, 4
    engine = SpeculativeDecoder(target, drafter, EngineConfig(max_new_tokens=budget, max_depth=depth))
    plain = SpeculativeDecoder(target, None, EngineConfig(max_new_tokens=budget))
    stopped_early = 0
    for prompt in PROMPTS:
        rule = Recording(make())
        rule.start()
        with torch.inference_mode():
            result = generate(engine, prompt, fixed_schedule(depth), stop=rule, on_round=rule.on_round)
            reference = generate(plain, prompt, fixed_schedule(0))
        assert result.token_ids == reference.token_ids
        before = np.cumsum([0] + [r.num_emitted for r in result.rounds])
        drafted = [(r, b) for r, b in zip(result.rounds, before) if r.num_proposed]
        assert len(drafted) == len(rule.asked)
        for (rnd, emitted), asked, stopped in zip(drafted, rule.asked, rule.stopped):
            assert rnd.num_proposed == asked  # width 1: one node per level, the rule asked after each
            assert asked == (stopped or min(depth, budget - emitted - 1))  # drafting ended at the rule's stop
            stopped_early += stopped is not None and stopped < depth
    assert stopped_early > 0  # the rule did cut rounds short: the identity is not just fixed depth 4's


def test_a_stop_that_never_fires_drafts_the_depths_tree(pair):
    target, head = pair
    trees = []
    for stop in (None, lambda features: False):
        engine = SpeculativeDecoder(target, Eagle3Drafter(head, target), EngineConfig(max_new_tokens=16, max_depth=4))
        with torch.inference_mode():
            result = generate(engine, PROMPTS[1], fixed_schedule(3), stop=stop)
        trees.append([(r.tokens, r.num_proposed, r.num_accepted) for r in result.rounds])
    assert trees[0] == trees[1]


class _WholeTree(Drafter):
    def propose(self, ids, depth, width, params, generator):
        return DraftTree()


def test_a_stop_needs_a_level_drafter(pair):
    target, _ = pair
    engine = SpeculativeDecoder(target, _WholeTree(), EngineConfig(max_new_tokens=4))
    engine.start([1, 2, 3])
    with pytest.raises(ValueError, match="needs a LevelDrafter"):
        engine.round(2, stop=lambda features: False)
