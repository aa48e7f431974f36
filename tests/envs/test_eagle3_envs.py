"""The env layer with a drafter that reads the target's hidden states (EAGLE-3): ``collect``
proposes from every prefix of the recorded sequence the same tree the engine drafts live from that
history, so TraceReplay trains on the head's real proposals, and calibration times real drafts
(before, both found no features and drafted nothing: drafting looked free)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from tiny_eagle3 import WordTokenizer, tiny_pair

from draftrl.config.env import EnvConfig
from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
from draftrl.drafters.eagle3 import Eagle3Drafter
from draftrl.models.distribution import SamplingParams
from draftrl.replay.calibrate import measure_draft
from draftrl.replay.traces import collect


def test_calibration_times_drafts_the_head_really_makes():
    target, head = tiny_pair()
    drafter = Eagle3Drafter(head, target)
    grown = []
    begin = drafter.begin

    def recording_begin(*args):
        builder = begin(*args)
        grown.append(builder)
        return builder

    drafter.begin = recording_begin
    clock = time.perf_counter
    with torch.inference_mode():
        base, levels = measure_draft(drafter, list(range(1, 30)), (1,), 3, 2, np.random.default_rng(0), clock, target)
    assert [len(b.tree) for b in grown] == [3, 3] and base > 0 and levels[0] > 0
    with pytest.raises(ValueError, match="pass target="):
        measure_draft(drafter, list(range(1, 30)), (1,), 3, 2, np.random.default_rng(0), clock)
    drafter.close()


def test_collect_replays_the_heads_live_proposals_from_every_prefix(tmp_path):
    target, head = tiny_pair()
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "x", "language": "en", "task": "chat", "split": "tune", '
                       '"prompt": "a few words of a prompt for the tiny target to read", "max_new_tokens": 12}\n')
    config = EnvConfig(prompts=str(prompts), split="tune", languages=("en",), tasks=("chat",), max_new_tokens=12,
                       depths=(0, 1, 3), chat_template=False, ignore_eos=True)
    drafter = Eagle3Drafter(head, target)
    engine = SpeculativeDecoder(target, drafter, EngineConfig(max_new_tokens=12))
    traces = collect(config, engine, WordTokenizer())

    prompt = traces.prompt_tokens.tolist()
    cont = traces.continuation.tolist()
    live = SpeculativeDecoder(target, Eagle3Drafter(head, target), EngineConfig(max_new_tokens=12))
    nodes = traces.cu_num_nodes
    for t in range(len(cont)):
        prefix = prompt + cont[:t]
        live.start(prefix, prefill=t > 0)  # as every engine round sees it: the first one verifies inside the prefill
        levels = min(3, 12 - t - 1)
        expected = live.drafter.propose(prefix, levels, 1, SamplingParams(), None).tokens
        recorded = traces.node_tokens[nodes[t] : nodes[t + 1]].tolist()
        assert recorded == expected and (len(expected) == (levels if t > 0 else 0))
        assert np.any(traces.draft_features[t] != 0) == (t > 0)
    drafter.close()
