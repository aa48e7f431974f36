"""``WorkloadConfig``: the requests a decoding run serves, shared by both engines' configs.

``EnvConfig`` (the Hugging Face engine's envs, ``draftrl eval --engine hf``) and ``ServeConfig``
(the serving envs, ``draftrl eval --engine vllm``) both extend it, so a workload key has one
name and one default on both engines: ``--set env.temperature=1`` or ``--target`` sets the
same thing whichever engine runs.

The sampling of a workload is one :class:`SamplingClass` (``temperature``, ``top_k``, ``top_p``)
or a mix of them (``temperature_mix``), from which every request (an episode of a round env, an
arriving request of a serving episode) draws its own: the key and its meaning are shared by both
tracks, so a mix written once drives ``draftrl collect``, ``train``, ``grid`` and ``eval`` on either
engine.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from draftrl.prompts import SPLITS


@dataclass(frozen=True)
class SamplingParams:
    """How a model's logits become the distribution that is sampled (target and draft alike)."""

    temperature: float = 0.0
    """Softmax temperature; 0 means greedy (one-hot at the argmax, lowest id among ties)."""
    top_k: int = 0
    """Keep the top_k most likely tokens (ties broken by ascending id); 0 turns top-k off."""
    top_p: float = 1.0
    """Keep the smallest set of most likely tokens with mass >= top_p (after top-k); 1 = off."""

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature={t!r} must be a finite number >= 0; use 0 for greedy, e.g. 0.7 to sample.")
        k = self.top_k
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 0:
            raise ValueError(f"top_k={k!r} must be an integer >= 0; use 0 to turn top-k off.")
        tp = self.top_p
        if isinstance(tp, bool) or not isinstance(tp, numbers.Real) or not 0 < tp <= 1:
            raise ValueError(f"top_p={tp!r} must be in (0, 1]; use 1.0 to turn top-p off.")

    @property
    def greedy(self) -> bool:
        """True when temperature is 0: sampling is the argmax."""
        return self.temperature == 0


@dataclass(frozen=True)
class SamplingClass:
    """One request's sampling (the transform ``draftrl.models.distribution.SamplingParams`` applies to
    target and draft alike) and its share of a workload's requests."""

    temperature: float = 0.0
    """0 = greedy"""
    top_k: int = 0
    """keep the k most likely tokens (0 = off)"""
    top_p: float = 1.0
    """nucleus mass (1 = off)"""
    weight: float = 1.0
    """share of the workload's requests (the mix's weights are normalised to sum to 1)"""

    def __post_init__(self) -> None:
        t, k, p, w = self.temperature, self.top_k, self.top_p, self.weight
        SamplingParams(t, k, p)  # the same checks
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w) or w <= 0:
            raise ValueError(f"weight={w!r} must be a positive number (a share of the requests).")
        object.__setattr__(self, "temperature", float(t))
        object.__setattr__(self, "top_k", int(k))
        object.__setattr__(self, "top_p", float(p))
        object.__setattr__(self, "weight", float(w))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def key(self) -> tuple[float, int, float]:
        """What identifies the class (its weight aside): the same sampling is one class."""
        return (self.temperature, self.top_k, self.top_p)

    @property
    def label(self) -> str:
        """One short name for tables, log keys and file names: ``T0``, ``T0.7``, ``T1:k20:p0.8``."""
        name = f"T{self.temperature:g}"
        if self.top_k:
            name += f":k{self.top_k}"
        if self.top_p < 1:
            name += f":p{self.top_p:g}"
        return name

    def params(self) -> SamplingParams:
        """The :class:`SamplingParams` of this class: what the engines take at ``start(sampling=...)``."""
        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)


_CLASS_KEYS = ("temperature", "top_k", "top_p", "weight")


def parse_temperature_mix(value: Any, where: str = "env.temperature_mix") -> tuple[SamplingClass, ...]:
    """A mix from its config spellings, weights normalised to sum to 1:

    - a mapping temperature -> weight, ``{0: 0.3, 0.7: 0.4, 1.0: 0.3}`` (top-k and top-p off);
    - a list of entries ``{temperature: 0.7, top_p: 0.9, top_k: 0, weight: 0.4}`` (missing keys take
      :class:`SamplingClass`'s defaults);
    - a tuple of :class:`SamplingClass` (what ``to_dict`` writes back reads as the list form).

    :raises ValueError: an empty mix, an unknown entry key, a bad value, or one sampling listed twice
        (each naming the fix).
    """
    if isinstance(value, SamplingClass):
        value = (value,)
    if isinstance(value, dict):
        entries = []
        for temperature, weight in value.items():
            try:
                temperature = float(temperature)
            except (TypeError, ValueError):
                raise ValueError(f"{where} key {temperature!r} is not a temperature; write e.g. "
                                 "{0: 0.3, 0.7: 0.4, 1.0: 0.3}.") from None
            entries.append({"temperature": temperature, "weight": weight})
        value = entries
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"{where}={value!r} must be a non-empty mapping temperature -> weight "
                         "(e.g. {0: 0.3, 0.7: 0.4, 1.0: 0.3}) or a list of {temperature, top_k, top_p, weight}.")
    classes = []
    for i, entry in enumerate(value):
        if isinstance(entry, SamplingClass):
            classes.append(entry)
            continue
        if not isinstance(entry, dict):
            raise ValueError(f"{where}[{i}]={entry!r} must be a mapping of {', '.join(_CLASS_KEYS)}.")
        unknown = sorted(set(entry) - set(_CLASS_KEYS))
        if unknown:
            raise ValueError(f"{where}[{i}] has unknown keys {unknown}; use {', '.join(_CLASS_KEYS)}.")
        try:
            classes.append(SamplingClass(**entry))
        except ValueError as err:
            raise ValueError(f"{where}[{i}]: {err}") from None
    keys = [c.key for c in classes]
    repeated = sorted({c.label for c in classes if keys.count(c.key) > 1})
    if repeated:
        raise ValueError(f"{where} lists {', '.join(repeated)} more than once; give each sampling one entry.")
    total = sum(c.weight for c in classes)
    return tuple(SamplingClass(c.temperature, c.top_k, c.top_p, c.weight / total) for c in classes)


@dataclass
class WorkloadConfig:
    """Prompts, token budgets, target model and sampling of a decoding workload."""

    section: ClassVar[str] = "env"
    """the config section these fields are read from, for errors (``TrainEnvConfig`` subclasses: depth_env, ...)"""

    prompts: str | None = None
    """JSONL prompt file with the ``draftrl.prompts.Prompt`` fields; None = the shipped set"""
    languages: tuple[str, ...] | None = None
    """keep these languages (e.g. [en, zh]); None = all"""
    tasks: tuple[str, ...] | None = None
    """keep these tasks (code_edit, summarize, qa_context, chat); None = all"""
    split: str | None = "tune"
    """tune or heldout; None = both"""
    limit_per_group: int | None = None
    """first n prompts of each (language, task) group; None = all"""
    shuffle: bool = True
    """visit prompts in a seeded random order (reshuffled every pass); False = file order"""
    chat_template: bool = True
    """wrap each prompt in the tokenizer's chat template (SmolLM2 is an instruct model)"""
    max_new_tokens: int | None = None
    """tokens per request; None = the prompt's suggestion, capped at max_new_tokens_cap"""
    max_new_tokens_cap: int = 256
    """upper bound on a prompt's suggested max_new_tokens"""
    target: str = "smollm2-135m"
    """target model: a known name, a local directory or a hub id"""
    dtype: str = "float32"
    temperature: float = 0.0
    """0 = greedy"""
    top_k: int = 0
    top_p: float = 1.0
    temperature_mix: dict[float, float] | tuple[SamplingClass, ...] | None = None
    """each request draws its sampling from this mix: ``{0: 0.3, 0.7: 0.4, 1.0: 0.3}`` (temperature ->
    weight) or a list of ``{temperature, top_k, top_p, weight}``; None = every request samples with
    ``temperature``, ``top_k`` and ``top_p``. Set, it replaces those three (which must keep their
    defaults). Read as a tuple of :class:`SamplingClass`"""
    seed: int | None = None
    """seed of the first reset() when none is passed; None = fresh entropy (gymnasium's convention)"""

    def __post_init__(self) -> None:
        if self.languages is not None:
            self.languages = tuple(self.languages)
        if self.tasks is not None:
            self.tasks = tuple(self.tasks)
        if self.split is not None and self.split not in SPLITS:
            raise ValueError(f"{self.section}.split={self.split!r} is unknown; use one of {', '.join(SPLITS)} or null.")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"{self.section}.max_new_tokens={self.max_new_tokens} must be >= 1 "
                             "(or null for the prompt's).")
        if self.max_new_tokens_cap < 1:
            raise ValueError(f"{self.section}.max_new_tokens_cap={self.max_new_tokens_cap} must be >= 1.")
        if self.temperature < 0:
            raise ValueError(f"{self.section}.temperature={self.temperature} must be >= 0 (0 = greedy).")
        if self.temperature_mix is not None:
            self.temperature_mix = parse_temperature_mix(self.temperature_mix, f"{self.section}.temperature_mix")
            if (self.temperature, self.top_k, self.top_p) != (0.0, 0, 1.0):
                raise ValueError(
                    f"{self.section}.temperature_mix and {self.section}.temperature/top_k/top_p are both set; the mix "
                    f"gives every request its sampling: put temperature={self.temperature}, top_k={self.top_k}, "
                    f"top_p={self.top_p} into the mix as an entry, or drop the mix."
                )

    @property
    def sampling_classes(self) -> tuple[SamplingClass, ...]:
        """The workload's samplings with their shares (one class when no mix is set)."""
        if self.temperature_mix is not None:
            return self.temperature_mix
        return (SamplingClass(self.temperature, self.top_k, self.top_p),)

    @property
    def mixed(self) -> bool:
        """Requests differ in sampling (a mix of more than one class)."""
        return len(self.sampling_classes) > 1

    def draw_sampling(self, rng: np.random.Generator) -> SamplingClass:
        """One request's sampling class, drawn from ``rng`` by the mix's weights. A workload of one class
        draws nothing from ``rng``, so its seeded runs are what they were before mixes existed."""
        classes = self.sampling_classes
        if len(classes) == 1:
            return classes[0]
        return classes[int(rng.choice(len(classes), p=[c.weight for c in classes]))]
