"""Two drafters' synthetic traces over the same continuations, for the drafter-choice tests."""

from __future__ import annotations

import numpy as np

from draftrl.prompts import Prompt
from draftrl.replay.traces import Traces
from draftrl.signals.costs import CostTable


def costs(level: float, base: float | None = None) -> CostTable:
    """Drafting ``level`` seconds per level at width 1 and ``base`` per round (default ``level / 4``)."""
    return CostTable(
        num_tokens=[1, 2, 4, 8, 16], context_lens=[4, 64],
        verify_seconds=[[0.02, 0.023, 0.03, 0.04, 0.06], [0.025, 0.028, 0.035, 0.05, 0.07]],
        draft_widths=[1, 2], draft_level_seconds=[level, 1.5 * level],
        draft_base_seconds=level / 4 if base is None else base,
        sample_base_seconds=1e-3, sample_token_seconds=2e-4,
    )


def synthetic(seed: int, width: int, lengths=(7, 9, 5), follow=(0, 5)) -> Traces:
    """Random trees over fixed continuations: at each position a path that follows the continuation
    for a random number of levels in ``follow`` (a range), then strays; width 2 adds a wrong sibling under
    every path node. The n-gram match feature is how many drafted levels follow it (a perfect signal)."""
    rng = np.random.default_rng(seed)
    cont_rng = np.random.default_rng(1234)  # the continuation is the target's: the same for every drafter
    prompts, cont, cu_pos, prompt_tokens, cu_prompt = [], [], [0], [], [0]
    for p, length in enumerate(lengths):
        prompts.append(Prompt(f"en-chat-{p:03d}", "en", "chat", "tune", "hi", length))
        cont += cont_rng.integers(10, 30, length).tolist()
        cu_pos.append(len(cont))
        prompt_tokens += [1, 2, 3 + p]  # distinct prompts: a replay finds a request by its tokens
        cu_prompt.append(len(prompt_tokens))
    tokens, parents, depths, scores, cu_nodes, signal = [], [], [], [], [0], []
    for p in range(len(lengths)):
        for i in range(cu_pos[p], cu_pos[p + 1]):
            follow_, size = int(rng.integers(*follow)), int(rng.integers(0, 5))
            node_parent, right_levels = -1, 0
            for level in range(1, size + 1):
                right = i + level - 1 < cu_pos[p + 1] and level <= follow_
                tok = cont[i + level - 1] if right else 99
                here = len(tokens) - cu_nodes[-1]
                tokens.append(tok), parents.append(node_parent), depths.append(level), scores.append(0.9 ** level)
                if width > 1:
                    tokens.append(98), parents.append(node_parent), depths.append(level), scores.append(0.1)
                node_parent, right_levels = here, right_levels + right
                if not right:
                    break
            cu_nodes.append(len(tokens))
            signal.append(right_levels)
    return Traces(
        prompts=prompts, budgets=list(lengths), stop_reasons=["length"] * len(lengths),
        prompt_tokens=np.array(prompt_tokens), cu_num_prompt_tokens=np.array(cu_prompt),
        continuation=np.array(cont), cu_num_positions=np.array(cu_pos),
        draft_features=np.column_stack([np.zeros(len(cont))] * 2 + [np.array(signal)] + [np.zeros(len(cont))]),
        cu_num_nodes=np.array(cu_nodes), node_tokens=np.array(tokens), node_parents=np.array(parents),
        node_depths=np.array(depths), node_scores=np.array(scores), max_depth=4, width=width,
        meta={"config": {}, "target": "smollm2-135m", "drafter": "ngram"},
    )
