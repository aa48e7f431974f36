"""The two engine interfaces the envs, evaluation and export drive: one request a round at a time
(:class:`RoundEngine`), a batch a step at a time (:class:`ServingEngine`). Each has a live
implementation here in ``decoding`` and a replayed one in ``draftrl.replay``; an env drives either.

A *round engine* decodes one request; each **round** drafts a tree, verifies it in one target
forward and emits the accepted tokens plus one (:class:`~draftrl.decoding.engine.RoundResult`):
:class:`draftrl.decoding.engine.SpeculativeDecoder` (live) and
:class:`draftrl.replay.round_engine.TraceRoundEngine` (greedy traces, a cost table's seconds).

A *serving engine* holds a batch of requests and advances all of them by one **engine step**
at a time; the step's action is a :class:`~draftrl.decoding.admission.StepAction` (a draft depth
cap and a verification budget for the whole batch). Two implementations:

- :class:`draftrl.decoding.batch.HFBatchEngine`: the exact Hugging Face reference
  (:class:`~draftrl.decoding.engine.SpeculativeDecoder`, one round per running request per step,
  requests run one after the other); the action applies to the step it is given to
  (``action_lag = 0``).
- :class:`draftrl.decoding.vllm.engine.VLLMEngine`: vLLM in-process with draftrl's proposer;
  vLLM drafts at the end of a step for the next one, so the action given to step ``t`` is
  verified in step ``t + 1`` (``action_lag = 1``).

- :class:`draftrl.replay.serve_engine.ReplayEngine`: recordings replayed with vLLM's step
  semantics and a calibrated step cost (``action_lag = 1``).

Terms as in :mod:`draftrl.decoding.engine`: a request gains ``num_accepted + 1`` tokens in a
step in which it decodes (fewer only at EOS or its token limit).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from draftrl.decoding.admission import StepAction

if TYPE_CHECKING:
    from draftrl.decoding.engine import EngineConfig, RoundResult
    from draftrl.drafters.base import TreeBuilder
    from draftrl.drafters.tree import DraftTree
    from draftrl.models.distribution import SamplingParams


@dataclass
class RequestStep:
    """One request's part of an engine step."""

    request_id: str
    token_ids: list[int]
    """tokens the request gained in this step (the first step of a request: its first token)"""
    num_verified: int
    """draft tokens verified for this request in this step"""
    num_accepted: int
    """of which accepted"""
    finished: bool
    draft_ids: list[int] = field(default_factory=list)
    """the draft tokens verified for this request in this step, when the engine knows them"""
    logprobs: list[dict[int, float]] | None = None
    """per gained token ``{token id: raw logprob}`` of the most likely tokens and the gained one, when
    the engine returned them (vLLM at temperature > 0: :mod:`draftrl.decoding.vllm.logprobs`)"""


@dataclass
class EngineStep:
    """What one engine step did. ``seconds`` is wall clock around the engine's step call."""

    seconds: float
    requests: list[RequestStep]
    num_running: int
    """requests in the batch after the step"""
    num_waiting: int
    """requests queued (not yet admitted) after the step"""
    num_proposed: int
    """draft tokens the step proposed under its action (verified in step t + action_lag)"""
    cpu_seconds: float | None = None
    """the calling thread's CPU seconds over the step, where the engine measures it (vLLM in-process:
    with one thread, other processes' load stops this clock, not the wall clock); None otherwise"""

    # cached: read several times per step by the env (features, reward, info); ``requests`` is not changed
    @cached_property
    def num_emitted(self) -> int:
        return sum(len(r.token_ids) for r in self.requests)

    @cached_property
    def num_verified(self) -> int:
        return sum(r.num_verified for r in self.requests)

    @cached_property
    def num_accepted(self) -> int:
        return sum(r.num_accepted for r in self.requests)


@runtime_checkable
class RoundEngine(Protocol):
    """One request decoded a round at a time: what ``SpecDecodeEnv`` and ``SpecDecodeDepthEnv`` use.

    Optional members: ``lookahead(depths, verify_sizes, value) -> [i, j]`` (the coming round's best
    grid indices by ``value(tokens, seconds)``, for an engine that knows the continuation: the envs'
    ``lookahead_action``) and ``workload(config)`` (the requests an engine that replays recordings
    can play: the env's workload then).
    """

    config: EngineConfig
    """``max_new_tokens`` (the env sets it per request), ``max_depth``, ``max_verify_size``"""
    samples: bool
    """whether a request takes a sampling seed and its output is the exactness monitor's to test"""
    finished: bool
    """the request is done (EOS or ``max_new_tokens``)"""

    @property
    def drafts_levels(self) -> bool:
        """Whether :meth:`begin_levels` can grow a tree a level at a time."""

    @property
    def ids(self) -> list[int]:
        """Prompt and emitted tokens."""

    @property
    def output_ids(self) -> list[int]:
        """Emitted tokens."""

    @property
    def remaining(self) -> int:
        """Tokens the request may still emit."""

    def check(self, config: Any) -> None:
        """Refuse an ``EnvConfig`` this engine cannot play (one line naming the fix)."""

    def start(self, prompt_ids: list[int], seed: int | None = None, prefill: bool = False,
              rng: np.random.Generator | None = None, sampling: SamplingParams | None = None) -> float:
        """Begin a request (``seed``: the sampler's; ``rng``: the env's, for an engine that draws per-episode
        noise; ``sampling``: the request's, from the workload's temperature mix, None = the engine config's);
        returns the seconds it took."""

    @property
    def sampling(self) -> SamplingParams:
        """The current request's sampling."""

    def features(self) -> dict[str, float]:
        """The drafter's signals before the coming round (never target output)."""

    def round(self, depth: int, verify_size: int | None = None, width: int = 1) -> RoundResult:
        """Draft up to ``depth`` levels, verify ``verify_size`` nodes (None = all), emit what is accepted."""

    def begin_levels(self, width: int) -> TreeBuilder:
        """The coming round's tree, one level per ``step()``; each step's seconds in ``step_seconds``."""

    def round_from_tree(self, tree: DraftTree, verify_size: int | None = None, *, draft_seconds: float = 0.0,
                        depth: int | None = None, width: int = 1) -> RoundResult:
        """Verify a tree grown by :meth:`begin_levels` (``draft_seconds``: its levels' seconds)."""


#: ``value(tokens, seconds)`` of a round, which ``RoundEngine.lookahead`` maximises.
RoundValue = Callable[[int, float], float]


@runtime_checkable
class ServingEngine(Protocol):
    """A batch of requests advanced one engine step at a time under a batch action."""

    action_lag: int
    """engine steps between an action and the verification of the drafts it admitted"""
    max_depth: int
    """largest depth cap a step may ask for"""
    max_num_seqs: int
    """most requests decoded together"""

    def add_request(self, request_id: str, prompt_ids: list[int], max_new_tokens: int, *,
                    temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None) -> None:
        """Queue a request; it joins the batch at a later step when there is room."""

    def step(self, action: StepAction) -> EngineStep:
        """Advance every running request by one step under ``action``."""

    def has_unfinished_requests(self) -> bool:
        """Whether any request is queued or running."""

    def request_counts(self) -> tuple[int, int]:
        """(running, waiting) requests now."""

    def request_signals(self) -> tuple[np.ndarray, np.ndarray]:
        """``([A] acceptance estimates, [A] n-gram match lengths)`` of the running requests after
        the last step (both empty when the engine does not draft)."""

    def abort_all(self) -> None:
        """Drop every queued and running request (an episode ended early)."""

    # Optional members: ``request_temperatures()`` (``[A]`` temperatures of ``request_signals``' requests,
    # 0 = greedy, or None: the serving observation then reads them as greedy), ``restart(rng)`` (an engine that
    # draws per-episode noise draws it from the env's
    # ``rng`` when an episode starts: the replay) and ``clone()`` (a copy whose steps leave the engine
    # untouched: the env's ``lookahead_action`` explores on it).


class QueuedBatch:
    """Request bookkeeping of an engine that keeps its own queue (the Hugging Face batch engine,
    the serving replay): ``waiting`` requests join ``running`` at a step when there is room;
    ``_signals`` holds the last step's ``request_signals()``, ``_temperatures`` their requests' temperatures."""

    def _start_queue(self) -> None:
        self.waiting: deque = deque()
        self.running: list = []
        self._signals = (np.zeros(0), np.zeros(0, dtype=np.int64))
        self._temperatures = np.zeros(0)

    def request_temperatures(self) -> np.ndarray:
        """``[A]`` temperatures (0 = greedy) of :meth:`request_signals`' requests."""
        return self._temperatures

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def request_counts(self) -> tuple[int, int]:
        return len(self.running), len(self.waiting)

    def request_signals(self) -> tuple[np.ndarray, np.ndarray]:
        return self._signals

    def abort_all(self) -> None:
        self._start_queue()
