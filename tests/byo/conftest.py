"""Bring your own: the stand-ins of a GPU user's setup, for whole-pipeline tests on CPU.

A user brings a target folder (``save_pretrained``), maybe a smaller draft model of the same
family, and EAGLE-3 heads as they are published. These session fixtures write each once (seconds,
no download; builders in ``byo_models.py``) and return its folder, to pass as ``--target DIR``,
``--drafter DIR`` or ``--drafter eagle3:DIR`` in float32 or bfloat16 (``--dtype``):

| fixture | folder |
|---|---|
| ``my_target`` | a random Llama (8 layers, hidden size and head_dim 64, 2 query heads over 1 KV head, untied output), a byte-level BPE tokenizer of 1,024 ids with a ChatML template saved beside it; vocab_size = the tokenizer's length. Loads in draftrl and in vLLM's CPU build |
| ``my_draft`` | a 2-layer Llama with the same tokenizer (the target's first layers, norm and output rows), its embedding matrix padded by 64 rows past the tokenizer: compared with the target over the tokenizer's ids |
| ``my_eagle_head_bin`` | an EAGLE-3 head in the EAGLE / SpecForge layout (``LlamaForCausalLMEagle3``), ``pytorch_model.bin``, scoring the whole vocabulary (no ``d2t`` / ``t2d``) |
| ``my_eagle_head_safetensors`` | the same layout in ``model.safetensors``, a 256-token draft vocabulary (``d2t``, ``t2d``) |
| ``my_speculators_head`` | the speculators layout without its optional keys (no ``eagle_aux_hidden_state_layer_ids``: the target's default (2, 4, 5); no ``norm_before_residual``: False, as speculators defines it; no ``target_hidden_size``), 256-token draft vocabulary. vLLM 0.32's speculators reader takes the absent ``norm_before_residual`` as True, so vLLM drafts other tokens with this head than draftrl does: compare draft tokens across the two on the other heads (whose config states it: True) |

Every head is built from ``my_target`` (aux layers (2, 4, 5); ``draftrl distill``'s untrained
starting point: ``fc`` passing layer 5's input through, the target's output rows) and lists it as
its verifier; their drafts are rarely accepted (the draft model's often: the target's later layers
are scaled down), so they test plumbing and exactness, not speed. ``DRAFTRL_KERNELS=stock`` for these tests: the kernel probe is pointless on models this
small, and its plan, keyed by the folder's name, would stay in the user's cache.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from byo_models import build_draft, build_head, build_target


@pytest.fixture(autouse=True)
def stock_kernels(monkeypatch):
    """Per test, not per session: a session-wide setting outlived these tests and forced the stock
    layout on every model the rest of the session loaded (the smollm2 fixture among them)."""
    monkeypatch.setenv("DRAFTRL_KERNELS", "stock")


@pytest.fixture(scope="session")
def my_target(tmp_path_factory) -> Path:
    return build_target(tmp_path_factory.mktemp("byo") / "my-target")


@pytest.fixture(scope="session")
def my_draft(my_target, tmp_path_factory) -> Path:
    return build_draft(tmp_path_factory.mktemp("byo") / "my-draft", my_target)


@pytest.fixture(scope="session")
def my_eagle_head_bin(my_target, tmp_path_factory) -> Path:
    return build_head(tmp_path_factory.mktemp("byo") / "my-head-bin", my_target, layout="eagle", weights="bin")


@pytest.fixture(scope="session")
def my_eagle_head_safetensors(my_target, tmp_path_factory) -> Path:
    return build_head(tmp_path_factory.mktemp("byo") / "my-head-safetensors", my_target, layout="eagle",
                      weights="safetensors", draft_vocab_size=256)


@pytest.fixture(scope="session")
def my_speculators_head(my_target, tmp_path_factory) -> Path:
    return build_head(tmp_path_factory.mktemp("byo") / "my-head-speculators", my_target, layout="speculators",
                      weights="safetensors", draft_vocab_size=256, bare=True)
