"""A scripted stand-in for vLLM's engine loop, for driving draftrl's proposers without vLLM.

:class:`ScriptedLLM` keeps vLLM's persistent batch as a proposer sees it (rows of tokens, each
step's sampled tokens, rows condensed when requests finish), admits queued requests up to
``max_num_seqs`` at the start of a step (their prefill yields their first token), verifies the
drafts of the previous step greedily against each request's scripted continuation, calls the
proposer's ``propose`` with vLLM's argument layout, and only then charges the step's seconds on
a scripted clock (so the time between two ``propose`` calls is one step, as in vLLM).

:class:`ScriptedVLLMEngine` is :class:`draftrl.decoding.vllm.engine.VLLMEngine` (its real
``step`` and ``request_signals``: the in-process driver's code) over a :class:`ScriptedLLM`.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from draftrl.decoding.vllm.counts import SpecDecodingCounts
from draftrl.decoding.vllm.engine import VLLMEngine, VLLMEngineConfig

MAX_LEN = 1024
VOCAB = 49152  # what vLLM stores as top_k when a request sets none


def continuation(prompt: list[int], length: int) -> list[int]:
    """A request's greedy 'target' output: pieces of its prompt's tail with a fresh token between
    them, so n-gram drafts are accepted at some positions and rejected at others."""
    tail = prompt[-6:] or [1]
    out: list[int] = []
    i = 0
    while len(out) < length:
        out += tail[: 2 + i % 5] + [200 + (i * 7 + len(prompt)) % 40]
        i += 1
    return out[:length]


class Clock:
    """Seconds that move only when a step is charged."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def fake_vllm_config(k: int, max_model_len: int = MAX_LEN):
    """The two fields draftrl's proposers read from vLLM's ``VllmConfig``."""
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                           model_config=SimpleNamespace(max_model_len=max_model_len))


class ScriptedLLM:
    """vLLM's engine loop as the proposer and the driver see it (module docstring)."""

    def __init__(self, proposer, clock: Clock, max_num_seqs: int = 16, cost=(0.02, 0.003, 0.001)):
        self.proposer, self.clock, self.max_num_seqs, self.cost = proposer, clock, max_num_seqs, cost
        self.waiting: list[dict] = []
        self.rows: list[dict] = []
        self.token_ids_cpu = np.zeros((max_num_seqs, MAX_LEN), dtype=np.int32)
        self.num_tokens = np.zeros(max_num_seqs, dtype=np.int32)
        # what a driver-attached runner shows the proposer: ids, and each row's sampling as vLLM keeps it
        # (temperature 0 for greedy, top_k = vocabulary size when off)
        self.input_batch = SimpleNamespace(req_ids=[], vocab_size=VOCAB, temperature_cpu=np.zeros(max_num_seqs),
                                           top_k_cpu=np.full(max_num_seqs, VOCAB), top_p_cpu=np.ones(max_num_seqs))
        self.drafts_per_step: list[list[list[int]]] = []

    def add_request(self, request_id: str, prompt_ids: list[int], max_new_tokens: int, temperature: float = 0.0,
                    top_k: int = 0, top_p: float = 1.0) -> None:
        self.waiting.append({"id": request_id, "prompt": list(prompt_ids), "max": max_new_tokens,
                             "truth": continuation(list(prompt_ids), max_new_tokens), "out": [], "draft": [],
                             "sampling": (temperature, top_k or VOCAB, top_p)})

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.rows)

    def get_num_unfinished_requests(self) -> int:
        return len(self.waiting) + len(self.rows)

    def abort_request(self, ids) -> None:
        self.waiting, self.rows = [], []

    def reset_prefix_cache(self) -> None:
        pass

    def step(self) -> list:
        new = []
        while self.waiting and len(self.rows) + len(new) < self.max_num_seqs:
            new.append(self.waiting.pop(0))
        sampled, verified = [], 0
        for r in self.rows:  # decode: verify last step's drafts greedily, gain accepted + 1 tokens
            t, draft = len(r["out"]), r["draft"]
            verified += len(draft)
            accepted = 0
            while (accepted < len(draft) and t + accepted < len(r["truth"])
                   and draft[accepted] == r["truth"][t + accepted]):
                accepted += 1
            gained = r["truth"][t: min(t + accepted + 1, r["max"])]
            r["out"] += gained
            sampled.append(gained)
        for r in new:  # prefill: the prompt's forward yields the first token
            self.rows.append(r)
            r["out"] = r["truth"][:1]
            sampled.append(list(r["out"]))
        for i, r in enumerate(self.rows):
            ids = r["prompt"] + r["out"]
            self.token_ids_cpu[i, : len(ids)] = ids
            self.num_tokens[i] = len(ids)
        self.input_batch.req_ids = [r["id"] for r in self.rows]
        for i, r in enumerate(self.rows):
            batch = self.input_batch
            batch.temperature_cpu[i], batch.top_k_cpu[i], batch.top_p_cpu[i] = r["sampling"]
        drafts = self.proposer.propose(sampled, self.num_tokens.copy(), self.token_ids_cpu)
        self.drafts_per_step.append([list(d) for d in drafts[: len(self.rows)]])
        base, per_seq, per_token = self.cost
        self.clock.now += base + per_seq * len(self.rows) + per_token * (verified + len(self.rows))
        outputs = []
        for r, gained, draft in zip(self.rows, sampled, drafts):
            r["draft"] = list(draft)
            done = len(r["out"]) >= r["max"]
            outputs.append(SimpleNamespace(request_id=r["id"], finished=done,
                                           outputs=[SimpleNamespace(token_ids=gained, logprobs=None)]))
        self.rows = [r for r, o in zip(self.rows, outputs) if not o.finished]  # rows condense
        return outputs


class ScriptedVLLMEngine(VLLMEngine):
    """``VLLMEngine`` (its ``step`` and ``request_signals``) over a :class:`ScriptedLLM`.

    :param proposer: the proposer vLLM would have built (``DraftrlProposer`` or a subclass).
    :param attach_runner: key requests by id as the in-process driver does (False: by content,
        as under ``vllm serve``).
    """

    def __init__(self, proposer, clock: Clock, *, max_num_seqs: int = 16, attach_runner: bool = True):
        self.config = VLLMEngineConfig(method="draftrl", num_speculative_tokens=proposer.max_depth,
                                       max_num_seqs=max_num_seqs)
        self.spec_counts = SpecDecodingCounts()
        self.llm = ScriptedLLM(proposer, clock, max_num_seqs)
        self.max_depth = proposer.max_depth
        self.max_num_seqs = max_num_seqs
        self.proposer = proposer
        if attach_runner:
            proposer.runner = SimpleNamespace(input_batch=self.llm.input_batch)
        self._scheduler = SimpleNamespace(get_request_counts=lambda: (len(self.llm.rows), len(self.llm.waiting)))
        self._internal, self._proposed = {}, {}
        self.load_seconds = 0.0

    def add_request(self, request_id, prompt_ids, max_new_tokens, *, temperature=0.0, top_k=0, top_p=1.0,
                    seed=None) -> None:
        """Queue a request; its sampling shows in the batch (the script decodes one continuation whatever it is)."""
        self._internal[request_id] = request_id
        self.llm.add_request(request_id, prompt_ids, max_new_tokens, temperature, top_k, top_p)


class ScriptedTokenizer:
    """Words to ids (no chat template: the workload runs with ``chat_template=False``)."""

    eos_token_id = 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [2 + len(w) % 50 for w in text.split()][:40]}
