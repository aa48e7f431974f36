"""The serving replay of an EAGLE-3 head: its proposals from every true prefix equal a live
head's, every drafter replays the recorded tokens exactly, the head's step cost is charged where it
drafts, SAM's rule and hindsight's per-request choice pick the drafter they name."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from tiny_eagle3 import tiny_pair

from draftrl.decoding.admission import StepAction
from draftrl.drafters.eagle3 import Eagle3Drafter
from draftrl.models.distribution import SamplingParams
from draftrl.prompts import Prompt
from draftrl.replay.recordings import HeadProposals, Proposals, Recording, Recordings
from draftrl.replay.serve_calibrate import StepCostModel
from draftrl.replay.serve_engine import ReplayEngine

TOKENS, LOOKAHEAD, DEPTH = 24, 9, 4
HEAD_TABLE = {1: ([1, 2, 4], [0.004, 0.008, 0.016]), 4: ([1, 2, 4], [0.006, 0.012, 0.024])}
COST = StepCostModel(base=0.03, per_seq=0.002, per_token=0.0005, head=HEAD_TABLE)


def recordings(num: int = 6, seed: int = 0) -> Recordings:
    """Continuations that repeat a motif of their prompt (n-gram lookup matches some positions)."""
    rng = np.random.default_rng(seed)
    recs = []
    for i in range(num):
        motif = rng.integers(1, 60, size=6).tolist()
        prompt = motif * 2 + rng.integers(1, 60, size=5).tolist()
        cont: list[int] = []
        while len(cont) < TOKENS + LOOKAHEAD:
            cont += motif[: int(rng.integers(2, 6))] + rng.integers(1, 60, size=int(rng.integers(1, 3))).tolist()
        recs.append(Recording(Prompt(f"p{i}", "en", "qa", "heldout", f"prompt {i}", TOKENS), prompt, TOKENS,
                              cont[: TOKENS + LOOKAHEAD], LOOKAHEAD))
    return Recordings(recs, {})


def scripted_head(recs: Recordings, seed: int = 1) -> SimpleNamespace:
    """Head proposals with known acceptance: at each prefix a random accepted prefix of a full chain."""
    rng = np.random.default_rng(seed)
    accepted = [[0] + rng.integers(0, DEPTH + 1, size=len(r.token_ids)).tolist() for r in recs.requests]
    available = [[0] + [DEPTH] * len(r.token_ids) for r in recs.requests]
    return SimpleNamespace(max_depth=DEPTH, accepted=accepted, available=available)


def run(engine: ReplayEngine, recs: Recordings, action: StepAction, concurrency: int):
    """Every request through ``engine`` at ``concurrency``: (tokens per request, seconds, steps)."""
    engine.max_num_seqs = concurrency
    for i, rec in enumerate(recs.requests):
        engine.add_request(f"r{i}", rec.prompt_ids, TOKENS)
    tokens: dict[str, list[int]] = {}
    seconds = steps = 0
    while engine.has_unfinished_requests():
        out = engine.step(action)
        seconds += out.seconds
        steps += 1
        for r in out.requests:
            tokens.setdefault(r.request_id, []).extend(r.token_ids)
    return tokens, seconds, steps


def test_head_proposals_equal_the_live_heads_from_every_prefix():
    """One target forward over the whole recording gives, at every prefix, the chain a live head
    drafts after a forward over that prefix alone (causal features); the same comparison one
    prefix off (a negative control) differs."""
    target, head = tiny_pair()
    recs = recordings(num=2)
    props = HeadProposals(recs, DEPTH, Eagle3Drafter(head, target), target)
    live = Eagle3Drafter(head, target)
    shifted = 0
    for i, rec in enumerate(recs.requests):
        ids = rec.prompt_ids + rec.token_ids
        m = len(rec.prompt_ids)
        for t in range(1, len(rec.token_ids) + 1, 5):
            live.reset(ids[: m + t])
            with torch.inference_mode():
                target(torch.tensor([ids[: m + t]]))
            live.keep_target_rows(list(range(m + t)))
            tree = live.propose(ids[: m + t], DEPTH, 1, SamplingParams(), None)
            assert props.available[i][t] == len(tree.tokens)
            assert props.scores[i][t] == pytest.approx(tree.scores, abs=1e-5)
            a = next((k for k, tok in enumerate(tree.tokens) if t + k >= len(rec.token_ids)
                      or tok != rec.token_ids[t + k]), len(tree.tokens))
            assert props.accepted[i][t] == a
            if t + 1 <= len(rec.token_ids):
                shifted += props.scores[i][t + 1] != pytest.approx(tree.scores, abs=1e-5)
    assert shifted > 0


@pytest.mark.parametrize("drafter,rule", [("ngram", "match"), ("eagle3", "match"), ("sam:2", "match"),
                                          ("hindsight", "match"), ("eagle3", "hindsight"), ("hindsight", "hindsight")])
@pytest.mark.parametrize("concurrency", [1, 4])
def test_every_drafter_replays_the_recorded_tokens(drafter, rule, concurrency):
    recs = recordings()
    engine = ReplayEngine(recs, COST, max_depth=DEPTH, rule=rule, drafter=drafter, head_proposals=scripted_head(recs))
    tokens, _, _ = run(engine, recs, StepAction(DEPTH), concurrency)
    assert [tokens[f"r{i}"] for i in range(len(recs))] == [r.token_ids[:TOKENS] for r in recs.requests]


def test_head_steps_cost_the_calibrated_head_seconds():
    """One request alone drafting with the head at depth d takes the steps its acceptance allows,
    each costing the decode step plus ``head_seconds(1, d)`` while the head drafts; with the head's
    cost zeroed the same schedule costs exactly that much less."""
    recs = recordings(num=1)
    head = scripted_head(recs)
    free = StepCostModel(COST.base, COST.per_seq, COST.per_token, head={1: ([1, 2, 4], [0.0, 0.0, 0.0])})
    _, paid, steps = run(ReplayEngine(recs, COST, max_depth=DEPTH, drafter="eagle3", head_proposals=head), recs,
                         StepAction(2), 1)
    _, unpaid, steps_free = run(ReplayEngine(recs, free, max_depth=DEPTH, drafter="eagle3", head_proposals=head),
                                recs, StepAction(2), 1)
    assert steps == steps_free
    # every step but the last drafts 2 levels for the next (the last one drafts too: the proposer cannot know)
    assert paid - unpaid == pytest.approx(steps * COST.head_seconds(1, 2))
    # the steps follow the head's acceptance: each verify step emits min(accepted, 2) + 1 tokens
    t, expected = 1, 1
    while t < TOKENS:
        t += min(head.accepted[0][t], 2) + 1
        expected += 1
    assert steps == expected


def test_sam_and_hindsight_choose_their_drafter_per_request():
    """``sam:N`` drafts with the head exactly where lookup matched fewer than N tokens; ``hindsight``
    drafts with whichever drafter accepts more and is never slower than either
    drafter's own hindsight when the head's drafting is free; ``ngram`` never pays the head."""
    recs = recordings()
    head = scripted_head(recs)
    lookup = Proposals(recs, DEPTH)
    engine = ReplayEngine(recs, COST, max_depth=DEPTH, drafter="sam:2", head_proposals=head, proposals=lookup)
    for i, rec in enumerate(recs.requests):
        for t in range(1, len(rec.token_ids) + 1):
            assert engine._drafts_with_head(i, t) == (lookup.match_len[i][t] < 2)
    assert (0 < sum(engine._drafts_with_head(i, t) for i in range(len(recs)) for t in range(1, TOKENS))
            < len(recs) * (TOKENS - 1))
    for rule in ("hindsight", "match"):
        best = ReplayEngine(recs, COST, max_depth=DEPTH, rule=rule, drafter="hindsight", head_proposals=head)
        assert all(best._drafts_with_head(i, t) == (head.accepted[i][t] > lookup.accepted[i][t])
                   for i in range(len(recs)) for t in range(1, TOKENS))
    free = StepCostModel(COST.base, COST.per_seq, COST.per_token, head={1: ([1], [0.0]), 4: ([1], [0.0])})
    steps = {name: run(ReplayEngine(recs, free, max_depth=DEPTH, rule="hindsight", drafter=name, head_proposals=head),
                       recs, StepAction(DEPTH), 1)[2] for name in ("ngram", "eagle3", "hindsight")}
    assert steps["hindsight"] < min(steps["ngram"], steps["eagle3"])
    plain = StepCostModel(COST.base, COST.per_seq, COST.per_token)  # no head cells: n-gram replays without them
    assert run(ReplayEngine(recs, plain, max_depth=DEPTH), recs, StepAction(DEPTH), 4)[1] > 0


def test_head_replay_refuses_what_it_cannot_replay():
    recs = recordings(num=1)
    with pytest.raises(ValueError, match="head_proposals"):
        ReplayEngine(recs, COST, max_depth=DEPTH, drafter="eagle3")
    with pytest.raises(ValueError, match="--drafter eagle3"):
        ReplayEngine(recs, StepCostModel(0.03, 0.002, 0.0005), max_depth=DEPTH, drafter="sam:2",
                     head_proposals=scripted_head(recs))
    with pytest.raises(ValueError, match="sam:2"):
        ReplayEngine(recs, COST, max_depth=DEPTH, drafter="sam:x", head_proposals=scripted_head(recs))
    with pytest.raises(ValueError, match="drafter='best' is renamed: write drafter='hindsight'"):
        ReplayEngine(recs, COST, max_depth=DEPTH, drafter="best", head_proposals=scripted_head(recs))


def as_head_proposals(scripted: SimpleNamespace) -> HeadProposals:
    """Scripted head proposals as the class the optimum prices as a head."""
    props = HeadProposals.__new__(HeadProposals)
    props.__dict__.update(vars(scripted))
    return props


def engine_seconds(recs, cost, drafter, depth, head, rule="match"):
    engine = ReplayEngine(recs, cost, max_depth=DEPTH, rule=rule, drafter=drafter, head_proposals=head)
    return run(engine, recs, StepAction(depth), 1)[1]


def test_single_stream_optimum_bounds_every_schedule_and_meets_the_known_one():
    """At concurrency 1 the dynamic program's seconds are at most every replayed schedule's (each fixed
    drafter and depth, SAM, hindsight's best drafter), strictly less than the best of them when the
    choice per step matters; where a step costs the same whatever it verifies and drafting is free,
    the optimum drafts all it can, and equals the engine's deepest fixed depth exactly."""
    from draftrl.replay.serve_engine import single_stream_optimum

    recs = recordings()
    head = as_head_proposals(scripted_head(recs))
    lookup = Proposals(recs, DEPTH)
    optimum = sum(single_stream_optimum(recs, TOKENS, DEPTH, [(lookup, COST), (head, COST)]))
    arms = {f"{drafter}:{d}": engine_seconds(recs, COST, drafter, d, head)
            for drafter in ("ngram", "eagle3", "sam:2") for d in range(DEPTH + 1)}
    arms["hindsight"] = engine_seconds(recs, COST, "hindsight", DEPTH, head, rule="hindsight")
    assert optimum < min(arms.values())
    flat = StepCostModel(base=0.03, per_seq=0.0, per_token=0.0)
    assert sum(single_stream_optimum(recs, TOKENS, DEPTH, [(lookup, flat)])) == \
        pytest.approx(engine_seconds(recs, flat, "ngram", DEPTH, None))
    # a source is only as good as its own proposals: the n-gram alone needs more time than both
    assert sum(single_stream_optimum(recs, TOKENS, DEPTH, [(lookup, COST)])) > optimum


@pytest.mark.parametrize("drafter,depth", [("ngram", 0), ("ngram", 2), ("ngram", 4), ("eagle3", 1), ("eagle3", 3)])
def test_single_stream_fixed_is_the_engines_fixed_arm(drafter, depth):
    """Per request and summed, the fixed arm's seconds at concurrency 1 are the engine's, less the
    head's drafting after each request's last step (the engine's proposer cannot know it finished)."""
    from draftrl.replay.serve_engine import single_stream_fixed

    recs = recordings()
    head = as_head_proposals(scripted_head(recs))
    source = (head if drafter == "eagle3" else Proposals(recs, DEPTH), COST)
    got = sum(single_stream_fixed(recs, TOKENS, depth, source))
    last = len(recs) * COST.head_seconds(1, depth) if drafter == "eagle3" else 0.0
    assert got == pytest.approx(engine_seconds(recs, COST, drafter, depth, head) - last)
