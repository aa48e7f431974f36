"""Bring your own: the stand-ins of a GPU user's setup, for whole-pipeline tests on CPU.

The one home of the tests' "user's own models" (builders in ``byo_models.py``). A user brings a
target folder (``save_pretrained``), maybe a smaller draft model of the same family, and EAGLE-3
heads as they are published. These session fixtures write each once (seconds, no download) and
return its folder, to pass as ``--target DIR``, ``--drafter DIR`` or ``--drafter eagle3:DIR`` in
float32 or bfloat16 (``--dtype``):

- ``my_target``: a random Llama (8 layers, hidden size and head_dim 64, 2 query heads over 1 KV head,
  untied output), a byte-level BPE tokenizer of 1,024 ids with a ChatML template saved beside it;
  vocab_size = the tokenizer's length. Loads in draftrl and in vLLM's CPU build.
- ``my_draft``: a 2-layer Llama with the same tokenizer (the target's first layers, norm and output
  rows), its embedding matrix padded by 64 rows past the tokenizer: compared with the target over the
  tokenizer's ids (vLLM: ``use_heterogeneous_vocab``).
- ``my_eagle_head_bin``: an EAGLE-3 head in the EAGLE / SpecForge layout (``LlamaForCausalLMEagle3``),
  ``pytorch_model.bin``, scoring the whole vocabulary (no ``d2t`` / ``t2d``).
- ``my_eagle_head_safetensors``: the same layout in ``model.safetensors``, a 256-token draft vocabulary
  (``d2t``, ``t2d``).
- ``my_speculators_head``: the speculators layout without its optional keys (no
  ``eagle_aux_hidden_state_layer_ids``: the target's default (2, 4, 5); no ``norm_before_residual``:
  False, as speculators defines it; no ``target_hidden_size``), 256-token draft vocabulary. vLLM 0.32's
  speculators reader takes the absent ``norm_before_residual`` as True, so vLLM would draft other tokens
  with this folder than draftrl does: an export states the key in its copy.
- ``my_one_token_head``: the speculators layout with every key (as ``draftrl distill`` writes it) and a
  one-token draft vocabulary, the token the target writes most often on the suite's workload
  (``byo_models.most_written_token``): its drafts are accepted wherever the target writes it, so a
  head's accepted drafts are tested too.

Every head is built from ``my_target`` (aux layers (2, 4, 5); ``draftrl distill``'s untrained
starting point: ``fc`` passing layer 5's input through, the target's output rows) and lists it as
its verifier; the other heads' drafts are rarely accepted (the draft model's often: the target's later
layers are scaled down), so they test plumbing and exactness, not speed.

``byo_pipeline(drafter, dtype)`` is the user's path on them, through the real CLI with a copy of
``configs/demo_quick_cpu.yaml`` (``byo_steps.byo_config``): ``draftrl calibrate``, ``collect``, ``train`` and
``grid``, run once per (drafter fixture, dtype) for the whole session and shared by the tests that
check each step, evaluate and export.

For every test here: ``DRAFTRL_KERNELS=stock`` (the kernel probe is pointless on models this small,
and its plan, keyed by the folder's name, would stay in the user's cache), wandb disabled, one torch
thread (these models are too small to gain from two, and a busy 2-core machine stalls OpenMP's
spinning threads).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from byo_models import build_draft, build_head, build_target, most_written_token
from byo_steps import Pipeline, byo_config, byo_settings, cli, drafter_spec


@pytest.fixture(autouse=True)
def byo_test_settings():
    """Each test here runs under :func:`byo_steps.byo_settings` (the session fixtures' commands do too,
    through ``byo_steps.cli``). Per test, not per session: a session-wide setting outlived these tests
    and forced the stock layout and one thread on every model the rest of the session loaded."""
    with byo_settings():
        yield


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


@pytest.fixture(scope="session")
def my_one_token_head(my_target, tmp_path_factory) -> Path:
    return build_head(tmp_path_factory.mktemp("byo") / "my-head-one-token", my_target, layout="speculators",
                      weights="safetensors", draft_ids=[most_written_token(my_target)])


@pytest.fixture(scope="session")
def byo_pipeline(request, my_target, tmp_path_factory):
    """``byo_pipeline(drafter, dtype)``: ``byo_steps.Pipeline`` after ``draftrl calibrate``, ``collect``, ``train``
    (``--traces``) and ``grid`` with ``byo_steps.byo_config``, each run once per (drafter fixture, dtype)."""
    done: dict[tuple[str, str], Pipeline] = {}

    def pipeline(drafter: str, dtype: str) -> Pipeline:
        if (drafter, dtype) not in done:
            folder = request.getfixturevalue(drafter)
            root = tmp_path_factory.mktemp(f"{drafter}-{dtype}")
            p = Pipeline(drafter, folder, dtype, my_target,
                         byo_config(root / "my_demo.yaml", my_target, drafter_spec(drafter, folder), dtype),
                         root / "cost_table.json", root / "traces", root / "ppo_size", root / "grid")
            cli("calibrate", "--config", p.config, "--out", p.cost_table)
            cli("collect", "--config", p.config, "--cost-table", p.cost_table, "--out", p.traces)
            cli("train", "--config", p.config, "--traces", p.traces, "--out", p.run)
            cli("grid", "--config", p.config, "--out", p.grid, "--quiet")
            done[drafter, dtype] = p
        return done[drafter, dtype]

    return pipeline
