"""``draftrl/TraceChoice-v0``: choose each round's drafter and depth, replayed from several drafters' traces.

With two drafters the decision the issue names becomes worth learning: n-gram lookup where the
answer copies the prompt, the trained head where it does not, no speculation where neither is
likely to be accepted. This env replays the traces of every drafter over the same prompts
(``draftrl collect --drafter D``, same target and workload) through
:func:`draftrl.eval.round.headroom.round_table`, so a round costs exactly what ``TraceReplay-v1`` charges
that drafter at that depth, plus the other drafters' per-round ``features()`` time (the policy reads
every drafter's signals, and in the real engine computing them costs that), and PPO trains in minutes.
The observation holds every drafter's own
pre-round signals (the head's top-1 probability and entropy, the n-gram match length and count),
each drafter's recent acceptance, the last rounds' tokens and where the request stands
(:class:`draftrl.signals.choice.ChoiceFeatures`, which the real-engine runner uses too).

Actions are arms: ``Discrete(len(arms))`` with ``arms[0] = ("none", 0)`` and then
``(drafter, depth)`` per drafter and positive depth. The reward is ``tokens - seconds / ar_step``
with ``ar_step`` the episode's first plain target step: an episode's return is
``tokens - total seconds / ar_step``, highest for the schedule that emits the request fastest.

    env = gym.make("draftrl/TraceChoice-v0", traces={"ngram": "runs/tr_ngram", "eagle3": "runs/tr_eagle3"})
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from draftrl.replay.round_table import RoundTable, round_table
from draftrl.replay.traces import Traces, load_choice_traces
from draftrl.signals.choice import ChoiceFeatures
from draftrl.signals.costs import CostTable


class TraceChoiceEnv(gym.Env[np.ndarray, np.int64]):
    """Per-round (drafter, depth) on recorded traces; see the module docstring.

    :param traces: drafter name -> trace directory (with its cost table) or ``Traces``.
    :param depths: positive draft depths of each drafter's arms.
    :param cost_tables: drafter name -> cost table, for ``Traces`` passed without a directory.
    :param common: whose cost table gives the target's costs (default: the first drafter's).
    :param history: rounds of emitted tokens in the observation.
    :param ema_decay: decay of each drafter's running acceptance.
    """

    metadata = {"render_modes": []}

    def __init__(self, traces: Mapping[str, str | Path | Traces], depths: Sequence[int] = (1, 2, 3, 4, 6), *,
                 cost_tables: Mapping[str, CostTable] | None = None, common: str | None = None, history: int = 4,
                 ema_decay: float = 0.7, seed: int | None = None, table: RoundTable | None = None):
        if cost_tables is not None:
            loaded, costs = dict(traces), dict(cost_tables)
        else:
            loaded, costs = load_choice_traces(traces)
        self.drafters: tuple[str, ...] = tuple(loaded)
        self.table = table if table is not None else round_table(
            loaded, costs, depths, common=costs[common] if common else None)
        self.arms = self.table.arms
        first = loaded[self.drafters[0]]
        cu = first.cu_num_positions
        self._draft = {name: [loaded[name].draft_features[cu[p]:cu[p + 1]] for p in range(len(first.prompts))]
                       for name in self.drafters}
        self.seed = seed
        self.features = ChoiceFeatures(self.drafters, history, ema_decay)
        self.feature_names: tuple[str, ...] = self.features.names
        self.observation_space = spaces.Box(self.features.low, self.features.high, dtype=np.float32)
        self._budgets = [int(b) for b in first.budgets]
        self.action_space = spaces.Discrete(len(self.arms))
        self._p = -1
        self._seeded = False

    @property
    def prompts(self):
        return self.table.prompts

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        if seed is None and not self._seeded:
            seed = self.seed
        super().reset(seed=seed)
        self._seeded = True
        if options and "prompt_index" in options:
            p = int(options["prompt_index"])
            if not 0 <= p < len(self.prompts):
                raise ValueError(f"options['prompt_index']={p} is outside the {len(self.prompts)} recorded prompts.")
        else:
            p = int(self.np_random.integers(len(self.prompts)))
        self._p, self._t = p, 0
        self._tokens, self._seconds = self.table.tokens[p], self.table.seconds[p]
        self._ar = float(self._seconds[0, 0])
        self.features.start(self._budgets[p])
        prompt = self.prompts[p]
        return self._observation(), {"prompt_id": prompt.id, "language": prompt.language, "task": prompt.task}

    def _observation(self) -> np.ndarray:
        t = min(self._t, len(self._tokens) - 1)
        return self.features.observation({d: self._draft[d][self._p][t] for d in self.drafters}, self._t)

    def step(self, action) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        if self._p < 0 or self._t >= len(self._tokens):
            raise RuntimeError("step() called before reset() or after the episode ended; call reset().")
        a = int(np.asarray(action).reshape(-1)[0])
        if not self.action_space.contains(a):
            raise ValueError(f"action={action!r} is outside {self.action_space} (arms {list(self.arms)}).")
        drafter, depth = self.arms[a]
        tokens = int(self._tokens[self._t, a])
        seconds = float(self._seconds[self._t, a]) + self.table.watched_seconds(a)
        self.features.observe(drafter, depth, tokens)
        self._t += tokens
        done = self._t >= len(self._tokens)
        info = {"num_emitted": tokens, "seconds": seconds, "drafter": drafter, "depth": depth, "arm": a,
                "prompt_id": self.prompts[self._p].id}
        return self._observation(), tokens - seconds / self._ar, done, False, info
