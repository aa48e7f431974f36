"""A continuous-batching serving engine replayed from recordings: ``draftrl/ServeReplay-v0``'s engine.

**Recordings** (:func:`record`, :class:`Recordings`): each request's greedy continuation, decoded
by a real serving engine without speculation (``draftrl collect --engine vllm``, through
:func:`draftrl.envs.serve_replay.record_workload`: vLLM, float32, the engine the simulator stands for). At temperature 0 a correct speculative engine emits
exactly that continuation whatever it drafts, so the tokens need no model.

**Proposals** (:class:`Proposals`): the n-gram drafter is deterministic given the context, so its
proposal from every true prefix ``prompt + continuation[:t]`` is recomputed here with the same
:class:`~draftrl.drafters.ngram.NgramDrafter` (width 1) that the vLLM proposer runs: the matched
n-gram length, how many draft tokens it can propose, and how many of them the continuation
accepts. Acceptance is then exact: ``min(accepted_prefix, admitted) + 1`` tokens per step.

**The head's proposals** (:class:`HeadProposals`): an EAGLE-3 head is deterministic given the
target's hidden states, so its greedy chain from every true prefix is recomputed too, from one
float32 forward of the Hugging Face target over the recorded sequence (the features vLLM's
route (b) hooks capture, float rounding aside). With them the engine replays the head
(``drafter="eagle3"``), SAM's rule (``sam:N``: n-gram lookup on an N-token match, else the head)
and the oracle ``drafter="best"``: every request drafts with whichever drafter accepts more (under
``rule="hindsight"`` just the tokens it accepts). A step whose proposer drafts ``L`` head levels for ``h``
requests costs ``StepCostModel.head_seconds(h, L)`` more (calibrated with ``draftrl calibrate
--engine vllm --drafter eagle3``).

**The engine** (:class:`ReplayEngine`) keeps vLLM's step semantics (what ``VLLMEngine`` does):
a waiting queue admitted up to ``max_num_seqs`` at the start of a step (a request's first step is
its prefill, charged per prompt token, and yields one token), drafts proposed at the end of a step under that step's action
and verified in the next (``action_lag = 1``), drafts also proposed for requests that just
finished (the proposer cannot know), admission through :func:`draftrl.decoding.admission.admit_drafts`
with the proposer's own history, decay and rules. Each step costs the seconds of a
:class:`~draftrl.decoding.vllm.calibrate.StepCostModel` fitted on ``draftrl calibrate --engine vllm``.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from draftrl.decoding.admission import RequestAcceptance, StepAction, admit_drafts, draft_cap
from draftrl.decoding.interface import EngineStep, QueuedBatch, RequestStep
from draftrl.decoding.vllm.calibrate import StepCostModel
from draftrl.decoding.vllm.proposer import ACCEPT_DECAY, serving_drafter
from draftrl.drafters.base import Drafter
from draftrl.io import read_json, write_json
from draftrl.models.distribution import SamplingParams
from draftrl.prompts import Prompt

FORMAT = "draftrl-serve-recordings/1"
#: File of a recordings directory.
RECORDINGS_FILE = "recordings.json"
#: Rules of the proposer the simulator replays (``fill`` pads drafts: calibration only). ``hindsight``
#: exists only here: each request drafts just the tokens its continuation will accept (under the
#: step's cap and budget), the most any per-request depth policy could get from this drafter.
RULES = ("match", "heuristic", "hindsight")
#: Tokens recorded past each request's limit (see :class:`Recording`).
LOOKAHEAD = 16


@dataclass
class Recording:
    """One request decoded greedily without speculation, ``lookahead`` tokens past its limit.

    Why the lookahead: in the step a request reaches its limit, vLLM's proposer still sees every
    token the step verified, past the limit too (the scheduler truncates the output afterwards),
    and its acceptance estimate then weighs in that step's budget. Past an EOS nothing is
    recorded; the simulator counts drafts beyond it as rejected (the one place it may differ
    from vLLM's bookkeeping: a request's last step, when it ends at EOS).
    """

    prompt: Prompt
    prompt_ids: list[int]
    max_new_tokens: int
    """the request's token limit"""
    token_ids: list[int]
    """the continuation, decoded to ``max_new_tokens + lookahead`` tokens or EOS"""
    lookahead: int = 0

    def tokens_for(self, max_new_tokens: int) -> int:
        """How many tokens a request with ``max_new_tokens`` emits (an error past the recording)."""
        if max_new_tokens > self.max_new_tokens:
            raise ValueError(f"prompt {self.prompt.id!r} was recorded for max_new_tokens={self.max_new_tokens}, "
                             f"not {max_new_tokens}; record again with a larger max_new_tokens_cap.")
        return min(max_new_tokens, len(self.token_ids))


@dataclass
class Recordings:
    """Every recorded request plus what they were decoded with (``meta``: engine, config)."""

    requests: list[Recording]
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def prompts(self) -> list[Prompt]:
        return [r.prompt for r in self.requests]

    def prompt_ids(self) -> dict[str, list[int]]:
        """Prompt id -> its recorded prompt token ids (the workload needs no tokenizer)."""
        return {r.prompt.id: r.prompt_ids for r in self.requests}

    def save(self, out: str | Path) -> Path:
        path = Path(out) / RECORDINGS_FILE
        write_json(path, {"format": FORMAT, "meta": self.meta, "requests": [
            {"prompt": r.prompt.__dict__, "prompt_ids": r.prompt_ids, "max_new_tokens": r.max_new_tokens,
             "token_ids": r.token_ids, "lookahead": r.lookahead} for r in self.requests]})
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Recordings":
        """A recordings directory (or its ``recordings.json``) from :func:`record`."""
        path = Path(path)
        if path.is_dir():
            path = path / RECORDINGS_FILE
        if not path.is_file():
            raise ValueError(f"no recordings at {path}; record them with draftrl collect --engine vllm --out DIR.")
        data = read_json(path, "recordings")
        if data.get("format") != FORMAT:
            raise ValueError(f"{path} is not a serving recording (format {data.get('format')!r}, expected {FORMAT!r}).")
        return cls([Recording(Prompt(**r["prompt"]), [int(t) for t in r["prompt_ids"]], int(r["max_new_tokens"]),
                              [int(t) for t in r["token_ids"]], int(r["lookahead"])) for r in data["requests"]],
                   data.get("meta", {}))


def record(engine, requests: list[tuple[Prompt, list[int], int]], *, lookahead: int = LOOKAHEAD,
           meta: dict[str, Any] | None = None, progress=None) -> Recordings:
    """Decode ``(prompt, prompt_ids, max_new_tokens)`` requests greedily without speculation on
    ``engine`` (any :class:`~draftrl.decoding.interface.ServingEngine`; every step's action is
    depth 0, budget 0), all queued at once, each to ``max_new_tokens + lookahead`` tokens."""
    if engine.has_unfinished_requests():
        engine.abort_all()
    tokens: dict[str, list[int]] = {}
    for i, (prompt, ids, max_new_tokens) in enumerate(requests):
        engine.add_request(f"rec{i}", list(ids), int(max_new_tokens) + lookahead, temperature=0.0)
        tokens[f"rec{i}"] = []
    t0 = time.perf_counter()
    num_steps = 0
    while engine.has_unfinished_requests():
        for r in engine.step(StepAction(0, 0)).requests:
            tokens[r.request_id].extend(int(t) for t in r.token_ids)
        num_steps += 1
        if progress is not None and num_steps % 32 == 0:
            progress(f"{num_steps} steps, {sum(map(len, tokens.values()))} tokens")
    meta = {**(meta or {}), "record_seconds": time.perf_counter() - t0, "record_steps": num_steps}
    return Recordings([Recording(p, list(ids), int(m), tokens[f"rec{i}"], lookahead)
                       for i, (p, ids, m) in enumerate(requests)], meta)


def accepted_prefix(draft: list[int], continuation: list[int], t: int) -> int:
    """How many leading tokens of ``draft``, proposed after ``t`` tokens, the recorded
    ``continuation`` accepts (greedy: each must equal the next recorded token)."""
    a = 0
    while a < len(draft) and t + a < len(continuation) and draft[a] == continuation[t + a]:
        a += 1
    return a


class Proposals:
    """The drafter's proposal at every true prefix of every recording, and what it accepts.

    For recording ``i`` and ``t`` tokens generated (``1 <= t <= len(continuation)``), context
    ``prompt + continuation[:t]``: ``match_len[i][t]`` (the matched n-gram, 0 = none),
    ``available[i][t]`` (draft tokens the drafter can propose, at most ``max_depth``) and
    ``accepted[i][t]`` (how many leading ones equal ``continuation[t:]``). Python lists: the
    simulator reads single entries, which lists do faster than numpy.
    """

    def __init__(self, recordings: Recordings, max_depth: int, drafter: Drafter | None = None):
        drafter = drafter or serving_drafter()
        self.max_depth = int(max_depth)
        self.match_len: list[list[int]] = []
        self.available: list[list[int]] = []
        self.accepted: list[list[int]] = []
        for rec in recordings.requests:
            ids = list(rec.prompt_ids) + list(rec.token_ids)
            cont, m = rec.token_ids, len(rec.prompt_ids)
            match, avail, acc = [0], [0], [0]
            for t in range(1, len(cont) + 1):
                tree = drafter.propose(ids[: m + t], self.max_depth, 1, SamplingParams(), None)  # greedy, as vLLM
                match.append(int(tree.features.get("ngram_match_len", 0)))
                avail.append(len(tree.tokens))
                acc.append(accepted_prefix(tree.tokens, cont, t))
            self.match_len.append(match)
            self.available.append(avail)
            self.accepted.append(acc)


class HeadProposals:
    """An EAGLE-3 head's greedy chain at every true prefix of every recording (module docstring).

    Same layout as :class:`Proposals`: ``available[i][t]`` (drafts, at most ``max_depth``),
    ``accepted[i][t]`` (how many leading ones the continuation accepts) and ``scores[i][t]`` (the
    chain's cumulative log probabilities under the head, one per draft).

    :param drafter: an :class:`~draftrl.drafters.eagle3.Eagle3Drafter` hooked on ``target`` (the
        Hugging Face model that ``draftrl.drafters.registry.build_drafter("eagle3", ...)`` loads).
    """

    def __init__(self, recordings: Recordings, max_depth: int, drafter: Drafter, target: Any,
                 progress: Callable[[str], None] | None = None):
        import torch

        if not drafter.reads_target_rows:
            raise ValueError(f"drafter {drafter.name!r} reads no target rows; HeadProposals replays an EAGLE-3 head.")
        self.max_depth = int(max_depth)
        self.available: list[list[int]] = []
        self.accepted: list[list[int]] = []
        self.scores: list[list[list[float]]] = []
        device = next(target.parameters()).device
        for n, rec in enumerate(recordings.requests):
            ids = list(rec.prompt_ids) + list(rec.token_ids)
            cont, m = rec.token_ids, len(rec.prompt_ids)
            drafter.reset(ids)
            with torch.inference_mode():
                target(torch.tensor([ids], device=device))
            drafter.keep_target_rows(list(range(len(ids))))
            avail, acc, scores = [0], [0], [[]]
            for t in range(1, len(cont) + 1):
                prefix = ids[: m + t]
                tree = drafter.propose(prefix, self.max_depth, 1, SamplingParams(), None)
                drafter.commit(prefix, [])
                avail.append(len(tree.tokens))
                acc.append(accepted_prefix(tree.tokens, cont, t))
                scores.append([float(x) for x in tree.scores])
            self.available.append(avail)
            self.accepted.append(acc)
            self.scores.append(scores)
            if progress is not None:
                progress(f"head proposals: {n + 1}/{len(recordings)} recordings")


def head_proposals(recordings: Recordings, max_depth: int, target: str, head: str | None = None,
                   progress: Callable[[str], None] | None = None) -> HeadProposals:
    """:class:`HeadProposals` of the head at ``head`` (None: the one draftrl ships for ``target``)
    on the Hugging Face ``target`` (a known name or a folder), float32 on the CPU as recorded."""
    from draftrl.drafters.registry import build_drafter
    from draftrl.models.loading import load_model

    loaded = load_model(target)
    drafter = build_drafter(f"eagle3:{head}" if head else "eagle3", loaded)
    try:
        return HeadProposals(recordings, max_depth, drafter, loaded.model, progress)
    finally:
        drafter.close()


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


#: drafters the engine replays: the n-gram proposer's, an EAGLE-3 head's, SAM's mix (``sam:N``),
#: and ``best`` (an oracle: per request and step, the drafter whose proposal is accepted further)
REPLAY_DRAFTERS = ("ngram", "eagle3", "sam:N", "best")


def parse_replay_drafter(spec: str) -> int | None:
    """SAM's shortest lookup match for ``sam:N``, 0 for ``ngram``, None for the head-only kinds
    (``eagle3``, ``best``); a one-line error for anything else."""
    if spec == "ngram":
        return 0
    if spec in ("eagle3", "best"):
        return None
    kind, _, n = spec.partition(":")
    if kind == "sam" and n.isdigit() and int(n) >= 1:
        return int(n)
    raise ValueError(f"drafter={spec!r} cannot be replayed; choose one of {', '.join(REPLAY_DRAFTERS)} (e.g. sam:2).")


@dataclass
class _SimRequest:
    request_id: str
    index: int
    """recording index"""
    num_prompt_tokens: int
    length: int
    """tokens it will emit"""
    history: RequestAcceptance
    generated: int = 0
    will_accept: int = 0
    """how many of the drafts proposed last step the continuation accepts"""


class ReplayEngine(QueuedBatch):
    """A :class:`~draftrl.decoding.interface.ServingEngine` replaying recordings (module docstring).

    :param recordings: the recorded requests; ``add_request`` finds a request by its prompt ids.
    :param cost: step seconds (:class:`StepCostModel`, fitted on ``draftrl calibrate --engine vllm``).
    :param max_depth: the proposer's largest depth (vLLM's ``num_speculative_tokens``).
    :param max_num_seqs: most requests in one step; more wait.
    :param max_model_len: the engine's context limit (the proposer leaves room below it).
    :param rule: each request's own depth before the cap and budget: ``match``, ``heuristic`` or
        ``hindsight`` (the accepted prefix of its proposal: a ceiling, see ``RULES``).
    :param rng: draws the step-cost noise (``cost.seconds``); None = no noise.
    :param drafter: whose proposals each request drafts (:data:`REPLAY_DRAFTERS`); every kind but
        ``ngram`` needs ``head_proposals`` and a ``cost`` calibrated with the head. ``best`` is an
        oracle: the drafter whose proposal the continuation accepts more of (with ``rule="hindsight"``
        also just the tokens it accepts).
    """

    action_lag = 1

    def __init__(self, recordings: Recordings, cost: StepCostModel, *, max_depth: int = 8, max_num_seqs: int = 16,
                 max_model_len: int = 1024, rule: str = "match", rng: np.random.Generator | None = None,
                 proposals: Proposals | None = None, drafter: str = "ngram",
                 head_proposals: HeadProposals | None = None):
        if rule not in RULES:
            raise ValueError(f"rule={rule!r} cannot be replayed; choose one of {', '.join(RULES)}.")
        self.min_match = parse_replay_drafter(drafter)
        if drafter != "ngram" and (head_proposals is None or head_proposals.max_depth < max_depth):
            raise ValueError(f"drafter={drafter!r} replays the head: pass head_proposals (HeadProposals) of depth >= "
                             f"{max_depth}.")
        if drafter != "ngram" and not cost.head:
            raise ValueError(f"drafter={drafter!r} needs the head's step cost; calibrate with draftrl calibrate "
                             "--engine vllm --drafter eagle3 --out FILE.")
        self.drafter, self.head_proposals = drafter, head_proposals
        self.recordings, self.cost, self.rng = recordings, cost, rng
        self.max_depth, self.max_num_seqs, self.max_model_len = int(max_depth), int(max_num_seqs), int(max_model_len)
        self.rule = rule
        self.initial_depth = float(self.max_depth)
        short = min((r.lookahead for r in recordings.requests), default=self.max_depth + 1)
        if short < self.max_depth + 1:
            raise ValueError(f"the recordings hold {short} tokens past a request's limit, fewer than max depth + 1 = "
                             f"{self.max_depth + 1} (a request's last step verifies up to that far); record again "
                             f"with draftrl collect --engine vllm (lookahead {LOOKAHEAD}).")
        self.proposals = proposals if proposals is not None and proposals.max_depth >= self.max_depth \
            else Proposals(recordings, self.max_depth)
        self._by_prompt = {tuple(r.prompt_ids): i for i, r in enumerate(recordings.requests)}
        self._start_queue()

    def set_rule(self, rule: str, initial_depth: float | None = None) -> None:
        """As ``DraftrlProposer.set_rule`` (``fill`` is for calibration and is not replayed)."""
        if rule not in RULES:
            raise ValueError(f"rule={rule!r} cannot be replayed; choose one of {', '.join(RULES)}.")
        self.rule = rule
        self.initial_depth = float(initial_depth if initial_depth is not None else self.max_depth)

    # ------------------------------------------------------------------ requests
    def add_request(self, request_id: str, prompt_ids: list[int], max_new_tokens: int, *,
                    temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None) -> None:
        """Queue a recorded request (greedy only: sampling has no single continuation to replay)."""
        if temperature != 0:
            raise ValueError(f"temperature={temperature}: the serving simulator replays greedy recordings; use 0.")
        index = self._by_prompt.get(tuple(prompt_ids))
        if index is None:
            raise ValueError(f"request {request_id!r}: its prompt is not among the {len(self.recordings)} recorded "
                             "ones; record this workload with draftrl collect --engine vllm.")
        rec = self.recordings.requests[index]
        self.waiting.append(_SimRequest(request_id, index, len(rec.prompt_ids), rec.tokens_for(max_new_tokens),
                                        RequestAcceptance(heuristic_depth=self.initial_depth)))

    def _start_queue(self) -> None:
        super()._start_queue()
        self._rows: list[_SimRequest | None] = []
        """the batch's rows after the last step, None where a request finished"""

    def clone(self) -> "ReplayEngine":
        """A copy whose steps leave this engine untouched (recordings and proposals shared, no
        cost noise): what the one-step look-ahead explores."""
        other = copy.copy(self)
        copies: dict[int, _SimRequest] = {}

        def dup(req: _SimRequest | None) -> _SimRequest | None:
            if req is None:
                return None
            if id(req) not in copies:
                copies[id(req)] = copy.copy(req)
                copies[id(req)].history = copy.copy(req.history)
            return copies[id(req)]

        other.waiting = deque(map(dup, self.waiting))
        other.running = list(map(dup, self.running))
        other._rows = list(map(dup, self._rows))
        other.rng = None
        return other

    def _place(self, new: list[_SimRequest]) -> list[_SimRequest]:
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
        if self.drafter == "best":
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
        for req in running:
            t = req.generated
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
        heuristic = self.rule == "heuristic"
        match, wanted, by_head = [], [], []
        for req, (v, t) in zip(running, verified):
            req.history.observe(v, ACCEPT_DECAY, heuristic)
            own = req.history.heuristic_depth if heuristic else self.max_depth
            cap = draft_cap(action.depth, own, self.max_depth, self.max_model_len, req.num_prompt_tokens + t)
            head = self._drafts_with_head(req.index, t)
            source = self.head_proposals if head else props
            match.append(0 if head and self.min_match is None else props.match_len[req.index][t])
            can = source.accepted[req.index][t] if self.rule == "hindsight" else source.available[req.index][t]
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
        self._rows = [r if r.generated < r.length else None for r in running]
        self.running = [r for r in self._rows if r is not None]
        return EngineStep(seconds, steps, len(self.running), len(self.waiting), int(admitted.sum()))
