"""Load a causal LM and its tokenizer by one short spec, ready for inference.

``spec`` is a known name (``smollm2-135m``, fetched and converted once, see
:mod:`draftrl.models.fetch`), a local directory holding a transformers causal LM, or a model-hub
id. Every model comes back in eval mode with gradients off, because draftrl only runs inference.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from draftrl.models.fetch import fetch_model
from draftrl.models.kernels import KernelPlan, apply_kernels, resolve_kernels
from draftrl.models.placement import check_device_map, check_kinds, model_devices
from draftrl.models.registry import KNOWN_MODELS

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

#: Accepted ``dtype`` strings.
DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class LoadedModel:
    """A causal LM with its tokenizer."""

    model: PreTrainedModel
    """In eval mode, ``requires_grad`` off, on the requested device."""
    tokenizer: PreTrainedTokenizerBase
    name: str
    """The known name, the local directory's name, or the hub id."""
    kernels: KernelPlan | None = None
    """The linear-layer layout the model's few-token forwards use (see :mod:`draftrl.models.kernels`)."""

    @property
    def eos_token_ids(self) -> list[int]:
        """Every end-of-sequence id of the tokenizer and the model config, sorted.

        A config may hold one id or a list (Llama 3.x lists several: ``<|end_of_text|>``,
        ``<|eom_id|>``, ``<|eot_id|>``); decoding stops at any of them.
        """
        found: set[int] = set()
        for item in (self.tokenizer.eos_token_id, getattr(self.model.config, "eos_token_id", None)):
            if isinstance(item, (list, tuple)):
                found.update(int(t) for t in item)
            elif item is not None:
                found.add(int(item))
        return sorted(found)


def load_model(spec: str, *, dtype: str = "float32", device: str = "cpu", kernels: str | None = None,
               device_map: str | dict | None = None, max_memory: dict | None = None,
               mixed_devices: bool = False) -> LoadedModel:
    """Load the causal LM named by ``spec``.

    :param spec: ``smollm2-135m`` (or another name from :func:`~draftrl.models.list_models`),
        a local directory with ``config.json``, weights and tokenizer files, or a hub id such
        as ``HuggingFaceTB/SmolLM2-360M-Instruct`` (needs access to the hub). A known name wins
        over a directory of the same name; write ``./smollm2-135m`` for the directory.
    :param dtype: ``float32``, ``bfloat16`` or ``float16``.
    :param device: a torch device string, e.g. ``cpu`` or ``cuda:0``.
    :param kernels: the layout of few-token linear layers on CPU: ``auto`` (a timed probe, cached
        per machine / model / dtype / threads, picks what is fastest here), ``stock`` or
        ``fast_linear``; None reads ``$DRAFTRL_KERNELS`` (default ``auto``). Set the torch thread
        count first: the probe measures at the current one. See :mod:`draftrl.models.kernels`.
    :param device_map: split the model over devices (``device`` is then not read): a preset
        (``auto``, ``balanced``, ...) or a mapping module -> device, given to transformers'
        ``from_pretrained`` (accelerate dispatches it); see :mod:`draftrl.models.placement`.
    :param max_memory: device -> limit for a preset ``device_map`` (e.g. ``{0: "70GiB", 1: "70GiB"}``).
    :param mixed_devices: allow a split over devices of different kinds (GPUs and CPU offload).
    :raises ValueError: bad ``dtype``, ``device``, ``kernels`` or placement.
    :raises FileNotFoundError: the model could not be found or fetched; the message says what to pass instead.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    resolve_kernels(kernels)  # refuse a bad value before loading anything
    torch_dtype = _torch_dtype(dtype)
    check_device_map(device_map, max_memory, mixed_devices=mixed_devices)
    torch_device = _torch_device(device) if device_map is None else None
    placement = {} if device_map is None else {"device_map": device_map, "max_memory": max_memory}
    if spec in KNOWN_MODELS:
        source, name = str(fetch_model(spec)), spec
    else:
        source, name = _local_or_hub(spec)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype, **placement)
    except OSError as err:  # hub unreachable, unknown id, or files missing from a local directory
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise FileNotFoundError(
            f"could not load model {spec!r} ({reason}); pass a local directory with a transformers causal LM, "
            f"or one of: {', '.join(KNOWN_MODELS)}"
        ) from err
    if device_map is None:
        model.to(torch_device)
    else:  # "auto" decides at load time; a CPU offload it chose is refused as an explicit one is
        check_kinds(model_devices(model), mixed_devices)
    model.eval()
    model.requires_grad_(False)
    plan = apply_kernels(model, name, kernels)
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, kernels=plan)


#: Models loaded once per process (:func:`shared_model`), by (spec, dtype, device, kernels, placement).
_SHARED: dict[tuple, LoadedModel] = {}


def shared_model(spec: str, dtype: str = "float32", device: str = "cpu", kernels: str | None = None, *,
                 device_map: str | dict | None = None, max_memory: dict | None = None,
                 mixed_devices: bool = False) -> LoadedModel:
    """:func:`load_model`, loaded once per process and then reused: every env and engine made in one
    process with the same ``(spec, dtype, device, kernels)`` and placement gets the same loaded model
    object (models are never pickled into subprocesses: vectorise with ``SyncVectorEnv`` /
    ``DummyVecEnv``). Its few-token kernels are chosen at the first load, for the torch thread count
    set at that time."""
    def items(mapping):  # keys may mix GPU indices and names ({0: "70GiB", "cpu": "8GiB"})
        return mapping if not isinstance(mapping, dict) else tuple(sorted((str(k), str(v)) for k, v in mapping.items()))

    placement = None if device_map is None else (items(device_map), items(max_memory), mixed_devices)
    key = (spec, dtype, device, kernels) if placement is None else (spec, dtype, device, kernels, placement)
    if key not in _SHARED:
        _SHARED[key] = load_model(spec, dtype=dtype, device=device, kernels=kernels, device_map=device_map,
                                  max_memory=max_memory, mixed_devices=mixed_devices)
    return _SHARED[key]


def model_name(spec: str) -> str:
    """The name :func:`load_model` gives ``spec``'s model (``LoadedModel.name``), without loading
    anything: a known name as written, an existing directory's own name, else the hub id."""
    if spec in KNOWN_MODELS:
        return spec
    path = Path(spec).expanduser()
    return path.resolve().name if path.exists() else spec


def model_config(spec: str):
    """The ``transformers`` config of ``spec``'s model (its ``config.json`` only, no weights), to
    check a command's settings against the target before anything heavy loads or is written."""
    from transformers import AutoConfig

    source = str(fetch_model(spec, quiet=True)) if spec in KNOWN_MODELS else _local_or_hub(spec)[0]
    try:
        return AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise FileNotFoundError(f"could not read the config of model {spec!r} ({reason}); pass a directory saved "
                                f"with save_pretrained, or one of: {', '.join(KNOWN_MODELS)}") from err


def check_device(device: str) -> None:
    """Refuse, in one line, a ``device`` that is not a torch device or that this machine lacks."""
    _torch_device(device)


def check_model_spec(spec: str, what: str = "model") -> None:
    """Fail at once, before anything loads, on a spec that cannot name a model here.

    A known name or an existing directory passes. Anything else is a hub id: with
    ``HF_HUB_OFFLINE`` set, or when the hub does not answer a TCP connection within a few seconds,
    it is refused with one line (instead of transformers' minute-long retries ending in the same
    error) unless the id is already in the Hugging Face cache.
    """
    if spec in KNOWN_MODELS:
        return
    _local_or_hub(spec, what)


def _hub_cached(spec: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(spec, "config.json"), str)
    except Exception:  # a malformed id: not cached
        return False


def _hub_reachable(timeout: float = 3.0) -> bool:
    import os
    import socket
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((url.hostname or "huggingface.co", url.port or 443), timeout=timeout).close()
    except OSError:
        return False
    return True


def _local_or_hub(spec: str, what: str = "model") -> tuple[str, str]:
    """(what to pass to ``from_pretrained``, display name) for a spec that is not a known name."""
    path = Path(spec).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"{path} has no config.json; pass a directory saved with save_pretrained "
                f"(config.json, weights, tokenizer files), or one of: {', '.join(KNOWN_MODELS)}"
            )
        return str(path), model_name(spec)
    looks_like_path = spec.startswith(("/", ".", "~")) or spec.count("/") > 1 or "\\" in spec
    if looks_like_path:
        raise FileNotFoundError(
            f"model directory {spec!r} does not exist; pass an existing directory, a hub id, "
            f"or one of: {', '.join(KNOWN_MODELS)}"
        )
    import os

    if not _hub_cached(spec):
        offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
        if offline or not _hub_reachable():
            why = "HF_HUB_OFFLINE is set" if offline else "the model hub is not reachable from here"
            raise FileNotFoundError(
                f"{what} {spec!r} is neither a known name nor an existing directory, and {why}; pass a local "
                f"directory with a transformers causal LM, or one of: {', '.join(KNOWN_MODELS)}"
            )
    return spec, spec


def _torch_dtype(dtype: str) -> torch.dtype:
    import torch

    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not supported; use one of {', '.join(DTYPES)}")
    return getattr(torch, dtype)


def _torch_device(device: str) -> torch.device:
    import torch

    try:
        torch_device = torch.device(device)
    except RuntimeError:
        raise ValueError(f"device={device!r} is not a torch device; use e.g. cpu or cuda:0") from None
    if torch_device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but this torch build sees no CUDA GPU; use device='cpu'")
    return torch_device


def model_folder(spec: str, what: str = "model") -> Path:
    """The local folder of ``spec``: draftrl's converted copy of a known name, an existing directory,
    or a hub id's snapshot in the Hugging Face cache (downloaded when the hub is reachable).

    Why a folder: draftrl reads a head's or a model's ``config.json`` before vLLM loads it (a head
    that vLLM could not load is refused in one line), and an export copies a drafter into its bundle.

    :raises FileNotFoundError: one line naming the spec and what to pass instead (as
        :func:`check_model_spec`, which refuses an uncached hub id at once when the hub is out of reach).
    """
    if spec in KNOWN_MODELS:
        return fetch_model(spec, quiet=True)
    path = Path(spec).expanduser()
    if path.is_dir():  # what it must hold is the caller's check (a head's files are not a model's)
        return path
    _local_or_hub(spec, what)
    import os

    from huggingface_hub import snapshot_download

    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    try:
        return Path(snapshot_download(spec, local_files_only=offline or _hub_cached(spec) and not _hub_reachable()))
    except Exception as err:  # the hub's errors are long; the one line names the spec and the way out
        raise FileNotFoundError(f"{what} {spec!r} could not be fetched from the model hub ({type(err).__name__}); "
                                "pass a local directory, or download it where the hub is reachable "
                                "(huggingface-cli download ID).") from None
