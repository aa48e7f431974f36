"""``draftrl/SpecDecode-v2`` and ``draftrl/TraceReplay-v1``: speculative decoding as a Gymnasium env, a round a step.

A step is one round of a :class:`~draftrl.decoding.interface.RoundEngine`: the live
:class:`~draftrl.decoding.engine.SpeculativeDecoder` (``SpecDecode-v2``) or the replay of greedy
traces, :class:`~draftrl.replay.round_engine.TraceRoundEngine` (``TraceReplay-v1``, registered with
``kwargs={"engine": "replay"}``). The env turns the round's result into an observation
(``draftrl.signals.features``) and a reward (``draftrl.signals.rewards``); the engine does the
decoding, so the spaces, features and reward are one code for both engines.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from draftrl.config import resolve
from draftrl.config.env import EnvConfig
from draftrl.config.workload import SamplingClass
from draftrl.decoding.workload import Request, Workload
from draftrl.signals.costs import CostTable
from draftrl.signals.features import CostTracker, FeatureBuilder, RoundSummary
from draftrl.signals.rewards import RewardModel

if TYPE_CHECKING:
    from draftrl.decoding.interface import RoundEngine
    from draftrl.replay.traces import Traces

#: The engines an env builds itself: ``live`` (a ``SpeculativeDecoder`` around the config's target and
#: drafter; also ``engine=None``) and ``replay`` (``TraceRoundEngine`` over ``traces``).
ENGINES = ("live", "replay")


def round_engine(config: EnvConfig | dict | None, overrides: dict[str, Any], engine: str | RoundEngine | None,
                 traces: str | Path | Traces | None, cost_table: CostTable | str | Path | None, tokenizer,
                 target) -> tuple[EnvConfig, RoundEngine, Any]:
    """``(config, engine, tokenizer)`` of a round env: the resolved config (a replay's defaults to the
    traces' recorded one) and the engine it drives, checked against each other."""
    if isinstance(engine, str) and engine not in ENGINES:
        raise ValueError(f"engine={engine!r} is unknown; use one of {', '.join(ENGINES)} or pass a RoundEngine.")
    if engine == "replay":
        from draftrl.replay.round_engine import TraceRoundEngine, open_traces, replay_cost_table

        traces, trace_dir = open_traces(traces)
        config = resolve(EnvConfig, config if config is not None else traces.config, overrides)
        return config, TraceRoundEngine(traces, config, replay_cost_table(cost_table, config, trace_dir)), None
    if traces is not None or cost_table is not None:
        raise ValueError("traces= and cost_table= are the replay's; pass engine='replay' (draftrl/TraceReplay-v1) "
                         "or drop them.")
    config = resolve(EnvConfig, config, overrides)
    if engine is None or engine == "live":
        from draftrl.decoding.build import build_engine

        engine, built_tokenizer = build_engine(config, target)
        tokenizer = tokenizer if tokenizer is not None else built_tokenizer
    elif tokenizer is None and not hasattr(engine, "workload"):
        raise ValueError("an engine was passed without its tokenizer; pass tokenizer=loaded.tokenizer as well.")
    engine.check(config)
    return config, engine, tokenizer


class SeededEpisodes:
    """Mixin: gymnasium's reset seeding for the envs with ``config``, ``workload``, ``features``, ``rewards``.

    The first reset without a seed takes ``config.seed``; a seeded reset (or the first) restarts
    the prompt order, the measured costs and the reward's running estimate, so a seed fixes the run.
    """

    _seeded: bool = False

    def _seed_episode(self, seed: int | None) -> bool:
        """Seed this episode (``gym.Env.reset``); True when the env restarted from the seed."""
        if seed is None and not self._seeded and self.config.seed is not None:
            seed = self.config.seed
        gym.Env.reset(self, seed=seed)
        restarted = seed is not None or not self._seeded
        if restarted:
            self._seeded = True
            self.workload.restart(self.np_random)
            self.features.reset_costs()
            self.rewards.restart()
        self.rewards.start_episode()
        return restarted


class EngineEpisodes(SeededEpisodes, gym.Env[np.ndarray, Any]):
    """What the round envs share: requests, the engine, features, rewards, the monitor and the lookahead."""

    metadata = {"render_modes": []}

    def __init__(self, config: EnvConfig | dict | None = None, *, engine: str | RoundEngine | None = None,
                 traces: str | Path | Traces | None = None, cost_table: CostTable | str | Path | None = None,
                 tokenizer=None, target=None, render_mode: str | None = None, **overrides: Any):
        if render_mode is not None:
            raise ValueError(f"render_mode={render_mode!r} is not supported; "
                             "the speculative-decoding envs do not render.")
        self.render_mode = render_mode
        config, engine, tokenizer = round_engine(config, overrides, engine, traces, cost_table, tokenizer, target)
        self.config = config
        self.engine = engine
        self.tokenizer = tokenizer
        self.workload = engine.workload(config) if hasattr(engine, "workload") else Workload(config, tokenizer)
        # a replay charges its cost table's seconds: the cost features start from it
        self.cost_table = getattr(engine, "cost_table", None) or (
            CostTable.load(config.cost_table) if config.cost_table else None)
        self.features = FeatureBuilder(config.history, config.ema_decay,
                                       CostTracker(self.cost_table, config.cost_decay, config.width))
        self.feature_names: tuple[str, ...] = self.features.names
        self.depths: tuple[int, ...] = config.depths
        self.verify_sizes: tuple[int, ...] = config.verify_sizes
        self.rewards = RewardModel(config.reward, config.rho, config.rho_rate, rho_prior=self._rho_prior)
        self.monitor = None
        self.request: Request | None = None
        self.sampling_class: SamplingClass = config.sampling_classes[0]
        """the current episode's sampling (drawn at ``reset``)"""
        if not hasattr(engine, "lookahead"):  # only an engine that knows the continuation has one
            self.lookahead_action = None

    # ------------------------------------------------------------------ shared pieces
    def _rho_prior(self) -> float | None:
        ar = self.features.costs.ar_seconds()
        return 1.0 / ar if ar else None

    def _new_monitor(self):
        if not self.config.monitor or not self.engine.samples:  # a replay samples nothing to test
            return None
        from draftrl.decoding.monitor import ExactnessMonitor

        return ExactnessMonitor()

    def _start_request(self, seed: int | None, options: dict[str, Any] | None) -> dict[str, Any]:
        if self._seed_episode(seed):
            self.monitor = self._new_monitor()
        options = dict(options or {})
        asked = options.pop("sampling", None)
        self.request = self.workload.request(self.workload.pick(options, self.np_random))
        # drawn after the prompt, and nothing drawn for a single class: seeded runs keep their streams
        self.sampling_class = self._sampling_class(asked)
        sampling_seed = int(self.np_random.integers(2**31)) if self.engine.samples else None
        self.engine.config.max_new_tokens = self.request.max_new_tokens
        # the first round verifies inside the prefill (as decoding.generate does): its seconds include the prompt
        prefill = self.engine.start(self.request.prompt_ids, seed=sampling_seed, prefill=False, rng=self.np_random,
                                    **self._sampling_argument())
        self.features.start_episode(self.request.max_new_tokens, self.sampling_class)
        cls = self.sampling_class
        return {
            "prompt_id": self.request.prompt.id,
            "language": self.request.prompt.language,
            "task": self.request.prompt.task,
            "num_prompt_tokens": len(self.request.prompt_ids),
            "max_new_tokens": self.request.max_new_tokens,
            "prefill_seconds": prefill,
            "sampling_seed": sampling_seed,
            "temperature": cls.temperature,
            "top_k": cls.top_k,
            "top_p": cls.top_p,
            "sampling_class": cls.label,
        }

    def _sampling_class(self, asked: str | None) -> SamplingClass:
        """The episode's sampling: the class ``reset(options={"sampling": label})`` names, else one drawn
        from ``EnvConfig.temperature_mix`` by its weights (:meth:`WorkloadConfig.draw_sampling`)."""
        classes = self.config.sampling_classes
        if asked is None:
            return self.config.draw_sampling(self.np_random)
        for cls in classes:
            if cls.label == asked:
                return cls
        raise ValueError(f"reset options sampling={asked!r} is not a class of this env's workload; use one of "
                         f"{', '.join(c.label for c in classes)} (EnvConfig.temperature_mix).")

    def _sampling_argument(self) -> dict[str, Any]:
        """``engine.start``'s ``sampling`` keyword: the episode's class, passed whenever a mix is set (a config
        without one leaves the engine on its own config's sampling, which ``engine.check`` compared)."""
        if self.config.temperature_mix is None:
            return {}
        return {"sampling": self.sampling_class.params()}

    def lookahead_action(self) -> np.ndarray:
        """The coming round's best action (grid indices) in hindsight: the ``LookAhead`` baseline, the
        upper bound training summaries report. Replay only (``None`` on an engine without ``lookahead``).

        Every (depth, verify_size) of the grid is played along the recorded continuation and charged
        the cost table's seconds (this episode's jitter, no per-round noise); the one with the best
        round reward wins: ``tokens - rho * seconds`` with the reward model's ``rho``, or
        ``tokens / seconds``. Greedy per round (the next round's position depends on this one)."""
        return self._lookahead(self.verify_sizes)

    def _lookahead(self, verify_sizes: tuple[int, ...]) -> np.ndarray:
        """:meth:`lookahead_action` over ``verify_sizes`` (the second index points into it)."""
        if self.request is None or self.engine.finished:
            raise RuntimeError("lookahead_action() called before reset() or after the episode ended; call reset().")
        rho = self.rewards.rho if self.config.reward == "ratio" else None
        if rho is not None:
            return self.engine.lookahead(self.depths, verify_sizes, lambda tokens, seconds: tokens - rho * seconds)
        return self.engine.lookahead(self.depths, verify_sizes, lambda tokens, seconds: tokens / seconds)

    def _observation(self) -> np.ndarray:
        engine = self.engine
        draft = engine.features() if not engine.finished else {}
        return self.features.observation(draft, len(engine.ids), len(engine.output_ids))

    def _finish_round(self, rnd, levels: int, reward_seconds: float) -> tuple[float, dict[str, Any]]:
        """Features, reward, monitor and info of a verified round."""
        summary = RoundSummary.from_round(rnd, levels)
        self.features.observe_round(summary)
        reward = self.rewards(rnd.num_emitted, reward_seconds)
        passed = None
        if self.monitor is not None:
            self.monitor.update(rnd.token_stats)  # raises ExactnessViolation on a failed test
            passed = self.monitor.passed
        info = {
            "num_emitted": rnd.num_emitted,
            "num_accepted": rnd.num_accepted,
            "seconds": rnd.seconds,
            "draft_seconds": rnd.draft_seconds,
            "verify_seconds": rnd.verify_seconds,
            "sample_seconds": rnd.sample_seconds,
            "depth": rnd.depth,
            "verify_size": 0 if rnd.verify_size is None else rnd.verify_size,
            "num_proposed": rnd.num_proposed,
            "num_verified": rnd.num_verified,
            "verified_depth": rnd.verified_depth,
            "token_ids": list(rnd.tokens),
            "token_stats": rnd.token_stats,
            "exactness_passed": passed,
            "stop_reason": rnd.stop_reason,
            "prompt_id": self.request.prompt.id,
            "target_features": dict(rnd.target_features),
        }
        return reward, info


class SpecDecodeEnv(EngineEpisodes):
    """
    ## Description

    Speculative decoding on a draft/target pair, one round per step. An episode is one
    request drawn from a prompt set (``EnvConfig``: the shipped multilingual set by default).
    Each round the agent picks the draft depth (0 = no speculation: one plain target step) and
    the verification size (how many of the drafted tree's best nodes the target checks in its
    single forward); the engine drafts, verifies and accepts exactly (Leviathan et al.; greedy
    output equals the target's own greedy decoding), so the policy changes only the speed,
    never the text's distribution.

    The engine is injected (``engine``): the live ``SpeculativeDecoder`` (``draftrl/SpecDecode-v2``)
    or the replay of greedy traces recorded by ``draftrl collect`` (``draftrl/TraceReplay-v1``,
    ``engine="replay"``, :class:`~draftrl.replay.round_engine.TraceRoundEngine`): the round's tree is
    the first ``depth`` levels of the tree recorded at the current position and the accepted length
    is found by walking it along the recorded continuation, so for the same actions every round's
    tokens equal the live engine's (tested). No model runs in the replay: a step takes
    microseconds (>= 100x faster). A policy moves between the two unchanged.

    ## Action Space

    ``MultiDiscrete([len(depths), len(verify_sizes)])``: ``action[0]`` indexes
    ``env.unwrapped.depths`` (default ``(0, 1, 2, 3, 4, 6, 8)``; 0 = no speculation) and
    ``action[1]`` indexes ``env.unwrapped.verify_sizes`` (default ``(0,)``; 0 = every drafted
    node). The tree width is fixed by ``EnvConfig.width`` (1 = chain). In the replay ``max(depths)``
    may not exceed the recorded depth and ``width`` must equal the recorded one.

    ## Observation Space

    ``Box(float32, shape=(31,))`` for ``history=4`` (``27 + history`` in general), names in
    ``env.unwrapped.feature_names``. Every entry is known before the target verifies the round.

    | Num   | Observation            | Min | Max  | Meaning |
    |-------|------------------------|-----|------|---------|
    | 0     | `draft_top1_prob`      | 0   | 1    | draft's top-1 next-token probability (model drafters; else 0) |
    | 1     | `draft_entropy`        | 0   | 20   | entropy of the draft's next-token distribution, nats |
    |       |                        |     |      | (model drafters) |
    | 2     | `ngram_match_len`      | 0   | 64   | length of the matched suffix n-gram (n-gram drafter; 0 = no match) |
    | 3     | `ngram_num_matches`    | 0   | 1024 | earlier occurrences of that n-gram (n-gram drafter) |
    | 4-7   | `last_tokens_1..4`     | 0   | 64   | tokens emitted 1..4 rounds ago (0 before) |
    | 8     | `ema_tokens`           | 0   | 64   | bias-corrected EMA of tokens per round (decay ``ema_decay``) |
    | 9-12  | `accept_rate_1..4`     | 0   | 1    | P(position i accepted given i-1 accepted and verified), |
    |       |                        |     |      | Jeffreys, discounted |
    | 13    | `context_len`          | 0   | 1024 | prompt + generated tokens / 1024 |
    | 14    | `generated_len`        | 0   | 1    | generated tokens / the episode's max_new_tokens |
    | 15    | `remaining_len`        | 0   | 1    | min(tokens left, 16) / 16 |
    | 16-22 | `verify_cost_1..64`    | 0   | 1e4  | running verify seconds with n in [b, 2b) verified nodes / |
    |       |                        |     |      | AR step seconds (b = 1, 2, 4, ..., 64+) |
    | 23    | `draft_cost_round`     | 0   | 1e4  | running per-round drafter seconds (features, catch-up) / |
    |       |                        |     |      | AR step seconds |
    | 24    | `draft_cost_level`     | 0   | 1e4  | running seconds per draft level / AR step seconds |
    | 25    | `temperature`          | 0   | 2    | the request's temperature (0 = greedy; above 2 reads 2) |
    | 26    | `top_k`                | 0   | 1    | min(top_k, 100) / 100; top-k off (0) reads 1 |
    | 27    | `top_p`                | 0   | 1    | the request's top-p (1 = off) |
    | 28    | `target_top1_prob`     | 0   | 1    | raw (T = 1) softmax top-1 prob of the target row that emitted |
    |       |                        |     |      | the last round's last token; 0 = unknown (before a round) |
    | 29    | `target_entropy`       | 0   | 20   | entropy (nats) of that row's raw softmax; 0 when unknown |
    | 30    | `accepted_mean_p`      | 0   | 1    | mean transformed target p of the last round's accepted drafts |
    |       |                        |     |      | (0 if none, or unknown) |

    Why these: the draft signals predict this round's acceptance (a long n-gram match or a
    confident draft is usually accepted); the history captures the workload's current regime
    and the shape of the acceptance-length distribution (not only its mean); the context
    features locate the request (cost grows with context; drafting past the remaining budget is
    waste); the cost ratios tell the policy what a deeper draft or a larger verification costs
    on this machine, so one policy adapts to CPU (steep g(V)) and GPU (flat g(V)). Cost
    averages persist across episodes and start from ``EnvConfig.cost_table`` when given (the
    replay's cost table in the replay: they sit at its ratios, plus noise with ``cost_noise > 0``).
    The request features say how the request samples (one policy serves a temperature mix:
    acceptance falls as the temperature rises); the target features are what the last
    verification forward computed anyway (no extra device sync), the target's own uncertainty
    where the round stopped. An engine that does not report them (``RoundResult.target_features``
    empty; today the replay of greedy traces) leaves them at 0, 0, 0 ("unknown": a real top-1
    probability is at least 1 / vocab).

    ## Rewards

    Wall clock, hence NOT reproducible run to run (timings vary with load). With ``tokens`` the
    round's emitted tokens and ``seconds`` its draft + verify + sample time:
    ``reward="ratio"`` (default) pays ``tokens - rho * seconds`` (tokens; ``rho`` a running
    tokens/s estimate frozen within an episode, so the episode return is maximised by the
    highest total tokens / total time); ``reward="throughput"`` pays ``tokens / seconds``
    (Learning to Draft). See ``draftrl.signals.rewards``.

    In the replay ``seconds`` are the cost table's: draft ``base + levels * level(width)``, verify
    ``forward(1 + num_verified, context)``, sample ``base + tokens * per_token``, each times
    ``exp(sigma * z - sigma^2 / 2)`` with ``sigma = EnvConfig.cost_noise`` and ``z ~ N(0, 1)`` from
    the env's RNG (``cost_jitter``: one such factor per episode on the verify cost's growth and on
    draft seconds). Deterministic given the seed.

    ## Starting State

    No round has run (history 0, acceptance estimates 0.5, target features 0 = unknown; the request
    features are the episode's sampling); the draft signals describe the first
    round, which feeds the prompt together with its drafts (one forward, as Hugging Face prompt
    lookup verifies its first candidates inside the prefill), so its seconds include the
    prompt's. ``reset(seed=...)`` draws a new prompt order and
    restarts the cost averages, ``rho`` and the exactness monitor, so a seed fixes the prompts
    and the sampling seeds (not the timings). ``reset(options={"prompt_id": ...})`` or
    ``{"prompt_index": i}`` decodes a given prompt. The replay's workload is the recorded prompts
    (the config's prompt filters are not used).

    Each episode's sampling is drawn from ``EnvConfig.temperature_mix`` by its weights, after the
    prompt (a workload of one class draws nothing, so its seeded streams are what they were), and
    passed to ``engine.start(sampling=...)``; ``reset(options={"sampling": "T0.7"})`` picks a class
    by its label (``SamplingClass.label``), e.g. to evaluate one temperature.

    ## Episode End

    - Termination: the target emits EOS or the request reaches its ``max_new_tokens`` (the
      prompt's suggestion capped at ``max_new_tokens_cap``, or ``EnvConfig.max_new_tokens``;
      in the replay never more than was recorded).
    - Truncation: ``max_episode_steps=1024`` rounds in ``register(...)`` (every round emits at
      least one token, so it binds only for budgets above 1024).

    ## Information

    ``num_emitted``, ``num_accepted``, ``seconds``, ``draft_seconds``, ``verify_seconds``,
    ``sample_seconds``, ``depth``, ``verify_size`` (0 = all), ``num_proposed``, ``num_verified``,
    ``verified_depth``, ``token_ids``, ``token_stats`` (``draftrl.decoding.stats.TokenStats`` of
    the emitted tokens), ``exactness_passed`` (the running verdict of
    ``draftrl.decoding.monitor.ExactnessMonitor``; None with ``monitor=False``; a failed test
    raises ``ExactnessViolation``; None in the replay: nothing is sampled, ``token_stats`` are the
    greedy statistics the engine would report, p = 1 on the emitted token), ``stop_reason``,
    ``prompt_id``, ``target_features`` (the round's ``RoundResult.target_features``; {} when the
    engine reports none). ``reset`` returns the prompt's id, language, task, length, budget, prefill
    seconds, sampling seed (None in the replay) and the episode's sampling: ``temperature``,
    ``top_k``, ``top_p`` and ``sampling_class`` (its label, e.g. ``T0.7``).

    ## Arguments

    ```python
    import gymnasium as gym
    import draftrl.envs  # registers the ids (or: gym.make("draftrl.envs:draftrl/..."))
    env = gym.make("draftrl/SpecDecode-v2", config=EnvConfig(drafter="ngram", languages=("en",)))
    env = gym.make("draftrl/SpecDecode-v2", depths=(0, 2, 4), max_new_tokens=32)   # field overrides
    env = SpecDecodeEnv(config, engine=engine, tokenizer=tokenizer)                # a prebuilt engine
    env = gym.make("draftrl/TraceReplay-v1", traces="runs/traces/tiny")             # the recorded config
    env = gym.make("draftrl/TraceReplay-v1", traces="runs/traces/tiny", depths=(0, 2, 4), cost_noise=0.05)
    ```

    ``config`` (:class:`~draftrl.config.env.EnvConfig`, a dict of its fields, or None) plus
    keyword overrides of its fields; ``engine``: ``None`` or ``"live"`` (a ``SpeculativeDecoder``
    built around ``target``, a ``LoadedModel``, or the config's target, loaded once per process
    and shared by every env of that process: vectorise with ``SyncVectorEnv`` / ``DummyVecEnv``,
    models are never pickled into subprocesses), ``"replay"`` (with ``traces``: a directory written
    by ``draftrl collect`` or a :class:`~draftrl.replay.traces.Traces`; ``config`` defaults to the
    recorded one; ``cost_table``: a ``CostTable`` or its JSON, default ``EnvConfig.cost_table``,
    else the ``cost_table.json`` stored with the traces), or a prebuilt
    :class:`~draftrl.decoding.interface.RoundEngine` (a ``SpeculativeDecoder`` with its
    ``tokenizer``, whose sampling matches the config).

    ``env.unwrapped.lookahead_action()`` (replay only; None on the live engine) gives the coming
    round's hindsight-best action (the ``LookAhead`` baseline, the upper bound that training
    summaries report).

    ## Version History

    ``draftrl/SpecDecode-v2`` (live):

    - v2: the observation gains the request's sampling (``temperature``, ``top_k``, ``top_p``) and
      the target's signals from the last verification (``target_top1_prob``, ``target_entropy``,
      ``accepted_mean_p``), entries 25..30 after the unchanged 0..24; each episode draws its sampling
      from ``EnvConfig.temperature_mix`` (issue 45). Reward unchanged. ``SpecDecode-v1`` is no longer
      registered: ``gymnasium.make`` refuses it naming v2, and so do policies trained on it.
    - v1: the first round feeds the prompt with its drafts (as Hugging Face prompt lookup does),
      so its seconds, and hence its reward, include the prompt's forward. The reward formula and
      the spaces are unchanged.
    - v0: initial version; ``reset`` prefilled the prompt, outside every round's seconds.

    ``draftrl/TraceReplay-v1`` (``engine="replay"``):

    - v1: the observation of ``SpecDecode-v2`` (issue 45). For the same seed and actions, rewards,
      flags, ``info`` and observation entries 0..24 equal ``TraceReplay-v0``'s bit for bit
      (``tests/envs/test_replay_ids_fixture.py`` checks them against v0's pinned episodes); the new
      entries are the request's sampling and the unknown target signals (the greedy traces record
      none). Mixes whose classes are all greedy (top-k/top-p aside) replay; sampled ones are refused.
    - v0: initial version (``TraceReplayEnv``). Since issue 42 this class with the replay round
      engine injected; its episodes were bit-identical for the same seed and actions.
    """

    def __init__(self, config: EnvConfig | dict | None = None, *, engine: str | RoundEngine | None = None,
                 traces: str | Path | Traces | None = None, cost_table: CostTable | str | Path | None = None,
                 tokenizer=None, target=None, render_mode: str | None = None, **overrides: Any):
        super().__init__(config, engine=engine, traces=traces, cost_table=cost_table, tokenizer=tokenizer,
                         target=target, render_mode=render_mode, **overrides)
        self.action_space = spaces.MultiDiscrete([len(self.depths), len(self.verify_sizes)])
        self.observation_space = spaces.Box(self.features.low, self.features.high, dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        info = self._start_request(seed, options)
        return self._observation(), info

    def step(self, action) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        if self.request is None or self.engine.finished:
            raise RuntimeError("step() called before reset() or after the episode ended; call reset().")
        action = np.asarray(action)
        if not self.action_space.contains(action.astype(self.action_space.dtype)) or action.shape != (2,):
            raise ValueError(f"action={action!r} is outside {self.action_space}.")
        depth = self.depths[int(action[0])]
        verify_size = self.verify_sizes[int(action[1])]
        levels = min(depth, self.engine.remaining - 1)
        rnd = self.engine.round(depth, verify_size or None, self.config.width)
        reward, info = self._finish_round(rnd, levels, rnd.seconds)
        return self._observation(), float(reward), bool(rnd.finished), False, info
