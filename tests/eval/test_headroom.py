"""The drafter-choice ceiling: its rounds are the replay env's, its hindsight schedule is optimal."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from choice_traces import costs, synthetic
from draftrl.config.env import EnvConfig
from draftrl.envs.trace_replay import TraceReplayEnv
from draftrl.envs.round_table import drafter_costs, match_depths, round_table
from draftrl.eval.headroom import headroom, hindsight, play

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
        env = TraceReplayEnv(tr, config, cost_table=drafter_costs(tables["ngram"], tables[name]))
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
