"""Self-speculation: the target's first N decoder layers draft for it (no extra weights)."""

from __future__ import annotations

import copy

from torch import nn

from draftrl.drafters.model import ModelDrafter


def layer_skip_model(target: nn.Module, num_layers: int) -> nn.Module:
    """A self-speculative draft: the target's first ``num_layers`` decoder layers, its final norm
    and its LM head, sharing the target's weights (no extra memory, no extra files)."""
    inner = getattr(target, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(
            f"layer-skip drafting needs a decoder with model.layers (Llama/Qwen/Mistral style); "
            f"{type(target).__name__} has none; use --drafter ngram or a draft model path."
        )
    if not 1 <= num_layers < len(layers):
        raise ValueError(
            f"layerskip:{num_layers} must keep between 1 and {len(layers) - 1} of the target's {len(layers)} layers."
        )
    draft = copy.copy(target)  # shallow: shares every parameter
    draft._modules = dict(target._modules)
    draft_inner = copy.copy(inner)
    draft_inner._modules = dict(inner._modules)
    draft_inner.layers = nn.ModuleList(list(layers)[:num_layers])
    draft._modules["model"] = draft_inner
    draft.config = copy.copy(target.config)
    draft.config.num_hidden_layers = num_layers
    draft_inner.config = draft.config
    return draft


class LayerSkipDrafter(ModelDrafter):
    """:class:`ModelDrafter` over :func:`layer_skip_model` of the target."""

    def __init__(self, target: nn.Module, num_layers: int, sampled: bool = False):
        super().__init__(layer_skip_model(target, num_layers), sampled=sampled, name=f"layerskip:{num_layers}")
