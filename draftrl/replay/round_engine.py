"""A round engine replayed from traces: what ``draftrl/TraceReplay-v1`` plays, without models.

:class:`TraceRoundEngine` is a :class:`~draftrl.decoding.interface.RoundEngine`, so the round envs
(``SpecDecodeEnv``, ``SpecDecodeDepthEnv``) drive it as they drive the live
:class:`~draftrl.decoding.engine.SpeculativeDecoder`. A round's tree is the first ``depth`` levels
of the tree recorded at the current position (:mod:`draftrl.replay.traces`), the target verifies
its ``verify_size`` best nodes (``DraftTree.select``'s rule), and the accepted length is found by
walking that subtree along a recorded continuation: for the same actions the tokens of every round
equal the live engine's at temperature 0, and at temperature > 0 (with top-k/top-p) the rounds have
the live engine's law (deterministic drafts, ``draft_sampling=False``; the proof is in
``docs/design.md``, "Sampled traces replay exactly in law"). A request picks its sampling class
(``start(sampling=...)``, default the config's one class) and one of that class's K recorded
continuations: ``seed % K``, else drawn from the env's ``rng`` (nothing is drawn when K = 1, so
greedy replays keep their random streams), else the first. Seconds come from a cost table
(``draft.base + levels * level(width)``, ``verify(1 + num_verified, context)``,
``sample(tokens)``), each times a mean-one lognormal factor of sigma ``EnvConfig.cost_noise``
drawn from the env's RNG; ``EnvConfig.cost_jitter`` draws one factor per episode on the verify
cost's growth and on draft seconds (another machine). A step takes microseconds.

Level by level (:meth:`TraceRoundEngine.begin_levels`), :class:`ReplayTreeBuilder` replays the
recorded tree one level per ``step()`` with the cost table's seconds per level, and
``round_from_tree`` charges the per-round draft base when the round is verified.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from draftrl.config.env import EnvConfig
from draftrl.decoding.engine import EngineConfig, RoundResult
from draftrl.decoding.interface import RoundValue
from draftrl.decoding.stats import TokenStats
from draftrl.decoding.workload import Workload
from draftrl.drafters.base import TreeBuilder
from draftrl.drafters.tree import DraftTree
from draftrl.models.distribution import SamplingParams
from draftrl.replay.traces import Traces, stored_cost_table
from draftrl.signals.costs import CostTable
from draftrl.signals.features import DRAFT_FEATURES, tree_level_features

#: The most draft nodes a replayed round may verify: any, the recorded tree bounds it.
NO_VERIFY_LIMIT = 1 << 30


def open_traces(traces: str | Path | Traces) -> tuple[Traces, Path | None]:
    """``(traces, their directory)`` of a trace directory written by ``draftrl collect``, or of a ``Traces``
    (no directory: no stored cost table)."""
    if isinstance(traces, Traces):
        return traces, None
    if traces is None:
        raise ValueError("the replay engine replays traces: pass traces=DIR (a directory written by draftrl collect).")
    return Traces.load(traces), Path(traces)


def replay_cost_table(table: CostTable | str | Path | None, config: EnvConfig, trace_dir: Path | None) -> CostTable:
    """The seconds a replay charges: ``table`` (a ``CostTable`` or its JSON), else ``EnvConfig.cost_table``,
    else the ``cost_table.json`` stored with the traces."""
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
        "the replay needs a cost table for its seconds: run draftrl calibrate --json --out costs.json and pass "
        "cost_table='costs.json' (or set EnvConfig.cost_table, or collect with --cost-table)."
    )


def _collect_sampling(sampling) -> str:
    """The ``draftrl collect`` overrides that record ``sampling`` (a ``SamplingClass`` or ``SamplingParams``)."""
    fix = f"--set env.temperature={sampling.temperature:g}"
    if sampling.top_k:
        fix += f" --set env.top_k={sampling.top_k}"
    if sampling.top_p < 1:
        fix += f" --set env.top_p={sampling.top_p:g}"
    return fix


def check_replayable(config: EnvConfig, traces: Traces) -> None:
    """Refuse a config the traces cannot answer for (each error names the fix)."""
    recorded = traces.meta.get("config", {})
    held = ", ".join(c.label for c in traces.classes)
    for sampling in config.sampling_classes:
        if traces.class_index(sampling) is None:
            raise ValueError(
                f"EnvConfig asks for sampling {sampling.label} but the traces hold {held}; record it with draftrl "
                f"collect {_collect_sampling(sampling)} (a mix: env.temperature_mix with every class)."
            )
    if config.draft_sampling and any(not c.greedy for c in config.sampling_classes):
        raise ValueError("EnvConfig.draft_sampling=True draws drafts from q: exact, but not replayable from recorded "
                         "continuations; train on the live env (draftrl/SpecDecode-v2) or set draft_sampling=false.")
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
    if config.max_depth > 0 and config.drafter == "none":
        raise ValueError(f"EnvConfig.depths={list(config.depths)} need a drafter but drafter='none'; "
                         "use depths: [0] or traces of a drafter.")


class ReplayTreeBuilder(TreeBuilder):
    """The recorded tree at the engine's position, one level per :meth:`step`, each level charged
    the cost table's level seconds (``step_seconds``); no level past the recorded ones."""

    def __init__(self, engine: TraceRoundEngine, width: int):
        self.engine, self.width = engine, width
        self.levels = 0
        self.step_seconds = 0.0
        self._lo, self._hi = engine._nodes()

    def step(self) -> bool:
        engine = self.engine
        if not any(d == self.levels + 1 for d in engine._dep[self._lo:self._hi]):
            self.step_seconds = 0.0
            return False
        self.step_seconds = engine.cost_table.draft_level(self.width) * engine._draft_scale * engine._noise()
        self.levels += 1
        return True

    def level_features(self) -> dict[str, float]:
        lo, hi = self._lo, self._hi
        return tree_level_features(self.engine._dep[lo:hi], self.engine._score[lo:hi], self.levels)

    @property
    def tree(self) -> DraftTree:
        """The recorded tree cut at the levels replayed so far (its nodes of depth <= levels are a
        prefix of the recorded node list)."""
        engine, lo = self.engine, self._lo
        n = lo
        while n < self._hi and engine._dep[n] <= self.levels:
            n += 1
        return DraftTree(tokens=engine._tok[lo:n], parents=engine._par[lo:n], depths=engine._dep[lo:n],
                         scores=engine._score[lo:n])


class TraceRoundEngine:
    """A :class:`~draftrl.decoding.interface.RoundEngine` over recorded traces (module docstring).

    :param traces: the recorded traces (``Traces``; :func:`open_traces` reads a directory).
    :param config: the env's config (checked by :func:`check_replayable`): its ``width``, ``drafter``,
        ``cost_noise``, ``cost_jitter`` and budgets are what the replay plays.
    :param cost_table: the seconds of every phase (:func:`replay_cost_table` finds it).
    """

    samples = False
    """no sampler: the env passes no sampling seed, and the exactness monitor has nothing to test (at
    temperature > 0 the replayed ``TokenStats`` are the recorded rows', not a sampler's output)"""

    def __init__(self, traces: Traces, config: EnvConfig, cost_table: CostTable):
        check_replayable(config, traces)
        self.traces, self.env_config, self.cost_table = traces, config, cost_table
        self.config = EngineConfig(max_new_tokens=1, temperature=0.0, max_depth=traces.max_depth,
                                   max_width=traces.width, max_verify_size=NO_VERIFY_LIMIT)
        self.drafter = config.drafter if config.drafter != "none" else None
        self.drafts_levels = self.drafter is not None
        # python lists: per-element access is faster than numpy indexing in the step loop
        self._cont = traces.continuation.tolist()
        self._p_token = traces.p_token.tolist()
        self._mass_before = traces.mass_before.tolist()
        self._p_entropy = traces.p_entropy.tolist()
        self._top1 = traces.target_top1_prob.tolist()
        self._target_entropy = traces.target_entropy.tolist()
        self._node_p = traces.node_p.tolist()
        #: the traces store the raw-softmax signals (``draftrl-trace/1`` ones do not: ``target_features`` stay {})
        self.target_signals = bool(np.isfinite(traces.target_top1_prob).all())
        self._cu_pos = traces.cu_num_positions.tolist()
        self._cu_prompt = traces.cu_num_prompt_tokens.tolist()
        self._cu_nodes = traces.cu_num_nodes.tolist()
        self._tok = traces.node_tokens.tolist()
        self._par = traces.node_parents.tolist()
        self._dep = traces.node_depths.tolist()
        self._score = traces.node_scores.tolist()
        self._draft = traces.draft_features.tolist()
        prompt_tokens = traces.prompt_tokens.tolist()
        self._prompt_ids = [prompt_tokens[a:b] for a, b in zip(self._cu_prompt, self._cu_prompt[1:])]
        self._rec_prompt = traces.recording_prompt.tolist()
        #: (prompt, class) -> its recordings in order of k
        self._recordings: dict[tuple[int, int], list[int]] = {}
        for r, (p, c, k) in enumerate(zip(self._rec_prompt, traces.recording_class.tolist(),
                                           traces.recording_k.tolist())):
            self._recordings.setdefault((p, c), []).append((k, r))
        self._recordings = {key: [r for _, r in sorted(recs)] for key, recs in self._recordings.items()}
        self._by_prompt = self._index_prompts()
        self._sampling = config.sampling_classes[0].params() if not config.mixed else None
        self._prompt = -1  # no request yet: the recording replayed
        self._t = self._budget = self._length = self._num_prompt_tokens = 0
        self._rng: np.random.Generator | None = None
        self.finished = True
        self._verify_growth = self._draft_scale = 1.0

    def _index_prompts(self) -> dict[tuple[int, ...], int]:
        """Prompt tokens -> the prompt whose recordings ``start`` replays. A prompt recorded twice serves
        both from the recordings of the larger budget (a request's budget cuts them: a continuation's
        first tokens are a sample of the shorter request's law); at temperature 0 it has one greedy
        continuation, and two that disagree are not greedy traces of one target."""
        index: dict[tuple[int, ...], int] = {}
        budgets = self.traces.budgets
        for p, ids in enumerate(self._prompt_ids):
            key = tuple(ids)
            q = index.setdefault(key, p)
            if q == p:
                continue
            short, long = sorted((p, q), key=lambda i: budgets[i])
            for c, sampling in enumerate(self.traces.classes):
                if not sampling.greedy or (short, c) not in self._recordings or (long, c) not in self._recordings:
                    continue
                r, s = self._recordings[(short, c)][0], self._recordings[(long, c)][0]
                a, b = self._cu_pos[r], self._cu_pos[r + 1]
                if self._cont[a:b] != self._cont[self._cu_pos[s]:self._cu_pos[s] + b - a]:
                    raise ValueError(f"the traces hold prompts {self.traces.prompts[q].id!r} and "
                                     f"{self.traces.prompts[p].id!r} with the same tokens but different greedy "
                                     "continuations; record them again with draftrl collect.")
            index[key] = long
        return index

    # ------------------------------------------------------------------ requests
    def workload(self, config: EnvConfig) -> Workload:
        """The recorded prompts, tokenised as recorded, each budget capped at what was recorded."""
        prompts = self.traces.prompts
        return Workload(config, None, prompts=prompts,
                        prompt_ids={p.id: ids for p, ids in zip(prompts, self._prompt_ids)},
                        limits={p.id: b for p, b in zip(prompts, self.traces.budgets)})

    def check(self, config: EnvConfig) -> None:
        """Refuse an env config other than the one this engine replays for."""
        if config != self.env_config:
            raise ValueError("the replay engine was built for another EnvConfig; build it from the env's config "
                             "(TraceRoundEngine(traces, config, cost_table)).")

    def start(self, prompt_ids: list[int], seed: int | None = None, prefill: bool = False,
              rng: np.random.Generator | None = None, sampling: SamplingParams | None = None) -> float:
        """Begin a recorded request of ``prompt_ids`` (``config.max_new_tokens`` its budget) with ``sampling``
        (a ``SamplingParams`` or ``SamplingClass``; None: the config's one class). Of that class's K recorded
        continuations it walks number ``seed % K``; without a seed one drawn from ``rng`` (the env's; nothing
        is drawn when K = 1), without either the first. Then draws this episode's cost jitter from ``rng``.
        No forward runs: 0 seconds.

        :raises ValueError: an unrecorded prompt, a class the traces lack (naming the collect command), or
            no ``sampling`` for a mixed config.
        """
        p = self._by_prompt.get(tuple(prompt_ids))
        if p is None:
            raise ValueError(f"the prompt ({len(prompt_ids)} tokens) is not among the {len(self.traces)} recorded "
                             "ones; record this workload with draftrl collect.")
        params = self._request_sampling(sampling)
        recordings = self._recordings[(p, self.traces.class_index(params))]
        if seed is not None:
            k = seed % len(recordings)
        elif rng is not None and len(recordings) > 1:
            k = int(rng.integers(len(recordings)))
        else:
            k = 0
        r = recordings[k]
        self._sampling = params
        self.config.temperature, self.config.top_k, self.config.top_p = params.temperature, params.top_k, params.top_p
        self._prompt, self._t, self._rng = r, 0, rng
        self._budget = self.config.max_new_tokens
        self._length = min(self._cu_pos[r + 1] - self._cu_pos[r], self._budget)
        self._num_prompt_tokens = len(self._prompt_ids[p])
        self.finished = False
        self._verify_growth = self._noise(self.env_config.cost_jitter)
        self._draft_scale = self._noise(self.env_config.cost_jitter)
        return 0.0

    def _request_sampling(self, sampling) -> SamplingParams:
        """The request's ``SamplingParams``: ``sampling``'s, or the config's one class; refused when the traces
        lack it (naming the collect command)."""
        if sampling is None:
            if self.env_config.mixed:
                labels = ", ".join(c.label for c in self.env_config.sampling_classes)
                raise ValueError(f"EnvConfig.temperature_mix has {labels}: start() needs sampling= (the request's "
                                 "class, e.g. config.draw_sampling(rng).params()).")
            sampling = self.env_config.sampling_classes[0]
        params = SamplingParams(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
        if self.traces.class_index(params) is None:
            held = ", ".join(c.label for c in self.traces.classes)
            raise ValueError(f"the traces hold {held}, not temperature={params.temperature:g} top_k={params.top_k} "
                             f"top_p={params.top_p:g}; record it with draftrl collect {_collect_sampling(params)}.")
        return params

    @property
    def sampling(self) -> SamplingParams | None:
        """The current request's sampling (before any request: the config's one class, None for a mix)."""
        return self._sampling

    @property
    def recording(self) -> int:
        """The index of the recording the current request walks (-1 before any), into the traces' ``recording_*``."""
        return self._prompt

    @property
    def ids(self) -> list[int]:
        """Prompt and the tokens emitted so far."""
        return self._prompt_ids[self._rec_prompt[self._prompt]] + self.output_ids if self._prompt >= 0 else []

    @property
    def output_ids(self) -> list[int]:
        if self._prompt < 0:
            return []
        start = self._cu_pos[self._prompt]
        return self._cont[start:start + self._t]

    @property
    def remaining(self) -> int:
        return self._budget - self._t

    def features(self) -> dict[str, float]:
        """The drafter's signals recorded before the coming round ({} without a drafter)."""
        if self.drafter is None or self.finished:
            return {}
        return dict(zip(DRAFT_FEATURES, self._draft[self._cu_pos[self._prompt] + self._t]))

    # ------------------------------------------------------------------ seconds
    def _noise(self, sigma: float | None = None) -> float:
        """A mean-one lognormal factor of ``sigma`` (default: ``cost_noise``) from the env's RNG."""
        sigma = self.env_config.cost_noise if sigma is None else sigma
        if sigma <= 0:
            return 1.0
        return math.exp(sigma * float(self._rng.standard_normal()) - 0.5 * sigma * sigma)

    def _verify_seconds(self, num_tokens: int, ctx: int) -> float:
        """The cost table's forward over ``num_tokens``, its growth over one token scaled by this episode's jitter."""
        seconds = self.cost_table.verify(num_tokens, ctx)
        if self._verify_growth != 1.0:
            one = self.cost_table.verify(1, ctx)
            seconds = one + (seconds - one) * self._verify_growth
        return seconds

    # ------------------------------------------------------------------ rounds
    def _check_running(self) -> None:
        if self._prompt < 0 or self.finished:
            raise RuntimeError("the request is finished; call start() with a new prompt")

    def _levels(self, depth: int) -> int:
        return min(depth, self._budget - self._t - 1) if self.drafter is not None else 0

    def round(self, depth: int, verify_size: int | None = None, width: int = 1) -> RoundResult:
        """Replay one round drafting ``min(depth, remaining - 1)`` levels and verifying ``verify_size`` nodes
        (None = all)."""
        self._check_running()
        levels = self._levels(depth)
        draft_seconds = (self.cost_table.draft(levels, width) * self._draft_scale * self._noise()
                         if self.drafter is not None else 0.0)
        return self._play(depth, verify_size, levels, draft_seconds)

    def begin_levels(self, width: int) -> ReplayTreeBuilder:
        """The recorded tree at this position, replayed a level at a time."""
        self._check_running()
        return ReplayTreeBuilder(self, width)

    def round_from_tree(self, tree: DraftTree, verify_size: int | None = None, *, draft_seconds: float = 0.0,
                        depth: int | None = None, width: int = 1) -> RoundResult:
        """Verify the first ``depth`` recorded levels (a :class:`ReplayTreeBuilder`'s tree), charging
        ``draft_seconds`` (its levels) plus the per-round draft base."""
        self._check_running()
        levels = depth if depth is not None else max(tree.depths, default=0)
        base = (self.cost_table.draft_base_seconds * self._draft_scale * self._noise()
                if self.drafter is not None else 0.0)
        return self._play(levels, verify_size, levels, draft_seconds + base)

    def _nodes(self) -> tuple[int, int]:
        """[lo, hi) node range of the tree recorded at the current position."""
        pos = self._cu_pos[self._prompt] + self._t
        return self._cu_nodes[pos], self._cu_nodes[pos + 1]

    def _walk(self, levels: int, verify_size: int) -> tuple[int, int, int, int, bool, dict, list[int]]:
        """The coming round without playing it: (nodes drafted, nodes verified, deepest verified
        level, draft tokens accepted, whether the node the walk stopped at had drafted children, the
        selected subtree's children per parent (token -> node, relative to the position's first node),
        the walk's nodes from the root, -1)."""
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

        # walk the selected subtree along the recorded continuation
        end = start + self._length
        node, k, last_drafted, path = -1, 0, False, [-1]
        while True:
            children = kids.get(node)
            last_drafted = bool(children)
            if not children or start + t + k >= end:
                break
            child = children.get(cont[start + t + k])
            if child is None:
                break
            node, k = child, k + 1
            path.append(node)
        return num_proposed, len(keep), verified_depth, k, last_drafted, kids, path

    def lookahead(self, depths: tuple[int, ...], verify_sizes: tuple[int, ...],
                  value: RoundValue) -> np.ndarray:
        """The coming round's best ``[depth index, verify size index]`` by ``value(tokens, seconds)``.

        Every (depth, verify_size) of the grid is walked along the recorded continuation and
        charged the cost table's seconds (this episode's jitter, no per-round noise). Greedy per
        round (the next round's position depends on this one), so it bounds per-round choices,
        which is what the policies make.
        """
        self._check_running()
        width = self.env_config.width
        ctx = self._num_prompt_tokens + self._t - 1
        best, best_value = np.zeros(2, dtype=np.int64), -math.inf
        for i, depth in enumerate(depths):
            levels = self._levels(depth)
            draft = self.cost_table.draft(levels, width) * self._draft_scale if self.drafter is not None else 0.0
            for j, verify_size in enumerate(verify_sizes):
                _, num_verified, _, k, _, _, _ = self._walk(levels, verify_size)
                tokens = min(k + 1, self._length - self._t)
                seconds = draft + self._verify_seconds(1 + num_verified, ctx) + self.cost_table.sample(tokens)
                score = value(tokens, seconds)
                if score > best_value + 1e-12:
                    best, best_value = np.array([i, j], dtype=np.int64), score
        return best

    def _play(self, depth: int, verify_size: int | None, levels: int, draft_seconds: float) -> RoundResult:
        """Replay one round drafting ``levels`` levels (its draft seconds already charged)."""
        t, cont = self._t, self._cont
        start = self._cu_pos[self._prompt]
        num_proposed, num_verified, verified_depth, k, last_drafted, kids, path = self._walk(levels, verify_size or 0)
        num_emitted = min(k + 1, self._length - t)
        num_accepted = min(k, num_emitted)
        tokens = cont[start + t: start + t + num_emitted]
        self._t = t + num_emitted
        self.finished = self._t >= self._length
        stop_reason = None
        if self.finished:  # EOS ends the recorded continuation unless the budget cut it shorter
            recorded = self._cu_pos[self._prompt + 1] - start
            eos = self.traces.stop_reasons[self._prompt] == "eos" and self._length == recorded  # per recording
            stop_reason = "eos" if eos else "length"

        ctx = self._num_prompt_tokens + t - 1
        verify_seconds = self._verify_seconds(1 + num_verified, ctx) * self._noise()
        sample_seconds = self.cost_table.sample(num_emitted) * self._noise()

        drafted = np.zeros(num_emitted, dtype=bool)
        drafted[:num_accepted] = True
        if num_emitted > num_accepted:
            drafted[num_accepted] = last_drafted
        agree = np.zeros(num_emitted)
        agree[:num_accepted] = 1.0
        a, b = start + t, start + t + num_emitted
        if self._sampling is None or self._sampling.greedy:
            # the greedy statistics the live engine would report: p = 1 on every emitted token
            stats = TokenStats(token=tokens, p_token=np.ones(num_emitted), mass_before=np.zeros(num_emitted),
                               entropy=np.zeros(num_emitted), drafted=drafted, agree=agree,
                               agree_expected=agree.copy())
        else:  # the recorded rows' p; E[agree] = p(children) at each drafted node of the walk (its exact p)
            lo = self._cu_nodes[a]  # the round's tree: the position it started at
            node_p = self._node_p
            expected = [sum(node_p[lo + c] for c in kids[node].values()) if node in kids else 0.0
                        for node in path[:num_emitted]]
            stats = TokenStats(token=tokens, p_token=self._p_token[a:b], mass_before=self._mass_before[a:b],
                               entropy=self._p_entropy[a:b], drafted=drafted, agree=agree, agree_expected=expected)
        target = {}
        if self.target_signals and num_emitted:
            accepted = self._p_token[a:a + num_accepted]
            target = {"target_top1_prob": self._top1[b - 1], "target_entropy": self._target_entropy[b - 1],
                      "accepted_mean_p": sum(accepted) / len(accepted) if accepted else 0.0}
        return RoundResult(tokens=tokens, depth=depth, width=self.env_config.width, verify_size=verify_size,
                           num_proposed=num_proposed, num_verified=num_verified, num_accepted=num_accepted,
                           verified_depth=verified_depth, draft_seconds=draft_seconds, verify_seconds=verify_seconds,
                           sample_seconds=sample_seconds, finished=self.finished, stop_reason=stop_reason,
                           token_stats=stats, target_features=target)
