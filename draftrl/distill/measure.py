"""Acceptance of a trained head in draftrl's engine: greedy chains of a fixed depth on held-out
prompts (measured only, never trained on). Per position i: the conditional acceptance (rounds that
accepted i drafts / rounds that reached draft i) and the share of rounds that accepted at least i;
the acceptance length counts the bonus token (``num_emitted`` per round); all counted by
:class:`draftrl.decoding.counts.AcceptanceCounts`."""

from __future__ import annotations

from draftrl.decoding.counts import AcceptanceCounts
from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
from draftrl.distill.data import encode
from draftrl.drafters.eagle3 import Eagle3Drafter, Eagle3Head
from draftrl.prompts import load_prompts


def measure_acceptance(head: Eagle3Head, loaded, num_prompts: int, depth: int, tokens: int,
                       max_prompt_tokens: int, progress=None) -> dict:
    prompts = load_prompts(split="heldout", limit_per_group=1)[:num_prompts]
    drafter = Eagle3Drafter(head, loaded.model)
    engine = SpeculativeDecoder(loaded.model, drafter, EngineConfig(max_new_tokens=tokens, max_depth=depth),
                                loaded.eos_token_ids)
    by_task: dict[str, AcceptanceCounts] = {}
    try:
        for index, prompt in enumerate(prompts):
            counts = by_task.setdefault(prompt.task, AcceptanceCounts(depth))
            engine.start(encode(loaded.tokenizer, prompt.prompt, max_prompt_tokens))
            while not engine.finished:
                counts.observe_round(engine.round(depth))
            if progress is not None:
                progress(index + 1, len(prompts), prompt.id)
    finally:
        drafter.close()
    total = sum(by_task.values(), AcceptanceCounts(depth))
    return {
        "prompts": [p.id for p in prompts], "depth": depth, "tokens_per_prompt": tokens, **total.summary(),
        "acceptance_length_per_task": {t: c.summary()["acceptance_length"] for t, c in sorted(by_task.items())},
    }
