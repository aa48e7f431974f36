"""``VLLMEngineConfig`` with vLLM's own EAGLE-3 (no vLLM needed: the config is checked before vLLM loads)."""

from __future__ import annotations

import pytest

from draftrl.decoding.vllm.engine import VLLMEngineConfig
from draftrl.drafters.eagle3 import random_head
from draftrl.models.fetch import fetch_model


def test_eagle3_names_its_method_and_head_and_the_head_belongs_to_eagle3_only(tmp_path):
    head = str(random_head(fetch_model("smollm2-135m", quiet=True), 16).save_pretrained(tmp_path / "eagle3-head"))
    config = VLLMEngineConfig(method="eagle3", head=head, num_speculative_tokens=3)
    # the method is named: vLLM re-detects a path containing "eagle3" otherwise
    assert config.speculative_config() == {"method": "eagle3", "model": head, "num_speculative_tokens": 3}
    with pytest.raises(ValueError, match="method='eagle3' needs head=DIR"):
        VLLMEngineConfig(method="eagle3")
    with pytest.raises(ValueError, match="method='eagle3' needs head=DIR"):
        VLLMEngineConfig(method="ngram", head=head)
    with pytest.raises(FileNotFoundError, match="no EAGLE-3 head folder"):
        VLLMEngineConfig(method="eagle3", head=str(tmp_path))
