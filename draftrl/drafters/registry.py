"""One registry from a spec string to a drafter, for both engines.

``--drafter`` / ``env.drafter`` (the Hugging Face engine) and the vLLM proposer's ``drafter`` key
name a drafter the same way: ``KIND`` or ``KIND:ARG:...``, where ``KIND`` is a key of
:data:`DRAFTERS`; any other spec is a draft model (a local directory, a hub id or a known name)
that must share the target's tokenizer (its embedding matrix may be padded differently:
:class:`~draftrl.models.vocab.SharedVocab`). Adding a drafter: one module in ``draftrl/drafters/``
and one :class:`DrafterEntry` here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from draftrl.drafters.base import Drafter
from draftrl.drafters.eagle3 import Eagle3Drafter, Eagle3Head
from draftrl.drafters.layerskip import LayerSkipDrafter
from draftrl.drafters.mixed import MixedDrafter
from draftrl.drafters.model import ModelDrafter
from draftrl.drafters.ngram import NgramDrafter
from draftrl.drafters.packaged import packaged_head
from draftrl.models import LoadedModel, check_model_spec, load_model, shared_vocab


def _load(spec: str, dtype: str, device: str) -> LoadedModel:
    return load_model(spec, dtype=dtype, device=device)


@dataclass(frozen=True)
class DrafterContext:
    """What a drafter may be built from besides its spec."""

    target: LoadedModel | None = None
    """the target (None inside vLLM's proposer, which sees token ids only)"""
    sampled: bool = False
    """model drafters draw their children from q instead of taking the top ones"""
    dtype: str = "float32"
    device: str = "cpu"
    load: Callable[[str, str, str], LoadedModel] = _load
    """``(spec, dtype, device) -> LoadedModel`` for a separate draft model; the envs pass
    ``draftrl.models.shared_model`` so that every env of a process shares one copy"""


@dataclass(frozen=True)
class DrafterEntry:
    """One kind of drafter: how its spec reads and how it is built."""

    usage: str
    """the spec's grammar, as error messages show it"""
    example: str
    """a spec of this kind that builds (the registry test builds every entry from it)"""
    build: Callable[[str, list[str], DrafterContext], Drafter | None]
    """``(spec, args after KIND, context) -> drafter`` (None: no speculation)"""
    needs_target: bool
    """False: the drafter runs on token ids alone, hence inside vLLM's proposer too"""


def _no_args(spec: str, args: list[str], usage: str) -> None:
    if args:
        raise ValueError(f"drafter spec {spec!r} takes no arguments; write {usage}")


def _none(spec: str, args: list[str], ctx: DrafterContext) -> None:
    _no_args(spec, args, "none")
    return None


def _ngram(spec: str, args: list[str], ctx: DrafterContext) -> NgramDrafter:
    if not args:
        return NgramDrafter()
    sizes, first = args[:2], args[2:]
    if len(sizes) != 2 or not all(p.isdigit() for p in sizes) or len(first) > 1:
        raise ValueError(f"drafter spec {spec!r} must look like {NGRAM.usage}, e.g. ngram:1:3 or ngram:1:3:latest")
    return NgramDrafter(min_ngram=int(sizes[0]), max_ngram=int(sizes[1]), first=first[0] if first else "earliest")


def _target(spec: str, ctx: DrafterContext) -> LoadedModel:
    if ctx.target is None:
        raise ValueError(f"drafter {spec!r} needs the target model, which this engine does not give; "
                         f"choose one that runs on token ids alone: {', '.join(serving_usages())}")
    return ctx.target


def _layerskip(spec: str, args: list[str], ctx: DrafterContext) -> LayerSkipDrafter:
    if len(args) != 1 or not args[0].isdigit():
        raise ValueError(f"drafter spec {spec!r} must look like layerskip:N with N an integer, e.g. layerskip:8")
    return LayerSkipDrafter(_target(spec, ctx).model, int(args[0]), sampled=ctx.sampled)


def _eagle3(spec: str, args: list[str], ctx: DrafterContext) -> Eagle3Drafter:
    target = _target(spec, ctx)
    path = ":".join(args) or packaged_head(target.name)
    head = Eagle3Head.from_pretrained(path, dtype=getattr(torch, ctx.dtype), device=ctx.device)
    return Eagle3Drafter(head, target.model, sampled=ctx.sampled, name=spec)


def _sam(spec: str, args: list[str], ctx: DrafterContext) -> MixedDrafter:
    if not args or not args[0].isdigit():
        raise ValueError(f"drafter spec {spec!r} must look like sam:N[:PATH] (N the shortest n-gram match that "
                         "drafts by lookup, PATH a head folder), e.g. sam:2")
    head = _eagle3(spec, args[1:], ctx)
    return MixedDrafter(NgramDrafter(1, 3, first="latest"), head, int(args[0]), name=spec)


def _self(spec: str, args: list[str], ctx: DrafterContext) -> ModelDrafter:
    _no_args(spec, args, "self")
    return ModelDrafter(_target(spec, ctx).model, sampled=ctx.sampled, name="self")


NGRAM = DrafterEntry("ngram[:MIN:MAX[:earliest|latest]]", "ngram:1:3:latest", _ngram, needs_target=False)

#: Every drafter kind that is not a model name, by the spec's first field.
DRAFTERS: dict[str, DrafterEntry] = {
    "none": DrafterEntry("none", "none", _none, needs_target=False),
    "ngram": NGRAM,
    "layerskip": DrafterEntry("layerskip:N", "layerskip:1", _layerskip, needs_target=True),
    "self": DrafterEntry("self", "self", _self, needs_target=True),
    "sam": DrafterEntry("sam:N[:PATH]", "sam:2:PATH", _sam, needs_target=True),
    "eagle3": DrafterEntry("eagle3[:PATH]", "eagle3:PATH", _eagle3, needs_target=True),
}
#: How a spec that names no kind reads: a draft model.
MODEL_USAGE = "a draft model (directory, hub id or known name)"


def known_usages() -> list[str]:
    """Every kind's grammar, then the model fallback (for error messages and ``--help``)."""
    return [entry.usage for entry in DRAFTERS.values()] + [MODEL_USAGE]


def serving_usages() -> list[str]:
    """The grammars of the drafters that need no target (they run inside vLLM's proposer)."""
    return [entry.usage for entry in DRAFTERS.values() if not entry.needs_target and entry.usage != "none"]


def _unknown(spec: str, reason: Exception) -> ValueError:
    return ValueError(f"drafter {spec!r} is unknown; choose one of: {', '.join(known_usages())} "
                      f"(as a model: {str(reason).splitlines()[0]})")


def check_drafter_spec(spec: str) -> None:
    """Fail before any model loads when ``spec`` names neither a drafter kind nor a model that can be found."""
    if spec.partition(":")[0] in DRAFTERS:
        return
    try:
        check_model_spec(spec, "drafter")
    except (FileNotFoundError, ValueError) as reason:
        raise _unknown(spec, reason) from None


def build_drafter(spec: str, target: LoadedModel | None = None, *, sampled: bool = False, dtype: str = "float32",
                  device: str = "cpu", load: Callable[[str, str, str], LoadedModel] = _load) -> Drafter | None:
    """The drafter named by ``spec`` (None for ``none``); ``target`` is needed by the kinds that
    read the target's weights or vocabulary (``DrafterEntry.needs_target``) and by draft models."""
    kind, *args = spec.split(":")
    ctx = DrafterContext(target, sampled, dtype, device, load)
    if kind in DRAFTERS:
        return DRAFTERS[kind].build(spec, args, ctx)
    target = _target(spec, ctx)
    try:
        draft = load(spec, dtype, device)
    except FileNotFoundError as reason:
        raise _unknown(spec, reason) from None
    vocab = shared_vocab(target.tokenizer, draft.tokenizer, target.model, draft.model)
    return ModelDrafter(draft.model, sampled=sampled, name=draft.name, vocab=vocab)
