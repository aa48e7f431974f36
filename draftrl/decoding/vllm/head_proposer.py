"""draftrl's proposer running an EAGLE-3 head itself inside vLLM (route (b) of serving a head).

Stock vLLM's ``eagle3`` method drafts the same K for every request of a step and never stops
early; :class:`HeadProposer` (a :class:`~draftrl.decoding.vllm.proposer.DraftrlProposer`) runs the
same head in the ``custom_class`` hook, so each request gets its own depth (the controller's
decision: a rule or a per-request policy, the step's cap and budget, a per-level stop) and, with
``sam:N``, its own drafter: n-gram lookup when the history's suffix match is at least N tokens, the
head otherwise (SAM-decoding's rule).

vLLM passes a ``custom_class`` proposer no hidden states, so :meth:`HeadProposer.load_model`
registers forward pre-hooks on the target's auxiliary decoder layers (:class:`AuxCapture`). Each
target forward leaves, for every scheduled token, its position and ``hidden + residual`` at the
input of those layers (vLLM's ``aux_hidden_state_layers`` convention); vLLM's forward context
gives each request's rows (``query_start_loc``, in the batch's row order). After the forward, a
request keeps the rows of positions that are now history (``<= num_tokens - 2``: a verified
round's rejected drafts are dropped, the head's row convention is
:mod:`draftrl.drafters.eagle3`'s) in its own :class:`~draftrl.drafters.eagle3.Eagle3Drafter`,
which holds the head's KV cache for that request.

Prompt prefixes that vLLM's prefix cache skips are never computed again, so the proposer keeps
the features of every block-aligned prompt prefix (and of every prompt but its last token, which
vLLM recomputes when the whole prompt hits) by the prefix's tokens: features depend on the
tokens before them only, so a hit is exact. A request whose skipped positions were never seen
(e.g. cached before this proposer started) drafts by lookup only (``sam``) or not at all, and is
counted in :attr:`HeadProposer.unseen_prefixes`.

The head drafts all of a step's requests together, as stock ``eagle3`` does: one padded head
forward for their roots and one per level (:func:`~draftrl.drafters.eagle3_chains.draft_chains`),
each request to its own cap and the decision's per-level stop (``StepDecision.stop``: the rules
``confidence:T`` / ``cumulative:T``). A decision with ``head`` False (the rule ``RULE|batch:B``,
policy names ``...:bB``, in a step of more than B decoding requests) drafts every request by n-gram
lookup (the proposer's own drafter) while its head keeps taking its rows, so it drafts again as
soon as the batch shrinks.

Requests are keyed by vLLM's request ids: the runner is the caller of ``load_model`` (vLLM
documents this interface as subject to change; ``tests/real_vllm/test_head_proposer.py`` pins
it on CPU; on CUDA vLLM 0.32's V1 ``GPUModelRunner.load_model`` makes the same call, see
docs/serving.md). Draft tokens of ``eagle3:PATH`` at depth K equal stock ``eagle3``'s at K (same
test). Needs ``enforce_eager=True`` (``--enforce-eager``): a compiled target, or a CUDA graph
replay, would not run the hooks (refused in one line when a head is loaded without it).
"""

from __future__ import annotations

import math
import sys
import weakref
from collections import OrderedDict
from functools import partial
from pathlib import Path
from typing import Any

import torch

from draftrl.decoding.vllm.control import StepDecision
from draftrl.decoding.vllm.proposer import _GREEDY, DraftrlProposer
from draftrl.drafters.base import Drafter
from draftrl.drafters.eagle3 import Eagle3Drafter, Eagle3Head, check_head_fits
from draftrl.drafters.eagle3_chains import draft_chains
from draftrl.drafters.mixed import MixedDrafter
from draftrl.drafters.ngram import NgramDrafter
from draftrl.drafters.packaged import packaged_head, packaged_heads
from draftrl.drafters.tree import DraftTree
from draftrl.models import model_folder

HEAD_CLASS_PATH = "draftrl.decoding.vllm.head_proposer.HeadProposer"
#: drafter kinds that run a head here: ``eagle3[:PATH]`` and ``sam:N[:PATH]``
HEAD_KINDS = ("eagle3", "sam")
#: most prompt prefixes whose features are kept for prefix-cache hits
PREFIX_ENTRIES = 4096


def head_spec(spec: str) -> tuple[int | None, str | None] | None:
    """``(min_match, head path)`` of a head drafter spec (``min_match`` None for ``eagle3``; path
    None for the shipped head), or None when ``spec`` runs no head."""
    kind, *args = spec.split(":")
    if kind not in HEAD_KINDS:
        return None
    if kind == "eagle3":
        return None, ":".join(args) or None
    if not args or not args[0].isdigit():
        raise ValueError(f"drafter spec {spec!r} must look like sam:N[:PATH], e.g. sam:2")
    return int(args[0]), ":".join(args[1:]) or None


def needs_head(spec: str) -> bool:
    """Whether the vLLM proposer for ``spec`` must run an EAGLE-3 head (:class:`HeadProposer`)."""
    return head_spec(spec) is not None


def chain_end(rule: tuple[str, float], scores: list[float]) -> int | None:
    """Read after each level of a chain (``scores``: its drafts' cumulative log probabilities so
    far): None while a stop ``rule`` (:func:`draftrl.decoding.vllm.control.stop_rule`) lets it
    grow, else how many of its drafts it keeps. The chain
    stops at the level that decides, so no level is drafted only to be dropped."""
    kind, threshold = rule
    log_t = math.log(threshold)
    if kind == "cumulative":
        return len(scores) - 1 if scores[-1] < log_t else None
    own = scores[-1] - (scores[-2] if len(scores) > 1 else 0.0)
    return len(scores) if own < log_t else None


class AuxCapture:
    """Forward pre-hooks on a vLLM target's decoder layers that keep the last forward's auxiliary
    hidden states, positions and per-request row offsets."""

    def __init__(self, model: torch.nn.Module, layers: tuple[int, ...]):
        self.layers = tuple(layers)
        self.aux: dict[int, torch.Tensor] = {}
        self.positions: torch.Tensor | None = None
        self.query_start_loc: list[int] | None = None
        ref = weakref.ref(self)
        self._hooks = [model.model.layers[layer].register_forward_pre_hook(_hook(ref, layer, layer == self.layers[0]),
                                                                          with_kwargs=True) for layer in self.layers]

    def take(self) -> tuple[torch.Tensor, torch.Tensor, list[int]] | None:
        """(features [T, len(layers) * H], positions [T], query_start_loc [num_reqs + 1]) of the
        forward since the last call, or None."""
        if self.positions is None or self.query_start_loc is None or set(self.aux) != set(self.layers):
            return None
        out = torch.cat([self.aux[layer] for layer in self.layers], dim=-1), self.positions, self.query_start_loc
        self.aux, self.positions, self.query_start_loc = {}, None, None
        return out

    def close(self) -> None:
        for handle in self._hooks:
            handle.remove()


def _hook(ref: weakref.ref[AuxCapture], layer: int, first: bool):
    """Layer ``layer``'s pre-hook (vLLM calls decoder layers as ``layer(positions, hidden, residual)``)."""
    def hook(module, args, kwargs):
        owner = ref()
        if owner is None:
            return
        positions = args[0] if args else kwargs["positions"]
        hidden = args[1] if len(args) > 1 else kwargs["hidden_states"]
        residual = args[2] if len(args) > 2 else kwargs.get("residual")
        owner.aux[layer] = aux_value(hidden, residual)
        if first:
            owner.positions = positions.detach().clone()
            owner.query_start_loc = _query_start_loc()
    return hook


def aux_value(hidden: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
    """The residual stream at a layer's input, as vLLM's ``aux_hidden_state_layers`` reads it; a
    copy, since vLLM's fused add-norm then updates ``hidden`` and ``residual`` in place."""
    return (hidden.clone() if residual is None else hidden + residual).detach()


def _query_start_loc() -> list[int] | None:
    """Each scheduled request's first row in this forward (vLLM's attention metadata), or None
    outside a step (profiling and warm-up forwards)."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return None
    metadata = get_forward_context().attn_metadata
    if isinstance(metadata, list):
        metadata = metadata[0] if metadata else None
    values = metadata.values() if isinstance(metadata, dict) else [metadata]
    for entry in values:
        loc = getattr(entry, "query_start_loc", None)
        if loc is not None:
            return [int(x) for x in loc.tolist()]
    return None


class HeadProposer(DraftrlProposer):
    """vLLM ``custom_class`` proposer drafting with an EAGLE-3 head (``drafter`` ``eagle3[:PATH]``)
    or with SAM's mix of the head and n-gram lookup (``sam:N[:PATH]``), per request; any other
    drafter spec runs as in :class:`DraftrlProposer`."""

    drafts_heads = True

    def __init__(self, vllm_config: Any):
        self.target: torch.nn.Module | None = None
        self.head: Eagle3Head | None = None
        self.head_path: str | None = None
        self.min_match: int | None = None
        self.capture: AuxCapture | None = None
        self.states: dict[str, Drafter] = {}
        self.prefixes: OrderedDict[int, torch.Tensor] = OrderedDict()
        self.unseen_prefixes = 0
        """requests whose prompt prefix vLLM skipped (prefix cache) before this proposer saw it"""
        self._blind: set[str] = set()
        self.block_size = int(getattr(vllm_config.cache_config, "block_size", 16) or 16)
        self.head_dtype = vllm_config.model_config.dtype
        self.eager = bool(vllm_config.model_config.enforce_eager)
        """whether vLLM runs the target eagerly (the hooks that feed the head run in eager forwards only)"""
        super().__init__(vllm_config)

    # ------------------------------------------------------------------ configuration
    def set_drafter(self, spec: str) -> None:
        parsed = head_spec(spec)
        if parsed is None:
            super().set_drafter(spec)
            self.head_path = self.min_match = None
            return
        self.drafter_spec = spec
        self.min_match, path = parsed
        if path and not Path(path).is_absolute() and self.bundle_path(path).is_dir():
            path = str(self.bundle_path(path))  # a bundle's own head folder (draftrl export copies it in)
        self.head_path = path
        self.states.clear()
        if self.target is not None:
            self._load_head()

    def _draft_all(self, keys: list[str], histories: list[list[int]], caps: list[int],
                   decision: StepDecision) -> list[DraftTree]:
        """The step's drafts: n-gram lookup for the requests whose drafter chooses it (every request
        when the decision says no head), the head's chains of all the others in one batched
        :func:`~draftrl.drafters.eagle3_chains.draft_chains` call, each to its own cap and the
        decision's stop."""
        if self.head is None:
            return super()._draft_all(keys, histories, caps, decision)
        if not decision.head:
            return [self.drafter.propose(ids, cap, 1, _GREEDY, None) for ids, cap in zip(histories, caps)]
        trees: list[DraftTree | None] = [None] * len(keys)
        heads, extras = [], []  # (index, the request's head drafter), the features its tree also carries
        for a, (key, ids, cap) in enumerate(zip(keys, histories, caps)):
            state = self._drafter_for(key)
            extra: dict[str, float] = {}
            if isinstance(state, MixedDrafter):
                extra = state.lookup.features(ids)
                if state.chooses_lookup(extra):
                    trees[a] = state.lookup.propose(ids, cap, 1, _GREEDY, None)
                    trees[a].features = {**trees[a].features, "drafter_lookup": 1.0}
                    continue
                extra["drafter_lookup"] = 0.0
            heads.append((a, self._head_of(state)))
            extras.append(extra)
        stop = None if decision.stop is None else partial(chain_end, decision.stop)
        chains = draft_chains([h for _, h in heads], [histories[a] for a, _ in heads],
                              [caps[a] for a, _ in heads], stop)
        for (a, _), extra, tree in zip(heads, extras, chains):
            tree.features = {**tree.features, **extra}
            trees[a] = tree
        return trees  # type: ignore[return-value]

    def load_model(self, target_model: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        """Keep the target and its runner (the caller), and load the head if one is configured."""
        self.target = target_model
        caller = sys._getframe(1).f_locals.get("self")
        if self.runner is None and hasattr(caller, "input_batch"):
            self.runner = caller
        if needs_head(self.drafter_spec):
            self._load_head()

    def _load_head(self) -> None:
        if self.runner is None:
            raise RuntimeError("HeadProposer found no vLLM model runner as the caller of its load_model (vLLM 0.32's "
                               "V1 runners, CPU and CUDA, call it from their own load_model); run vLLM 0.32 "
                               "(pip install vllm==0.32.0) or serve the head with stock method eagle3.")
        if not self.eager:
            raise ValueError("the head in draftrl's proposer reads the target's hidden states through hooks that "
                             "compiled forwards and CUDA graphs never call; start vLLM with enforce_eager=True "
                             "(--enforce-eager), or serve the head with stock method eagle3.")
        path = model_folder(self.head_path, "EAGLE-3 head") if self.head_path else _fitting_head(self.target)
        head = Eagle3Head.from_pretrained(path, dtype=self.head_dtype, device=str(_device(self.target)))
        head.config = check_head_fits(head.config, self.target, f"the head {path}")  # auxiliary layers resolved
        if self.capture is not None and self.capture.layers != head.config.aux_layers:
            self.capture.close()
            self.capture = None
        self.capture = self.capture or AuxCapture(self.target, head.config.aux_layers)
        self.head, self.head_path = head, str(path)

    # ------------------------------------------------------------------ per-request drafters
    def _new_state(self) -> Drafter:
        head = Eagle3Drafter(self.head, None, embed=self.target.model.embed_tokens, name="eagle3")
        if self.min_match is None:
            return head
        return MixedDrafter(NgramDrafter(1, 3, first="latest"), head, self.min_match, name=self.drafter_spec)

    def _drafter_for(self, key: str) -> Drafter:
        if self.head is None:
            return super()._drafter_for(key)
        if key not in self.states:
            self.states[key] = self._new_state()
        return self.states[key]

    @staticmethod
    def _head_of(state: Drafter) -> Eagle3Drafter:
        return state.model if isinstance(state, MixedDrafter) else state  # type: ignore[return-value]

    def _ingest(self, num_tokens_no_spec: Any, token_ids_cpu: Any) -> None:
        """Hand every request its rows of the forward that just ran (module docstring)."""
        step = self.capture.take()
        req_ids = list(self.runner.input_batch.req_ids)
        self.states = {k: s for k, s in self.states.items() if k in req_ids}
        self._blind &= set(self.states)
        if step is None:
            return
        features, positions, starts = step
        for row, key in enumerate(req_ids[: len(starts) - 1]):
            begin, end = starts[row], starts[row + 1]
            if end <= begin:
                continue
            state = self.states.get(key)
            if state is None:
                state = self.states[key] = self._new_state()
            head = self._head_of(state)
            n, first = int(num_tokens_no_spec[row]), int(positions[begin])
            have = head.num_features
            if first < have:  # recomputed rows (a preempted request): forget what follows them
                state.rewind(first + 1)
            elif first > have and not self._restore(key, head, token_ids_cpu[row, :first].tolist(), have):
                continue  # positions the prefix cache skipped and no earlier request showed
            keep = min(end - begin, n - 1 - first)
            if keep > 0:
                head.append_features(features[begin : begin + keep])
                prompt = int(self.runner.input_batch.num_prompt_tokens[row])
                self._remember(token_ids_cpu[row], first, head,
                               prompt - 1 if first < prompt <= first + keep + 1 else None)

    def _restore(self, key: str, head: Eagle3Drafter, prefix: list[int], have: int) -> bool:
        cached = self.prefixes.get(hash(tuple(prefix)))
        if cached is None or cached.shape[0] != len(prefix):
            if key not in self._blind:
                self._blind.add(key)
                self.unseen_prefixes += 1
            return False
        self.prefixes.move_to_end(hash(tuple(prefix)))
        head.append_features(cached[have:])
        return True

    def _remember(self, ids: Any, first: int, head: Eagle3Drafter, prompt_but_last: int | None) -> None:
        """Keep the block-aligned prefixes that just gained features, and the prompt minus its last
        token (``prompt_but_last``: its length, when the prompt's end was in this forward)."""
        total = head.num_features
        lengths = list(range((first // self.block_size + 1) * self.block_size, total + 1, self.block_size))
        if prompt_but_last:
            lengths.append(prompt_but_last)
        for length in lengths:
            key = hash(tuple(int(t) for t in ids[:length]))
            self.prefixes[key] = head.features_store[:length]
            self.prefixes.move_to_end(key)
        while len(self.prefixes) > PREFIX_ENTRIES:
            self.prefixes.popitem(last=False)

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: Any, token_ids_cpu: Any,
                slot_mappings: Any = None) -> list[list[int]]:
        if self.head is not None:
            self._ingest(num_tokens_no_spec, token_ids_cpu)
        return super().propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings)


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _fitting_head(target: torch.nn.Module) -> Path:
    """The shipped head that fits ``target`` (``--drafter eagle3`` with no path under ``vllm serve``)."""
    for name in packaged_heads():
        from draftrl.drafters.eagle3 import head_config

        try:
            check_head_fits(head_config(packaged_head(name)), target)
        except ValueError:
            continue
        return packaged_head(name)
    raise ValueError(f"draftrl ships no EAGLE-3 head that fits this target (shipped: {', '.join(packaged_heads())}); "
                     "name one with drafter eagle3:PATH or sam:N:PATH")
