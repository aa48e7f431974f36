"""Where a model's weights go when one device cannot hold it: ``device_map`` and ``max_memory``.

A target larger than one GPU is split by transformers / accelerate
(``from_pretrained(device_map=..., max_memory=...)``): ``auto`` / ``balanced`` /
``balanced_low_0`` / ``sequential`` fill the visible GPUs (``max_memory`` caps each, e.g.
``{0: "70GiB", 1: "70GiB"}``), or an explicit map sends each module to a device
(``{"model.embed_tokens": 0, "model.layers.0": 0, ..., "lm_head": 1}``). accelerate's hooks move
the activations from one device to the next inside the forward, and return the logits on the
device of the inputs.

draftrl times rounds, so a split over devices of different kinds (GPUs and CPU offload, or disk)
is refused unless asked for: its seconds are mostly PCIe transfers of weights, which no cost
table of GPU rounds predicts and which change with the split. Every refusal is one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The named strategies of transformers' ``device_map``.
DEVICE_MAP_PRESETS: tuple[str, ...] = ("auto", "balanced", "balanced_low_0", "sequential")


def device_kind(device: str | int) -> str:
    """``cuda`` for a GPU index or a ``cuda[:N]`` string, else the device's type (``cpu``, ``mps``, ``disk``)."""
    if isinstance(device, int) and not isinstance(device, bool):
        return "cuda"
    if str(device) == "disk":
        return "disk"
    import torch

    return torch.device(str(device)).type


def check_placement(device: str | int, where: str) -> None:
    """Refuse a device that is not a torch device, or that this machine lacks, in one line."""
    import torch

    if isinstance(device, bool) or not isinstance(device, (int, str)):
        raise ValueError(f"{where}={device!r} is not a device; use a GPU index (0), cuda:N or cpu.")
    if device == "disk":
        raise ValueError(f"{where}='disk': offloading weights to disk is not supported (every forward would read "
                         "them back); give the model more GPUs, or a smaller dtype.")
    try:
        torch_device = torch.device(f"cuda:{device}" if isinstance(device, int) else device)
    except RuntimeError:
        raise ValueError(f"{where}={device!r} is not a torch device; use a GPU index (0), cuda:N or cpu.") from None
    if torch_device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = torch_device.index or 0
        if index >= count:
            raise ValueError(f"{where}={device!r} but this machine sees {count} CUDA GPU(s)"
                             f"{'' if count else ' (this torch build or CUDA_VISIBLE_DEVICES hides them)'}; "
                             "name a device it has.")


def check_device_map(device_map: str | Mapping[str, Any] | None, max_memory: Mapping[Any, Any] | None = None, *,
                     mixed_devices: bool = False, where: str = "env") -> None:
    """Refuse, before anything loads, a ``device_map`` / ``max_memory`` draftrl cannot time.

    :param device_map: None (the whole model on ``env.device``), a preset of
        :data:`DEVICE_MAP_PRESETS`, or a mapping module name -> device (GPU index, ``cuda:N``, ``cpu``).
    :param max_memory: device -> limit (``"70GiB"`` or bytes), read with a preset; its keys are
        the devices the preset may fill.
    :param mixed_devices: allow devices of different kinds in one model (timings then mix them).
    """
    if device_map is None:
        if max_memory is not None:
            raise ValueError(f"{where}.max_memory is read with {where}.device_map only; set {where}.device_map: auto "
                             f"(or balanced), or drop {where}.max_memory.")
        return
    if isinstance(device_map, str):
        if device_map not in DEVICE_MAP_PRESETS:
            raise ValueError(f"{where}.device_map={device_map!r} is not a preset; use one of "
                             f"{', '.join(DEVICE_MAP_PRESETS)}, or a mapping module -> device.")
        devices = list(max_memory or {})
    elif isinstance(device_map, Mapping):
        if not device_map:
            raise ValueError(f"{where}.device_map is empty; map every module to a device, or use device_map: auto.")
        if max_memory is not None:
            raise ValueError(f"{where}.max_memory is read with a preset device_map (auto, balanced, ...); an explicit "
                             "map already says where every module goes: drop max_memory.")
        devices = list(device_map.values())
    else:
        raise ValueError(f"{where}.device_map={device_map!r} must be a preset ({', '.join(DEVICE_MAP_PRESETS)}) "
                         "or a mapping module -> device.")
    if max_memory is not None and not isinstance(max_memory, Mapping):
        raise ValueError(f"{where}.max_memory={max_memory!r} must be a mapping device -> limit, e.g. "
                         "{0: 70GiB, 1: 70GiB}.")
    for device in devices:
        check_placement(device, f"{where}.{'device_map' if isinstance(device_map, Mapping) else 'max_memory'} device")
    check_kinds(devices, mixed_devices, where)


def check_kinds(devices, mixed_devices: bool, where: str = "env") -> None:
    """Refuse one model spread over devices of different kinds unless ``mixed_devices``."""
    kinds = sorted({device_kind(d) for d in devices})
    if len(kinds) > 1 and not mixed_devices:
        raise ValueError(f"{where}.device_map puts the model on {' and '.join(kinds)}: a round timed across device "
                         "kinds is mostly weight transfers, which no cost table predicts; keep the model on one kind "
                         f"(more GPUs, or {where}.max_memory without cpu), or set {where}.mixed_devices=true to time "
                         "it anyway.")


def device_name(device: str | int) -> str:
    """One spelling per device: ``cuda:N`` for a GPU index, ``cuda`` or ``cuda:N``, else the device's type."""
    if isinstance(device, int) and not isinstance(device, bool):
        return f"cuda:{device}"
    import torch

    one = torch.device(str(device))
    return f"cuda:{one.index or 0}" if one.type == "cuda" else one.type


def check_main_device(device: str, devices, where: str = "env") -> None:
    """Refuse a ``device`` (where the inputs and the logits of a split model live) that holds none of it."""
    names = sorted({device_name(d) for d in devices})
    if device_name(device) not in names:
        raise ValueError(f"{where}.device={device!r} holds no part of the target that {where}.device_map put on "
                         f"{', '.join(names)}; set {where}.device to the first of them ({names[0]}): the inputs, "
                         "the logits and the timing clock live there.")


def model_devices(model) -> list:
    """The devices ``model``'s weights live on (its ``hf_device_map`` after a split load), sorted by name."""
    placed = getattr(model, "hf_device_map", None)
    if placed:
        return sorted({d for d in placed.values()}, key=str)
    return sorted({str(p.device) for p in model.parameters()})
