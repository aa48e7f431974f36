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


def test_the_memory_share_is_checked_and_the_eager_rule_follows_the_platform(tmp_path):
    """``gpu_memory_utilization`` in (0, 1]; ``enforce_eager`` None means CUDA graphs on a GPU and
    eager on CPU; the head in draftrl's proposer runs eager whatever is asked, and asking for
    compiled forwards with it is refused (its hooks would never run)."""
    assert VLLMEngineConfig(gpu_memory_utilization=0.45).gpu_memory_utilization == 0.45
    for bad in (0.0, 1.2, -0.1):
        with pytest.raises(ValueError, match=rf"gpu_memory_utilization={bad} must be in \(0, 1\]"):
            VLLMEngineConfig(gpu_memory_utilization=bad)
    auto, eager, graphs = (VLLMEngineConfig(), VLLMEngineConfig(enforce_eager=True),
                           VLLMEngineConfig(enforce_eager=False))
    assert (auto.eager(on_gpu=True), auto.eager(on_gpu=False)) == (False, True)
    assert (eager.eager(on_gpu=True), graphs.eager(on_gpu=False)) == (True, False)
    head = str(random_head(fetch_model("smollm2-135m", quiet=True), 16).save_pretrained(tmp_path / "head"))
    route_b = VLLMEngineConfig(drafter=f"eagle3:{head}")
    assert route_b.runs_head and route_b.eager(on_gpu=True) and not auto.runs_head
    with pytest.raises(ValueError, match="enforce_eager=False with drafter='eagle3:.*hooks"):
        VLLMEngineConfig(drafter=f"eagle3:{head}", enforce_eager=False)


def test_custom_class_proposers_are_refused_on_a_forced_model_runner_v2(monkeypatch):
    """vLLM 0.32 runs custom_class on its V1 runner only (V2 raises NotImplementedError after
    loading the weights): a forced V2 is refused before anything loads; stock methods pass."""
    from draftrl.decoding.vllm.engine import check_model_runner

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    for method in ("draftrl", "custom_class"):
        config = VLLMEngineConfig(method=method, proposer="a.B" if method == "custom_class" else None)
        with pytest.raises(ValueError, match="VLLM_USE_V2_MODEL_RUNNER is set.*V1 model runner only"):
            check_model_runner(config)
    check_model_runner(VLLMEngineConfig(method="ngram", num_speculative_tokens=2))
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    check_model_runner(VLLMEngineConfig())


def _cached_hub_model(cache, repo: str, files: dict[str, str]):
    """A hub id's snapshot laid out as huggingface_hub caches it (no network here)."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    snapshot = folder / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("0123abcd")
    for name, text in files.items():
        (snapshot / name).write_text(text)
    return snapshot


def test_hub_ids_are_accepted_where_folders_are_and_refused_in_one_line_when_out_of_reach(tmp_path, monkeypatch):
    """vLLM's paths take a hub id as they take a folder: the target goes to vLLM as the id, a head
    resolves to its cached snapshot (draftrl reads its config first); an id neither cached nor
    reachable is refused at once, naming it."""
    import huggingface_hub.constants

    from draftrl.decoding.vllm.engine import model_path
    from draftrl.models import model_folder

    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    snapshot = _cached_hub_model(cache, "someone/tiny-llama", {"config.json": "{}"})
    assert model_path("someone/tiny-llama") == "someone/tiny-llama"
    assert model_folder("someone/tiny-llama") == snapshot
    with pytest.raises(ValueError, match="'someone/absent' is neither a known name nor an existing directory, and "
                                         "HF_HUB_OFFLINE is set"):
        model_path("someone/absent")
    with pytest.raises(FileNotFoundError, match="EAGLE-3 head 'someone/absent-head' is neither"):
        VLLMEngineConfig(method="eagle3", head="someone/absent-head")
    head = random_head(fetch_model("smollm2-135m", quiet=True), 16).save_pretrained(tmp_path / "saved")
    cached = _cached_hub_model(cache, "someone/eagle3-head", {})
    for name in ("config.json", "model.safetensors"):
        (cached / name).write_bytes((head / name).read_bytes())
    config = VLLMEngineConfig(method="eagle3", head="someone/eagle3-head", num_speculative_tokens=2)
    assert config.speculative_config()["model"] == "someone/eagle3-head"  # vLLM reads the same cache
    assert VLLMEngineConfig(drafter="eagle3:someone/eagle3-head").runs_head


def test_a_head_config_vllm_reads_otherwise_is_given_to_it_pinned(tmp_path, monkeypatch):
    """A speculators head without ``norm_before_residual`` (False to draftrl, True to vLLM 0.32) reaches
    vLLM as a cached folder whose config states False, its weights linked, made once; a head that states
    the key, and the EAGLE layout, reach vLLM as given."""
    import json

    from draftrl.decoding.vllm.engine import vllm_head
    from draftrl.drafters.eagle3_config import read_config

    monkeypatch.setenv("DRAFTRL_CACHE", str(tmp_path / "cache"))
    head = random_head(fetch_model("smollm2-135m", quiet=True), 16)
    stated = head.save_pretrained(tmp_path / "stated")
    bare = head.save_pretrained(tmp_path / "bare")
    data = json.loads((bare / "config.json").read_text())
    data.pop("norm_before_residual")
    (bare / "config.json").write_text(json.dumps(data))
    assert read_config(data, "bare").norm_before_residual is False

    pinned = vllm_head(str(bare))
    assert pinned != str(bare) and pinned.startswith(str(tmp_path / "cache" / "vllm_heads"))
    written = json.loads((tmp_path / "cache" / "vllm_heads" / pinned.rsplit("/", 1)[1] / "config.json").read_text())
    assert written == {**data, "norm_before_residual": False}
    weights = sorted(p.name for p in bare.iterdir() if p.name != "config.json")
    linked = [p for p in sorted((tmp_path / "cache" / "vllm_heads").glob("*/*")) if p.name != "config.json"]
    assert [p.name for p in linked] == weights and all(p.is_symlink() for p in linked)
    assert vllm_head(str(bare)) == pinned  # made once
    assert vllm_head(str(stated)) == str(stated)
    assert vllm_head(str(head.save_pretrained(tmp_path / "eagle", layout="eagle"))) == str(tmp_path / "eagle")
    assert vllm_head("org/some-hub-head") == "org/some-hub-head"
