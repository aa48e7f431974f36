"""A workload's requests: which prompt each request decodes, tokenised, with its token budget.

Both engines' callers consume it: the round envs (one request per episode), the serving env (a
batch of them), the evaluation, ``draftrl collect`` and the benchmarks. Prompts come from
``draftrl.prompts.load_prompts`` filtered by the config; a seeded restart draws a fresh
permutation from the caller's RNG and requests walk through it (reshuffled after every pass), so a
seed fixes the prompt order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from draftrl.config.workload import WorkloadConfig
from draftrl.models.chat import user_message_ids
from draftrl.prompts import Prompt, load_prompts


@dataclass
class Request:
    """One episode's prompt, tokenised."""

    prompt: Prompt
    prompt_ids: list[int]
    max_new_tokens: int


def select_prompts(config: WorkloadConfig) -> list[Prompt]:
    """The config's prompt set; an empty selection is an error that names the filters."""
    prompts = load_prompts(
        config.prompts,
        languages=config.languages,
        tasks=config.tasks,
        split=config.split,
        limit_per_group=config.limit_per_group,
    )
    if not prompts:
        raise ValueError(
            f"no prompt matches languages={config.languages}, tasks={config.tasks}, split={config.split!r} "
            f"in {config.prompts or 'the shipped set'}; widen the filters."
        )
    return prompts


def budget(config: WorkloadConfig, prompt: Prompt) -> int:
    """Tokens to generate for ``prompt``: the config's value, else the prompt's suggestion, capped."""
    if config.max_new_tokens is not None:
        return config.max_new_tokens
    return min(prompt.max_new_tokens, config.max_new_tokens_cap)


def encode(tokenizer, text: str, chat_template: bool) -> list[int]:
    """Token ids of a user message, wrapped in the chat template if asked."""
    if chat_template and not getattr(tokenizer, "chat_template", None):
        raise ValueError("env.chat_template=true needs a tokenizer with a chat template; set it to false.")
    return user_message_ids(tokenizer, text, chat_template)


class Workload:
    """Hands out one :class:`Request` per episode in a seeded order."""

    def __init__(self, config: WorkloadConfig, tokenizer=None, prompts: list[Prompt] | None = None,
                 prompt_ids: dict[str, list[int]] | None = None, limits: dict[str, int] | None = None):
        """``tokenizer`` may be None when only indices are needed or when ``prompt_ids`` (prompt id ->
        token ids, e.g. recorded ones) covers ``prompts``; ``limits`` (prompt id -> tokens) caps a
        request's budget where less was recorded (replayed traces)."""
        self.config = config
        self.tokenizer = tokenizer
        self.prompts = prompts if prompts is not None else select_prompts(config)
        self._ids: dict[str, list[int]] = dict(prompt_ids or {})
        self._limits: dict[str, int] = dict(limits or {})
        self._order: list[int] = list(range(len(self.prompts)))
        self._next = 0

    def __len__(self) -> int:
        return len(self.prompts)

    def restart(self, rng: np.random.Generator) -> None:
        """A new pass in a fresh order drawn from ``rng`` (file order when ``shuffle`` is off)."""
        self._order = rng.permutation(len(self.prompts)).tolist() if self.config.shuffle else list(
            range(len(self.prompts))
        )
        self._next = 0

    def next_index(self, rng: np.random.Generator) -> int:
        """Index of the next prompt; starts a new pass (reshuffled with ``rng``) after the last one."""
        if self._next >= len(self._order):
            self.restart(rng)
        index = self._order[self._next]
        self._next += 1
        return index

    def pick(self, options: dict | None, rng: np.random.Generator) -> int:
        """The prompt a reset asked for (``prompt_index`` or ``prompt_id``), else the next in order."""
        options = options or {}
        unknown = set(options) - {"prompt_index", "prompt_id"}
        if unknown:
            raise ValueError(f"reset options {sorted(unknown)} are unknown; use prompt_index or prompt_id (the round "
                             "envs also take sampling: a class label of EnvConfig.temperature_mix, e.g. 'T0.7').")
        if "prompt_id" in options:
            return self.index_of(options["prompt_id"])
        if "prompt_index" in options:
            index = int(options["prompt_index"])
            if not 0 <= index < len(self.prompts):
                raise ValueError(f"prompt_index={index} is outside 0..{len(self.prompts) - 1} of the selected prompts.")
            return index
        return self.next_index(rng)

    def request(self, index: int) -> Request:
        """The request for prompt number ``index`` (file order of the selection)."""
        if not 0 <= index < len(self.prompts):
            raise ValueError(f"prompt index {index} is outside 0..{len(self.prompts) - 1} of the selected prompts.")
        prompt = self.prompts[index]
        if prompt.id not in self._ids:
            self._ids[prompt.id] = encode(self.tokenizer, prompt.prompt, self.config.chat_template)
        tokens = budget(self.config, prompt)
        if prompt.id in self._limits:
            tokens = min(tokens, self._limits[prompt.id])
        return Request(prompt, self._ids[prompt.id], tokens)

    def index_of(self, prompt_id: str) -> int:
        for i, prompt in enumerate(self.prompts):
            if prompt.id == prompt_id:
                return i
        raise ValueError(f"prompt id {prompt_id!r} is not among the {len(self.prompts)} selected prompts.")
