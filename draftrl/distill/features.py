"""The target's hidden states, computed once per sample and cached, and the draft vocabulary.

Per sample (``features/NNNNN.safetensors``): ``ids`` [T], ``aux`` [T, len(aux_layers) * H] (the
inputs of the target's auxiliary layers, what the head reads), ``final`` [T, H] (the target's
last hidden state after its norm: with the LM head's rows of the draft vocabulary it gives the
target's distribution the head is distilled against) and ``loss_mask`` [T] (1 where the target's
distribution is a label: every position but the last with ``loss_on_prompt``, else those whose
next token is a response token), stored in the target's dtype.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch
from safetensors.torch import load_file, save

from draftrl.distill.data import Sample
from draftrl.io import atomic_write_bytes


@torch.inference_mode()
def cache_features(model, samples: list[Sample], aux_layers: tuple[int, ...], folder: Path, progress=None,
                   loss_on_prompt: bool = True) -> None:
    """Write each sample's features to ``folder`` (a rerun skips the files already there)."""
    folder.mkdir(parents=True, exist_ok=True)
    device = next(model.parameters()).device
    for index, sample in enumerate(samples):
        path = folder / f"{index:05d}.safetensors"
        if not path.exists():
            ids = sample.prompt_ids + sample.response_ids
            out = model.model(input_ids=torch.tensor([ids], device=device), output_hidden_states=True)
            mask = torch.zeros(len(ids), dtype=torch.bool)
            mask[0 if loss_on_prompt else len(sample.prompt_ids) - 1 : len(ids) - 1] = True
            tensors = {"ids": torch.tensor(ids), "loss_mask": mask,
                       "aux": torch.cat([out.hidden_states[layer][0] for layer in aux_layers], dim=-1).cpu(),
                       "final": out.last_hidden_state[0].cpu()}
            atomic_write_bytes(path, save({k: v.contiguous() for k, v in tensors.items()}))  # whole or not at all
        if progress is not None:
            progress(index + 1, len(samples), sample.id)


def load_features(folder: Path, count: int) -> list[dict[str, torch.Tensor]]:
    return [load_file(str(folder / f"{i:05d}.safetensors")) for i in range(count)]


def draft_vocabulary(samples: list[Sample], size: int, vocab_size: int) -> torch.Tensor:
    """[size] target ids, sorted: the most frequent tokens of the responses, then of the prompts
    (ties by id), then the lowest ids not yet chosen."""
    counts = Counter(t for s in samples for t in s.response_ids)
    prompt_counts = Counter(t for s in samples for t in s.prompt_ids)
    ranked = sorted(set(counts) | set(prompt_counts), key=lambda t: (-counts[t], -prompt_counts[t], t))
    chosen = ranked[:size]
    taken = set(chosen)
    chosen += [t for t in range(vocab_size) if t not in taken][: size - len(chosen)]
    return torch.tensor(sorted(chosen))
