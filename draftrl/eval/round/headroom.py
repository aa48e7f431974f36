"""How much a per-round choice of drafter and depth could gain on recorded traces, at most.

Over :func:`draftrl.replay.round_table.round_table` (every round any schedule could play, in the
seconds ``TraceReplay-v1`` charges), this module plays

- **fixed** ``(drafter, depth)`` every round: the grid search's candidates;
- **rule**: SAM-decoding's choice, n-gram lookup when its match is at least ``min_match`` tokens
  long, else the model drafter, at one depth;
- **stop**: a per-level stop rule (:mod:`draftrl.policies.confidence_stop`,
  :mod:`draftrl.policies.acceptance_stop`) on one model drafter, fed each level's recorded confidence
  as the engine feeds it while drafting, the round's depth where it stops;
- **heuristic**: Hugging Face's ``num_assistant_tokens_schedule="heuristic"`` on one drafter (+2
  levels after a round that accepted every draft, else -1, never below 1);
- **lookahead**: per round, the arm with the most tokens per second (greedy, one round ahead);
- **hindsight**: a dynamic program over positions, the fewest seconds in which any sequence of
  per-round ``(drafter, depth)`` choices emits the continuation. No policy choosing per round can
  beat it on these costs, so ``hindsight / best fixed`` is the ceiling of a learned schedule's
  gain over the grid (a ceiling that knows each round's acceptance in advance).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from draftrl.decoding.schedule import heuristic_depth
from draftrl.policies.confidence_stop import LevelStopRule
from draftrl.replay.round_table import RoundTable


# ----------------------------------------------------------------------------- schedules
def play(tokens: np.ndarray, seconds: np.ndarray, choose) -> tuple[float, list[int]]:
    """Seconds of one prompt under ``choose(t) -> arm index``, and the arms it played."""
    t, total, played = 0, 0.0, []
    while t < len(tokens):
        a = int(choose(t))
        total += float(seconds[t, a])
        played.append(a)
        t += int(tokens[t, a])
    return total, played


def hindsight(tokens: np.ndarray, seconds: np.ndarray) -> tuple[float, list[int]]:
    """The fewest seconds any per-round schedule needs for one prompt, and its arms (a dynamic
    program from the end: ``best[t] = min_a seconds[t, a] + best[t + tokens[t, a]]``)."""
    length = len(tokens)
    best = np.zeros(length + 1)
    arg = np.zeros(length, dtype=np.int64)
    for t in range(length - 1, -1, -1):
        nxt = np.minimum(t + tokens[t], length)
        value = seconds[t] + best[nxt]
        arg[t] = int(np.argmin(value))
        best[t] = float(value[arg[t]])
    return play(tokens, seconds, lambda t: arg[t])


def play_stop(table: RoundTable, prompt: int, drafter: str, rule: LevelStopRule) -> tuple[float, list[int]]:
    """Seconds of one prompt when ``rule`` ends ``drafter``'s chain each round, and the arms it played.

    As ``SpeculativeDecoder.round(depth, stop=rule)`` with ``depth`` the table's deepest: each round
    asks the rule after every level (at most ``budget - t - 1``, and no deeper than the recorded
    tree), keeps the level it stops at, then tells it how many drafted tokens were accepted.
    """
    tokens = table.tokens[prompt]
    paths = table.path_probs[drafter][prompt]
    budget = table.budgets[prompt]
    arms = [0] + [table.arm(drafter, d) for d in range(1, paths.shape[1] + 1)]

    def choose(t: int) -> int:
        depth = 0
        for level in range(1, min(paths.shape[1], budget - t - 1) + 1):
            prob = float(paths[t, level - 1])
            if not np.isfinite(prob):
                break
            depth = level
            if rule({"level": float(level), "level_best_prob": prob, "level_num_nodes": 1.0}):
                break
        rule.observe(int(tokens[t, arms[depth]]) - 1)
        return arms[depth]

    rule.start()
    return play(tokens, table.seconds[prompt], choose)


def play_heuristic(table: RoundTable, prompt: int, drafter: str, initial: int) -> tuple[float, list[int]]:
    """Seconds of one prompt under Hugging Face's heuristic schedule on ``drafter`` from depth
    ``initial``, and the arms it played (the depth each round drafts, capped at the table's deepest)."""
    tokens = table.tokens[prompt]
    available = np.isfinite(table.path_probs[drafter][prompt]).sum(axis=1)  # levels the recorded tree has
    most = max(d for name, d in table.arms if name == drafter)
    budget = table.budgets[prompt]
    depth = float(min(initial, most))

    def choose(t: int) -> int:
        nonlocal depth
        asked = min(int(depth), budget - t - 1)
        a = table.arm(drafter, asked) if asked > 0 else 0
        # what the round drafted (a drafter may propose fewer levels than asked) and accepted
        depth = heuristic_depth(depth, int(tokens[t, a]) - 1, min(asked, int(available[t])), most)
        return a

    return play(tokens, table.seconds[prompt], choose)


def lookahead(tokens: np.ndarray, seconds: np.ndarray) -> tuple[float, list[int]]:
    """Each round the arm with the most tokens per second for that round alone."""
    return play(tokens, seconds, lambda t: int(np.argmax(tokens[t] / seconds[t])))


@dataclass
class Headroom:
    """Seconds per prompt of every schedule, and what they add up to."""

    table: RoundTable
    schedules: dict[str, list[float]]
    """schedule name -> seconds per prompt"""
    played: dict[str, list[list[int]]]

    def total(self, name: str, prompts: Sequence[int] | None = None) -> float:
        rows = range(len(self.table.prompts)) if prompts is None else prompts
        return float(sum(self.schedules[name][p] for p in rows))

    def speedup(self, name: str, over: str = "none:0", prompts: Sequence[int] | None = None) -> float:
        """Tokens per second of ``name`` over ``over`` on the whole workload (or ``prompts``):
        every schedule emits the same tokens, so the ratio of total seconds."""
        return self.total(over, prompts) / self.total(name, prompts)

    def best_fixed(self, prompts: Sequence[int] | None = None) -> str:
        fixed = [n for n in self.schedules if n.startswith("fixed:")]
        return min(fixed, key=lambda n: self.total(n, prompts))

    def best_stop(self, prompts: Sequence[int] | None = None) -> str | None:
        stops = [n for n in self.schedules if n.startswith("stop:")]
        return min(stops, key=lambda n: self.total(n, prompts)) if stops else None

    def took(self, name: str, prompts: Sequence[int] | None = None) -> float:
        """The share of the headroom over the best fixed arm that ``name`` took: 0 at the best
        fixed arm's speed, 1 at hindsight's (on log speed; negative when slower than the best fixed)."""
        best = self.best_fixed(prompts)
        ceiling = math.log(self.speedup("hindsight", over=best, prompts=prompts))
        return math.log(self.speedup(name, over=best, prompts=prompts)) / ceiling if ceiling > 0 else 0.0

    def best_rule(self, prompts: Sequence[int] | None = None) -> str | None:
        rules = [n for n in self.schedules if n.startswith("rule:")]
        return min(rules, key=lambda n: self.total(n, prompts)) if rules else None

    def arm_shares(self, name: str) -> dict[str, float]:
        """Fraction of ``name``'s rounds per drafter."""
        counts: dict[str, int] = {}
        for arms in self.played[name]:
            for a in arms:
                drafter = self.table.arms[a][0]
                counts[drafter] = counts.get(drafter, 0) + 1
        total = sum(counts.values()) or 1
        return {k: v / total for k, v in sorted(counts.items())}


def headroom(table: RoundTable, rules: Sequence[tuple[str, str, int]] = (),
             stops: Sequence[tuple[str, LevelStopRule]] = (), heuristics: Sequence[tuple[str, int]] = ()) -> Headroom:
    """Every fixed arm, ``rules`` (``(lookup drafter, model drafter, min_match)``, at each depth),
    ``stops`` (``(model drafter, rule)``, drafting up to the table's deepest level), ``heuristics``
    (``(drafter, initial depth)``), the lookahead and the hindsight schedule, on every prompt of ``table``.

    Fixed arms are named ``fixed:none:0``... ``fixed:DRAFTER:K`` (``none:0`` is also kept under
    its own name), rules ``rule:LOOKUP|MODEL>=N:K``, stops ``stop:DRAFTER:RULE`` (``rule.name``),
    heuristics ``heuristic:DRAFTER:INITIAL``. A stop or a heuristic needs the table to hold its
    drafter at every depth from 1 to the deepest.
    """
    schedules: dict[str, list[float]] = {}
    played: dict[str, list[list[int]]] = {}

    def add(name: str, results) -> None:
        schedules[name] = [r[0] for r in results]
        played[name] = [r[1] for r in results]

    pairs = list(zip(table.tokens, table.seconds))
    for a, (drafter, depth) in enumerate(table.arms):
        results = [play(tok, sec, lambda t, a=a: a) for tok, sec in pairs]
        add(f"fixed:{drafter}:{depth}", results)
    add("none:0", [(s, p) for s, p in zip(schedules["fixed:none:0"], played["fixed:none:0"])])
    depths = sorted({d for _, d in table.arms if d > 0})
    for lookup, model, min_match in rules:
        if lookup not in table.ngram_match or model not in table.ngram_match:
            raise ValueError(f"rule ({lookup}, {model}) names a drafter the table lacks; it has "
                             f"{sorted(table.ngram_match)}.")
        for depth in depths:
            la, ma = table.arm(lookup, depth), table.arm(model, depth)
            results = [play(tok, sec, lambda t, m=match: la if m[t] >= min_match else ma)
                       for (tok, sec), match in zip(pairs, table.ngram_match[lookup])]
            add(f"rule:{lookup}|{model}>={min_match}:{depth}", results)

    def every_depth(drafter: str, what: str) -> None:
        have = {d for name, d in table.arms if name == drafter}
        if not have or have != set(range(1, max(have) + 1)):
            raise ValueError(f"a {what} on {drafter!r} plays every depth up to the deepest; the table has "
                             f"{sorted(have)}: build it with depths 1..{max(have, default=1)}.")

    for drafter, rule in stops:
        every_depth(drafter, "stop")
        add(f"stop:{drafter}:{rule.name}", [play_stop(table, p, drafter, rule) for p in range(len(pairs))])
    for drafter, initial in heuristics:
        every_depth(drafter, "heuristic")
        add(f"heuristic:{drafter}:{initial}", [play_heuristic(table, p, drafter, initial) for p in range(len(pairs))])
    add("lookahead", [lookahead(tok, sec) for tok, sec in pairs])
    add("hindsight", [hindsight(tok, sec) for tok, sec in pairs])
    return Headroom(table, schedules, played)

