"""The Hugging Face reference engine behind the serving interface.

:class:`HFBatchEngine` serves a batch through :class:`~draftrl.decoding.engine.SpeculativeDecoder`
(one decoder, hence one KV cache, per running request) and implements
:class:`~draftrl.decoding.interface.ServingEngine`: each engine step runs one round for every
running request, one request after the other (no batched forward: this is the exact reference,
not a fast server). The step's depth cap and budget are admitted with the same scores as vLLM's
proposer (:mod:`draftrl.decoding.admission`) and apply to the step they are given to
(``action_lag = 0``). Drafting is prompt lookup (:class:`~draftrl.drafters.ngram.NgramDrafter`),
each request drafting as deep as its match allows under the cap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from draftrl.decoding.admission import RequestAcceptance, StepAction, admit_drafts
from draftrl.decoding.clock import clock_for
from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
from draftrl.decoding.interface import EngineStep, QueuedBatch, RequestStep
from draftrl.drafters.ngram import NgramDrafter

ACCEPT_DECAY = 0.8


@dataclass
class _Running:
    request_id: str
    decoder: SpeculativeDecoder
    acceptance: RequestAcceptance


class HFBatchEngine(QueuedBatch):
    """Serving interface over the exact Hugging Face engine (module docstring).

    :param target: a loaded causal LM (``draftrl.models.LoadedModel``).
    :param max_depth: largest depth cap.
    :param max_num_seqs: most requests in the batch; later ones wait.
    :param eos_token_ids: ids that end a request.
    """

    action_lag = 0

    def __init__(self, target, *, max_depth: int = 8, max_num_seqs: int = 16, eos_token_ids: tuple[int, ...] = ()):
        self.target = target
        self.max_depth = int(max_depth)
        self.max_num_seqs = int(max_num_seqs)
        self.eos_token_ids = tuple(eos_token_ids)
        self.drafter = NgramDrafter()
        self.clock = clock_for(next(target.model.parameters()).device)  # GPU work counted where it happens
        self._start_queue()

    def add_request(self, request_id: str, prompt_ids: list[int], max_new_tokens: int, *,
                    temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None) -> None:
        config = EngineConfig(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                              seed=seed or 0, max_depth=max(16, self.max_depth))
        self.waiting.append((request_id, list(prompt_ids), config, seed))

    def step(self, action: StepAction | None = None) -> EngineStep:
        """Admit waiting requests (prefill), then one round per running request under ``action``."""
        action = action or StepAction(self.max_depth)
        t0 = self.clock()
        while self.waiting and len(self.running) < self.max_num_seqs:
            request_id, ids, config, seed = self.waiting.popleft()
            decoder = SpeculativeDecoder(self.target.model, self.drafter, config, self.eos_token_ids)
            decoder.start(ids, seed=seed)
            self.running.append(_Running(request_id, decoder, RequestAcceptance()))
        match = np.array([int(r.decoder.features().get("ngram_match_len", 0)) for r in self.running], dtype=np.int64)
        depth = min(action.depth, self.max_depth)
        capacity = np.array([min(depth, r.decoder.remaining - 1) if m > 0 else 0
                             for r, m in zip(self.running, match)], dtype=np.int64)
        acceptance, admitted = admit_drafts([r.acceptance for r in self.running], match, capacity, action.budget)
        self._signals = (acceptance, match)
        self._temperatures = np.array([float(r.decoder.config.temperature) for r in self.running])
        steps, still = [], []
        for req, n in zip(self.running, admitted):
            rnd = req.decoder.round(int(n))
            req.acceptance.last_proposed = rnd.num_verified
            req.acceptance.observe(rnd.num_emitted, ACCEPT_DECAY)
            steps.append(RequestStep(req.request_id, list(rnd.tokens), rnd.num_verified, rnd.num_accepted,
                                     rnd.finished))
            if not rnd.finished:
                still.append(req)
        self.running = still
        return EngineStep(self.clock() - t0, steps, len(self.running), len(self.waiting),
                          int(sum(s.num_verified for s in steps)))
