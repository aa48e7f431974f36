"""A trained per-request policy inside vLLM 0.32, through its ``custom_class`` proposer.

:class:`PolicyProposer` is draftrl's vLLM proposer
(:class:`draftrl.decoding.vllm.proposer.DraftrlProposer`: n-gram drafts, a depth cap and a
verification budget per step admitted by survival scores) whose per-request depth comes from an
exported size policy (``draftrl export --format onnx``), all running requests in one onnxruntime
call. ``draftrl export RUN --format vllm --out DIR`` writes everything ``LLM(...)`` or
``vllm serve`` needs (``draftrl.export.vllm_bundle``); vLLM finds the policy through
``DRAFTRL_PROPOSER_CONFIG=DIR/proposer.json``.

:class:`PolicyProposerCore` (vLLM-independent, tested with vLLM's argument layout) builds each
request's observation: vLLM passes no request ids, so a request is recognised by its row, its
token count and its last tokens (rows that move after other requests finish are found again; a
new request starts fresh). What vLLM does not expose is filled honestly: cost features come from
the training cost table (seconds a round *would* take by the table, as ``TraceReplay-v0`` charges
them), not from measured time; the request's token budget is not passed either, so
``generated_len`` is measured against the training budget and ``remaining_len`` is held at 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from draftrl.decoding.vllm.proposer import CONFIG_ENV, DraftrlProposer
from draftrl.signals.costs import CostTable
from draftrl.signals.features import FeatureBuilder, RoundSummary
from draftrl.export.features import make_feature_builder, ngram_drafter

CLASS_PATH = "draftrl.export.vllm_proposer.PolicyProposer"
#: tokens of a row's tail remembered to recognise the request at the next step
_TAIL = 8


@dataclass
class _Request:
    """One request's feature state between steps."""

    features: FeatureBuilder
    num_prompt_tokens: int
    length: int
    """token count at the last step"""
    tail: tuple[int, ...]
    num_proposed: int = 0
    """drafts proposed at the last step (verified this step)"""
    levels: int = 0
    seen: int = field(default=0)
    """step counter of the last sighting"""


class PolicyProposerCore:
    """Per-request features, one batched controller call, n-gram drafts: the vLLM-independent part.

    :param controller: a size policy (``PolicyController``) trained on a ``FeatureBuilder`` env
        with the n-gram drafter.
    :param num_speculative_tokens: vLLM's cap on drafts per request.
    :param max_model_len: drafts never run past it.
    :param depth_by_batch: ``[[start_bs, end_bs, k], ...]``: cap on the depth at batch size B.
    """

    def __init__(self, controller: Any, num_speculative_tokens: int, max_model_len: int | None = None,
                 depth_by_batch: list[list[int]] | None = None):
        if controller.kind != "size" or controller.width != 1:
            raise ValueError("vLLM drafts chains: the policy must be a size policy of width 1.")
        self.controller = controller
        self.entry = controller.manifest.get("features") or {}
        make_feature_builder(self.entry, controller.feature_names)  # refuse unusable policies now
        self.ngram = ngram_drafter(str(self.entry.get("drafter") or "ngram"))
        self.table = CostTable.from_dict(self.entry["cost_table"]) if self.entry.get("cost_table") else None
        self.budget = int(self.entry.get("max_new_tokens") or 256)
        self.num_speculative_tokens = int(num_speculative_tokens)
        self.max_model_len = max_model_len
        self.depth_by_batch = depth_by_batch or []
        names = list(controller.feature_names)
        self._remaining = names.index("remaining_len") if "remaining_len" in names else None
        self.requests: dict[int, _Request] = {}
        self.step = 0

    # ------------------------------------------------------------------ request tracking
    def _match(self, row: int, tokens: np.ndarray, sampled: list[int]) -> _Request | None:
        n = len(tokens)
        def same(req: _Request) -> bool:
            return req.length + len(sampled) == n and tuple(tokens[req.length - len(req.tail): req.length]) == req.tail

        req = self.requests.get(row)
        if req is not None and same(req):
            return req
        for other_row, other in list(self.requests.items()):  # a row that moved after others finished
            if other_row != row and other.seen == self.step - 1 and same(other):
                del self.requests[other_row]
                return other
        return None

    def _new_request(self, tokens: np.ndarray, sampled: list[int]) -> _Request:
        features = make_feature_builder(self.entry, self.controller.feature_names)
        features.start_episode(self.budget)
        return _Request(features, num_prompt_tokens=len(tokens) - len(sampled), length=len(tokens), tail=())

    def _observe(self, req: _Request, sampled: list[int], context: int) -> None:
        n = req.num_proposed
        accepted = max(0, min(len(sampled) - 1, n))
        table = self.table
        req.features.observe_round(RoundSummary(
            num_emitted=len(sampled), num_accepted=accepted, num_verified=n, verified_depth=n, levels=req.levels,
            draft_seconds=table.draft(req.levels, 1) if table else 0.0,
            verify_seconds=table.verify(n + 1, context) if table else 0.0,
            sample_seconds=table.sample(len(sampled)) if table else 0.0,
        ))

    def _cap(self, batch_size: int) -> int:
        for start, end, k in self.depth_by_batch:
            if start <= batch_size <= end:
                return int(k)
        return self.num_speculative_tokens

    # ------------------------------------------------------------------ the step
    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None) -> list[list[int]]:
        """vLLM's ``propose`` contract (module docstring)."""
        self.step += 1
        num_reqs = len(sampled_token_ids)
        active, observations = [], []
        seen: dict[int, _Request] = {}
        for row, sampled in enumerate(sampled_token_ids):
            if not sampled:  # still prefilling (chunked prefill): nothing to do this step
                continue
            tokens = np.asarray(token_ids_cpu[row, : int(num_tokens_no_spec[row])])
            req = self._match(row, tokens, list(sampled))
            if req is None:
                req = self._new_request(tokens, list(sampled))
            else:
                self._observe(req, list(sampled), req.length)
            req.length, req.tail, req.seen = len(tokens), tuple(int(t) for t in tokens[-_TAIL:]), self.step
            seen[row] = req
            ids = tokens.tolist()
            generated = len(ids) - req.num_prompt_tokens
            obs = req.features.observation(self.ngram.features(ids), len(ids), generated)
            if self._remaining is not None:
                obs[self._remaining] = 1.0  # the request's budget is unknown: assume its end is not near
            observations.append(obs)
            active.append((row, req, ids))
        # forget requests not seen for a step (finished or preempted)
        self.requests = {row: r for row, r in self.requests.items() if r.seen >= self.step - 1 and row not in seen}
        self.requests.update(seen)
        drafts: list[list[int]] = [[] for _ in range(num_reqs)]
        if not active:
            return drafts
        settings = self.controller.act_batch(np.stack(observations))  # [A, 2]: (depth, verify_size)
        cap = min(self.num_speculative_tokens, self._cap(num_reqs))
        for (row, req, ids), (depth, verify_size) in zip(active, settings):
            room = (self.max_model_len - len(ids) - 1) if self.max_model_len else cap
            levels = int(max(0, min(depth, cap, room)))
            n = levels if not verify_size else min(levels, int(verify_size))
            tokens = self.ngram.propose(ids, n, 1, None, None).tokens if n > 0 else []
            req.levels, req.num_proposed = levels, len(tokens)
            drafts[row] = [int(t) for t in tokens]
        return drafts


class PolicyProposer(DraftrlProposer):
    """vLLM ``custom_class`` proposer running an exported per-request size policy::

        DRAFTRL_PROPOSER_CONFIG=DIR/proposer.json  speculative_config={"method": "custom_class",
            "model": "draftrl.export.vllm_proposer.PolicyProposer", "num_speculative_tokens": K}

    ``proposer.json``: ``policy`` (the ``.onnx`` file, relative to the JSON), ``depth`` and
    ``budget`` (the fixed step action; None = no budget), ``depth_by_batch`` (optional cap per
    batch size, ``[[start, end, k], ...]``).
    """

    def __init__(self, vllm_config: Any):
        self.core: PolicyProposerCore | None = None
        super().__init__(vllm_config)
        if self.core is None:
            raise ValueError(f"set {CONFIG_ENV}=DIR/proposer.json (written by draftrl export --format vllm --out DIR) "
                             "in the environment vLLM runs in; it names the exported policy.")

    def configure(self, config: dict[str, Any]) -> None:
        from draftrl.export.controller import PolicyController

        config = dict(config)
        policy = config.pop("policy", None)
        table = config.pop("depth_by_batch", None)
        config.setdefault("rule", "match")
        super().configure(config)
        if policy:
            self.core = PolicyProposerCore(PolicyController(self.bundle_path(policy)), num_speculative_tokens=self.max_depth,
                                           max_model_len=self.max_model_len, depth_by_batch=table)
            self.rule = "policy"

    def _own_depths(self, rows, reqs, sampled_token_ids, num_tokens_no_spec, token_ids_cpu) -> list[int]:
        if self.core is None:
            return super()._own_depths(rows, reqs, sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        drafts = self.core.propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        return [len(drafts[row]) for row in rows]

    def _admitted(self, rows: list[int], counts: list[int]) -> None:
        """The budget may cut a policy's draft: its features must count what was really verified."""
        if self.core is None:
            return
        for row, n in zip(rows, counts):
            req = self.core.requests.get(row)
            if req is not None:
                req.num_proposed = n
