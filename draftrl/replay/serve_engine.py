"""A continuous-batching serving engine replayed from recordings: ``draftrl/ServeReplay-v1``'s engine.

:class:`ReplayEngine` keeps vLLM's step semantics (what ``VLLMEngine`` does) over
:class:`~draftrl.replay.recordings.Recordings` and their proposals: a waiting queue admitted up
to ``max_num_seqs`` at the start of a step (a request's first step is its prefill, charged per
prompt token, and yields one token), drafts proposed at the end of a step under that step's action
and verified in the next (``action_lag = 1``), drafts also proposed for requests that just
finished (the proposer cannot know), admission through :func:`draftrl.decoding.admission.admit_drafts`
with the proposer's own history and decay, and each request's own depth from the proposer's own
rule objects (:mod:`draftrl.decoding.vllm.control`: ``match``, ``heuristic``), asked every step
with the same :class:`~draftrl.decoding.vllm.control.StepView` counts. Each step costs the seconds of a
:class:`~draftrl.replay.serve_calibrate.StepCostModel` fitted on ``draftrl calibrate --engine vllm``;
a step whose proposer drafts ``L`` head levels for ``h`` requests costs
``StepCostModel.head_seconds(h, L)`` more (calibrated with ``draftrl calibrate --engine vllm
--drafter eagle3``). Numpy only: no model runs, a step takes tens of microseconds.

:func:`single_stream_optimum` and :func:`single_stream_fixed` price a request alone over the same
proposals (the headroom benchmark's ceiling and fixed arms).
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from draftrl.config.serve import SERVING_DRAFTER, ServeConfig
from draftrl.config.workload import SamplingClass
from draftrl.decoding.admission import RequestAcceptance, StepAction, admit_drafts, draft_cap
from draftrl.decoding.interface import EngineStep, QueuedBatch, RequestStep
from draftrl.decoding.vllm.control import HeuristicRule, MatchRule, RuleControl, StepView, rule_controller
from draftrl.decoding.vllm.proposer import ACCEPT_DECAY
from draftrl.decoding.workload import Workload
from draftrl.replay.recordings import LOOKAHEAD, HeadProposals, Proposals, Recordings, parse_replay_drafter
from draftrl.replay.serve_calibrate import StepCostModel

#: Rules of the proposer the replay engine replays (``fill`` pads drafts: calibration only; the head's
#: stop and load parts need the head's confidences), and ``hindsight`` (:class:`HindsightRule`).
RULES = ("match", "heuristic", "hindsight")


class HindsightRule(MatchRule):
    """``hindsight``, the replay's only: each request drafts just the tokens its continuation will
    accept (under the step's cap and budget), the most any per-request depth policy could get from
    this drafter: a ceiling, not a policy (it knows the future)."""

    kind = "hindsight"


def replay_controller(rule: str) -> RuleControl:
    """The rule ``rule`` (``ServeConfig.rule``) as the replay follows it: the vLLM proposer's own
    ``match`` or ``heuristic`` controller, or :class:`HindsightRule`."""
    controller = HindsightRule() if rule == "hindsight" else _replayable(rule)
    check_replayable(controller)
    return controller


def _replayable(rule: str) -> RuleControl:
    try:
        return rule_controller(rule)
    except ValueError:
        raise ValueError(f"rule={rule!r} cannot be replayed; choose one of {', '.join(RULES)}.") from None


def check_replayable(controller: object) -> None:
    """Refuse, in one line, a controller the replay cannot follow (module docstring)."""
    if type(controller) not in (MatchRule, HeuristicRule, HindsightRule) or controller.needs_head:
        name = getattr(controller, "rule", type(controller).__name__)
        raise ValueError(f"rule={name!r} cannot be replayed; choose one of {', '.join(RULES)}.")


def single_stream_optimum(recordings: Recordings, max_new_tokens: int, max_depth: int,
                          sources: list[tuple[Proposals | HeadProposals, StepCostModel]]) -> list[float]:
    """The fewest seconds each recorded request needs alone (concurrency 1) over every per-step
    choice of drafter and depth: a dynamic program over tokens emitted, ``f[t] = min over (source,
    d) of step(d) + f[t + min(accepted, d) + 1]``, plus its prefill. Each ``(proposals, cost)``
    source drafts ``d <= available`` tokens at a step costing ``cost.mean(1, d + 1)`` (and the head's
    ``head_seconds(1, d)`` for :class:`HeadProposals`); ``d = 0`` drafts nothing. A step may take the
    cheapest source's engine, so with sources priced on different engines this is optimistic: the
    ceiling no schedule of those drafters beats, learned or not (the engine also drafts once more
    after a request's last step, which this leaves out)."""
    plain = min(cost.mean(1, 1) for _, cost in sources)
    steps = [(props, [_step_seconds(props, cost, d) for d in range(max_depth + 1)]) for props, cost in sources]
    out = []
    for i, rec in enumerate(recordings.requests):
        length = rec.tokens_for(max_new_tokens)
        f = [0.0] * (length + 1)
        for t in range(length - 1, 0, -1):
            best = plain + f[t + 1]
            for props, seconds in steps:
                for d in range(1, min(props.available[i][t], max_depth) + 1):
                    best = min(best, seconds[d] + f[min(t + min(props.accepted[i][t], d) + 1, length)])
            f[t] = best
        prefill = min(cost.mean(1, 0, len(rec.prompt_ids)) for _, cost in sources)
        out.append(prefill + (f[1] if length > 1 else 0.0))
    return out


def single_stream_fixed(recordings: Recordings, max_new_tokens: int, depth: int,
                        source: tuple[Proposals | HeadProposals, StepCostModel]) -> list[float]:
    """Seconds each recorded request needs alone (concurrency 1) drafting ``min(depth, available)``
    tokens every step from one source: the fixed arm :func:`single_stream_optimum` is compared with,
    per request, so a workload's groups (task, language) each get their own best fixed arm."""
    props, cost = source
    out = []
    for i, rec in enumerate(recordings.requests):
        length, t = rec.tokens_for(max_new_tokens), 1
        seconds = cost.mean(1, 0, len(rec.prompt_ids))
        while t < length:
            d = min(depth, props.available[i][t])
            seconds += _step_seconds(props, cost, d)
            t += min(props.accepted[i][t], d) + 1
        out.append(seconds)
    return out


def _step_seconds(props: Proposals | HeadProposals, cost: StepCostModel, depth: int) -> float:
    """One request's decode step verifying ``depth`` drafts of ``props``' drafter (the head's
    drafting included for :class:`HeadProposals`)."""
    return cost.mean(1, depth + 1, 0, (1, depth) if isinstance(props, HeadProposals) else (0, 0))


def replay_drafter(config: ServeConfig, drafter: str = "ngram") -> str:
    """The drafter :class:`ReplayEngine` replays: ``drafter`` (its names: ``ngram``, ``eagle3``,
    ``sam:N``, the upper bound ``hindsight``), or the one ``config.drafter`` names when it is not the default
    (``eagle3[:DIR]`` -> ``eagle3``, ``sam:N[:DIR]`` -> ``sam:N``; the head's proposals come from
    ``head_proposals``). One line when the two disagree or the spec is another n-gram drafter than
    the one the recordings' proposals are computed with."""
    if config.drafter == SERVING_DRAFTER:
        return drafter
    kind, _, rest = config.drafter.partition(":")
    named = {"eagle3": "eagle3", "sam": f"sam:{rest.partition(':')[0]}"}.get(kind)
    if named is None or drafter not in ("ngram", named):
        raise ValueError(f"{config.section}.drafter={config.drafter!r} cannot be replayed with drafter={drafter!r}: "
                         f"ServeReplay-v1 replays the proposer's n-gram drafter ({SERVING_DRAFTER}) or an EAGLE-3 head "
                         "(eagle3[:DIR], sam:N[:DIR], with head_proposals); set one of those.")
    return named


@dataclass
class _ReplayRequest:
    request_id: str
    index: int
    """recording index"""
    num_prompt_tokens: int
    length: int
    """tokens it will emit"""
    history: RequestAcceptance
    memory: dict = field(default_factory=dict)
    """the controller's scratch space for this request (``StepView.memory``)"""
    generated: int = 0
    will_accept: int = 0
    """how many of the drafts proposed last step the continuation accepts"""
    sampling: tuple[float, int, float] = (0.0, 0, 1.0)
    """its sampling class's (temperature, top_k, top_p); temperature 0 = greedy"""


class ReplayEngine(QueuedBatch):
    """A :class:`~draftrl.decoding.interface.ServingEngine` replaying recordings (module docstring).

    :param recordings: the recorded requests; ``add_request`` finds a request by its prompt ids.
    :param cost: step seconds (:class:`StepCostModel`, fitted on ``draftrl calibrate --engine vllm``).
    :param max_depth: the proposer's largest depth (vLLM's ``num_speculative_tokens``).
    :param max_num_seqs: most requests in one step; more wait.
    :param max_model_len: the engine's context limit (the proposer leaves room below it).
    :param rule: each request's own depth before the cap and budget: ``match``, ``heuristic`` or
        ``hindsight`` (the accepted prefix of its proposal: a ceiling, :class:`HindsightRule`);
        :meth:`set_controller` replaces it.
    :param rng: draws the step-cost noise (``cost.seconds``); None = no noise (until :meth:`restart`).
    :param cost_jitter: lognormal sigma of the per-episode factors on the step cost's coefficients
        that :meth:`restart` draws (0 = none: another machine per episode otherwise).
    :param cost_noise: whether :meth:`restart` turns on the per-step residual noise.
    :param drafter: whose proposals each request drafts (:data:`~draftrl.replay.recordings.REPLAY_DRAFTERS`);
        every kind but
        ``ngram`` needs ``head_proposals`` and a ``cost`` calibrated with the head. ``hindsight`` is an
        upper bound: the drafter whose proposal the continuation accepts more of (with ``rule="hindsight"``
        also just the tokens it accepts).
    """

    action_lag = 1

    def __init__(self, recordings: Recordings, cost: StepCostModel, *, max_depth: int = 8, max_num_seqs: int = 16,
                 max_model_len: int = 1024, rule: str = "match", rng: np.random.Generator | None = None,
                 proposals: Proposals | None = None, drafter: str = "ngram",
                 head_proposals: HeadProposals | None = None, cost_jitter: float = 0.0, cost_noise: bool = True):
        self.controller = replay_controller(rule)
        self.min_match = parse_replay_drafter(drafter)
        if drafter != "ngram" and (head_proposals is None or head_proposals.max_depth < max_depth):
            raise ValueError(f"drafter={drafter!r} replays the head: pass head_proposals (HeadProposals) of depth >= "
                             f"{max_depth}.")
        if drafter != "ngram" and not cost.head:
            raise ValueError(f"drafter={drafter!r} needs the head's step cost; calibrate with draftrl calibrate "
                             "--engine vllm --drafter eagle3 --out FILE.")
        self.drafter, self.head_proposals = drafter, head_proposals
        if cost_jitter < 0:
            raise ValueError(f"cost_jitter={cost_jitter} must be >= 0 (a lognormal sigma).")
        self.recordings, self.cost, self.rng = recordings, cost, rng
        self.cost_model, self.cost_jitter, self.cost_noise = cost, float(cost_jitter), bool(cost_noise)
        self.max_depth, self.max_num_seqs, self.max_model_len = int(max_depth), int(max_num_seqs), int(max_model_len)
        short = min((r.lookahead for r in recordings.requests), default=self.max_depth + 1)
        if short < self.max_depth + 1:
            raise ValueError(f"the recordings hold {short} tokens past a request's limit, fewer than max depth + 1 = "
                             f"{self.max_depth + 1} (a request's last step verifies up to that far); record again "
                             f"with draftrl collect --engine vllm (lookahead {LOOKAHEAD}).")
        self.proposals = proposals if proposals is not None and proposals.max_depth >= self.max_depth \
            else Proposals(recordings, self.max_depth)
        self._by_prompt: dict[tuple[int, ...], dict[tuple[float, int, float], list[int]]] = {}
        """prompt ids -> sampling key -> recording indices of its continuations, by ``sample``"""
        for i, r in sorted(enumerate(recordings.requests), key=lambda e: e[1].sample):
            self._by_prompt.setdefault(tuple(r.prompt_ids), {}).setdefault(r.sampling.key, []).append(i)
        self._start_queue()

    @classmethod
    def for_config(cls, config: ServeConfig, recordings: str | Path | Recordings,
                   calibration: str | Path | dict | StepCostModel, **kwargs: Any) -> ReplayEngine:
        """The replay of ``config``'s serving engine: ``recordings`` (a ``draftrl collect --engine vllm``
        directory or :class:`Recordings`, made with the config's target and chat template) and the step
        cost of ``calibration`` (a ``draftrl calibrate --engine vllm`` JSON, refitted, or a
        :class:`StepCostModel`); ``kwargs`` as the constructor's (``proposals``, ``drafter``,
        ``head_proposals``, ``cost_jitter``, ``cost_noise``). The config's ``drafter`` (a drafter
        spec) names the drafter replayed as ``drafter`` does (:func:`replay_drafter`)."""
        if recordings is None or calibration is None:
            raise ValueError("the serving replay needs recordings= (draftrl collect --engine vllm --out DIR) and "
                             "calibration= (draftrl calibrate --engine vllm --out FILE).")
        if not isinstance(recordings, Recordings):
            recordings = Recordings.load(recordings)
        recordings.check_covers(config.sampling_classes, config.section)
        recorded = recordings.meta.get("config", {})
        for name in ("target", "chat_template"):
            if name in recorded and recorded[name] != getattr(config, name):
                raise ValueError(f"{config.section}.{name}={getattr(config, name)!r} differs from the recordings' "
                                 f"{recorded[name]!r}; record again with --set env.{name}={getattr(config, name)}.")
        cost = calibration if isinstance(calibration, StepCostModel) else StepCostModel.from_calibration(calibration)
        kwargs["drafter"] = replay_drafter(config, kwargs.get("drafter", "ngram"))
        return cls(recordings, cost, max_depth=max(1, config.max_depth), max_num_seqs=config.max_num_seqs,
                   max_model_len=config.max_model_len, rule=config.rule, **kwargs)

    def workload(self, config: ServeConfig) -> Workload:
        """The recorded requests as a workload (tokenised as recorded: no tokenizer needed)."""
        return Workload(config, None, prompts=self.recordings.prompts, prompt_ids=self.recordings.prompt_ids())

    def restart(self, rng: np.random.Generator) -> None:
        """A new episode: this machine's step cost, the calibrated one jittered by ``cost_jitter`` (factors
        drawn from ``rng``, the env's), and the per-step noise from ``rng`` when ``cost_noise``."""
        self.cost = self.cost_model.jittered(self.cost_jitter, rng)
        self.rng = rng if self.cost_noise else None

    def set_controller(self, controller: RuleControl) -> None:
        """As ``DraftrlProposer.set_controller``, for the rules the replay follows (:func:`replay_controller`);
        what the previous one kept per request is forgotten."""
        check_replayable(controller)
        self.controller = controller
        for req in [*self.waiting, *self.running]:
            req.memory.clear()

    # ------------------------------------------------------------------ requests
    def add_request(self, request_id: str, prompt_ids: list[int], max_new_tokens: int, *,
                    temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None) -> None:
        """Queue a recorded request: it follows one recorded continuation of its prompt in its sampling
        class (``temperature``, ``top_k``, ``top_p``), number ``seed % K`` of the class's ``K`` (the first
        when ``seed`` is None), accepting drafts by the one-hot coupling (``draftrl.replay.recordings``)."""
        by_class = self._by_prompt.get(tuple(prompt_ids))
        if by_class is None:
            raise ValueError(f"request {request_id!r}: its prompt is not among the {len(self._by_prompt)} recorded "
                             "ones; record this workload with draftrl collect --engine vllm.")
        sampling = SamplingClass(temperature, top_k, top_p)
        indices = by_class.get(sampling.key)
        if indices is None:
            recorded = ", ".join(sorted(SamplingClass(*k).label for k in by_class))
            raise ValueError(f"request {request_id!r} samples with {sampling.label}, but its prompt was recorded "
                             f"with {recorded} only; record this workload with draftrl collect --engine vllm at "
                             "its temperatures (env.temperature_mix).")
        index = indices[int(seed) % len(indices) if seed is not None else 0]
        rec = self.recordings.requests[index]
        self.waiting.append(_ReplayRequest(request_id, index, len(rec.prompt_ids), rec.tokens_for(max_new_tokens),
                                           RequestAcceptance(), sampling=sampling.key))

    def _start_queue(self) -> None:
        super()._start_queue()
        self._rows: list[_ReplayRequest | None] = []
        """the batch's rows after the last step, None where a request finished"""

    def clone(self) -> ReplayEngine:
        """A copy whose steps leave this engine untouched (recordings and proposals shared, no
        cost noise): what the one-step lookahead explores."""
        other = copy.copy(self)
        copies: dict[int, _ReplayRequest] = {}

        def dup(req: _ReplayRequest | None) -> _ReplayRequest | None:
            if req is None:
                return None
            if id(req) not in copies:
                copies[id(req)] = copy.copy(req)
                copies[id(req)].history = copy.copy(req.history)
                copies[id(req)].memory = dict(req.memory)
            return copies[id(req)]

        other.waiting = deque(map(dup, self.waiting))
        other.running = list(map(dup, self.running))
        other._rows = list(map(dup, self._rows))
        other.rng = None
        return other

    def _place(self, new: list[_ReplayRequest]) -> list[_ReplayRequest]:
        """The rows of this step, as vLLM's persistent batch orders them (its ``InputBatch``):
        new requests fill the lowest rows that finished requests left, else go at the end; then
        the last rows slide down into the remaining holes (``condense``). The order matters:
        the budget breaks ties between equal scores by row."""
        rows = self._rows
        holes = [i for i, r in enumerate(rows) if r is None]
        for req in new:
            if holes:
                rows[holes.pop(0)] = req
            else:
                rows.append(req)
        while holes:
            while rows and rows[-1] is None:
                rows.pop()
            hole = holes.pop(0)
            if hole >= len(rows):
                break
            rows[hole] = rows.pop()
        while rows and rows[-1] is None:
            rows.pop()
        return rows

    def _drafts_with_head(self, index: int, t: int) -> bool:
        """Whether recording ``index``'s request drafts with the head after ``t`` tokens."""
        if self.drafter == "ngram":
            return False
        if self.drafter == "hindsight":
            return self.head_proposals.accepted[index][t] > self.proposals.accepted[index][t]
        return self.min_match is None or self.proposals.match_len[index][t] < self.min_match

    # ------------------------------------------------------------------ the step
    def step(self, action: StepAction | None = None) -> EngineStep:
        """Verify the drafts proposed last step, emit the recorded tokens, then propose under
        ``action`` for the next step (module docstring)."""
        action = action or StepAction(self.max_depth)
        new = []
        while self.waiting and len(self.running) + len(new) < self.max_num_seqs:
            new.append(self.waiting.popleft())
        running = self._place(new)
        props = self.proposals
        cont = self.recordings.requests
        num_tokens = prompt_tokens = 0
        steps, verified = [], []
        emitted, proposed, accepted, lengths, fresh = [], [], [], [], []  # the proposer's view of this step
        for req in running:
            t = req.generated
            fresh.append(t == 0)
            if t == 0:  # prefill: the prompt's forward yields the first token, at the calibrated prefill
                # slope (calibrate --engine vllm times prompts apart from decode tokens; the whole prompt
                # in one step: vLLM's chunking of long prompts over steps is not modelled)
                prompt_tokens += req.num_prompt_tokens
                v, drafted = 1, 0
            else:  # accepted drafts + 1, as the step verified them (past the limit too; the output stops at it)
                drafted = req.history.last_proposed
                num_tokens += drafted + 1
                v = min(min(req.will_accept, drafted) + 1, len(cont[req.index].token_ids) - t)
            gained = min(v, req.length - t)
            req.generated = t + gained
            verified.append((v, t + v))
            steps.append(RequestStep(req.request_id, cont[req.index].token_ids[t: t + gained], drafted,
                                     min(gained - 1, drafted), req.generated >= req.length))
            # the proposer, at the end of the step, for every request that decoded (finished ones too),
            # on every token the step verified
            emitted.append(v)
            proposed.append(req.history.last_proposed)
            accepted.append(req.history.observe(v, ACCEPT_DECAY))
            lengths.append(req.num_prompt_tokens + t + v)
        # its controller decides each request's own depth
        view = StepView(list(range(len(running))), [r.request_id for r in running], fresh, lengths,
                        np.array(emitted, dtype=np.int64), np.array(proposed, dtype=np.int64),
                        np.array(accepted, dtype=np.int64), 0, 0, self.max_depth, [r.memory for r in running],
                        None, np.array([r.sampling for r in running], dtype=np.float64).reshape(len(running), 3))
        controller = self.controller
        controller.action = action
        decision = controller.decide(view)
        action = decision.action
        own_depths = decision.depths if decision.depths is not None else [self.max_depth] * len(running)
        hindsight = isinstance(controller, HindsightRule)
        match, wanted, by_head = [], [], []
        for req, (v, t), own in zip(running, verified, own_depths):
            cap = draft_cap(action.depth, own, self.max_depth, self.max_model_len, req.num_prompt_tokens + t)
            head = self._drafts_with_head(req.index, t)
            source = self.head_proposals if head else props
            match.append(0 if head and self.min_match is None else props.match_len[req.index][t])
            can = source.accepted[req.index][t] if hindsight else source.available[req.index][t]
            wanted.append(min(cap, can))
            req.will_accept = source.accepted[req.index][t]
            by_head.append(head)
        acceptance, admitted = admit_drafts([r.history for r in running], np.array(match, dtype=np.int64),
                                            np.array(wanted, dtype=np.int64), action.budget)
        # the head drafts its requests to their caps before the budget admits (one forward per level)
        head_levels = [w for w, h in zip(wanted, by_head) if h and w > 0]
        seconds = self.cost.seconds(len(running), num_tokens, self.rng, prompt_tokens,
                                    (len(head_levels), max(head_levels, default=0)))
        self._signals = (acceptance, np.array(match, dtype=np.int64))
        self._temperatures = view.sampling[:, 0].copy()
        self._rows = [r if r.generated < r.length else None for r in running]
        self.running = [r for r in self._rows if r is not None]
        return EngineStep(seconds, steps, len(self.running), len(self.waiting), int(admitted.sum()))
