"""Real-vLLM tests: marked ``vllm``, skipped with the install command when vLLM is missing.

Loading an engine takes seconds, so every test module shares the process's engines through
``draftrl.decoding.vllm.engine.shared_engine`` (one per config) and keeps to a few short requests.
"""

from __future__ import annotations

import pytest

from draftrl.decoding.vllm.engine import INSTALL_CPU, vllm_available


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason=f"vllm is not installed ({INSTALL_CPU})")
    for item in items:
        if "tests/real_vllm/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.vllm)
            if not vllm_available():
                item.add_marker(skip)


@pytest.fixture(scope="session")
def vllm_tokenizer():
    from transformers import AutoTokenizer

    from draftrl.decoding.vllm.engine import model_path

    return AutoTokenizer.from_pretrained(model_path("smollm2-135m"))


@pytest.fixture(scope="session")
def mixed_prompts(vllm_tokenizer):
    """Four held-out prompts: four languages, four tasks (code edit copies the prompt most)."""
    from draftrl.prompts import load_prompts

    picks = [("en", "code_edit"), ("it", "summarize"), ("zh", "qa_context"), ("es", "code_edit")]
    prompts = load_prompts(None, split="heldout")
    chosen = [next(p for p in prompts if (p.language, p.task) == pick) for pick in picks]
    return [(p.id, vllm_tokenizer(p.prompt, add_special_tokens=False)["input_ids"]) for p in chosen]


@pytest.fixture(scope="session", params=["built", "shipped"])
def eagle3_head(request, tmp_path_factory, vllm_tokenizer):
    """An EAGLE-3 head folder for SmolLM2-135M, each test running with both:

    - ``built``: made in a second, random weights and a one-token draft vocabulary, the newline, so
      every draft is a newline; the target writes newlines often enough here (each reply to
      ``mixed_prompts`` starts with two) that greedy identity is checked on accepted drafts too;
    - ``shipped``: the trained head draftrl ships (``draftrl.drafters.packaged``), float16 weights
      that vLLM loads into its float32 model: most of its drafts are accepted.
    """
    from draftrl.decoding.vllm.engine import model_path
    from draftrl.drafters.eagle3 import random_head
    from draftrl.drafters.packaged import packaged_head

    if request.param == "shipped":
        return str(packaged_head("smollm2-135m"))
    head = random_head(model_path("smollm2-135m"), draft_vocab_size=1)
    head.set_draft_vocab(vllm_tokenizer("\n", add_special_tokens=False)["input_ids"])
    return str(head.save_pretrained(tmp_path_factory.mktemp("eagle3") / "head", speculative_tokens=3))
