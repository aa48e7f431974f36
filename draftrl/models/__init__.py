"""Load draft/target models and check that a pair shares one vocabulary. Knows nothing about RL.

- :func:`load_model` -> :class:`LoadedModel` (``model``, ``tokenizer``, ``name``); :func:`shared_model`
  loads one copy per process for every env and engine of that process
- :func:`check_same_vocab` raises ``ValueError`` naming the first token id that differs;
  :func:`shared_vocab` checks that too and says which ids a draft model may propose when the two
  embedding matrices are padded differently (:class:`SharedVocab`)
- :func:`check_model_spec`: a name that is neither known, a directory nor reachable fails at once;
  :func:`model_name`, :func:`model_config`, :func:`check_device`: a target's name, its config and
  the device, read and checked without loading weights;
  :func:`model_folder`: the local folder of any spec (a hub id's snapshot in the Hugging Face cache)
- :func:`list_models` / :func:`fetch_model`: the known names and their cache
- :func:`apply_kernels` / :func:`kernel_plan`: the few-token CPU layout chosen by a timed probe
  (cached per machine); :func:`apply_fast_linear` / :func:`remove_fast_linear` switch it by hand
- :mod:`~draftrl.models.distribution` (logits -> the sampled distribution, the one draw) and
  :mod:`~draftrl.models.kv` (KV-cache bookkeeping): what drafters and the engine both use
"""

from draftrl.models.fast_linear import apply_fast_linear, has_fast_linear, remove_fast_linear
from draftrl.models.fetch import fetch_model
from draftrl.models.kernels import KERNELS, KernelPlan, apply_kernels, kernel_plan, stock_kernels
from draftrl.models.loading import (
    LoadedModel,
    check_device,
    check_model_spec,
    load_model,
    model_config,
    model_folder,
    model_name,
    shared_model,
)
from draftrl.models.registry import DEFAULT_MODEL, ModelInfo, cache_root, list_models
from draftrl.models.vocab import SharedVocab, check_same_vocab, shared_vocab

__all__ = [
    "DEFAULT_MODEL",
    "KERNELS",
    "KernelPlan",
    "LoadedModel",
    "ModelInfo",
    "SharedVocab",
    "apply_fast_linear",
    "apply_kernels",
    "cache_root",
    "check_device",
    "check_model_spec",
    "check_same_vocab",
    "fetch_model",
    "has_fast_linear",
    "kernel_plan",
    "list_models",
    "load_model",
    "model_config",
    "model_folder",
    "model_name",
    "remove_fast_linear",
    "shared_model",
    "shared_vocab",
    "stock_kernels",
]
