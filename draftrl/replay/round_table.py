"""Every round any schedule could play on several drafters' traces: the arms' tokens and seconds.

A trace (``draftrl collect``) holds, from every true prefix of a greedy continuation, the tree a
drafter drafts; at temperature 0 a round's emitted tokens follow from walking that tree along the
continuation, and a cost table gives its seconds. With traces of several drafters over the same
prompts (same target, hence the same continuation), :func:`round_table` lists, for every position
and every arm (``none``, or a drafter at a depth), what the round would emit and cost.

Seconds are the ones ``draftrl/TraceReplay-v1`` charges (verify every drafted node, no noise; a
test plays each fixed arm through that env and compares). The target forward and the sampler cost
come from one table for every drafter, so arms differ only in what they draft and what drafting
costs; the arm ``none`` drafts nothing and pays no drafter time (a policy that reads every drafter's
signals pays each one's per-round ``features()`` time in every round: ``RoundTable.watched_seconds``).
Drafters that must keep up with
the target even in rounds they do not draft (an EAGLE head's key/value rows) are charged only in
their own rounds, which errs on the generous side.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from draftrl.prompts import Prompt
from draftrl.replay.traces import Traces
from draftrl.signals.costs import CostTable
from draftrl.signals.features import DRAFT_FEATURES

#: The arm that drafts nothing: one plain target step per round.
NONE = ("none", 0)
_MATCH = DRAFT_FEATURES.index("ngram_match_len")


def match_depths(traces: Traces) -> np.ndarray:
    """int64 [T]: at each position, how many levels of the recorded tree the continuation follows
    (the draft tokens a verify-everything round of unlimited depth would accept)."""
    cont, cu_pos, cu_nodes = traces.continuation, traces.cu_num_positions, traces.cu_num_nodes
    out = np.zeros(len(cont), dtype=np.int64)
    for p in range(len(traces.prompts)):
        start, end = int(cu_pos[p]), int(cu_pos[p + 1])
        for i in range(start, end):
            lo, hi = int(cu_nodes[i]), int(cu_nodes[i + 1])
            kids: dict[tuple[int, int], int] = {}
            for n in range(lo, hi):
                kids[(int(traces.node_parents[n]), int(traces.node_tokens[n]))] = n - lo
            node, k = -1, 0
            while i + k < end:
                child = kids.get((node, int(cont[i + k])))
                if child is None:
                    break
                node, k = child, k + 1
            out[i] = k
    return out


def nodes_by_depth(traces: Traces, max_depth: int) -> np.ndarray:
    """int64 [T, max_depth + 1]: nodes of depth <= K in each position's recorded tree."""
    depths = traces.node_depths
    cu = traces.cu_num_nodes
    out = np.zeros((len(traces.continuation), max_depth + 1), dtype=np.int64)
    for i in range(len(traces.continuation)):
        counts = np.bincount(depths[cu[i]:cu[i + 1]], minlength=max_depth + 1)[: max_depth + 1]
        out[i] = np.cumsum(counts)
    return out


def level_path_probs(traces: Traces, max_depth: int) -> np.ndarray:
    """float64 [T, max_depth]: at each position, ``level_features()["level_best_prob"]`` of each
    level of the recorded tree (the exp of its best cumulative draft log-probability; NaN past the
    tree's last level): what a per-level stop reads while drafting that round."""
    cu = traces.cu_num_nodes
    out = np.full((len(traces.continuation), max_depth), np.nan)
    for i in range(len(traces.continuation)):
        lo, hi = int(cu[i]), int(cu[i + 1])
        for depth, score in zip(traces.node_depths[lo:hi].tolist(), traces.node_scores[lo:hi].tolist()):
            if 1 <= depth <= max_depth:
                prob = math.exp(score)
                if not prob <= out[i, depth - 1]:  # NaN (first node of the level) or a better one
                    out[i, depth - 1] = prob
    return out


@dataclass
class RoundTable:
    """Every round any schedule could play: ``tokens[p][t, a]`` and ``seconds[p][t, a]`` for prompt
    ``p``, position ``t`` and arm ``a = arms[a]``."""

    arms: tuple[tuple[str, int], ...]
    prompts: list[Prompt]
    tokens: list[np.ndarray]
    seconds: list[np.ndarray]
    ngram_match: dict[str, list[np.ndarray]]
    """per drafter: its ``ngram_match_len`` feature before each round, per prompt (0 for model drafters)"""
    path_probs: dict[str, list[np.ndarray]] = dataclasses.field(default_factory=dict)
    """per drafter, per prompt: :func:`level_path_probs` of each position (what a per-level stop reads)"""
    budgets: list[int] = dataclasses.field(default_factory=list)
    """per prompt: the recorded request's max_new_tokens (a round drafts at most ``budget - t - 1`` levels)"""
    observe_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    """per drafter: its per-round ``features()`` seconds (the cost table's ``draft_base_seconds``), which a
    fixed arm pays only in its own drafter's rounds but a policy reading every drafter's signals pays
    for every drafter in every round"""

    def watched_seconds(self, arm: int) -> float:
        """What a round of ``arm`` costs on top of ``seconds`` when the policy observes every drafter."""
        drafter = self.arms[arm][0]
        return sum(v for name, v in self.observe_seconds.items() if name != drafter)

    def arm(self, drafter: str, depth: int) -> int:
        try:
            return self.arms.index((drafter, int(depth)))
        except ValueError:
            raise ValueError(f"arm ({drafter}, {depth}) is not in the table; it has {list(self.arms)}.") from None


def drafter_costs(common: CostTable, own: CostTable) -> CostTable:
    """``common``'s target forward and sampler with ``own``'s drafter seconds."""
    return dataclasses.replace(common, draft_widths=own.draft_widths, draft_level_seconds=own.draft_level_seconds,
                               draft_base_seconds=own.draft_base_seconds)


def round_table(traces: Mapping[str, Traces], costs: Mapping[str, CostTable], depths: Sequence[int],
                common: CostTable | None = None) -> RoundTable:
    """The rounds of arms ``NONE`` and ``(drafter, depth)`` for every drafter and positive ``depth``.

    :param traces: drafter name -> its traces; every one over the same prompts and continuations.
    :param costs: drafter name -> its cost table (the drafter part is read from it).
    :param common: the target forward and sampler costs of every arm (default: the first drafter's).
    :raises ValueError: when the traces disagree on prompts or continuations, or are too shallow.
    """
    names = list(traces)
    if not names:
        raise ValueError("round_table needs the traces of at least one drafter.")
    first = traces[names[0]]
    common = common if common is not None else costs[names[0]]
    depths = sorted({int(d) for d in depths if int(d) > 0})
    for name in names:
        t = traces[name]
        t.check_one_per_prompt(f"the drafter-choice table (the {name!r} traces)")
        if [p.id for p in t.prompts] != [p.id for p in first.prompts]:
            raise ValueError(f"the {name!r} traces hold other prompts than the {names[0]!r} ones; collect both "
                             "with the same env section (split, languages, tasks, limit_per_group).")
        if not np.array_equal(t.continuation, first.continuation) or not np.array_equal(
                t.cu_num_positions, first.cu_num_positions):
            raise ValueError(f"the {name!r} and {names[0]!r} traces record different continuations; they must "
                             "come from the same target, dtype and max_new_tokens.")
        if depths and t.max_depth < depths[-1]:
            raise ValueError(f"the {name!r} traces hold trees of {t.max_depth} levels, fewer than depth "
                             f"{depths[-1]}; drop the deeper depths or collect deeper traces.")
    arms = (NONE,) + tuple((name, d) for name in names for d in depths)
    per = {name: (match_depths(traces[name]), nodes_by_depth(traces[name], max(depths, default=0)),
                  drafter_costs(common, costs[name]), traces[name].width) for name in names}
    cu_pos, cu_prompt = first.cu_num_positions, first.cu_num_prompt_tokens
    tokens, seconds = [], []
    ngram: dict[str, list[np.ndarray]] = {n: [] for n in names}
    paths = {n: level_path_probs(traces[n], max(depths, default=0)) for n in names}
    for p, prompt in enumerate(first.prompts):
        start, length = int(cu_pos[p]), int(cu_pos[p + 1] - cu_pos[p])
        budget = int(first.budgets[p])
        num_prompt = int(cu_prompt[p + 1] - cu_prompt[p])
        tok = np.zeros((length, len(arms)), dtype=np.int64)
        sec = np.zeros((length, len(arms)))
        for t in range(length):
            ctx = num_prompt + t - 1
            left = length - t
            tok[t, 0] = 1
            sec[t, 0] = common.verify(1, ctx) + common.sample(1)
            for a, (name, depth) in enumerate(arms[1:], start=1):
                match, nodes, table, width = per[name]
                levels = min(depth, budget - t - 1)
                k = min(int(match[start + t]), levels)
                emitted = min(k + 1, left)
                tok[t, a] = emitted
                sec[t, a] = (table.draft(levels, width) + common.verify(1 + int(nodes[start + t, levels]), ctx)
                             + common.sample(emitted))
        tokens.append(tok)
        seconds.append(sec)
        for name in ngram:
            ngram[name].append(np.asarray(traces[name].draft_features[start:start + length, _MATCH]))
    observe = {name: float(per[name][2].draft_base_seconds) for name in names}
    path_probs = {n: [paths[n][int(cu_pos[p]):int(cu_pos[p + 1])] for p in range(len(first.prompts))] for n in names}
    return RoundTable(arms, list(first.prompts), tokens, seconds, ngram, path_probs,
                      [int(b) for b in first.budgets], observe)
