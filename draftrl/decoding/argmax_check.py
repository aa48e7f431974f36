"""The per-token guarantee of greedy speculative decoding, in every dtype, checked every round.

At temperature 0 each emitted token must be the argmax of the target row computed by the forward
that verified it: the root's row for the round's first token, then the row of the node accepted
before it (accepted node ``n`` is row ``n + 1`` of the verification forward). And the accepted
nodes must form a root-to-leaf path whose tokens are the tokens emitted at their places, since the
target's KV cache keeps those nodes.

This holds in bfloat16 and float16 as in float32, whatever order the verification forward
reduces in: it compares the round's tokens with the rows the round itself computed. Bitwise
identity with plain decoding (one-token forwards) is a float32 property only and is checked by the
evaluation (``draftrl.eval.agreement``).

The check reads the argmax list the greedy walk already transferred to the host
(:attr:`~draftrl.decoding.acceptance.Acceptance.row_argmax`): no device work, no extra sync; it
re-derives each token's row from the accepted path, independently of how the walk chose them.
"""

from __future__ import annotations

from draftrl.decoding.monitor import ExactnessViolation
from draftrl.drafters.tree import DraftTree


class ArgmaxViolation(ExactnessViolation):
    """A greedy round emitted a token that is not the argmax of the row that verified it (or kept a
    node whose token it did not emit). ``failures[0]`` carries the evidence (statistic ``argmax``)."""

    def __init__(self, failure: dict, num_tokens: int):
        super().__init__([failure], num_tokens)
        self.args = (f"exactness violation after {num_tokens} emitted tokens: {failure['hint']}",)


def check_argmax(tree: DraftTree, tokens: list[int], accepted: list[int], row_argmax: list[int],
                 num_before: int = 0) -> None:
    """Raise :class:`ArgmaxViolation` unless every emitted token is its verifying row's argmax.

    :param tree: the verified tree (the selection the forward fed, row ``i + 1`` at node ``i``).
    :param tokens: the round's emitted tokens (after EOS / length truncation).
    :param accepted: the accepted node indices, root to leaf (``len(tokens)`` at most).
    :param row_argmax: [1 + len(tree)] the argmax of each row of the verification forward.
    :param num_before: tokens the request emitted before this round (for the evidence).
    """
    rows = [0] + [1 + node for node in accepted[: max(0, len(tokens) - 1)]]
    for i, (token, row) in enumerate(zip(tokens, rows)):
        if token != row_argmax[row]:
            where = "the root row" if row == 0 else f"the row of accepted node {row - 1}"
            _raise(i, num_before, token, row_argmax[row],
                   f"round token {i} (output position {num_before + i}) is {token}, but the argmax of {where} of the "
                   f"verification forward is {row_argmax[row]}: the walk accepted a draft token the target did not "
                   "choose (an off-by-one acceptance), or emitted a token from the wrong row")
    parent = -1
    for i, node in enumerate(accepted[: len(tokens)]):
        if tree.parents[node] != parent:
            _raise(i, num_before, tokens[i], tree.tokens[node],
                   f"accepted node {node} hangs off node {tree.parents[node]}, not off the previous accepted node "
                   f"{parent}: the accepted nodes are no root-to-leaf path, so the cache keeps the wrong history")
        parent = node
        if tree.tokens[node] != tokens[i]:
            _raise(i, num_before, tokens[i], tree.tokens[node],
                   f"round token {i} (output position {num_before + i}) is {tokens[i]}, but the accepted node {node} "
                   f"that the target's cache keeps there holds token {tree.tokens[node]}")


def _raise(i: int, num_before: int, token: int, expected: int, hint: str) -> None:
    raise ArgmaxViolation({"statistic": "argmax", "what": "emitted token", "value": float(token), "p_value": 0.0,
                           "threshold": 0.0, "rule": "temperature 0: each token is its verifying row's argmax",
                           "num_tokens": num_before + i + 1, "num_informative": 0, "expected": expected,
                           "position": num_before + i, "hint": hint}, num_before + i + 1)
