"""Shipped multilingual prompt sets for benchmarks and policy training.

docs/design.md asks for multilingual workloads (English, Italian, Chinese, Spanish, plus code) with
comparable request lengths, reported per language and task. ``prompts.jsonl`` holds original
prompts written for this project: 4 languages x 4 tasks x 24 prompts.

Tasks, and why each is here:

- ``code_edit``: an instruction plus an 8-25 line Python snippet to modify. The answer mostly
  repeats the snippet, which is where prompt-lookup (n-gram) drafting shines.
- ``summarize``: a 90-150 word passage (about 185-220 characters in Chinese) to condense into
  2-3 sentences; the answer reuses phrases from the passage.
- ``qa_context``: a 60-120 word context plus a question answerable from it; short answers.
- ``chat``: open-ended one-to-three-sentence requests; little to copy from the prompt.

Every record has a fixed ``split``: within each (language, task) group every third prompt is
``heldout`` and the rest ``tune``, so configurations and policies can be tuned on one part and
reported on the other. ``max_new_tokens`` is a per-task suggestion (code_edit 160,
summarize 96, qa_context 64, chat 128) that keeps output lengths equal across languages.

Request lengths are matched across languages by content: the same word ranges, and Chinese
passages sized at about one character per English-equivalent token. SmolLM2's tokenizer
(49152-token BPE) is English-centric, so the same content costs more real tokens: per-task
medians run about 1.4-1.8x English for Italian and Spanish and 1.6-2.5x for Chinese. Report
results per language rather than pooled.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path

LANGUAGES = ("en", "it", "zh", "es")
TASKS = ("code_edit", "summarize", "qa_context", "chat")
SPLITS = ("tune", "heldout")

_SHIPPED = "prompts.jsonl"


@dataclass(frozen=True)
class Prompt:
    """One benchmark request."""

    id: str
    """Unique id, ``{language}-{task}-{index:03d}`` in the shipped file."""
    language: str
    """ISO 639-1 code of the request's natural language, one of ``LANGUAGES`` when shipped."""
    task: str
    """One of ``TASKS`` when shipped."""
    split: str
    """``tune`` (2/3 of each group) or ``heldout`` (the other 1/3) when shipped."""
    prompt: str
    """The user message, to be wrapped in the model's chat template by the caller."""
    max_new_tokens: int
    """Suggested generation budget in tokens for this task."""


_FIELDS = tuple(f.name for f in fields(Prompt))


def _parse_line(line: str, where: str) -> Prompt:
    """One JSONL line -> Prompt, with errors that say which line and field is wrong."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{where}: not valid JSON ({error.msg}); each line must be one JSON object."
        ) from None
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}.")
    missing = [name for name in _FIELDS if name not in record]
    if missing:
        raise ValueError(
            f"{where}: missing field(s) {', '.join(missing)}; "
            f"every record needs {', '.join(_FIELDS)}."
        )
    for name in ("id", "language", "task", "split", "prompt"):
        if not isinstance(record[name], str) or not record[name]:
            raise ValueError(f"{where}: field {name}={record[name]!r} must be a non-empty string.")
    budget = record["max_new_tokens"]
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        raise ValueError(f"{where}: max_new_tokens={budget!r} must be a positive integer.")
    return Prompt(**{name: record[name] for name in _FIELDS})


def _read(path: str | Path | None) -> list[Prompt]:
    if path is None:
        text = resources.files(__name__).joinpath(_SHIPPED).read_text(encoding="utf-8")
        source = f"draftrl/prompts/{_SHIPPED}"
    else:
        text = Path(path).read_text(encoding="utf-8")
        source = str(path)
    prompts: list[Prompt] = []
    seen: set[str] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        item = _parse_line(line, f"{source}:{number}")
        if item.id in seen:
            raise ValueError(f"{source}:{number}: duplicate id {item.id!r}; ids must be unique.")
        seen.add(item.id)
        prompts.append(item)
    return prompts


def _selection(kind: str, wanted: str | Iterable[str] | None, known: tuple[str, ...],
               present: Iterable[str]) -> frozenset[str] | None:
    """Normalise a filter (a name, several names, or None for all) and reject unknown names.

    Valid names are the shipped ones plus any that a user's own file uses, so a typo fails
    loudly instead of silently selecting nothing.
    """
    if wanted is None:
        return None
    names = (wanted,) if isinstance(wanted, str) else tuple(wanted)
    valid = known + tuple(sorted(set(present) - set(known)))
    unknown = [name for name in names if name not in valid]
    if unknown:
        raise ValueError(
            f"unknown {kind} {', '.join(map(repr, unknown))}; valid: {', '.join(valid)}."
        )
    return frozenset(names)


def load_prompts(
    path: str | Path | None = None,
    *,
    languages: str | Iterable[str] | None = None,
    tasks: str | Iterable[str] | None = None,
    split: str | None = None,
    limit_per_group: int | None = None,
) -> list[Prompt]:
    """Load prompts in file order, optionally filtered.

    :param path: a JSONL file with the ``Prompt`` fields, one object per line; ``None`` = the
        shipped set.
    :param languages: a language code or several (``"zh"``, ``("en", "it")``); ``None`` = all.
    :param tasks: a task name or several; ``None`` = all.
    :param split: ``"tune"`` or ``"heldout"``; ``None`` = both.
    :param limit_per_group: keep only the first n matching prompts of each (language, task)
        group, so quick runs stay balanced across languages and tasks.
    :return: the matching prompts.
    """
    prompts = _read(path)
    wanted_languages = _selection("language", languages, LANGUAGES, (p.language for p in prompts))
    wanted_tasks = _selection("task", tasks, TASKS, (p.task for p in prompts))
    wanted_splits = _selection("split", split, SPLITS, (p.split for p in prompts))
    if limit_per_group is not None and (isinstance(limit_per_group, bool) or limit_per_group < 1):
        raise ValueError(f"limit_per_group={limit_per_group!r} must be a positive integer or None.")

    selected: list[Prompt] = []
    num_per_group: dict[tuple[str, str], int] = {}
    for item in prompts:
        if wanted_languages is not None and item.language not in wanted_languages:
            continue
        if wanted_tasks is not None and item.task not in wanted_tasks:
            continue
        if wanted_splits is not None and item.split not in wanted_splits:
            continue
        group = (item.language, item.task)
        if limit_per_group is not None and num_per_group.get(group, 0) >= limit_per_group:
            continue
        num_per_group[group] = num_per_group.get(group, 0) + 1
        selected.append(item)
    return selected
