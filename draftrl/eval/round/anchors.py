"""The anchors of every speed table: stock Hugging Face ``generate``, greedy and with prompt lookup.

Why: a speedup over draftrl's own plain decoding says nothing if that plain decoding is slower
than what a user already has (on one Xeon it was 2.3x slower than ``generate``). So the grid and
the evaluation also time, interleaved with the policies on the same requests and in the same
run:

- ``hf``: ``model.generate(do_sample=False)`` with stock ``nn.Linear`` kernels
  (:func:`draftrl.models.kernels.stock_kernels`), i.e. what ``transformers`` gives a user;
- ``hf-lookup:G``: the same with ``prompt_lookup_num_tokens=G`` (transformers' prompt lookup,
  ``max_matching_ngram_size`` = the n-gram drafter's longest n), for each gamma G asked for;
  the tables use the gamma with the best throughput ("its best gamma").

- ``hf-assisted``: the same with ``assistant_model=`` the run's draft model (HF's assisted
  generation with its own defaults: 20 assistant tokens, confidence threshold 0.4), where the
  drafter is a separate draft model (:func:`assistant_of`).

At temperature 0 the anchors decode greedily, where ``generate`` and draftrl must agree token for
token (the run checks it). At temperature > 0 (a :class:`~draftrl.models.distribution.SamplingParams`
given) they sample with ``do_sample=True`` and exactly draftrl's transform: the same temperature,
top-k (0 = off: HF's own default of 50 is overridden) and top-p, every other logits processor a
model's ``generation_config.json`` may switch on (repetition penalty, min-p, typical-p, ...) set
neutral (:func:`generation_kwargs`); ``torch.manual_seed(seed)`` before each request, the request's
own seed. An :class:`AnchorRun` has what the speedup columns and the bootstrap need (tokens,
seconds) plus the number of target forwards (prefill included).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

from draftrl.eval.records import DecodedRequest

#: Anchor kinds.
HF = "hf"
HF_LOOKUP = "hf-lookup"
HF_ASSISTED = "hf-assisted"

#: ``generate`` keywords that turn off every logits processor but temperature, top-k and top-p: a
#: model's ``generation_config.json`` fills every keyword left unset (transformers 5 merges it in).
NEUTRAL_PROCESSORS: dict = {"repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
                            "min_p": None, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "top_h": None,
                            "min_length": 0, "min_new_tokens": None, "bad_words_ids": None, "suppress_tokens": None,
                            "begin_suppress_tokens": None, "forced_bos_token_id": None, "forced_eos_token_id": None,
                            "exponential_decay_length_penalty": None, "renormalize_logits": False,
                            "num_beams": 1, "num_return_sequences": 1}


@dataclass(frozen=True)
class Anchor:
    """One anchor method: ``hf`` (gamma 0), ``hf-lookup:G`` or ``hf-assisted`` (``assisted``)."""

    gamma: int = 0
    ngram: int = 3
    assisted: bool = False
    """HF assisted generation with the run's draft model (``assistant_model``); ``gamma`` unused"""

    @property
    def label(self) -> str:
        if self.assisted:
            return HF_ASSISTED
        return HF if self.gamma == 0 else f"{HF_LOOKUP}:{self.gamma}"


def generation_kwargs(anchor: Anchor, sampling=None) -> dict:
    """The ``generate`` keywords of ``anchor`` under ``sampling`` (a ``SamplingParams``; None or
    temperature 0 = greedy), decoding draftrl's distribution (``draftrl.decoding.sampling.logits_to_probs``):
    temperature, then top-k (ours 0 = off is HF's 0 too, but HF's default is 50: always passed), then
    top-p, nothing else (:data:`NEUTRAL_PROCESSORS`)."""
    kwargs: dict = dict(NEUTRAL_PROCESSORS)
    if sampling is None or sampling.temperature == 0:
        kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    else:
        kwargs.update(do_sample=True, temperature=float(sampling.temperature), top_k=int(sampling.top_k),
                      top_p=float(sampling.top_p))
    if anchor.gamma and not anchor.assisted:
        kwargs.update(prompt_lookup_num_tokens=anchor.gamma, max_matching_ngram_size=anchor.ngram)
    return kwargs


def assistant_of(engine):
    """The draft model HF assisted generation can take as ``assistant_model`` from ``engine``'s drafter:
    a separate draft model (``draftrl.drafters.model.ModelDrafter`` around its own weights, with the
    target's vocabulary), else None (n-gram lookup, EAGLE-3 or SAM heads, layer skipping, ``self``)."""
    from draftrl.drafters.model import ModelDrafter

    drafter = getattr(engine, "drafter", None)
    if not isinstance(drafter, ModelDrafter) or drafter.vocab is not None:
        return None
    if drafter.model is getattr(engine, "target", None) or drafter.name == "self":
        return None
    return drafter.model


def anchors_for(gammas: tuple[int, ...], ngram: int = 3, assisted: bool = False) -> list[Anchor]:
    """``hf`` plus ``hf-lookup:G`` for every G in ``gammas`` (plus ``hf-assisted`` with ``assisted``)."""
    out = [Anchor(0, ngram)] + [Anchor(int(g), ngram) for g in sorted(set(gammas)) if int(g) > 0]
    return out + [Anchor(0, ngram, assisted=True)] if assisted else out


def anchor_ngram(drafter: str) -> int:
    """HF prompt lookup's ``max_matching_ngram_size``: the n-gram drafter's longest n (3 by default)."""
    kind, _, arg = drafter.partition(":")
    parts = arg.split(":")
    return int(parts[1]) if kind == "ngram" and len(parts) == 2 and parts[1].isdigit() else 3


@dataclass
class AnchorRun(DecodedRequest):
    """One request decoded by an anchor (wall clock, seconds, prefill included)."""

    seconds: float
    num_forwards: int
    """target forwards, prefill included (HF verifies its first candidates inside the prefill)"""


def run_anchor(model, anchor: Anchor, request, *, eos_token_ids: list[int], repeat: int = 0,
               device: str = "cpu", sampling=None, seed: int = 0, assistant=None) -> AnchorRun:
    """Decode ``request`` (a ``draftrl.decoding.workload.Request``) with ``anchor`` on ``model``.

    ``eos_token_ids`` empty (``env.ignore_eos``): decode to ``max_new_tokens`` whatever the model's
    config names as EOS, as the engine does (``generate`` takes an empty list as no EOS).

    :param sampling: a ``SamplingParams``; None or temperature 0 = greedy (:func:`generation_kwargs`).
    :param seed: ``torch.manual_seed`` before ``generate`` (sampled anchors; untimed).
    :param assistant: the draft model of ``hf-assisted`` (:func:`assistant_of`)."""
    import torch

    from draftrl.decoding.clock import clock_for
    from draftrl.models.kernels import stock_kernels

    clock = clock_for(device)

    forwards = [0]
    handle = model.register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    kwargs = generation_kwargs(anchor, sampling)
    if anchor.assisted:
        if assistant is None:
            raise ValueError("anchor hf-assisted needs the run's draft model (assistant=); the drafter is not a "
                             "separate draft model (see draftrl.eval.round.anchors.assistant_of).")
        kwargs["assistant_model"] = assistant
    ids = torch.tensor([request.prompt_ids], device=device)
    if kwargs["do_sample"]:
        torch.manual_seed(seed)
    try:
        with stock_kernels(model), (stock_kernels(assistant) if anchor.assisted else nullcontext()), \
                torch.inference_mode():
            t0 = clock()
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=request.max_new_tokens,
                                 eos_token_id=list(eos_token_ids),
                                 pad_token_id=eos_token_ids[0] if eos_token_ids else 0,  # batch 1: never padded
                                 **kwargs)
            seconds = clock() - t0
    finally:
        handle.remove()
    tokens = out[0, ids.shape[1]:].tolist()
    for i, token in enumerate(tokens):  # generate stops at EOS; draftrl's output ends with it too
        if token in eos_token_ids:
            tokens = tokens[: i + 1]
            break
    prompt = request.prompt
    return AnchorRun(policy=anchor.label, prompt_id=prompt.id, language=prompt.language, task=prompt.task,
                     repeat=repeat, token_ids=tokens, seconds=seconds, num_forwards=forwards[0])


def median_anchor_runs(runs: list[AnchorRun]) -> list[AnchorRun]:
    """For each (anchor, request): the repeat with the median seconds (the lower middle one)."""
    groups: dict[tuple[str, str], list[AnchorRun]] = {}
    for run in runs:
        groups.setdefault((run.policy, run.prompt_id), []).append(run)
    return [sorted(g, key=lambda r: r.seconds)[(len(g) - 1) // 2] for g in groups.values()]


def summarize_anchors(runs: list[AnchorRun]) -> dict[str, dict]:
    """Per anchor: ``tokens_per_second``, ``num_tokens``, ``seconds``, ``num_requests``,
    ``tokens_per_forward`` (prefill included), ``per_task`` {task: the same}; plus ``best_lookup``:
    the ``hf-lookup:G`` label with the best throughput (None if none was timed)."""
    kept = median_anchor_runs(runs)

    def summary(items: list[AnchorRun]) -> dict:
        tokens, seconds = sum(r.num_tokens for r in items), sum(r.seconds for r in items)
        forwards = sum(r.num_forwards for r in items)
        return {"tokens_per_second": tokens / seconds if seconds > 0 else 0.0, "num_tokens": tokens,
                "seconds": seconds, "num_requests": len(items),
                "tokens_per_forward": tokens / forwards if forwards else None}

    out: dict[str, dict] = {}
    for label in sorted({r.policy for r in kept}):
        items = [r for r in kept if r.policy == label]
        out[label] = summary(items)
        out[label]["per_task"] = {t: summary([r for r in items if r.task == t])
                                  for t in sorted({r.task for r in items})}
    lookups = [k for k in out if k.startswith(HF_LOOKUP)]
    out_best = max(lookups, key=lambda k: out[k]["tokens_per_second"]) if lookups else None
    return {"methods": out, "best_lookup": out_best}
