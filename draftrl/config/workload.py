"""``WorkloadConfig``: the requests a decoding run serves, shared by both engines' configs.

``EnvConfig`` (the Hugging Face engine's envs, ``draftrl eval --engine hf``) and ``ServeConfig``
(the serving envs, ``draftrl eval --engine vllm``) both extend it, so a workload key has one
name and one default on both engines: ``--set env.temperature=1`` or ``--target`` sets the
same thing whichever engine runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from draftrl.prompts import SPLITS


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
