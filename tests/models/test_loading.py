"""load_model: the real SmolLM2 default, the cache, and one-line errors that name the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from draftrl.models import fetch as fetch_module
from draftrl.models import has_fast_linear, kernel_plan, list_models, load_model, loading


def test_default_model_is_ready_for_inference(smollm2) -> None:
    model = smollm2.model
    assert smollm2.name == "smollm2-135m"
    assert not model.training
    assert not any(p.requires_grad for p in model.parameters())
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, as in the GGUF
    assert kernel_plan(model).kernels == "auto"  # CPU default: the layout measured fastest here
    assert len(smollm2.tokenizer) == model.config.vocab_size == 49152
    assert smollm2.tokenizer.chat_template is not None


def test_default_model_generates_greedily(smollm2) -> None:
    tokenizer = smollm2.tokenizer
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.inference_mode():
        out = smollm2.model.generate(**inputs, max_new_tokens=8, do_sample=False)
    text = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in text


def test_second_load_uses_the_cache(smollm2, monkeypatch: pytest.MonkeyPatch) -> None:
    def must_not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("the cached copy should have been used")

    monkeypatch.setattr(fetch_module, "download_wheel", must_not_run)
    monkeypatch.setattr(fetch_module, "convert_gguf", must_not_run)
    assert list_models()[0].cached
    again = load_model("smollm2-135m", kernels="stock")
    assert not has_fast_linear(again.model)
    assert torch.equal(again.model.lm_head.weight, smollm2.model.lm_head.weight)


def test_missing_local_path(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError) as info:
        load_model(str(missing))
    message = str(info.value)
    assert "\n" not in message and str(missing) in message and "does not exist" in message
    assert "smollm2-135m" in message


def test_directory_without_config(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        load_model(str(tmp_path))


def test_unreachable_hub_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(*args: object, **kwargs: object) -> None:
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files.\nCheck your connection.")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", offline)
    monkeypatch.setattr(loading, "_hub_reachable", lambda timeout=3.0: True)  # the hub answers, the load fails
    with pytest.raises(FileNotFoundError) as info:
        load_model("SomeOrg/some-model")
    message = str(info.value)
    assert "\n" not in message
    assert "'SomeOrg/some-model'" in message and "couldn't connect" in message and "smollm2-135m" in message


@pytest.mark.parametrize("why", ["HF_HUB_OFFLINE", "unreachable"])
def test_unknown_name_fails_at_once_without_a_hub(monkeypatch: pytest.MonkeyPatch, why: str) -> None:
    """A typo (``--drafter foo``) is refused before transformers spends a minute on hub retries."""
    import time

    calls = []
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: calls.append(a))
    if why == "HF_HUB_OFFLINE":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setattr(loading, "_hub_reachable", lambda timeout=3.0: False)
    start = time.perf_counter()
    with pytest.raises(FileNotFoundError, match="'foo' is neither a known name nor an existing directory") as info:
        loading.check_model_spec("foo", "drafter")
    with pytest.raises(FileNotFoundError):
        load_model("foo")
    assert time.perf_counter() - start < 1.0 and not calls
    assert "\n" not in str(info.value) and "smollm2-135m" in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dtype": "fp32"}, "dtype='fp32' is not supported"),
        ({"device": "gpu"}, "device='gpu' is not a torch device"),
        ({"kernels": "fast"}, "kernels='fast' is not a kernel choice; use one of auto, stock, fast_linear"),
        pytest.param(
            {"device": "cuda"},
            "sees no CUDA GPU",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="only without CUDA"),
        ),
    ],
)
def test_bad_options(kwargs: dict[str, str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        load_model("smollm2-135m", **kwargs)
