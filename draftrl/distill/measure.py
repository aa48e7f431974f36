"""Acceptance of a trained head in draftrl's engine: greedy chains of a fixed depth on held-out
prompts (measured only, never trained on). Per position i: the conditional acceptance (rounds that
accepted i drafts / rounds that reached draft i) and the share of rounds that accepted at least i;
the acceptance length counts the bonus token (``num_emitted`` per round)."""

from __future__ import annotations

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
    accepted, drafted, emitted, rounds, by_task = [], [], 0, 0, {}
    try:
        for index, prompt in enumerate(prompts):
            engine.start(encode(loaded.tokenizer, prompt.prompt, max_prompt_tokens))
            while not engine.finished:
                result = engine.round(depth)
                if result.num_proposed:
                    accepted.append(result.num_accepted)
                    drafted.append(result.num_proposed)
                    emitted += result.num_emitted
                    rounds += 1
                    task = by_task.setdefault(prompt.task, [0, 0])
                    task[0] += result.num_emitted
                    task[1] += 1
            if progress is not None:
                progress(index + 1, len(prompts), prompt.id)
    finally:
        drafter.close()
    reached = [sum(1 for a, d in zip(accepted, drafted) if d >= i and a >= i - 1) for i in range(1, depth + 1)]
    kept = [sum(1 for a in accepted if a >= i) for i in range(1, depth + 1)]
    return {
        "prompts": [p.id for p in prompts], "depth": depth, "tokens_per_prompt": tokens, "rounds": rounds,
        "acceptance_per_position": [round(k / r, 4) if r else None for k, r in zip(kept, reached)],
        "accepted_at_least": [round(k / rounds, 4) if rounds else None for k in kept],
        "acceptance_length": round(emitted / rounds, 3) if rounds else None,
        "acceptance_length_per_task": {t: round(e / n, 3) for t, (e, n) in sorted(by_task.items())},
    }
