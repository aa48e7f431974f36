"""Greedy EAGLE-3 chains for many requests at once: one head forward per level for the whole step.

vLLM's stock ``eagle3`` drafts every request of a step in one batched head forward per position;
running each request's :class:`~draftrl.drafters.eagle3.Eagle3Drafter` on its own costs a head
forward per request per position instead (about 5 ms each for SmolLM2-135M's head on one CPU
core), which under load costs more than the drafts bring. :func:`draft_chains` drafts the chains
of several drafters that share one head together: their caches differ in length, so each forward
pads them (a boolean mask keeps every row to its own request's rows), while each request keeps
its own depth cap and its own per-level stop.

The result equals each drafter's own greedy ``propose(ids, cap, 1, greedy)`` (the same rows, the
same masks, float rounding aside), and the drafters' state afterwards is what their own rounds
would leave: committed rows in the cache, the root remembered, no tree rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from draftrl.drafters.eagle3 import Eagle3Drafter
from draftrl.drafters.tree import DraftTree

#: requests catching up on more new rows than this (a prompt just prefilled) run their root alone,
#: so that one long prompt does not pad every other request of the step to its length
ALONE_ROWS = 16

#: ``stop(scores)``: None while a chain whose drafts have cumulative log probabilities ``scores``
#: should grow, else how many of its drafts it keeps
ChainStop = Callable[[list[float]], "int | None"]


def draft_chains(drafters: Sequence[Eagle3Drafter], histories: Sequence[list[int]], caps: Sequence[int],
                 stop: ChainStop | None = None) -> list[DraftTree]:
    """Each drafter's greedy chain of at most ``caps[i]`` drafts after ``histories[i]``.

    :param drafters: one per request, all over the same :class:`~draftrl.drafters.eagle3.Eagle3Head`
    :param stop: a per-level stop read after every level (see :data:`ChainStop`); None: draft to the cap
    """
    if len({id(d.head) for d in drafters}) > 1:
        raise ValueError("draft_chains batches drafters of one head; these hold different heads")
    trees = [DraftTree() for _ in drafters]
    pending = []  # (index, rows to feed at the root: start, last) of the requests that draft
    for i, (drafter, ids, cap) in enumerate(zip(drafters, histories, caps)):
        if cap <= 0:
            continue
        drafter._drop_tree()
        if drafter._root is not None and drafter._root[0] == len(ids):
            pending.append((i, None))
            continue
        last = len(ids) - 2  # the root's row: features at L-2, token ids[L-1]
        if last < 0 or drafter.num_features <= last:
            continue
        drafter._rows = min(drafter._rows, last)
        pending.append((i, (drafter._rows, last)))
    small = [p for p in pending if p[1] is None or p[1][1] + 1 - p[1][0] <= ALONE_ROWS]
    groups = [small] if small else []
    groups += [[p] for p in pending if p not in small]
    for group in groups:
        _draft_group([drafters[i] for i, _ in group], [histories[i] for i, _ in group],
                     [caps[i] for i, _ in group], [rows for _, rows in group], stop,
                     [trees[i] for i, _ in group])
    return trees


def root_mask(starts: torch.Tensor, news: torch.Tensor, p: int, n: int) -> torch.Tensor:
    """[B, n, p + n] bool for the root forward: new row r of request b sees its committed rows
    (``< starts[b]``) and its new rows up to itself; a padding row (``r >= news[b]``) only itself."""
    cols, rows = torch.arange(p + n), torch.arange(n)
    real = rows[None, :, None] < news[:, None, None]
    past = cols[None, None] < starts[:, None, None]
    causal = ((cols[None] >= p) & (cols[None] - p <= rows[:, None]))[None]
    own = (cols[None] == p + rows[:, None])[None]
    return (real & (past | causal)) | (~real & own)


def level_mask(starts: torch.Tensor, news: torch.Tensor, p: int, n: int, col: int) -> torch.Tensor:
    """[B, col + 1] bool for a level's forward: each request's committed and new rows, then the
    chain's rows up to column ``col`` (its own)."""
    cols = torch.arange(col + 1)[None]
    return (cols < starts[:, None]) | ((cols >= p) & (cols < p + news[:, None])) | (cols >= p + n)


@torch.inference_mode()
def _draft_group(drafters: list[Eagle3Drafter], histories: list[list[int]], caps: list[int],
                 roots: list[tuple[int, int] | None], stop: ChainStop | None, trees: list[DraftTree]) -> None:
    """The root forward (each request's new rows, padded) and one forward per level, for one group.

    Key columns of the padded cache: ``[0, P)`` each request's committed rows (``starts[b]`` of
    them), ``[P, P + N)`` its new rows (``news[b]``), ``[P + N, ...)`` its chain's rows, one per level.
    """
    head, b = drafters[0].head, len(drafters)
    device, dtype = drafters[0].device, drafters[0].dtype
    starts = torch.tensor([r[0] if r else d._rows for d, r in zip(drafters, roots)])
    news = torch.tensor([r[1] + 1 - r[0] if r else 0 for r in roots])
    p, n, levels = int(starts.max()), max(int(news.max()), 1), max(caps) - 1
    attn = head.midlayer.self_attn
    keys = torch.zeros(b, attn.num_kv_heads, p + n + levels, attn.head_dim, device=device, dtype=dtype)
    values = torch.zeros_like(keys)
    for j, d in enumerate(drafters):
        if starts[j]:
            keys[j, :, : starts[j]] = d.keys[0, :, : starts[j]]
            values[j, :, : starts[j]] = d.values[0, :, : starts[j]]
    feeding = [j for j in range(b) if news[j]]
    if feeding:
        tokens = torch.zeros(len(feeding), n, dtype=torch.long)
        positions = torch.zeros(len(feeding), n, dtype=torch.long)
        features = torch.zeros(len(feeding), n, drafters[0].features_store.shape[1], device=device, dtype=dtype)
        for f, j in enumerate(feeding):
            start, last = roots[j]
            tokens[f, : news[j]] = torch.tensor(histories[j][start + 1 : last + 2])
            positions[f, : news[j]] = torch.arange(start, last + 1)
            features[f, : news[j]] = drafters[j].features_store[start : last + 1]
        q, k, v, residual = head.qkv(_embed(drafters[0], tokens), head.project(features), positions.to(device))
        idx = torch.tensor(feeding)
        keys[idx, :, p : p + n], values[idx, :, p : p + n] = k, v
        mask = root_mask(starts[idx], news[idx], p, n)[:, None].to(device)
        out, logits = head.finish(q, keys[idx, :, : p + n], values[idx, :, : p + n], mask, residual)
        for f, j in enumerate(feeding):
            d, start, m = drafters[j], int(starts[j]), int(news[j])
            d.keys = torch.cat([keys[j : j + 1, :, :start], keys[j : j + 1, :, p : p + m]], dim=2)
            d.values = torch.cat([values[j : j + 1, :, :start], values[j : j + 1, :, p : p + m]], dim=2)
            d._rows = start + m
            d._root = (len(histories[j]), logits[f, m - 1].float(), out[f, m - 1])
    logp = torch.log_softmax(torch.stack([d._root[1] for d in drafters]), dim=-1)
    hidden = torch.stack([d._root[2] for d in drafters])
    probs = logp.exp()
    entropy = -(probs * logp).nan_to_num().sum(-1)
    for j in range(b):
        trees[j].features = {"draft_top1_prob": probs[j].max().item(), "draft_entropy": entropy[j].item()}
    active = list(range(b))
    for level in range(levels + 1):
        best = logp.max(dim=-1)
        tokens = (best.indices + head.d2t[best.indices]).tolist()
        still = []
        for r, j in enumerate(active):
            tree = trees[j]
            tree.add(tokens[r], len(tree) - 1, (tree.scores[-1] if tree.scores else 0.0) + best.values[r].item())
            end = stop(tree.scores) if stop is not None else None
            if end is not None:
                trees[j] = tree.subset(list(range(end)))
            elif len(tree) < caps[j]:
                still.append(r)
        if not still:
            break
        active = [active[r] for r in still]
        idx, col = torch.tensor(active), p + n + level
        positions = torch.tensor([[len(histories[j]) - 1 + level] for j in active], device=device)
        fed = torch.tensor([[tokens[r]] for r in still])
        q, k, v, residual = head.qkv(_embed(drafters[0], fed), hidden[still][:, None], positions)
        keys[idx, :, col], values[idx, :, col] = k[:, :, 0], v[:, :, 0]
        mask = level_mask(starts[idx], news[idx], p, n, col)[:, None, None].to(device)
        out, logits = head.finish(q, keys[idx, :, : col + 1], values[idx, :, : col + 1], mask, residual)
        hidden, logp = out[:, 0], torch.log_softmax(logits[:, 0].float(), dim=-1)


def _embed(drafter: Eagle3Drafter, tokens: torch.Tensor) -> torch.Tensor:
    """The target's embeddings [B, T, H] of ``tokens`` [B, T], in the head's device and dtype."""
    return drafter.embed(tokens.to(drafter.embed.weight.device)).to(drafter.device, drafter.dtype)
