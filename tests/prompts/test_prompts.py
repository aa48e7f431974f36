"""Shipped prompt sets: coverage, splits, filters, errors and cross-language length balance."""

from __future__ import annotations

import ast
import json
import re
import statistics
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from draftrl.prompts import LANGUAGES, SPLITS, TASKS, Prompt, load_prompts

MIN_PER_GROUP = 24
MAX_NEW_TOKENS = {"code_edit": 160, "summarize": 96, "qa_context": 64, "chat": 128}
CJK = re.compile(r"[\u3000-\u303f\u3400-\u9fff\uff00-\uffef]")
CODE_BLOCK = re.compile(r"```python\n(.*?)\n```", re.DOTALL)


def rough_tokens(text: str) -> float:
    """Crude token count without a tokenizer: one per CJK character, one per 4 other characters.

    Good enough to catch a language whose requests are far longer or shorter than the others'.
    """
    num_cjk = len(CJK.findall(text))
    return num_cjk + (len(text) - num_cjk) / 4


def by_group(prompts: list[Prompt]) -> dict[tuple[str, str], list[Prompt]]:
    groups: dict[tuple[str, str], list[Prompt]] = defaultdict(list)
    for item in prompts:
        groups[(item.language, item.task)].append(item)
    return groups


@pytest.fixture(scope="module")
def shipped() -> list[Prompt]:
    return load_prompts()


def test_every_language_task_group_has_enough_prompts(shipped: list[Prompt]) -> None:
    counts = Counter((p.language, p.task) for p in shipped)
    assert set(counts) == {(lang, task) for lang in LANGUAGES for task in TASKS}
    assert min(counts.values()) >= MIN_PER_GROUP, counts


def test_ids_are_unique_and_name_their_group(shipped: list[Prompt]) -> None:
    assert len({p.id for p in shipped}) == len(shipped)
    for item in shipped:
        assert re.fullmatch(rf"{item.language}-{item.task}-\d{{3}}", item.id), item.id
    assert all(p.max_new_tokens == MAX_NEW_TOKENS[p.task] for p in shipped)


def test_splits_are_disjoint_complete_and_balanced_per_group(shipped: list[Prompt]) -> None:
    tune = {p.id for p in load_prompts(split="tune")}
    heldout = {p.id for p in load_prompts(split="heldout")}
    assert not tune & heldout
    assert tune | heldout == {p.id for p in shipped}
    assert {p.split for p in shipped} == set(SPLITS)
    for group, items in by_group(shipped).items():
        num_heldout = sum(p.split == "heldout" for p in items)
        assert abs(num_heldout - len(items) / 3) <= 1, (group, num_heldout, len(items))


def test_filters_select_exactly_what_was_asked(shipped: list[Prompt]) -> None:
    zh = load_prompts(languages="zh")
    assert zh and {p.language for p in zh} == {"zh"}
    assert len(zh) == sum(p.language == "zh" for p in shipped)

    mixed = load_prompts(languages=["en", "es"], tasks=("chat", "qa_context"), split="heldout")
    assert {(p.language, p.task, p.split) for p in mixed} == {
        (lang, task, "heldout") for lang in ("en", "es") for task in ("chat", "qa_context")
    }

    code = load_prompts(tasks="code_edit")
    assert {p.task for p in code} == {"code_edit"} and {p.language for p in code} == set(LANGUAGES)


def test_limit_per_group_keeps_the_first_n_of_every_group(shipped: list[Prompt]) -> None:
    limited = load_prompts(limit_per_group=2)
    assert Counter((p.language, p.task) for p in limited) == {
        (lang, task): 2 for lang in LANGUAGES for task in TASKS
    }
    groups = by_group(shipped)
    for group, items in by_group(limited).items():
        assert items == groups[group][:2]
    tune_only = load_prompts(split="tune", tasks="chat", limit_per_group=3)
    assert len(tune_only) == 3 * len(LANGUAGES) and all(p.split == "tune" for p in tune_only)


@pytest.mark.parametrize(
    ("kwargs", "bad", "valid"),
    [
        ({"languages": "fr"}, "'fr'", "en, it, zh, es"),
        ({"languages": ["en", "english"]}, "'english'", "en, it, zh, es"),
        ({"tasks": "translate"}, "'translate'", "code_edit, summarize, qa_context, chat"),
        ({"split": "test"}, "'test'", "tune, heldout"),
    ],
)
def test_unknown_filter_names_fail_with_one_line_naming_the_valid_ones(
    kwargs: dict[str, object], bad: str, valid: str
) -> None:
    with pytest.raises(ValueError) as caught:
        load_prompts(**kwargs)  # type: ignore[arg-type]
    message = str(caught.value)
    assert "\n" not in message and bad in message and valid in message


@pytest.mark.parametrize("limit", [0, -1])
def test_non_positive_limit_is_rejected(limit: int) -> None:
    with pytest.raises(ValueError, match="limit_per_group"):
        load_prompts(limit_per_group=limit)


def write_jsonl(path: Path, records: list[dict[str, object]]) -> Path:
    lines = [json.dumps(record, ensure_ascii=False) + "\n" for record in records]
    path.write_text("".join(lines), encoding="utf-8")
    return path


def test_a_users_own_file_loads_and_its_names_are_valid_filters(tmp_path: Path) -> None:
    records = [
        {"id": "fr-chat-001", "language": "fr", "task": "chat", "split": "tune",
         "prompt": "Raconte-moi une blague.", "max_new_tokens": 32},
        {"id": "en-chat-001", "language": "en", "task": "chat", "split": "heldout",
         "prompt": "Tell me a joke.", "max_new_tokens": 32},
    ]
    path = write_jsonl(tmp_path / "mine.jsonl", records)
    assert [p.id for p in load_prompts(path)] == ["fr-chat-001", "en-chat-001"]
    assert [p.id for p in load_prompts(str(path), languages="fr")] == ["fr-chat-001"]
    with pytest.raises(ValueError, match="valid: en, it, zh, es, fr"):
        load_prompts(path, languages="de")


GOOD_RECORD: dict[str, object] = {
    "id": "a", "language": "en", "task": "chat", "split": "tune", "prompt": "Hi.",
    "max_new_tokens": 8,
}


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens=0"),
        ({"prompt": ""}, "prompt=''"),
        ({"task": None}, "task=None"),
    ],
)
def test_malformed_records_name_the_line_and_field(
    tmp_path: Path, change: dict[str, object], expected: str
) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [GOOD_RECORD, {**GOOD_RECORD, "id": "b", **change}])
    with pytest.raises(ValueError, match=rf"bad\.jsonl:2: .*{re.escape(expected)}"):
        load_prompts(path)


def test_missing_fields_and_duplicate_ids_are_rejected(tmp_path: Path) -> None:
    missing = {k: v for k, v in GOOD_RECORD.items() if k != "split"}
    with pytest.raises(ValueError, match="missing field.*split"):
        load_prompts(write_jsonl(tmp_path / "missing.jsonl", [missing]))
    with pytest.raises(ValueError, match="duplicate id 'a'"):
        load_prompts(write_jsonl(tmp_path / "dup.jsonl", [GOOD_RECORD, GOOD_RECORD]))


def test_code_edit_prompts_hold_one_short_valid_python_snippet() -> None:
    for item in load_prompts(tasks="code_edit"):
        blocks = CODE_BLOCK.findall(item.prompt)
        assert len(blocks) == 1, item.id
        assert 8 <= blocks[0].count("\n") + 1 <= 25, item.id
        ast.parse(blocks[0])


def passage(item: Prompt) -> str:
    """The text to summarize, or the context of a qa_context prompt (second paragraph)."""
    return item.prompt.split("\n\n")[1]


@pytest.mark.parametrize(
    ("task", "words", "cjk_chars"),
    [("summarize", (90, 150), (150, 260)), ("qa_context", (60, 120), (100, 200))],
)
def test_passages_stay_in_their_length_range(
    task: str, words: tuple[int, int], cjk_chars: tuple[int, int]
) -> None:
    """Words for alphabetic languages; Chinese has no spaces, so count its characters instead."""
    for item in load_prompts(tasks=task):
        text = passage(item)
        if item.language == "zh":
            size, (low, high) = len(CJK.findall(text)), cjk_chars
        else:
            size, (low, high) = len(text.split()), words
        assert low <= size <= high, (item.id, size)


def test_chat_requests_are_one_to_three_sentences() -> None:
    for item in load_prompts(tasks="chat"):
        sentences = [s for s in re.split(r"[.!?。？！]+", item.prompt) if s.strip()]
        assert 1 <= len(sentences) <= 3, item.id


@pytest.mark.parametrize("task", TASKS)
def test_request_lengths_are_comparable_across_languages(shipped: list[Prompt], task: str) -> None:
    """Per task, the median rough token count of each language is within 1.5x of the others'."""
    groups = by_group(shipped)
    medians = {
        lang: statistics.median(rough_tokens(p.prompt) for p in groups[(lang, task)])
        for lang in LANGUAGES
    }
    assert max(medians.values()) <= 1.5 * min(medians.values()), medians
