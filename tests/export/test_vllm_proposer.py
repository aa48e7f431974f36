"""The vLLM ``custom_class`` adapter's per-request policy core without vLLM, driven with vLLM's
``propose`` arguments by a simulated greedy verifier (tests/export/test_vllm_bundle.py runs it in vLLM)."""

from __future__ import annotations

import numpy as np

from draftrl.export.controller import PolicyController
from draftrl.export.vllm_proposer import PolicyProposerCore

MAX_LEN = 256


class FixedDepth:
    """The real manifest; every request gets ``depth`` (act_batch, as the core calls it)."""

    def __init__(self, controller: PolicyController, depth: int):
        self.depth, self.batches = depth, []
        for name in ("kind", "manifest", "feature_names", "width", "depths", "verify_sizes", "path"):
            setattr(self, name, getattr(controller, name))

    def act_batch(self, obs: np.ndarray) -> np.ndarray:
        self.batches.append(np.array(obs))
        return np.tile([self.depth, 0], (len(obs), 1))


class Batch:
    """vLLM's persistent batch, as the proposer sees it: rows of tokens, and per step the sampled
    tokens. Each request's 'target' emits a fixed repeating text; drafts matching it are accepted."""

    def __init__(self, max_reqs: int = 4):
        self.token_ids_cpu = np.zeros((max_reqs, MAX_LEN), dtype=np.int32)
        self.num_tokens = np.zeros(max_reqs, dtype=np.int32)
        self.rows: list[dict] = []

    def add(self, prompt: list[int], truth: list[int]) -> None:
        row = len(self.rows)
        self.rows.append({"truth": truth, "pos": 0, "drafts": [], "sampled": []})
        self.token_ids_cpu[row, : len(prompt)] = prompt
        self.num_tokens[row] = len(prompt)
        self._emit(row, 1)  # the prefill's token

    def _emit(self, row: int, count: int) -> None:
        r = self.rows[row]
        tokens = r["truth"][r["pos"]: r["pos"] + count]
        n = self.num_tokens[row]
        self.token_ids_cpu[row, n: n + len(tokens)] = tokens
        self.num_tokens[row] += len(tokens)
        r["pos"] += len(tokens)
        r["sampled"] = list(tokens)

    def verify(self, drafts: list[list[int]]) -> None:
        for row, draft in enumerate(drafts[: len(self.rows)]):
            r = self.rows[row]
            accepted = 0
            while accepted < len(draft) and draft[accepted] == r["truth"][r["pos"] + accepted]:
                accepted += 1
            self._emit(row, accepted + 1)

    def finish(self, row: int) -> None:
        """Remove a request; later rows move up (vLLM condenses its batch)."""
        del self.rows[row]
        self.token_ids_cpu[row:-1] = self.token_ids_cpu[row + 1:].copy()
        self.num_tokens[row:-1] = self.num_tokens[row + 1:].copy()
        self.num_tokens[-1] = 0

    def sampled(self) -> list[list[int]]:
        return [r["sampled"] for r in self.rows]


def repeating(start: int, period: int, length: int) -> list[int]:
    return [start + (i % period) for i in range(length)]


def test_core_tracks_requests_across_steps_and_row_moves(replay_exports):
    controller = FixedDepth(PolicyController(replay_exports["onnx"]), depth=4)
    core = PolicyProposerCore(controller, num_speculative_tokens=3, max_model_len=MAX_LEN)
    batch = Batch()
    batch.add(repeating(10, 5, 20), repeating(10, 5, 200))  # the continuation repeats the prompt's pattern
    batch.add(repeating(50, 7, 21), repeating(50, 7, 200))
    drafts = core.propose(batch.sampled(), batch.num_tokens, batch.token_ids_cpu)
    assert [len(d) for d in drafts] == [3, 3]  # depth 4 capped at num_speculative_tokens
    second = core.requests[1]
    for _ in range(4):
        batch.verify(drafts)
        drafts = core.propose(batch.sampled(), batch.num_tokens, batch.token_ids_cpu)
    assert all(r["sampled"] and len(r["sampled"]) == 4 for r in batch.rows)  # every n-gram draft accepted
    assert core.requests[1] is second
    names = list(controller.feature_names)
    last = controller.batches[-1]
    assert last[1, names.index("last_tokens_1")] == 4.0 and last[1, names.index("accept_rate_1")] > 0.5
    assert last[1, names.index("verify_cost_4")] > 1.0  # table costs: verifying 3 drafts costs more than 1 step
    # the first request finishes: the second moves to row 0 and keeps its history
    batch.verify(drafts)
    batch.finish(0)
    drafts = core.propose(batch.sampled(), batch.num_tokens, batch.token_ids_cpu)
    assert core.requests[0] is second and list(core.requests) == [0]
    assert len(drafts) == 1 and len(drafts[0]) == 3
    # a new request in the freed row starts with empty history
    batch.verify(drafts)
    batch.add(repeating(80, 3, 12), repeating(80, 3, 100))
    drafts = core.propose(batch.sampled(), batch.num_tokens, batch.token_ids_cpu)
    fresh = controller.batches[-1][1]
    assert fresh[names.index("last_tokens_1")] == 0.0 and core.requests[1] is not second


def test_core_applies_the_per_batch_cap_and_skips_prefilling_rows(replay_exports):
    controller = FixedDepth(PolicyController(replay_exports["onnx"]), depth=4)
    core = PolicyProposerCore(controller, num_speculative_tokens=4, max_model_len=MAX_LEN,
                              depth_by_batch=[[1, 1, 4], [2, 512, 1]])
    batch = Batch()
    batch.add(repeating(10, 5, 20), repeating(10, 5, 200))
    assert [len(d) for d in core.propose(batch.sampled(), batch.num_tokens, batch.token_ids_cpu)] == [4]
    batch.add(repeating(50, 7, 21), repeating(50, 7, 200))
    sampled = batch.sampled()
    sampled[1] = []  # still prefilling: vLLM passes no sampled tokens
    drafts = core.propose(sampled, batch.num_tokens, batch.token_ids_cpu)
    assert len(drafts[0]) == 1 and drafts[1] == []  # batch of 2: capped at k(2) = 1
