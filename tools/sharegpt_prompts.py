"""Write a prompt file (``draftrl.prompts`` JSONL) from ShareGPT's held-out conversations: prompts
from outside the shipped set that neither the drafter (``draftrl distill`` never trains on the
held-out tenth, ``draftrl.distill.data``) nor any policy saw, in the languages they come in.

The language is a guess, printed with the counts: the script of the letters (Han, kana, Hangul,
Cyrillic), then for Latin text the language whose common words occur most (en, es, it, fr, de,
pt); ``und`` when nothing decides. The task is ``chat``. Needs ``pip install "draftrl[distill]"``.

    python tools/sharegpt_prompts.py --out runs/sharegpt_heldout.jsonl --per-language 8 --max-new-tokens 32
    python benchmarks/vllm_head_routes.py --prompts runs/sharegpt_heldout.jsonl ...
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import unicodedata
from pathlib import Path

#: a few of each language's most common words (lower case)
COMMON_WORDS = {
    "en": "the and is of to you that it for with this are what how please".split(),
    "es": "el los las que por para una con del como está qué cómo".split(),
    "it": "il che per non una sono della con come questo gli è".split(),
    "fr": "le les et est une des pour que dans pas vous sur je".split(),
    "de": "der die und das ist nicht ein eine zu mit den ich sie wie".split(),
    "pt": "não um uma para com os do da em é você que".split(),
}
SCRIPTS = (("HIRAGANA", "ja"), ("KATAKANA", "ja"), ("HANGUL", "ko"), ("CJK", "zh"), ("CYRILLIC", "ru"),
           ("LATIN", "latin"))


def guess_language(text: str) -> str:
    """An ISO 639-1 code for ``text`` (module docstring), ``und`` when nothing decides."""
    scripts = collections.Counter()
    for ch in text:
        if ch.isalpha():
            name = unicodedata.name(ch, "")
            scripts[next((code for key, code in SCRIPTS if key in name), "other")] += 1
    if not scripts:
        return "und"
    if scripts["ja"]:
        return "ja"
    top = scripts.most_common(1)[0][0]
    if top != "latin":
        return top if top != "other" else "und"
    words = collections.Counter(re.findall(r"[^\W\d_]+", text.lower()))
    hits = {lang: sum(words[w] for w in common) for lang, common in COMMON_WORDS.items()}
    best = max(hits, key=hits.get)
    return best if hits[best] >= 3 and list(hits.values()).count(hits[best]) == 1 else "und"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--per-language", type=int, default=8, help="most prompts per guessed language (file order)")
    p.add_argument("--min-chars", type=int, default=20)
    p.add_argument("--max-chars", type=int, default=1500, help="longer prompts are skipped (CPU prefill time)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    args = p.parse_args()
    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise SystemExit(f"sharegpt_prompts: error: {out} already exists; pass --overwrite to replace it, "
                         "or choose another --out.")
    from draftrl.distill.data import sharegpt_exchanges
    from draftrl.io import atomic_write_text

    chosen: dict[str, list[dict]] = collections.defaultdict(list)
    for cid, human, _ in sharegpt_exchanges("heldout"):
        text = human.strip()
        language = guess_language(text)
        if language == "und" or not args.min_chars <= len(text) <= args.max_chars:
            continue
        if len(chosen[language]) < args.per_language:
            chosen[language].append({"id": cid, "language": language, "task": "chat", "split": "heldout",
                                     "prompt": text, "max_new_tokens": args.max_new_tokens})
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, "".join(json.dumps(record, ensure_ascii=False) + "\n"
                                   for records in chosen.values() for record in records))
    print("  ".join(f"{lang}={len(r)}" for lang, r in sorted(chosen.items())) + f"  out={out}")


if __name__ == "__main__":
    main()
