"""A drafting policy inside vLLM, through its experimental ``custom_class`` proposer.

Targets vLLM 0.22.1 (the custom proposer appears in its ``vllm.v1.spec_decode`` API docs;
0.19.0 lacks it). vLLM imports the class named in ``speculative_config.model``, builds it with
the ``VllmConfig`` and calls, every decoding step::

    propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None) -> list[list[int]]

- ``sampled_token_ids``: ``[num_reqs]`` lists: the tokens each request gained this step (the
  accepted drafts plus the target's token); empty while a request is still prefilling;
- ``num_tokens_no_spec``: ``[>= num_reqs]`` each row's token count (prompt + output);
- ``token_ids_cpu``: ``[>= num_reqs, max_model_len]`` each row's tokens;
- returns each request's draft tokens (any length up to ``num_speculative_tokens``; ``[]`` =
  no speculation for that request this step).

``DraftrlPolicyProposer`` answers with n-gram drafts (draftrl's ``NgramDrafter``, the drafter the
policy was trained with) of the depth the controller picks per request, all requests in one
onnxruntime call. Per-request history features are tracked across steps: vLLM passes no request
ids, so a request is recognised by its row, its token count and its last tokens (rows that move
after other requests finish are found again; a new request starts fresh). What vLLM does not
expose is filled honestly: cost features come from the training cost table (seconds a round
*would* take by the table, as ``TraceReplay-v0`` charges them), not from measured time; the
request's token budget is not passed either, so ``generated_len`` is measured against the
training budget (``EnvConfig.max_new_tokens`` or its cap; it saturates at 1) and
``remaining_len`` is held at 1 (end not near); drafts are capped only by
``num_speculative_tokens``, the per-batch table and ``max_model_len``.

Configuration (environment variables, since ``speculative_config`` has no free-form field):
``DRAFTRL_POLICY`` = the exported ``.onnx`` file (required); ``DRAFTRL_ENGINE_CONFIG`` = the
JSON of ``draftrl export --format vllm`` (optional: its ``derivation.policy_cap_by_batch`` table
caps every request's depth for the current batch size, shallower as batches grow).

Not tested against vLLM here (no GPU, vLLM not installable); ``PolicyProposerCore`` (everything
except the vLLM glue) is tested with vLLM's documented argument layout.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from draftrl.envs.costs import CostTable
from draftrl.envs.features import FeatureBuilder, RoundSummary
from draftrl.export.engine_config import VLLM_VERSION
from draftrl.export.features import make_feature_builder, ngram_drafter

POLICY_ENV = "DRAFTRL_POLICY"
ENGINE_CONFIG_ENV = "DRAFTRL_ENGINE_CONFIG"
#: tokens of a row's tail remembered to recognise the request at the next step
_TAIL = 8


def require_vllm() -> str:
    """The installed vLLM version; an ImportError with the install command when vLLM is missing."""
    if importlib.util.find_spec("vllm") is None:
        raise ImportError(
            f"vllm is not installed; this adapter targets vLLM {VLLM_VERSION}: run pip install \"vllm=={VLLM_VERSION}\" "
            "on a machine with a CUDA GPU."
        )
    version = importlib.metadata.version("vllm")
    if version != VLLM_VERSION:
        warnings.warn(f"draftrl's vLLM proposer targets vLLM {VLLM_VERSION}, found {version}; the custom_class "
                      "interface is experimental and may have changed.", stacklevel=2)
    return version


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
        active, observations, contexts = [], [], []
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


class DraftrlPolicyProposer:
    """vLLM ``custom_class`` proposer: ``speculative_config={"method": "custom_class", "model":
    "draftrl.export.vllm_proposer.DraftrlPolicyProposer", "num_speculative_tokens": K}`` with
    ``DRAFTRL_POLICY=/path/policy.onnx`` in the environment of vLLM's workers.
    """

    def __init__(self, vllm_config: Any):
        require_vllm()
        from draftrl.export.controller import PolicyController

        path = os.environ.get(POLICY_ENV)
        if not path:
            raise ValueError(f"set {POLICY_ENV}=/path/policy.onnx (written by draftrl export --format onnx) "
                             "in the environment vLLM runs in.")
        table = None
        config_path = os.environ.get(ENGINE_CONFIG_ENV)
        if config_path:
            table = json.loads(Path(config_path).read_text())["derivation"]["policy_cap_by_batch"]
        spec = vllm_config.speculative_config
        self.core = PolicyProposerCore(
            PolicyController(path),
            num_speculative_tokens=int(spec.num_speculative_tokens),
            max_model_len=int(vllm_config.model_config.max_model_len),
            depth_by_batch=table,
        )

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None) -> list[list[int]]:
        return self.core.propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings)

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load: the n-gram drafter has no weights (a no-op in case the runner asks)."""
