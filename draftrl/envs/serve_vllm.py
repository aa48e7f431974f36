"""``draftrl/ServeVLLM-v1`` and ``draftrl/ServeReplay-v1``: a serving engine under load as a Gymnasium env,
one engine step per step, over a live engine (vLLM by default) or its replay
(:class:`~draftrl.replay.serve_engine.ReplayEngine`, ``kwargs={"engine": "replay"}``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from draftrl.config import resolve
from draftrl.config.serve import ServeConfig
from draftrl.config.workload import SamplingClass
from draftrl.decoding.admission import StepAction
from draftrl.decoding.workload import Workload
from draftrl.signals.rewards import RewardModel

# the observation table (OBSERVATION, FEATURE_NAMES) lives with the code that builds it, which the
# exported vLLM proposer shares; importers keep reading the names from here
from draftrl.signals.serving import FEATURE_NAMES, OBSERVATION, ServingFeatures, StepCounts  # noqa: F401

if TYPE_CHECKING:
    from draftrl.decoding.interface import ServingEngine
    from draftrl.replay.recordings import HeadProposals, Proposals, Recordings
    from draftrl.replay.serve_calibrate import StepCostModel

#: The engines the env builds itself: ``live`` (vLLM in-process with draftrl's proposer; also
#: ``engine=None``) and ``replay`` (``ReplayEngine`` over ``recordings`` and ``calibration``).
ENGINES = ("live", "replay")
#: ServeConfig fields a per-episode load (``loads``) may set.
LOAD_KEYS = ("arrival", "concurrency", "rate", "burst_size", "burst_interval")


@dataclass
class RequestTimeline:
    """One request of an episode: when it arrived and when each of its tokens came out
    (seconds of engine time since the episode started)."""

    request_id: str
    prompt_id: str
    language: str
    task: str
    num_prompt_tokens: int
    max_new_tokens: int
    arrival: float
    admitted: float | None = None
    token_times: list[float] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    finished: bool = False
    sampling: SamplingClass | None = None
    """the sampling class it drew from the workload's mix (drawn at reset)"""
    seed: int | None = None
    """its sampling seed (temperature > 0)"""

    @property
    def sampling_label(self) -> str:
        """Its sampling class's label (``T0``, ``T0.7``, ...; ``-`` when none was drawn)."""
        return self.sampling.label if self.sampling is not None else "-"

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.arrival if self.token_times else None

    def inter_token_latencies(self) -> np.ndarray:
        """Seconds between successive tokens; tokens of one step share its time, spread evenly."""
        times = np.asarray(self.token_times)
        if times.size < 2:
            return np.zeros(0)
        return np.diff(times)


class ServeVLLMEnv(gym.Env[np.ndarray, np.ndarray]):
    """
    ## Description

    A serving engine (vLLM in-process by default, with draftrl's proposer drafting with
    ``drafter``, n-gram lookup by default, as its ``custom_class`` proposer) decoding a
    workload of requests that arrive over time. One env
    step is one engine step over the whole running batch. ``draftrl/ServeReplay-v1``
    (``engine="replay"``) replaces the engine by its replay,
    :class:`~draftrl.replay.serve_engine.ReplayEngine`: the recorded continuations of the
    workload's requests (``draftrl collect --engine vllm``: greedy, and ``K`` sampled ones per
    request in every sampled class of the mix), the drafter's proposal recomputed at every true
    prefix (acceptance exact in law at every temperature: vLLM verifies a deterministic draft
    one-hot, so a draft is accepted iff it equals the continuation's token), vLLM's step semantics (prefill step,
    one-step action lag, ``max_num_seqs``, admission by survival score) and step seconds from the
    cost model fitted on ``draftrl calibrate --engine vllm``. No model runs in the replay: a step
    takes tens of microseconds, and a policy moves between the two unchanged. The agent chooses, every step, a
    depth cap (the most draft tokens any request may propose) and a verification budget (the
    most draft tokens the whole batch may verify); the proposer admits the batch's best draft
    positions by their survival estimate (``draftrl.decoding.admission``). vLLM verifies
    exactly, so the policy changes only the speed.

    **One-step lag**: vLLM drafts at the end of a step for the next, so the action given to
    step ``t`` shapes the drafts verified in step ``t + 1`` (``env.unwrapped.action_lag``; 0 for
    the Hugging Face batch engine). ``proposed_per_seq``, ``last_depth`` and ``last_budget``
    show the action already in flight.

    ## Action Space

    ``MultiDiscrete([len(depths), len(budgets)])``: ``action[0]`` indexes
    ``env.unwrapped.depths`` (default ``(0, 1, 2, 3, 4, 6, 8)``; 0 = no speculation) and
    ``action[1]`` indexes ``env.unwrapped.budgets`` (default ``(0, 2, 4, 8, 16, 32, 64, 128)``
    draft tokens per step for the whole batch; 0 = no speculation; a budget of at least
    depth x running requests does not bind).

    ## Observation Space

    ``Box(float32, shape=(23,))``, names in ``env.unwrapped.feature_names``
    (``draftrl.envs.serve_vllm.FEATURE_NAMES``). "Last step" is the engine step that just ran.

    | Num | Observation             | Min | Max  | Meaning |
    |-----|-------------------------|-----|------|---------|
    | 0   | `running`               | 0   | 1    | requests in the batch / max_num_seqs |
    | 1   | `waiting`               | 0   | 64   | requests queued in the engine / max_num_seqs |
    | 2   | `tokens_in_flight`      | 0   | 1    | prompt + generated tokens of in-flight requests / |
    |     |                         |     |      | (max_num_seqs x max_model_len) |
    | 3   | `step_seconds`          | 0   | 10   | wall seconds of the last step |
    | 4   | `step_seconds_ema`      | 0   | 10   | EMA of step seconds (decay ``ema_decay``) |
    | 5   | `seconds_per_seq_ema`   | 0   | 10   | EMA of step seconds / requests that decoded in it |
    | 6   | `tokens_per_seq`        | 0   | 65   | tokens gained per decoding request in the last step |
    |     |                         |     |      | (1 = no accepted draft) |
    | 7   | `drafted_per_seq`       | 0   | 64   | draft tokens verified per decoding request in the last step |
    | 8   | `accept_rate_step`      | 0   | 1    | accepted / verified drafts in the last step (0.5 when none) |
    | 9   | `accept_mean`           | 0   | 1    | mean of the running requests' per-position acceptance estimates |
    | 10  | `accept_min`            | 0   | 1    | their minimum |
    | 11  | `accept_max`            | 0   | 1    | their maximum |
    | 12-15 | `match_0..match_3`    | 0   | 1    | share of running requests whose suffix n-gram match has |
    |     |                         |     |      | length 0, 1, 2, 3+ |
    | 16  | `proposed_per_seq`      | 0   | 64   | drafts the last action proposed (verified next step) per |
    |     |                         |     |      | running request |
    | 17  | `last_depth`            | 0   | 1    | the last action's depth / max depth |
    | 18  | `last_budget`           | 0   | 1    | the last action's budget / max budget |
    | 19  | `tokens_per_second_ema` | 0   | 1e5  | EMA of tokens / seconds per step |
    | 20  | `greedy_share`          | 0   | 1    | share of the requests drafted for at temperature 0 |
    | 21  | `temperature_mean`      | 0   | 2    | their mean temperature |
    | 22  | `temperature_max`       | 0   | 2    | their largest temperature |

    Per-request signals (9-15, 20-22) come from the engine's proposer after the last step, over the
    requests it drafted for (zeros under an engine that does not draft); 20-22 from each request's
    own sampling parameters (vLLM's batch; the replay: the request's class), read as greedy by an
    engine that does not report them.

    ## Sampling

    Every arriving request draws its sampling class from ``temperature_mix`` (e.g. ``{0: 0.3, 0.7:
    0.4, 1.0: 0.3}``; without it, every request samples with ``temperature``, ``top_k``, ``top_p``),
    and a seed at temperature > 0 (``RequestTimeline.sampling``, ``seed``), all drawn at reset. The
    replay follows continuation ``seed % K`` of its prompt in that class; a class the recordings lack
    is refused naming the fix.

    ## Rewards

    Wall clock, NOT reproducible run to run. With ``tokens`` the tokens all requests gained in
    the step and ``seconds`` its wall time: ``reward="ratio"`` (default) pays
    ``tokens - rho * seconds`` (``rho`` a running tokens/s estimate, frozen within an episode);
    ``reward="throughput"`` pays ``tokens / seconds`` (``draftrl.signals.rewards``).

    In the replay ``seconds`` (reward, clock, TTFT, ITL) are the cost model's:
    ``(base + per_seq * B) * j1 + (per_token * tokens + per_prefill_token * prompt_tokens) * j2
    + residual_std * z``, with ``B`` the sequences in the step, ``tokens`` the tokens its forward
    verifies (drafts + 1 of decoding requests), ``prompt_tokens`` the prompts of the requests it
    prefills (calibrated apart: a prompt token costs far less than a decode token), ``j1, j2``
    mean-one lognormal factors of sigma ``cost_jitter`` drawn per episode, ``z ~ N(0, 1)`` per step
    when ``cost_noise`` (floored at a tenth of the mean). Deterministic given the seed.

    ## Starting State

    ``reset`` aborts anything left in the engine, draws the episode's request order (seeded) and
    arrival times (``arrival``: ``fixed`` keeps ``concurrency`` requests in flight, ``poisson``
    draws exponential gaps at ``rate`` requests per second of engine time, ``burst`` releases
    ``burst_size`` requests every ``burst_interval`` seconds) and admits the requests that have
    arrived at time 0. Idle time before the next arrival is skipped (and not rewarded). With
    ``loads`` each episode first draws its load (the arrival process and its parameters).

    ## Episode End

    - Termination: every request of the episode has finished (EOS or its ``max_new_tokens``).
    - Truncation: ``max_episode_steps=8192`` engine steps in ``register(...)``.

    ## Information

    ``num_emitted`` (tokens all requests gained in the step), ``seconds``, ``cpu_seconds`` (the
    engine's thread CPU seconds, None in the replay), ``num_verified`` (drafts verified in the
    step), ``num_accepted``, ``num_proposed`` (drafts proposed for the next step), ``running``,
    ``waiting``, ``depth``, ``budget``, ``clock`` (engine seconds since reset), ``finished``
    (request ids finished in the step); at the end ``requests`` (:class:`RequestTimeline` list:
    arrival, token times and ids per request, for TTFT and inter-token latency). ``reset`` returns
    ``num_requests``, ``arrivals`` and the episode's ``load``.

    ## Arguments

    ```python
    env = gym.make("draftrl/ServeVLLM-v1", arrival="poisson", rate=8.0, split="heldout")
    env = ServeVLLMEnv(ServeConfig(concurrency=16), engine=my_engine, tokenizer=tok)   # any ServingEngine
    env = gym.make("draftrl/ServeReplay-v1", recordings="runs/serve/rec", calibration="runs/serve/cal.json",
                   arrival="poisson", rate=8.0, cost_jitter=0.1)
    ```

    ``config`` (:class:`~draftrl.config.serve.ServeConfig`, a dict or None) plus keyword
    overrides; ``engine``: ``None`` or ``"live"`` (vLLM with draftrl's proposer drafting with
    ``config.drafter``, one per process and config), ``"replay"``, or any
    :class:`~draftrl.decoding.interface.ServingEngine`; ``tokenizer`` (default: the target's); ``loads`` (a list
    of dicts of arrival fields, e.g.
    ``[{"concurrency": 1}, {"arrival": "poisson", "rate": 8.0}]``: each episode draws one, so a
    policy trains across loads; default: the config's).

    The replay's (``engine="replay"``): ``recordings`` (a directory from ``draftrl collect --engine
    vllm`` or :class:`~draftrl.replay.recordings.Recordings`: the recorded prompts are the
    workload), ``calibration`` (a ``draftrl calibrate --engine vllm`` JSON, refitted on load, or a
    ``StepCostModel``), ``cost_jitter`` (default 0), ``cost_noise`` (default True), ``proposals``
    (precomputed n-gram proposals to share between envs). The recordings must hold every sampling class of
    the workload; ``rule``
    ``match``, ``heuristic`` or ``hindsight`` (replay only: each request drafts just what it will
    accept, the ceiling of per-request depth control; ``benchmarks/serve_headroom.py``).
    ``drafter`` (default ``ngram``) and ``head_proposals`` replay an EAGLE-3 head too (``eagle3``,
    ``sam:N``, ``hindsight``: :class:`~draftrl.replay.serve_engine.ReplayEngine`), with the
    calibration's head cells as its cost; the config's ``drafter`` (a drafter spec) names the same
    (:func:`~draftrl.replay.serve_engine.replay_drafter`).

    ``env.unwrapped.lookahead_action()`` (replay only; None on an engine that cannot be cloned): the
    greedy one-step lookahead (the ``LookAhead`` baseline).

    ## Version History

    ``draftrl/ServeVLLM-v1``:

    - v1: the observation sees the batch's sampling (20 -> 23 entries: ``greedy_share``,
      ``temperature_mean``, ``temperature_max``); requests draw their sampling from ``temperature_mix``
      (issue 46). ``v0`` is refused naming v1.
    - v0: initial version.

    ``draftrl/ServeReplay-v1`` (``engine="replay"``):

    - v1: as ``ServeVLLM-v1``; replays sampled continuations too (recordings format 2). A greedy
      episode's first 20 entries, rewards and ``info`` are v0's bit for bit
      (``tests/envs/test_replay_ids_fixture.py``).
    - v0: initial version (``ServeReplayEnv``). Since issue 42 this class with the replay engine
      injected; its episodes are bit-identical for the same seed and actions, so the version stood.
    """

    metadata = {"render_modes": []}
    #: an episode is a whole workload, not one prompt (``evaluate_policy`` then does not pick prompts)
    one_request_per_episode = False

    def __init__(self, config: ServeConfig | dict | None = None, *, engine: str | ServingEngine | None = None,
                 tokenizer=None, loads: list[dict[str, Any]] | None = None,
                 recordings: str | Path | Recordings | None = None,
                 calibration: str | Path | dict | StepCostModel | None = None, cost_jitter: float = 0.0,
                 cost_noise: bool = True, proposals: Proposals | None = None, drafter: str = "ngram",
                 head_proposals: HeadProposals | None = None, render_mode: str | None = None, **overrides: Any):
        config = resolve(ServeConfig, config, overrides)
        if render_mode is not None:
            raise ValueError(f"render_mode={render_mode!r} is not supported; the serving env does not render.")
        unknown = {k for load in loads or () for k in load} - set(LOAD_KEYS)
        if unknown:
            raise ValueError(f"loads may set only {', '.join(LOAD_KEYS)}, not {', '.join(sorted(unknown))}.")
        self.loads = [dataclasses.replace(config, **load) for load in loads or ()]
        if isinstance(engine, str) and engine not in ENGINES:
            raise ValueError(f"engine={engine!r} is unknown; use one of {', '.join(ENGINES)} or pass a ServingEngine.")
        if engine == "replay":
            from draftrl.replay.serve_engine import ReplayEngine

            engine = ReplayEngine.for_config(config, recordings, calibration, cost_jitter=cost_jitter,
                                             cost_noise=cost_noise, proposals=proposals, drafter=drafter,
                                             head_proposals=head_proposals)
        elif recordings is not None or calibration is not None:
            raise ValueError("recordings= and calibration= are the replay's; pass engine='replay' "
                             "(draftrl/ServeReplay-v1) or drop them.")
        elif engine is None or engine == "live":
            from draftrl.decoding.vllm.engine import VLLMEngineConfig, shared_engine

            engine = shared_engine(VLLMEngineConfig.serving(config, method="draftrl", drafter=config.drafter,
                                                            num_speculative_tokens=max(1, config.max_depth)))
        replayed = hasattr(engine, "workload")  # an engine that replays recordings brings their requests
        if tokenizer is None and not replayed:
            from transformers import AutoTokenizer

            from draftrl.decoding.vllm.engine import model_path

            tokenizer = AutoTokenizer.from_pretrained(model_path(config.target))
        self.tokenizer = tokenizer
        self.config = config
        self.engine = engine
        self.workload = engine.workload(config) if replayed else Workload(config, tokenizer)
        self.depths, self.budgets = config.depths, config.budgets
        self.feature_names = FEATURE_NAMES
        self.action_lag = int(engine.action_lag)
        if getattr(engine, "proposer", None) is not None:  # vLLM's proposer decides by the config's rule
            from draftrl.decoding.vllm.control import rule_controller

            engine.proposer.set_controller(rule_controller(config.rule))
        self.action_space = spaces.MultiDiscrete([len(self.depths), len(self.budgets)])
        self.features = ServingFeatures.from_config(config)
        self.observation_space = spaces.Box(self.features.low, self.features.high, dtype=np.float32)
        self.rewards = RewardModel(config.reward, config.rho, config.rho_rate)
        self.requests: list[RequestTimeline] = []
        self._seeded = False
        self._done = True
        if not hasattr(engine, "clone"):  # the lookahead explores on copies of the engine
            self.lookahead_action = None

    # ------------------------------------------------------------------ episode
    def _arrivals(self, n: int) -> np.ndarray:
        """Arrival times of ``n`` requests; with ``loads``, first draw this episode's load."""
        if self.loads:
            self.config = self.loads[int(self.np_random.integers(len(self.loads)))]
        c = self.config
        if c.arrival == "poisson":
            return np.cumsum(self.np_random.exponential(1.0 / c.rate, n)) - 0.0
        if c.arrival == "burst":
            return (np.arange(n) // c.burst_size) * c.burst_interval
        return np.zeros(n)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        if seed is None and not self._seeded and self.config.seed is not None:
            seed = self.config.seed
        super().reset(seed=seed)
        if seed is not None or not self._seeded:
            self._seeded = True
            self.rewards.restart()
        self.rewards.start_episode()
        self.engine.abort_all()  # and a cold prefix cache: every episode pays its prefills
        options = options or {}
        unknown = set(options) - {"prompt_ids"}
        if unknown:
            raise ValueError(f"reset options {sorted(unknown)} are unknown; use prompt_ids (a list of prompt ids).")
        if "prompt_ids" in options:
            indices = [self.workload.index_of(pid) for pid in options["prompt_ids"]]
        else:
            n = self.config.num_requests or len(self.workload)
            self.workload.restart(self.np_random)
            indices = [self.workload.next_index(self.np_random) for _ in range(n)]
        arrivals = self._arrivals(len(indices))
        self.requests = []
        self._pending: list[tuple[RequestTimeline, list[int]]] = []
        for i, (index, arrival) in enumerate(zip(indices, arrivals)):
            req = self.workload.request(index)
            timeline = RequestTimeline(f"{i}:{req.prompt.id}", req.prompt.id, req.prompt.language, req.prompt.task,
                                       len(req.prompt_ids), req.max_new_tokens, float(arrival))
            # its sampling, drawn here (not at admission: the replay's step noise shares the RNG, so every
            # policy's request i gets the same class and seed); a single greedy class draws nothing
            timeline.sampling = self.config.draw_sampling(self.np_random)
            if timeline.sampling.temperature > 0:
                timeline.seed = int(self.np_random.integers(2**31))
            self.requests.append(timeline)
            self._pending.append((timeline, req.prompt_ids))
        self._by_id = {r.request_id: r for r in self.requests}
        self.clock = 0.0
        self.idle_seconds = 0.0
        self._in_flight = 0
        self._in_flight_tokens = 0
        self.features.restart()
        self._done = False
        self._admit()
        restart = getattr(self.engine, "restart", None)  # a replay draws this episode's machine
        if restart is not None:
            restart(self.np_random)
        load = {k: getattr(self.config, k) for k in LOAD_KEYS}
        return self._observation(), {"num_requests": len(self.requests), "arrivals": arrivals.tolist(), "load": load}

    def _admit(self) -> None:
        """Hand the engine every request that has arrived (fixed: up to ``concurrency`` in flight);
        with nothing in flight, skip the idle time to the next arrival."""
        c = self.config
        while self._pending:
            timeline, ids = self._pending[0]
            if c.arrival == "fixed":
                if self._in_flight >= c.concurrency:
                    break
                timeline.arrival = self.clock
            elif timeline.arrival > self.clock:
                if self._in_flight == 0:
                    self.idle_seconds += timeline.arrival - self.clock
                    self.clock = timeline.arrival
                else:
                    break
            self._pending.pop(0)
            sampling = timeline.sampling
            self.engine.add_request(timeline.request_id, ids, timeline.max_new_tokens,
                                    temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                                    seed=timeline.seed)
            timeline.admitted = self.clock
            self._in_flight += 1
            self._in_flight_tokens += timeline.num_prompt_tokens

    def step(self, action) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        if self._done:
            raise RuntimeError("step() called before reset() or after the episode ended; call reset().")
        depth, budget = self._decode_action(action)
        result = self.engine.step(StepAction(depth, budget))
        self.clock += result.seconds
        finished = []
        for r in result.requests:
            timeline = self._by_id.get(r.request_id)
            if timeline is None:
                continue
            timeline.token_ids.extend(r.token_ids)
            timeline.token_times.extend([self.clock] * len(r.token_ids))
            self._in_flight_tokens += len(r.token_ids)
            if r.finished:
                timeline.finished = True
                self._in_flight -= 1
                self._in_flight_tokens -= timeline.num_prompt_tokens + len(timeline.token_ids)
                finished.append(r.request_id)
        self.features.record(StepCounts.of(result), (depth, budget))
        self._admit()
        reward = self.rewards(result.num_emitted, result.seconds)
        self._done = not self._pending and self._in_flight == 0
        info = {"num_emitted": result.num_emitted, "seconds": result.seconds,
                "cpu_seconds": result.cpu_seconds,
                "num_verified": result.num_verified,
                "num_accepted": result.num_accepted, "num_proposed": result.num_proposed,
                "running": result.num_running, "waiting": result.num_waiting, "decoding": len(result.requests),
                "depth": depth, "budget": budget,
                "clock": self.clock, "finished": finished, "request_steps": result.requests}
        if self._done:
            info["requests"] = self.requests
            info["idle_seconds"] = self.idle_seconds
        return self._observation(), float(reward), self._done, False, info

    def lookahead_action(self) -> np.ndarray:
        """The greedy one-step lookahead: the action whose drafts (verified in the next step, the
        one-step lag) give the most ``tokens - rho * seconds`` over this step and the next, each
        action tried on a copy of the engine with the noise-free step cost; ties go to the
        shallowest, smallest-budget action. ``rho`` is the reward's running tokens/s."""
        rho = self.rewards.rho or 0.0
        best, best_score = np.array([0, 0]), -np.inf
        for i, depth in enumerate(self.depths):
            for j, budget in enumerate(self.budgets):
                if (depth == 0 or budget == 0) and (i, j) != (0, 0):
                    continue  # every no-speculation action is (0, 0)
                engine, score = self.engine.clone(), 0.0
                for _ in range(2):
                    if not engine.has_unfinished_requests():
                        break
                    result = engine.step(StepAction(depth, budget))
                    score += result.num_emitted - rho * result.seconds
                if score > best_score + 1e-12:
                    best, best_score = np.array([i, j]), score
        return best

    def _decode_action(self, action) -> tuple[int, int]:
        """(depth, budget) of a ``MultiDiscrete`` action; a ValueError naming it when outside the space."""
        try:
            i, j = action
            ok = i == int(i) and j == int(j) and 0 <= i < len(self.depths) and 0 <= j < len(self.budgets)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(f"action={action!r} is outside {self.action_space}.")
        return self.depths[int(i)], self.budgets[int(j)]

    # ------------------------------------------------------------------ features
    def _observation(self) -> np.ndarray:
        """:class:`~draftrl.signals.serving.ServingFeatures` over the last step, the requests in flight
        (prompt + generated tokens of admitted, unfinished requests) and the proposer's signals."""
        temperatures = getattr(self.engine, "request_temperatures", None)
        return self.features.observation(self._in_flight_tokens, *self.engine.request_signals(),
                                         temperatures() if temperatures is not None else None)
