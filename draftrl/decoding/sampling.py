"""Exact verification for speculative decoding: pure tensor functions, no models.

Notation. ``p`` is the target model's distribution and ``q`` the draft model's, both exactly as
returned by :func:`draftrl.models.distribution.logits_to_probs` (after temperature, top-k and
top-p), over the same vocabulary of size ``V``. Draft tokens are the proposals of one round;
verification turns them into output tokens. Terms, as in vLLM's rejection sampler:

- **accepted token**: a draft token that verification keeps. Accepted tokens always form a prefix
  of the draft chain (or a root-to-node path of the draft tree).
- **recovered token**: after the first rejected draft token, the token sampled instead of it from
  the residual distribution ``norm(max(p - q, 0))``. It ends the round.
- **bonus token**: when every draft token is accepted, one extra token sampled from the target's
  distribution at the position after the last draft token. It also ends the round.

So a round emits ``num_accepted + 1`` tokens, and the emitted sequence is distributed exactly as
plain autoregressive sampling from the target (Leviathan et al., ICML 2023; SpecInfer for trees).
Rejected draft tokens are never output.

Conventions:

- Probability rows need not sum to exactly 1 (float32 rounding): every function samples from, and
  verifies against, the row divided by its sum, computed in float64.
- Each call draws a fixed number of uniforms from ``generator``, whatever the outcome, so runs are
  reproducible given the generator's seed. ``generator=None`` uses torch's global generator.
- ``*_batch`` functions hold the logic; the per-round functions call them with a batch of one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from draftrl.models.distribution import sample_rows

#: Chain verification rules. "resample-from-p" is a known-wrong negative control.
CHAIN_METHODS: tuple[str, ...] = ("correct", "resample-from-p")
#: Tree-node rules for sampled children. The others are known-wrong negative controls.
NODE_METHODS: tuple[str, ...] = ("correct", "resample-from-p", "no-residual-update")
#: Tree-node rules for deterministic children. "resample-from-p" is a known-wrong negative control.
DETERMINISTIC_METHODS: tuple[str, ...] = ("correct", "resample-from-p")

def _normalise(probs: Tensor) -> Tensor:
    """[..., V] -> float64 rows that sum to 1."""
    probs = probs.double()
    return probs / probs.sum(dim=-1, keepdim=True)


def _accept_prob(p_x: Tensor, q_x: Tensor) -> Tensor:
    """min(1, p(x)/q(x)) elementwise in float64; q(x) = 0 (never proposed) gives 1 if p(x) > 0."""
    return torch.where(q_x > 0, (p_x / q_x.clamp(min=1e-300)).clamp(max=1.0), (p_x > 0).double())


def _residual(p: Tensor, q: Tensor) -> Tensor:
    """norm(max(p - q, 0)) for normalised float64 rows [N, V].

    Where the residual mass Z is 0 (p <= q everywhere, i.e. p == q) a rejection has probability
    0, so the row is never needed; p is returned there instead of 0/0.
    """
    res = (p - q).clamp_(min=0.0)
    z = res.sum(dim=-1, keepdim=True)
    return torch.where(z > 0, res / torch.where(z > 0, z, 1.0), p)


# --------------------------------------------------------------------------- chains


@dataclass
class ChainVerdict:
    """Outcome of verifying one draft chain."""

    num_accepted: int
    """Accepted draft tokens, 0..k (a prefix of the chain)."""
    next_token: int
    """The recovered token (after a rejection) or the bonus token (all k accepted)."""
    recovered: bool
    """True if next_token was sampled from the residual after a rejection."""

    @property
    def num_emitted(self) -> int:
        """Tokens this round emits: the accepted ones plus next_token."""
        return self.num_accepted + 1


def _check_method(method: str, allowed: tuple[str, ...]) -> None:
    if method not in allowed:
        raise ValueError(f"method={method!r} is not one of {allowed}; "
                         "use 'correct' (the others are negative controls).")


def _draft_token_probs(
    target_probs: Tensor, draft_tokens: Tensor, draft_probs: Tensor | None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Normalised p(x_i) and q(x_i) at each draft position, and q's row sums.

    target_probs [B, >=k, V], draft_tokens [B, k], draft_probs [B, k, V] or None (one-hot q).
    Returns p_x [B, k] float64, q_x [B, k] float64, q_sum [B, k] float64 or None.
    """
    k = draft_tokens.shape[-1]
    x = draft_tokens.long().unsqueeze(-1)
    p = target_probs[:, :k]
    p_x = p.gather(-1, x).squeeze(-1).double() / p.sum(dim=-1, dtype=torch.float64)
    if draft_probs is None:
        return p_x, torch.ones_like(p_x), None
    q_sum = draft_probs.sum(dim=-1, dtype=torch.float64)
    return p_x, draft_probs.gather(-1, x).squeeze(-1).double() / q_sum, q_sum


def verify_chain_batch(
    target_probs: Tensor,
    draft_tokens: Tensor,
    draft_probs: Tensor | None,
    generator: torch.Generator | None,
    method: str = "correct",
) -> tuple[Tensor, Tensor, Tensor]:
    """Verify B independent draft chains at once (the logic behind :func:`verify_chain`).

    Draws B*k uniforms for acceptance, then B for the recovered/bonus token.

    :param target_probs: [B, k+1, V] p at each draft position plus the bonus position.
    :param draft_tokens: [B, k] long draft token ids.
    :param draft_probs: [B, k, V] the q each draft token was really sampled from, or None for
        deterministic proposals (q one-hot at the draft token).
    :param generator: torch generator; None uses the global one.
    :param method: "correct", or "resample-from-p" (known-wrong negative control: on rejection
        sample from p instead of the residual).
    :return: num_accepted [B] long, next_token [B] long, recovered [B] bool.
    """
    _check_method(method, CHAIN_METHODS)
    if target_probs.dim() != 3 or draft_tokens.dim() != 2:
        raise ValueError(
            f"expected target_probs [B, k+1, V] and draft_tokens [B, k], got shapes {tuple(target_probs.shape)} "
            f"and {tuple(draft_tokens.shape)}."
        )
    batch, k, vocab = draft_tokens.shape[0], draft_tokens.shape[1], target_probs.shape[-1]
    if target_probs.shape[:2] != (batch, k + 1):
        raise ValueError(
            f"target_probs has {target_probs.shape[1]} rows for {k} draft tokens; pass k+1 rows "
            "(one per draft position plus the bonus position)."
        )
    if draft_probs is not None and tuple(draft_probs.shape) != (batch, k, vocab):
        raise ValueError(
            f"draft_probs has shape {tuple(draft_probs.shape)}, expected {(batch, k, vocab)} (one q row per draft "
            "token); pass None for deterministic proposals."
        )
    device = target_probs.device
    rows = torch.arange(batch, device=device)
    if k > 0:
        p_x, q_x, q_sum = _draft_token_probs(target_probs, draft_tokens, draft_probs)
        u = torch.rand((batch, k), dtype=torch.float64, device=device, generator=generator)
        accepted = u * q_x < p_x  # probability min(1, p/q); q = 0 < p accepts, p = 0 rejects
        num_accepted = accepted.long().cumprod(dim=-1).sum(dim=-1)
    else:
        num_accepted = torch.zeros(batch, dtype=torch.long, device=device)
    recovered = num_accepted < k
    # p at the position where the round stops (the first rejection, or the bonus position)
    weights = _normalise(target_probs[rows, num_accepted])
    if method == "correct" and bool(recovered.any()):
        pos = num_accepted.clamp(max=k - 1)
        if draft_probs is None:  # one-hot q: the residual is p with the rejected token removed
            q_row = torch.zeros_like(weights).scatter_(-1, draft_tokens.long()[rows, pos].unsqueeze(-1), 1.0)
        else:
            q_row = draft_probs[rows, pos].double() / q_sum[rows, pos].unsqueeze(-1)
        weights = torch.where(recovered.unsqueeze(-1), _residual(weights, q_row), weights)
    next_token = sample_rows(weights, generator)
    return num_accepted, next_token, recovered


def verify_chain(
    target_probs: Tensor,
    draft_tokens: Tensor,
    draft_probs: Tensor | None,
    generator: torch.Generator | None,
    method: str = "correct",
) -> ChainVerdict:
    """Verify one draft chain with Leviathan et al.'s rule.

    Draft token x_i is accepted with probability min(1, p_i(x_i) / q_i(x_i)); at the first
    rejection the round stops with a recovered token from norm(max(p_i - q_i, 0)); if all k are
    accepted a bonus token is drawn from p_k. With draft_probs None (deterministic proposals)
    acceptance is p_i(x_i), the same as "sample y ~ p_i and accept iff y == x_i", and the
    recovered token comes from p_i with x_i removed.

    :param target_probs: [k+1, V] p at each draft position plus the bonus position.
    :param draft_tokens: [k] long draft token ids (k may be 0: a plain target step).
    :param draft_probs: [k, V] the q each draft token was really sampled from, or None (one-hot).
    :param generator: torch generator; None uses the global one.
    :param method: "correct", or "resample-from-p" (negative control only).
    """
    if target_probs.dim() != 2 or draft_tokens.dim() != 1:
        raise ValueError(
            f"expected target_probs [k+1, V] and draft_tokens [k], got shapes {tuple(target_probs.shape)} and "
            f"{tuple(draft_tokens.shape)}; use verify_chain_batch for batches."
        )
    num_accepted, next_token, recovered = verify_chain_batch(
        target_probs.unsqueeze(0),
        draft_tokens.unsqueeze(0),
        None if draft_probs is None else draft_probs.unsqueeze(0),
        generator,
        method,
    )
    return ChainVerdict(int(num_accepted[0]), int(next_token[0]), bool(recovered[0]))


def chain_agree_expected_batch(target_probs: Tensor, draft_tokens: Tensor, draft_probs: Tensor | None) -> Tensor:
    """Batched :func:`chain_agree_expected`: [B, k(+1), V], [B, k], [B, k, V] or None -> [B, k] float64."""
    return _accept_prob(*_draft_token_probs(target_probs, draft_tokens, draft_probs)[:2])


def chain_agree_expected(target_probs: Tensor, draft_tokens: Tensor, draft_probs: Tensor | None) -> Tensor:
    """P(the token emitted at draft position i equals x_i | the round reached position i).

    min(1, p_i(x_i)/q_i(x_i)) for sampled proposals, p_i(x_i) for deterministic ones (the
    residual never holds x_i when x_i can be rejected, so this is the acceptance probability).

    :param target_probs: [k+1, V] or [k, V] p at each draft position.
    :param draft_tokens: [k] long.
    :param draft_probs: [k, V] or None (one-hot q).
    :return: [k] float64.
    """
    return chain_agree_expected_batch(
        target_probs.unsqueeze(0), draft_tokens.unsqueeze(0), None if draft_probs is None else draft_probs.unsqueeze(0)
    )[0]


# --------------------------------------------------------------------------- tree nodes


def verify_node_deterministic_batch(
    p: Tensor, children: Tensor, generator: torch.Generator | None, method: str = "correct"
) -> tuple[Tensor, Tensor]:
    """Batched :func:`verify_node_deterministic`: one uniform per row (c + 1 for the control).

    :param p: [B, V] target distribution at the node.
    :param children: [B, c] distinct child token ids, proposed deterministically.
    :param method: "correct", or "resample-from-p" (negative control: child i is accepted with
        probability p(x_i) as if q were one-hot at it, and if all are rejected the token is
        sampled from p instead of from p without the children: too much mass on drafted tokens).
    :return: index [B] long (position of the sampled token in children, or -1), token [B] long.
    """
    _check_method(method, DETERMINISTIC_METHODS)
    p = _normalise(p)
    children = children.long()
    if method == "resample-from-p":
        u = torch.rand(children.shape, dtype=torch.float64, device=p.device, generator=generator)
        hit = u < p.gather(-1, children)
        first = torch.where(hit.any(dim=-1), hit.long().argmax(dim=-1), -1)
        fallback = sample_rows(p, generator)
        token = torch.where(first >= 0, children.gather(-1, first.clamp(min=0).unsqueeze(-1)).squeeze(-1), fallback)
        match = children == token.unsqueeze(-1)
        return torch.where(match.any(dim=-1), match.long().argmax(dim=-1), -1), token
    token = sample_rows(p, generator)
    match = children == token.unsqueeze(-1)
    index = torch.where(match.any(dim=-1), match.long().argmax(dim=-1), -1)
    return index, token


def verify_node_deterministic(
    p: Tensor, children: Tensor, generator: torch.Generator | None, method: str = "correct"
) -> tuple[int, int]:
    """Verify a tree node whose children were proposed deterministically (top-k tree, n-gram trie).

    Samples y ~ p: exact by construction. The caller descends into the child equal to y, or stops
    with y as the recovered token when y is not a child.

    :param p: [V] target distribution at the node.
    :param children: [c] distinct child token ids.
    :param method: "correct", or "resample-from-p" (negative control only).
    :return: (index of y in children or -1, y).
    """
    index, token = verify_node_deterministic_batch(p.unsqueeze(0), children.unsqueeze(0), generator, method)
    return int(index[0]), int(token[0])


def agree_expected_deterministic_batch(p: Tensor, children: Tensor) -> Tensor:
    """Batched :func:`agree_expected_deterministic`: p [B, V], children [B, c] -> [B] float64.
    A repeated child counts once (a mask over the vocabulary, so no data-dependent shapes)."""
    drafted = torch.zeros(p.shape, dtype=torch.bool, device=p.device).scatter_(-1, children.long(), True)
    return torch.where(drafted, _normalise(p), 0.0).sum(dim=-1)


def agree_expected_deterministic(p: Tensor, children: Tensor) -> float:
    """P(y ~ p is one of the deterministic children) = p(children).sum(), in float64.

    :param p: [V] target distribution; :param children: [c] token ids (a repeated one counts once).
    """
    return float(agree_expected_deterministic_batch(p.unsqueeze(0), children.unsqueeze(0))[0])


def verify_node_sampled_batch(
    p: Tensor, children: Tensor, q: Tensor, generator: torch.Generator | None, method: str = "correct",
    *, expected: bool = True,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Batched :func:`verify_node_sampled`: draws B*c uniforms for acceptance, then B to sample.

    :param p: [B, V] target distribution at the node.
    :param children: [B, c] child token ids drawn i.i.d. from q (duplicates possible), in order.
    :param q: [B, V] the draft distribution the children were drawn from.
    :param method: "correct"; negative controls: "resample-from-p" (after the last rejection the
        token is sampled from p instead of the residual) and "no-residual-update" (every child is
        tested against the original p, and the fallback samples from norm(max(p - q, 0))).
    :param expected: also compute agree_expected (False: None in its place, and c fewer residual
        passes over the vocabulary: the verification walk needs it only for the exactness statistics).
    :return: index [B] long (accepted child or -1), token [B] long, agree_expected [B] float64.
    """
    _check_method(method, NODE_METHODS)
    if p.dim() != 2 or children.dim() != 2 or q.shape != p.shape or children.shape[0] != p.shape[0]:
        raise ValueError(
            f"expected p [B, V], children [B, c], q [B, V], got shapes {tuple(p.shape)}, {tuple(children.shape)}, "
            f"{tuple(q.shape)}."
        )
    batch, num_children = children.shape
    children = children.long()
    p = _normalise(p)
    q = _normalise(q)
    q_x = q.gather(-1, children)  # [B, c]
    u = torch.rand((batch, num_children), dtype=torch.float64, device=p.device, generator=generator)
    index = torch.full((batch,), -1, dtype=torch.long, device=p.device)
    token = torch.zeros(batch, dtype=torch.long, device=p.device)
    current = p  # p_i: p_1 = p, p_{i+1} = norm(max(p_i - q, 0)) after each rejection
    for i in range(num_children):
        x = children[:, i]
        p_x = current.gather(-1, x.unsqueeze(-1)).squeeze(-1)
        hit = (index < 0) & (u[:, i] * q_x[:, i] < p_x)
        index = torch.where(hit, i, index)
        token = torch.where(hit, x, token)
        if method != "no-residual-update":
            current = _residual(current, q)
    if method == "resample-from-p":
        final = p
    elif method == "no-residual-update":
        final = _residual(p, q)
    else:
        final = current
    fallback = sample_rows(final, generator)
    token = torch.where(index < 0, fallback, token)
    return index, token, _agree_expected_sampled(p, children, q) if expected else None


def agree_expected_sampled_batch(p: Tensor, children: Tensor, q: Tensor) -> Tensor:
    """The agree_expected of :func:`verify_node_sampled_batch` alone: p [B, V], children [B, c]
    drawn i.i.d. from q [B, V] -> [B] float64 (rows normalised in float64)."""
    return _agree_expected_sampled(_normalise(p), children.long(), _normalise(q))


def _agree_expected_sampled(p: Tensor, children: Tensor, q: Tensor) -> Tensor:
    """[B] P(the emitted token is one of the children) under the CORRECT rule, whatever rule ran:
    the monitor compares what happened with what exact sampling predicts."""
    q_x = q.gather(-1, children)
    reach = torch.ones(p.shape[0], dtype=torch.float64, device=p.device)  # P(all earlier children rejected)
    agree = torch.zeros_like(reach)
    current = p
    for i in range(children.shape[1]):
        accept = _accept_prob(current.gather(-1, children[:, i : i + 1]).squeeze(-1), q_x[:, i])
        agree += reach * accept
        reach = reach * (1.0 - accept)
        current = _residual(current, q)
    return agree  # the final residual is 0 on every child, so nothing more is added


def verify_node_sampled(
    p: Tensor, children: Tensor, q: Tensor, generator: torch.Generator | None, method: str = "correct"
) -> tuple[int, int, float]:
    """Verify a tree node whose children were drawn i.i.d. from q (recursive rejection sampling).

    For i in order, child x_i is accepted with probability min(1, p_i(x_i)/q(x_i)), where p_1 = p
    and p_{i+1} = norm(max(p_i - q, 0)) after each rejection; if all are rejected, the token is
    sampled from the final residual. The emitted token is distributed exactly as p (SpecInfer).
    The children must be i.i.d. draws (with replacement): distinct children drawn without
    replacement, or the deterministic top-c of q, are biased under this rule.

    :param p: [V] target distribution at the node.
    :param children: [c] child token ids drawn i.i.d. from q (duplicates possible), in order.
    :param q: [V] the draft distribution the children were drawn from.
    :param method: "correct", or a negative control ("resample-from-p", "no-residual-update").
    :return: (accepted child index or -1, token, agree_expected) where agree_expected is the exact
        probability, given the children, that the emitted token is one of them.
    """
    index, token, agree = verify_node_sampled_batch(
        p.unsqueeze(0), children.unsqueeze(0), q.unsqueeze(0), generator, method
    )
    return int(index[0]), int(token[0]), float(agree[0])


# --------------------------------------------------------------------------- per-token statistics


def target_stats_batch(p: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Batched :func:`target_stats`: p [N, V], tokens [N] -> three [N] float64 tensors."""
    p = _normalise(p)
    tokens = tokens.long().unsqueeze(-1)
    p_token = p.gather(-1, tokens)
    ids = torch.arange(p.shape[-1], device=p.device)
    before = (p > p_token) | ((p == p_token) & (ids < tokens))
    mass_before = torch.where(before, p, 0.0).sum(dim=-1)
    entropy = -torch.special.xlogy(p, p).sum(dim=-1)
    return p_token.squeeze(-1), mass_before, entropy


def target_stats(p: Tensor, token: int) -> tuple[float, float, float]:
    """The target-side fields of :class:`~draftrl.decoding.stats.TokenStats` for one emitted
    token (``p_token``, ``mass_before``, ``entropy``), in O(V) without sorting.

    :param p: [V] target distribution at the token's position (after temperature/top-k/top-p).
    :param token: the emitted token id.
    :return: (p(token); mass of the tokens ranked strictly before it by decreasing p, ties by
        ascending id; entropy of p in nats).
    """
    token_index = torch.tensor([token], device=p.device)
    support = torch.nonzero(p).flatten()
    if support.numel() < p.numel() and bool((support == token).any()):
        # top-k / top-p rows: the zero-probability tokens change none of the three values
        token_index = torch.searchsorted(support, token_index)
        p = p[support]
    p_token, mass_before, entropy = target_stats_batch(p.unsqueeze(0), token_index)
    return float(p_token[0]), float(mass_before[0]), float(entropy[0])
