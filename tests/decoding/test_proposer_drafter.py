"""The vLLM proposer takes its drafter by name from the one registry (no vLLM needed here)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from draftrl.decoding.vllm.engine import VLLMEngineConfig
from draftrl.decoding.vllm.proposer import SERVING_DRAFTER, DraftrlProposer

IDS = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2]  # "1 2" went on "3 4" first and "3 5" last


def proposer(**config) -> DraftrlProposer:
    vllm_config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=2),
                                  model_config=SimpleNamespace(max_model_len=64))
    out = DraftrlProposer(vllm_config)
    if config:
        out.configure(config)
    return out


def drafts(p: DraftrlProposer) -> list[int]:
    return p.propose([[IDS[-1]]], np.array([len(IDS)]), np.array([IDS]))[0]


def test_the_default_drafter_continues_the_latest_occurrence():
    assert proposer().drafter_spec == SERVING_DRAFTER and drafts(proposer()) == [3, 5]


def test_a_config_names_another_drafter_from_the_registry():
    assert drafts(proposer(drafter="ngram:1:3")) == [3, 4]  # the earliest occurrence, as vLLM's ngram


@pytest.mark.parametrize("spec", ["layerskip:2", "self"])
def test_drafters_that_need_the_target_are_refused_in_one_line(spec: str):
    with pytest.raises(ValueError, match=r"needs the target model.*ngram\[:MIN:MAX") as info:
        proposer(drafter=spec)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="needs the target model"):
        VLLMEngineConfig(drafter=spec)  # before vLLM loads anything


def test_none_is_refused_with_the_method_that_means_it():
    with pytest.raises(ValueError, match="method none"):
        proposer(drafter="none")
