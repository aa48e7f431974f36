"""``draftrl/TraceReplay-v0``: ``SpecDecode-v1`` replayed from greedy traces, without models.

Tokens per round are exact (see ``draftrl.replay.traces``); seconds come from a cost table
(``draftrl calibrate``). The observation is built by the same :class:`FeatureBuilder` as the
real env's, so a policy trained here runs unchanged on ``draftrl/SpecDecode-v1``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from draftrl.decoding.stats import TokenStats
from draftrl.config import resolve
from draftrl.config.env import EnvConfig
from draftrl.signals.costs import CostTable
from draftrl.signals.features import DRAFT_FEATURES, CostTracker, FeatureBuilder, RoundSummary
from draftrl.decoding.workload import Workload, budget
from draftrl.envs.spec_decode import SeededEpisodes
from draftrl.replay.traces import Traces, stored_cost_table
from draftrl.signals.rewards import RewardModel


class TraceReplayEnv(SeededEpisodes, gym.Env[np.ndarray, np.ndarray]):
    """
    ## Description

    ``draftrl/SpecDecode-v1`` at temperature 0, replayed from traces recorded by
    ``draftrl collect``: an episode is one recorded request, a step one round. The round's
    draft tree is the first ``depth`` levels of the tree recorded at the current position, the
    target verifies its ``verify_size`` best nodes (``DraftTree.select``'s rule), and the accepted
    length is found by walking that subtree along the target's recorded greedy continuation:
    for the same actions the tokens of every round equal the real engine's (tested). No model
    runs, so a step takes microseconds (>= 100x faster than the real env).

    ## Action Space

    As ``SpecDecode-v1``: ``MultiDiscrete([len(depths), len(verify_sizes)])`` indexing
    ``env.unwrapped.depths`` (0 = no speculation) and ``env.unwrapped.verify_sizes`` (0 = all).
    ``max(depths)`` may not exceed the recorded depth and ``width`` must equal the recorded one.

    ## Observation Space

    Identical to ``SpecDecode-v1`` (``env.unwrapped.feature_names``, same table): the draft
    signals recorded at each position, the same history and context features, and cost features
    built by the same running averages, fed with the replayed seconds (so they sit at the cost
    table's ratios, plus noise when ``cost_noise > 0``).

    ## Rewards

    As ``SpecDecode-v1`` (``ratio`` or ``throughput``), but ``seconds`` are the cost table's:
    draft ``base + levels * level(width)``, verify ``forward(1 + num_verified, context)``, sample
    ``base + tokens * per_token``, each times ``exp(sigma * z - sigma^2 / 2)`` with
    ``sigma = EnvConfig.cost_noise`` and ``z ~ N(0, 1)`` from the env's RNG. Deterministic given
    the seed.

    ## Starting State

    The first position of the episode's recorded request; prompts are drawn in a seeded order
    (``reset(seed=...)`` restarts the order, cost averages and ``rho``);
    ``options={"prompt_id": ...}`` / ``{"prompt_index": i}`` picks one.

    ## Episode End

    - Termination: the recorded continuation's EOS or the budget (``EnvConfig.max_new_tokens``
      or the prompt's suggestion, never more than was recorded).
    - Truncation: ``max_episode_steps=1024`` in ``register(...)``.

    ## Information

    The keys of ``SpecDecode-v1``; ``token_stats`` are the greedy statistics the engine would
    report (p = 1 on the emitted token); ``exactness_passed`` is None (nothing to test at
    temperature 0).

    ## Arguments

    ```python
    env = gym.make("draftrl/TraceReplay-v0", traces="runs/traces/tiny")             # recorded config
    env = gym.make("draftrl/TraceReplay-v0", traces="runs/traces/tiny", depths=(0, 2, 4), cost_noise=0.05)
    ```

    ``traces`` (a directory written by ``draftrl collect`` or a :class:`Traces`); ``config``
    (default: the recorded config) and keyword overrides; ``cost_table`` (a
    :class:`CostTable` or JSON path; default ``EnvConfig.cost_table``, else the
    ``cost_table.json`` stored with the traces). Prompt filters of the config are not used:
    the recorded prompts are the workload.

    ``env.unwrapped.lookahead_action()`` gives the coming round's hindsight-best action (the
    ``LookAhead`` baseline, the upper bound that training summaries report).

    ## Version History

    - v0: initial version.
    """

    metadata = {"render_modes": []}

    def __init__(self, traces: str | Path | Traces, config: EnvConfig | dict | None = None, *,
                 cost_table: CostTable | str | Path | None = None, render_mode: str | None = None,
                 **overrides: Any):
        trace_dir = None
        if not isinstance(traces, Traces):
            trace_dir = Path(traces)
            traces = Traces.load(trace_dir)
        self.traces = traces
        self.config = config = resolve(EnvConfig, config if config is not None else traces.config, overrides)
        if render_mode is not None:
            raise ValueError(f"render_mode={render_mode!r} is not supported; TraceReplayEnv does not render.")
        self.render_mode = render_mode
        self._check_compatible(config, traces)
        self.cost_table = self._cost_table(cost_table, config, trace_dir)

        self.depths: tuple[int, ...] = config.depths
        self.verify_sizes: tuple[int, ...] = config.verify_sizes
        self.features = FeatureBuilder(config.history, config.ema_decay,
                                       CostTracker(self.cost_table, config.cost_decay, config.width))
        self.feature_names: tuple[str, ...] = self.features.names
        self.rewards = RewardModel(config.reward, config.rho, config.rho_rate,
                                   rho_prior=lambda: 1.0 / self.features.costs.ar_seconds())
        self.workload = Workload(config, None, prompts=traces.prompts)
        self.action_space = spaces.MultiDiscrete([len(self.depths), len(self.verify_sizes)])
        self.observation_space = spaces.Box(self.features.low, self.features.high, dtype=np.float32)

        # python lists: per-element access is faster than numpy indexing in the step loop
        self._cont = traces.continuation.tolist()
        self._cu_pos = traces.cu_num_positions.tolist()
        self._cu_prompt = traces.cu_num_prompt_tokens.tolist()
        self._cu_nodes = traces.cu_num_nodes.tolist()
        self._tok = traces.node_tokens.tolist()
        self._par = traces.node_parents.tolist()
        self._dep = traces.node_depths.tolist()
        self._score = traces.node_scores.tolist()
        self._draft = traces.draft_features.tolist()
        self._budgets = [min(budget(config, p), recorded) for p, recorded in zip(traces.prompts, traces.budgets)]
        self._has_drafter = config.drafter != "none"
        self._prompt = -1
        self._verify_growth = self._draft_scale = 1.0

    # ------------------------------------------------------------------ construction
    @staticmethod
    def _check_compatible(config: EnvConfig, traces: Traces) -> None:
        recorded = traces.meta.get("config", {})
        if config.temperature != 0:
            raise ValueError(f"TraceReplay-v0 replays greedy traces; EnvConfig.temperature={config.temperature} must be 0.")
        for name in ("target", "drafter", "chat_template"):
            if name in recorded and getattr(config, name) != recorded[name]:
                raise ValueError(
                    f"EnvConfig.{name}={getattr(config, name)!r} differs from the traces' {recorded[name]!r}; "
                    f"record new traces with draftrl collect --set env.{name}={getattr(config, name)}."
                )
        if config.width != traces.width:
            raise ValueError(
                f"EnvConfig.width={config.width} differs from the recorded width={traces.width}; a narrower or "
                "wider tree is not a part of the recorded one: record traces with that width."
            )
        if config.max_depth > traces.max_depth:
            raise ValueError(
                f"EnvConfig.depths reach {config.max_depth} but the traces hold trees of {traces.max_depth} levels; "
                f"drop the deeper depths or record with --set env.depths=[...,{config.max_depth}]."
            )

    @staticmethod
    def _cost_table(table, config: EnvConfig, trace_dir: Path | None) -> CostTable:
        if isinstance(table, CostTable):
            return table
        if table is not None:
            return CostTable.load(table)
        if config.cost_table:
            return CostTable.load(config.cost_table)
        stored = stored_cost_table(trace_dir) if trace_dir is not None else None
        if stored is not None:
            return stored
        raise ValueError(
            "TraceReplay-v0 needs a cost table for its seconds: run draftrl calibrate --json --out costs.json and "
            "pass cost_table='costs.json' (or set EnvConfig.cost_table, or collect with --cost-table)."
        )

    # ------------------------------------------------------------------ episodes
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        self._seed_episode(seed)
        p = self._prompt = self.workload.pick(options, self.np_random)
        self._t = 0
        self._budget = self._budgets[p]
        self._length = min(self._cu_pos[p + 1] - self._cu_pos[p], self._budget)
        self._num_prompt_tokens = self._cu_prompt[p + 1] - self._cu_prompt[p]
        self._finished = False
        self._verify_growth = self._noise(self.config.cost_jitter)
        self._draft_scale = self._noise(self.config.cost_jitter)
        self.features.start_episode(self._budget)
        prompt = self.traces.prompts[p]
        info = {
            "prompt_id": prompt.id,
            "language": prompt.language,
            "task": prompt.task,
            "num_prompt_tokens": self._num_prompt_tokens,
            "max_new_tokens": self._budget,
        }
        return self._observation(), info

    def _observation(self) -> np.ndarray:
        if self._finished or not self._has_drafter:
            draft = {}
        else:
            draft = dict(zip(DRAFT_FEATURES, self._draft[self._cu_pos[self._prompt] + self._t]))
        return self.features.observation(draft, self._num_prompt_tokens + self._t, self._t)

    def _noise(self, sigma: float | None = None) -> float:
        """A mean-one lognormal factor of ``sigma`` (default: ``cost_noise``) from the env's RNG."""
        sigma = self.config.cost_noise if sigma is None else sigma
        if sigma <= 0:
            return 1.0
        return math.exp(sigma * float(self.np_random.standard_normal()) - 0.5 * sigma * sigma)

    def _verify_seconds(self, num_tokens: int, ctx: int) -> float:
        """The cost table's forward over ``num_tokens``, its growth over one token scaled by this episode's jitter."""
        seconds = self.cost_table.verify(num_tokens, ctx)
        if self._verify_growth != 1.0:
            one = self.cost_table.verify(1, ctx)
            seconds = one + (seconds - one) * self._verify_growth
        return seconds

    def step(self, action) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        self._check_running()
        action = np.asarray(action)
        if action.shape != (2,) or not self.action_space.contains(action.astype(self.action_space.dtype)):
            raise ValueError(f"action={action!r} is outside {self.action_space}.")
        depth = self.depths[int(action[0])]
        verify_size = self.verify_sizes[int(action[1])]
        levels = min(depth, self._budget - self._t - 1) if self._has_drafter else 0
        draft_seconds = (self.cost_table.draft(levels, self.config.width) * self._draft_scale * self._noise()
                         if self._has_drafter else 0.0)
        return self._play_round(depth, verify_size, levels, draft_seconds)

    def _check_running(self) -> None:
        if self._prompt < 0 or self._finished:
            raise RuntimeError("step() called before reset() or after the episode ended; call reset().")

    def _nodes(self) -> tuple[int, int]:
        """[lo, hi) node range of the tree recorded at the current position."""
        pos = self._cu_pos[self._prompt] + self._t
        return self._cu_nodes[pos], self._cu_nodes[pos + 1]

    def _walk(self, levels: int, verify_size: int) -> tuple[int, int, int, int, bool]:
        """The coming round without playing it: (nodes drafted, nodes verified, deepest verified
        level, draft tokens accepted, whether the node the walk stopped at had drafted children)."""
        t, cont = self._t, self._cont
        start = self._cu_pos[self._prompt]
        # the draft tree: nodes of depth <= levels are a prefix of the recorded node list
        lo, hi = self._nodes()
        n = lo
        dep = self._dep
        while n < hi and dep[n] <= levels:
            n += 1
        num_proposed = n - lo
        if verify_size == 0 or verify_size >= num_proposed:
            keep = range(lo, n)
        else:
            score = self._score
            order = sorted(range(lo, n), key=lambda i: (-score[i], dep[i], i))
            keep = sorted(order[:verify_size])
        kids: dict[int, dict[int, int]] = {}
        for i in keep:
            kids.setdefault(self._par[i], {})[self._tok[i]] = i - lo
        verified_depth = max((dep[i] for i in keep), default=0)

        # walk the selected subtree along the greedy continuation
        end = start + self._length
        node, k, last_drafted = -1, 0, False
        while True:
            children = kids.get(node)
            last_drafted = bool(children)
            if not children or start + t + k >= end:
                break
            child = children.get(cont[start + t + k])
            if child is None:
                break
            node, k = child, k + 1
        return num_proposed, len(keep), verified_depth, k, last_drafted

    def lookahead_action(self) -> np.ndarray:
        """The per-round hindsight best action (grid indices) for the coming round.

        Every (depth, verify_size) of the grid is walked along the recorded continuation and
        charged the cost table's seconds (this episode's jitter, no per-round noise); the one
        with the best round reward wins: ``tokens - rho * seconds`` with the reward model's
        ``rho``, or ``tokens / seconds``. Greedy per round (the next round's position depends on
        this one), so it bounds per-round choices, which is what the policies make. Used by
        ``draftrl.policies.LookAhead``.
        """
        return self._lookahead(self.verify_sizes)

    def _lookahead(self, verify_sizes: tuple[int, ...]) -> np.ndarray:
        """:meth:`lookahead_action` over ``verify_sizes`` (the second index points into it)."""
        self._check_running()
        rho = self.rewards.rho if self.config.reward == "ratio" else None
        ctx = self._num_prompt_tokens + self._t - 1
        best, best_value = np.zeros(2, dtype=np.int64), -math.inf
        for i, depth in enumerate(self.depths):
            levels = min(depth, self._budget - self._t - 1) if self._has_drafter else 0
            draft = self.cost_table.draft(levels, self.config.width) * self._draft_scale if self._has_drafter else 0.0
            for j, verify_size in enumerate(verify_sizes):
                _, num_verified, _, k, _ = self._walk(levels, verify_size)
                tokens = min(k + 1, self._length - self._t)
                seconds = draft + self._verify_seconds(1 + num_verified, ctx) + self.cost_table.sample(tokens)
                value = tokens - rho * seconds if rho is not None else tokens / seconds
                if value > best_value + 1e-12:
                    best, best_value = np.array([i, j], dtype=np.int64), value
        return best

    def _play_round(self, depth: int, verify_size: int, levels: int, draft_seconds: float,
                    charged: float = 0.0) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        """Replay one round drafting ``levels`` levels; the reward leaves out ``charged`` seconds
        (already paid by per-level shaping)."""
        t, cont = self._t, self._cont
        start = self._cu_pos[self._prompt]
        num_proposed, num_verified, verified_depth, k, last_drafted = self._walk(levels, verify_size)
        num_emitted = min(k + 1, self._length - t)
        num_accepted = min(k, num_emitted)
        tokens = cont[start + t : start + t + num_emitted]
        self._t = t + num_emitted
        self._finished = self._t >= self._length
        stop_reason = None
        if self._finished:  # EOS ends the recorded continuation unless the budget cut it shorter
            recorded = self._cu_pos[self._prompt + 1] - start
            eos = self.traces.stop_reasons[self._prompt] == "eos" and self._length == recorded
            stop_reason = "eos" if eos else "length"

        table, ctx = self.cost_table, self._num_prompt_tokens + t - 1
        verify_seconds = self._verify_seconds(1 + num_verified, ctx) * self._noise()
        sample_seconds = table.sample(num_emitted) * self._noise()
        summary = RoundSummary(num_emitted, num_accepted, num_verified, verified_depth, levels,
                               draft_seconds, verify_seconds, sample_seconds)
        self.features.observe_round(summary)
        reward = self.rewards(num_emitted, summary.seconds - charged)

        drafted = np.zeros(num_emitted, dtype=bool)
        drafted[:num_accepted] = True
        if num_emitted > num_accepted:
            drafted[num_accepted] = last_drafted
        agree = np.zeros(num_emitted)
        agree[:num_accepted] = 1.0
        stats = TokenStats(token=tokens, p_token=np.ones(num_emitted), mass_before=np.zeros(num_emitted),
                           entropy=np.zeros(num_emitted), drafted=drafted, agree=agree, agree_expected=agree.copy())
        info = {
            "num_emitted": num_emitted,
            "num_accepted": num_accepted,
            "seconds": summary.seconds,
            "draft_seconds": draft_seconds,
            "verify_seconds": verify_seconds,
            "sample_seconds": sample_seconds,
            "depth": depth,
            "verify_size": verify_size,
            "num_proposed": num_proposed,
            "num_verified": num_verified,
            "verified_depth": verified_depth,
            "token_ids": tokens,
            "token_stats": stats,
            "exactness_passed": None,
            "stop_reason": stop_reason,
            "prompt_id": self.traces.prompts[self._prompt].id,
        }
        return self._observation(), float(reward), self._finished, False, info

