"""Build drafters from the short specs the CLI and configs use.

``ngram`` / ``ngram:MIN:MAX`` (prompt lookup), ``layerskip:N`` (the target's first N layers),
``none`` (plain decoding), or anything else: a draft model (local path, hub id or known name)
that must share the target's vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable

from draftrl.decoding.drafters import Drafter, LayerSkipDrafter, ModelDrafter, NgramDrafter
from draftrl.models import LoadedModel, check_same_logits, check_same_vocab, load_model


#: drafter kinds that are not a model name
BUILTIN_DRAFTERS = ("ngram", "layerskip", "none")


def check_drafter_spec(spec: str) -> None:
    """Fail before any model loads when ``spec`` is a model name that cannot be found (see ``check_model_spec``)."""
    from draftrl.models import check_model_spec

    if spec.partition(":")[0] not in BUILTIN_DRAFTERS:
        check_model_spec(spec, "drafter")


def _load(spec: str, dtype: str, device: str) -> LoadedModel:
    return load_model(spec, dtype=dtype, device=device)


def build_drafter(
    spec: str, target: LoadedModel, *, sampled: bool = False, dtype: str = "float32", device: str = "cpu",
    load: Callable[[str, str, str], LoadedModel] = _load,
) -> Drafter | None:
    """The drafter named by ``spec`` for ``target``; ``sampled`` draws model proposals from q.

    :param load: ``(spec, dtype, device) -> LoadedModel`` for a separate draft model; the envs pass
        ``draftrl.envs.engines.shared_model`` so that every env of a process shares one copy.
    """
    kind, _, arg = spec.partition(":")
    if kind == "none":
        return None
    if kind == "ngram":
        if not arg:
            return NgramDrafter()
        parts = arg.split(":")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise ValueError(f"drafter spec {spec!r} must look like ngram or ngram:MIN:MAX, e.g. ngram:1:3")
        return NgramDrafter(min_ngram=int(parts[0]), max_ngram=int(parts[1]))
    if kind == "layerskip":
        if not arg.isdigit():
            raise ValueError(f"drafter spec {spec!r} must look like layerskip:N with N an integer, e.g. layerskip:8")
        return LayerSkipDrafter(target.model, int(arg), sampled=sampled)
    draft = load(spec, dtype, device)
    check_same_vocab(target.tokenizer, draft.tokenizer)
    check_same_logits(target.model, draft.model)
    return ModelDrafter(draft.model, sampled=sampled, name=draft.name)
