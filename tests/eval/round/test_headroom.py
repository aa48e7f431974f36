"""The drafter-choice ceiling: its rounds are the replay env's, its hindsight schedule is optimal, and a
per-level stop replayed on recorded traces drafts what the real engine drafts with it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from choice_traces import costs, synthetic
from tiny_eagle3 import WordTokenizer, tiny_pair

from draftrl.config.env import EnvConfig
from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
from draftrl.decoding.generate import fixed_schedule, generate
from draftrl.decoding.schedule import HeuristicSchedule
from draftrl.drafters.eagle3 import Eagle3Drafter
from draftrl.envs.spec_decode import SpecDecodeEnv
from draftrl.eval.round.headroom import headroom, hindsight, play, play_stop
from draftrl.policies.acceptance_stop import AcceptanceModel, AcceptanceStop
from draftrl.policies.confidence_stop import CumulativeConfidenceStop, LevelStopRule, RocConfidenceStop
from draftrl.replay.round_table import drafter_costs, match_depths, round_table
from draftrl.replay.traces import collect

DEPTHS = (0, 1, 2, 4)


@pytest.fixture(scope="module")
def pair():
    traces = {"ngram": synthetic(1, 1), "eagle3": synthetic(2, 2)}
    tables = {"ngram": costs(1e-4), "eagle3": costs(4e-3)}
    return traces, tables, round_table(traces, tables, DEPTHS)


def test_every_fixed_arm_costs_what_the_replay_env_charges(pair):
    traces, tables, table = pair
    room = headroom(table)
    for name, tr in traces.items():
        config = EnvConfig(depths=DEPTHS, verify_sizes=(0,), width=tr.width, temperature=0.0, cost_noise=0.0,
                           cost_jitter=0.0, drafter="ngram")
        env = SpecDecodeEnv(config, engine="replay", traces=tr, cost_table=drafter_costs(tables["ngram"], tables[name]))
        for depth in DEPTHS[1:]:
            for p in range(len(tr.prompts)):
                env.reset(seed=0, options={"prompt_index": p})
                seconds, tokens, done = 0.0, 0, False
                while not done:
                    _, _, done, _, info = env.step(np.array([DEPTHS.index(depth), 0]))
                    seconds += info["seconds"]
                    tokens += info["num_emitted"]
                assert tokens == len(table.tokens[p])
                assert room.schedules[f"fixed:{name}:{depth}"][p] == pytest.approx(seconds, rel=1e-9)


def test_hindsight_is_the_optimum_of_every_schedule(pair):
    """Brute force over every arm sequence on short prompts: the dynamic program finds the minimum."""
    traces = {"ngram": synthetic(1, 1, lengths=(4, 5, 3)), "eagle3": synthetic(2, 2, lengths=(4, 5, 3))}
    table = round_table(traces, {"ngram": costs(1e-4), "eagle3": costs(4e-3)}, (1, 2, 4))
    for tok, sec in zip(table.tokens, table.seconds):
        best = min(play(tok, sec, lambda t, seq=seq: seq[t])[0]
                   for seq in itertools.product(range(len(table.arms)), repeat=len(tok)))
        assert hindsight(tok, sec)[0] == pytest.approx(best, rel=1e-12)


def test_hindsight_bounds_fixed_rule_and_lookahead(pair):
    _, _, table = pair
    room = headroom(table, rules=[("ngram", "eagle3", 2)])
    for name in room.schedules:
        assert room.total("hindsight") <= room.total(name) + 1e-12, name
    assert room.speedup("hindsight") >= room.speedup(room.best_fixed()) >= 1.0 - 1e-12
    assert room.best_rule().startswith("rule:ngram|eagle3>=2:")


def test_match_depth_follows_the_continuation(pair):
    traces, _, _ = pair
    tr = traces["eagle3"]
    depths = match_depths(tr)
    for i in range(len(tr.continuation)):
        lo, hi = tr.cu_num_nodes[i], tr.cu_num_nodes[i + 1]
        right = [d for n, d in zip(range(lo, hi), tr.node_depths[lo:hi])
                 if tr.node_tokens[n] not in (98, 99)]
        assert depths[i] == len(right)


def test_traces_of_other_continuations_are_refused(pair):
    traces, tables, _ = pair
    other = synthetic(3, 1, lengths=(7, 9, 6))
    with pytest.raises(ValueError, match="different continuations"):
        round_table({"ngram": traces["ngram"], "eagle3": other}, tables, DEPTHS)


STOPS = [lambda: CumulativeConfidenceStop(0.3), lambda: RocConfidenceStop(0.4),
         lambda: AcceptanceStop(AcceptanceModel((0.5, 1.0, 0.2, -0.6)), 0.6)]


BUDGET, DEPTH = 32, 4


@pytest.fixture(scope="module")
def head_traces(tmp_path_factory):
    """The tiny EAGLE-3 pair and its traces over two prompts (every level to DEPTH)."""
    target, head = tiny_pair()
    prompts = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    prompts.write_text("".join(
        f'{{"id": "x{i}", "language": "en", "task": "chat", "split": "tune", "prompt": "{text}", '
        f'"max_new_tokens": {BUDGET}}}\n'
        for i, text in enumerate(["a few words of a prompt for the tiny target to read",
                                  "words again and again and again a few words"])))
    config = EnvConfig(prompts=str(prompts), split="tune", languages=("en",), tasks=("chat",),
                       max_new_tokens=BUDGET, depths=tuple(range(DEPTH + 1)), chat_template=False, ignore_eos=True)
    with torch.inference_mode():
        traces = collect(config, SpeculativeDecoder(target, Eagle3Drafter(head, target),
                                                    EngineConfig(max_new_tokens=BUDGET)), WordTokenizer())
    return target, head, traces, round_table({"eagle3": traces}, {"eagle3": costs(4e-3)}, range(1, DEPTH + 1))


def assert_replays_the_engine(head_traces, name: str, room, run) -> list:
    """Per prompt, the schedule ``name`` replayed in ``room`` plays the depths the real engine's rounds
    (``run(engine, prompt_ids)``) drafted, emits their tokens and costs the table's seconds; returns the rounds."""
    target, head, traces, table = head_traces
    engine = SpeculativeDecoder(target, Eagle3Drafter(head, target), EngineConfig(max_new_tokens=BUDGET,
                                                                                    max_depth=DEPTH))
    cu, every = traces.cu_num_prompt_tokens, []
    for p in range(len(traces.prompts)):
        with torch.inference_mode():
            result = run(engine, traces.prompt_tokens[cu[p]:cu[p + 1]].tolist())
        start = traces.cu_num_positions[p]
        assert result.token_ids == traces.continuation[start:traces.cu_num_positions[p + 1]].tolist()
        replayed = [table.arms[a] for a in room.played[name][p]]
        assert len(replayed) == len(result.rounds)
        t, seconds = 0, 0.0
        for (drafter, d), rnd in zip(replayed, result.rounds):
            assert min(d, BUDGET - 1 - t) == rnd.num_proposed or (t == 0 and rnd.num_proposed == 0)
            assert table.tokens[p][t, table.arms.index((drafter, d))] == rnd.num_emitted
            seconds += table.seconds[p][t, table.arms.index((drafter, d))]
            every.append((rnd, t))
            t += rnd.num_emitted
        assert room.schedules[name][p] == pytest.approx(seconds, rel=1e-12)
    return every


@pytest.mark.parametrize("make", STOPS, ids=["eagle2-cum", "hf-roc", "specdec"])
def test_a_stop_replayed_on_traces_drafts_what_the_engine_drafts(head_traces, make):
    """Traces of the tiny EAGLE-3 head, replayed with a stop: the same depth every round as the real
    engine with that stop, the same tokens, and the cost of the fixed arm at that depth."""
    room = headroom(head_traces[3], stops=[("eagle3", make())])

    def run(engine, ids):
        rule = make()
        rule.start()
        return generate(engine, ids, fixed_schedule(DEPTH), stop=rule, on_round=rule.on_round)

    rounds = assert_replays_the_engine(head_traces, f"stop:eagle3:{make().name}", room, run)
    # the rule did end rounds early: not just fixed depth 4's rounds
    assert any(0 < r.num_proposed < min(DEPTH, BUDGET - 1 - t) for r, t in rounds)


def test_the_heuristic_replayed_on_traces_drafts_what_the_engine_drafts(head_traces):
    room = headroom(head_traces[3], heuristics=[("eagle3", 3)])
    schedule = HeuristicSchedule(3, DEPTH)

    def run(engine, ids):
        schedule.start()
        return generate(engine, ids, schedule, on_round=schedule.on_round)

    rounds = assert_replays_the_engine(head_traces, "heuristic:eagle3:3", room, run)
    assert len({r.num_proposed for r, _ in rounds if r.num_proposed}) > 1  # the depth did move


def test_a_stop_needs_every_depth_of_its_drafter(pair):
    _, _, table = pair  # depths 1, 2, 4: no 3
    with pytest.raises(ValueError, match="every depth up to the deepest"):
        headroom(table, stops=[("eagle3", CumulativeConfidenceStop(0.3))])


class _Scripted(LevelStopRule):
    """Stops at level 1, 2, 3, 1, 2, 3, ... round after round, and records what each round accepted."""

    name = "scripted"

    def __init__(self):
        super().__init__()
        self.rounds, self.observed = 0, []

    def stops(self, path: float) -> bool:
        return len(self.confidences) >= 1 + self.rounds % 3

    def observe(self, num_accepted: int) -> None:
        self.rounds += 1
        self.observed.append(num_accepted)


def test_a_replayed_stop_learns_each_rounds_accepted_drafts(pair):
    traces, tables, _ = pair
    tr = traces["eagle3"]
    table = round_table({"eagle3": tr}, {"eagle3": tables["eagle3"]}, (1, 2, 3, 4))
    match = match_depths(tr)
    for p in range(len(tr.prompts)):
        rule = _Scripted()
        _, played = play_stop(table, p, "eagle3", rule)
        t, start = 0, int(tr.cu_num_positions[p])
        for a, accepted in zip(played, rule.observed):
            depth = table.arms[a][1]
            assert accepted == min(int(match[start + t]), depth)
            t += int(table.tokens[p][t, a])
        assert len(rule.observed) == len(played) and t == len(table.tokens[p])
