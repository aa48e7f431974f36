"""Serving recordings: what ``draftrl/ServeReplay-v1``'s engine replays, and how they are recorded.

**Recordings** (:func:`record`, :class:`Recordings`): each request's continuations, decoded by a
real serving engine without speculation (``draftrl collect --engine vllm``, through
:func:`record_workload`: vLLM, float32, the engine the replay stands for), one per sampling class
of the workload (``WorkloadConfig.sampling_classes``): the greedy one for a greedy class, and
``K`` sampled ones (``--continuations K``, each with its own seed, :func:`continuation_seed`)
for a class at temperature > 0. At temperature 0 a correct speculative engine emits exactly the
greedy continuation whatever it drafts, so the tokens need no model.

**Why sampled continuations replay exactly** (vLLM's one-hot verification, ``SAMPLING.md``):
vLLM drafts deterministically and accepts a draft token d with probability p(d), else samples
the residual p with d removed; so the emitted token equals d iff d is accepted, and the emitted
sequence follows p step by step whatever was drafted. Coupling the engine's draws with one
continuation y sampled from p without speculation, a draft is accepted iff it equals y's next
token: the same joint law of (tokens, accepted counts) as the engine's, drafts being functions of
the true prefix. The greedy replay's rule (:func:`accepted_prefix`) is therefore the rule at every
temperature; only which continuation a request follows changes (its sampling class, and one of its
``K`` continuations drawn per request).

**Proposals** (:class:`Proposals`): the n-gram drafter is deterministic given the context, so its
proposal from every true prefix ``prompt + continuation[:t]`` is recomputed here with the same
:class:`~draftrl.drafters.ngram.NgramDrafter` (width 1) that the vLLM proposer runs: the matched
n-gram length, how many draft tokens it can propose, and how many of them the continuation
accepts. Acceptance is then exact: ``min(accepted_prefix, admitted) + 1`` tokens per step.

**The head's proposals** (:class:`HeadProposals`): an EAGLE-3 head is deterministic given the
target's hidden states, so its greedy chain from every true prefix is recomputed too, from one
float32 forward of the Hugging Face target over the recorded sequence (the features vLLM's
route (b) hooks capture, float rounding aside). With them the replay engine
(:class:`draftrl.replay.serve_engine.ReplayEngine`) replays the head (``drafter="eagle3"``), SAM's
rule (``sam:N``: n-gram lookup on an N-token match, else the head) and the hindsight drafter
``drafter="hindsight"``, an upper bound (:data:`REPLAY_DRAFTERS`).
"""

from __future__ import annotations

import dataclasses
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from draftrl.config.serve import ServeConfig
from draftrl.config.workload import SamplingClass
from draftrl.decoding.admission import StepAction
from draftrl.decoding.vllm.proposer import serving_drafter
from draftrl.decoding.workload import Workload
from draftrl.drafters.base import Drafter
from draftrl.io import read_json, write_json
from draftrl.models.distribution import SamplingParams
from draftrl.prompts import Prompt

FORMAT = "draftrl-serve-recordings/2"
#: The first format (greedy continuations only, one per request): loads as greedy, one continuation each.
FORMAT_V1 = "draftrl-serve-recordings/1"
#: File of a recordings directory.
RECORDINGS_FILE = "recordings.json"
#: Tokens recorded past each request's limit (see :class:`Recording`).
LOOKAHEAD = 16
#: ``draftrl collect --engine vllm``'s sampled continuations per request and class at temperature > 0.
CONTINUATIONS = 8


@dataclass
class Recording:
    """One continuation of a request decoded without speculation, ``lookahead`` tokens past its limit:
    greedy (``temperature`` 0) or sampled with ``temperature``, ``top_k``, ``top_p`` and ``seed``
    (continuation number ``sample`` of its sampling class).

    Why the lookahead: in the step a request reaches its limit, vLLM's proposer still sees every
    token the step verified, past the limit too (the scheduler truncates the output afterwards),
    and its acceptance estimate then weighs in that step's budget. Past an EOS nothing is
    recorded; the replay counts drafts beyond it as rejected (the one place it may differ
    from vLLM's bookkeeping: a request's last step, when it ends at EOS).
    """

    prompt: Prompt
    prompt_ids: list[int]
    max_new_tokens: int
    """the request's token limit"""
    token_ids: list[int]
    """the continuation, decoded to ``max_new_tokens + lookahead`` tokens or EOS"""
    lookahead: int = 0
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    sample: int = 0
    """which of its class's continuations (0..K-1)"""
    seed: int | None = None
    """the seed vLLM sampled it with (None: greedy)"""

    @property
    def sampling(self) -> SamplingClass:
        """Its sampling class (weight aside)."""
        return SamplingClass(self.temperature, self.top_k, self.top_p)

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
        """The recorded prompts, each once (in recording order)."""
        seen: dict[str, Prompt] = {}
        for r in self.requests:
            seen.setdefault(r.prompt.id, r.prompt)
        return list(seen.values())

    def sampling_keys(self) -> set[tuple[float, int, float]]:
        """The ``SamplingClass.key`` of every class recorded."""
        return {r.sampling.key for r in self.requests}

    def check_covers(self, classes: tuple[SamplingClass, ...], where: str = "env") -> None:
        """Refuse, naming the fix, a workload whose sampling classes were not all recorded."""
        missing = [c.label for c in classes if c.key not in self.sampling_keys()]
        if missing:
            recorded = ", ".join(sorted(SamplingClass(*k).label for k in self.sampling_keys()))
            raise ValueError(f"the recordings hold {recorded} continuations, not {', '.join(missing)}; record this "
                             f"workload with draftrl collect --engine vllm (the same {where}.temperature_mix or "
                             f"{where}.temperature) --continuations K.")

    def prompt_ids(self) -> dict[str, list[int]]:
        """Prompt id -> its recorded prompt token ids (the workload needs no tokenizer)."""
        return {r.prompt.id: r.prompt_ids for r in self.requests}

    def save(self, out: str | Path) -> Path:
        path = Path(out) / RECORDINGS_FILE
        write_json(path, {"format": FORMAT, "meta": self.meta, "requests": [
            {"prompt": r.prompt.__dict__, "prompt_ids": r.prompt_ids, "max_new_tokens": r.max_new_tokens,
             "token_ids": r.token_ids, "lookahead": r.lookahead, "temperature": r.temperature, "top_k": r.top_k,
             "top_p": r.top_p, "sample": r.sample, "seed": r.seed} for r in self.requests]})
        return path

    @classmethod
    def load(cls, path: str | Path) -> Recordings:
        """A recordings directory (or its ``recordings.json``) from :func:`record`."""
        path = Path(path)
        if path.is_dir():
            path = path / RECORDINGS_FILE
        if not path.is_file():
            raise ValueError(f"no recordings at {path}; record them with draftrl collect --engine vllm --out DIR.")
        data = read_json(path, "recordings")
        fmt = data.get("format")
        if fmt not in (FORMAT, FORMAT_V1):
            raise ValueError(f"{path} is not a serving recording (format {fmt!r}, expected {FORMAT!r}).")
        meta = dict(data.get("meta", {}))
        if fmt == FORMAT_V1:
            # the first format decoded every request greedily, whatever its meta's config said
            meta["format_loaded"] = FORMAT_V1
            meta["sampling"] = [{"temperature": 0.0, "top_k": 0, "top_p": 1.0, "continuations": 1}]
        sampling = ("temperature", "top_k", "top_p", "sample", "seed")
        return cls([Recording(Prompt(**r["prompt"]), [int(t) for t in r["prompt_ids"]], int(r["max_new_tokens"]),
                              [int(t) for t in r["token_ids"]], int(r["lookahead"]),
                              **{k: r[k] for k in sampling if k in r and fmt == FORMAT})
                    for r in data["requests"]], meta)


def continuation_seed(seed: int | None, prompt_id: str, sampling: SamplingClass, sample: int) -> int:
    """The vLLM seed of continuation ``sample`` of ``prompt_id`` in class ``sampling``: a function of
    the config's ``seed`` (None reads as 0), the prompt, the class and the continuation number only,
    so a recording is reproducible and one request's seeds do not move when others are added."""
    words = [int(seed or 0), zlib.crc32(prompt_id.encode()), zlib.crc32(sampling.label.encode()), int(sample)]
    return int(np.random.SeedSequence(words).generate_state(1)[0] & 0x7FFFFFFF)


def record(engine, requests: list[tuple[Prompt, list[int], int]], *, lookahead: int = LOOKAHEAD,
           meta: dict[str, Any] | None = None, progress=None,
           sampling: tuple[SamplingClass, ...] = (SamplingClass(),), continuations: int = 1,
           seed: int | None = None) -> Recordings:
    """Decode ``(prompt, prompt_ids, max_new_tokens)`` requests without speculation on ``engine``
    (any :class:`~draftrl.decoding.interface.ServingEngine`; every step's action is depth 0, budget
    0), all queued at once, each to ``max_new_tokens + lookahead`` tokens: once per greedy class of
    ``sampling`` and ``continuations`` times (seeds from :func:`continuation_seed` of ``seed``) per
    class at temperature > 0."""
    if continuations < 1:
        raise ValueError(f"continuations={continuations} must be >= 1 (sampled continuations per request and class).")
    if engine.has_unfinished_requests():
        engine.abort_all()
    tokens: dict[str, list[int]] = {}
    entries: list[tuple[str, Prompt, list[int], int, SamplingClass, int, int | None]] = []
    for i, (prompt, ids, max_new_tokens) in enumerate(requests):
        for c in sampling:
            for k in range(1 if c.greedy else continuations):
                rid = f"rec{i}/{c.label}/{k}"
                s = None if c.greedy else continuation_seed(seed, prompt.id, c, k)
                engine.add_request(rid, list(ids), int(max_new_tokens) + lookahead, temperature=c.temperature,
                                   top_k=c.top_k, top_p=c.top_p, seed=s)
                tokens[rid] = []
                entries.append((rid, prompt, list(ids), int(max_new_tokens), c, k, s))
    t0 = time.perf_counter()
    num_steps = 0
    while engine.has_unfinished_requests():
        for r in engine.step(StepAction(0, 0)).requests:
            tokens[r.request_id].extend(int(t) for t in r.token_ids)
        num_steps += 1
        if progress is not None and num_steps % 32 == 0:
            progress(f"{num_steps} steps, {sum(map(len, tokens.values()))} tokens")
    meta = {**(meta or {}), "record_seconds": time.perf_counter() - t0, "record_steps": num_steps,
            "sampling": [{"temperature": c.temperature, "top_k": c.top_k, "top_p": c.top_p,
                          "continuations": 1 if c.greedy else continuations} for c in sampling]}
    return Recordings([Recording(p, ids, m, tokens[rid], lookahead, c.temperature, c.top_k, c.top_p, k, s)
                       for rid, p, ids, m, c, k, s in entries], meta)


def accepted_prefix(draft: list[int], continuation: list[int], t: int) -> int:
    """How many leading tokens of ``draft``, proposed after ``t`` tokens, the recorded
    ``continuation`` accepts: each must equal the next recorded token (greedy, and sampled under
    vLLM's one-hot verification: the module docstring)."""
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
    replay engine reads single entries, which lists do faster than numpy.
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


#: drafters the engine replays: the n-gram proposer's, an EAGLE-3 head's, SAM's mix (``sam:N``),
#: and ``hindsight`` (an upper bound: per request and step, the drafter whose proposal is accepted further)
REPLAY_DRAFTERS = ("ngram", "eagle3", "sam:N", "hindsight")
#: earlier spellings, refused naming their replacement
RENAMED_DRAFTERS = {"best": "hindsight"}


def parse_replay_drafter(spec: str) -> int | None:
    """SAM's shortest lookup match for ``sam:N``, 0 for ``ngram``, None for the head-only kinds
    (``eagle3``, ``hindsight``); a one-line error for anything else."""
    if spec in RENAMED_DRAFTERS:
        raise ValueError(f"drafter={spec!r} is renamed: write drafter={RENAMED_DRAFTERS[spec]!r} (the replay's upper "
                         "bound that knows every continuation).")
    if spec == "ngram":
        return 0
    if spec in ("eagle3", "hindsight"):
        return None
    kind, _, n = spec.partition(":")
    if kind == "sam" and n.isdigit() and int(n) >= 1:
        return int(n)
    raise ValueError(f"drafter={spec!r} cannot be replayed; choose one of {', '.join(REPLAY_DRAFTERS)} (e.g. sam:2).")


def record_workload(config: ServeConfig, engine=None, tokenizer=None, progress=None,
                    continuations: int = 1, indices: list[int] | None = None) -> Recordings:
    """Record every request of a :class:`~draftrl.config.serve.ServeConfig`'s workload, in every
    sampling class of it (``continuations`` sampled continuations per request in each class at
    temperature > 0, seeded from ``config.seed``).

    Default engine: vLLM without speculation in ``config.dtype`` (float32 by default: there vLLM
    with draftrl's proposer is token-identical to it, so the recording is what ``ServeVLLM-v1``
    emits under every policy; a Hugging Face greedy decode may break float ties differently).

    :param indices: the workload's requests to record, by index (None: all, in order); a shard of
        :func:`draftrl.replay.ray_record.record_on_ray`. A request's seeds depend on its prompt, class
        and continuation number only (:func:`continuation_seed`), not on which others share its engine.
    """
    if engine is None:
        from draftrl.decoding.vllm.engine import VLLMEngineConfig, shared_engine

        engine = shared_engine(VLLMEngineConfig.serving(config, method="none"))
    if tokenizer is None:
        from transformers import AutoTokenizer

        from draftrl.decoding.vllm.engine import model_path

        tokenizer = AutoTokenizer.from_pretrained(model_path(config.target))
    workload = Workload(config, tokenizer)
    chosen = range(len(workload)) if indices is None else indices
    requests = [(r.prompt, r.prompt_ids, r.max_new_tokens) for r in map(workload.request, chosen)]
    describe = engine.describe() if hasattr(engine, "describe") else {"engine": type(engine).__name__}
    return record(engine, requests, meta={"config": dataclasses.asdict(config), "engine": describe}, progress=progress,
                  sampling=config.sampling_classes, continuations=continuations, seed=config.seed)


def merge_recordings(shards: list[tuple[list[int], Recordings]], count: int) -> Recordings:
    """One :class:`Recordings` from shards of one workload (``(request indices, their recordings)``, as
    :func:`record_workload` with ``indices`` returns them): requests in workload order, each exactly
    once, meta of the first shard (its ``record_seconds`` / ``record_steps``: the shards' longest and
    summed). A request missing, recorded twice or outside ``0..count-1``, or shards of different
    configs or sampling, is refused in one line."""
    groups: dict[int, list[Recording]] = {}
    twice: list[int] = []
    for indices, recs in shards:
        if len(recs.requests) % max(1, len(indices)) or (recs.requests and not indices):
            raise RuntimeError(f"a shard of {len(indices)} request(s) holds {len(recs.requests)} recordings, not a "
                               "whole number per request; record it again.")
        size = len(recs.requests) // max(1, len(indices))
        for n, index in enumerate(indices):
            if index in groups:
                twice.append(index)
            groups[index] = recs.requests[n * size:(n + 1) * size]
    missing = [i for i in range(count) if i not in groups]
    outside = sorted(i for i in groups if not 0 <= i < count)
    if twice or missing or outside:
        problems = [f"{what} {', '.join(map(str, found[:8]))}" for what, found in
                    (("recorded twice:", sorted(set(twice))), ("missing:", missing), ("outside the workload:", outside))
                    if found]
        raise RuntimeError(f"the shards do not hold each of the {count} requests exactly once ({'; '.join(problems)}); "
                           "nothing was saved.")
    metas = [recs.meta for _, recs in shards if recs.requests]
    if any((m["config"], m["sampling"]) != (metas[0]["config"], metas[0]["sampling"]) for m in metas):
        raise RuntimeError("the shards were recorded with different configs or sampling classes; nothing was saved.")
    meta = {**metas[0], "record_seconds": max(m["record_seconds"] for m in metas),
            "record_steps": sum(m["record_steps"] for m in metas)} if metas else {}
    return Recordings([r for i in range(count) for r in groups[i]], meta)
