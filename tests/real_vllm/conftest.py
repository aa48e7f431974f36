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
