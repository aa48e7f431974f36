"""The lookahead policy for the real engine at temperature 0, or at any temperature with keyed sampling: the
upper bound of a comparison.

At temperature 0 the output is the target's greedy continuation whatever the policy does (with keyed
sampling, ``env.keyed``, plain decoding's keyed continuation for the request's seed: docs/design.md), so
once plain decoding has produced it (the evaluation's reference run), the number of draft
tokens the target *will* accept is known before verifying: propose the deepest tree, walk it
along the reference. The lookahead then drafts exactly that deep (the largest grid depth not above
it; 0 when nothing would be accepted), so it never pays for a rejected draft token. It reads
the answer, so it is not deployable; its lookahead time is reported as ``excluded_seconds``
and not charged to its throughput.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from draftrl.policies.base import Policy


class GreedyLookAhead(Policy):
    """Per-round depth = the accept length the reference continuation reveals.

    :param env: the (real-engine) env the lookahead acts on; it reads ``env.unwrapped.engine`` and
        ``env.unwrapped.request``.
    :param references: ``{prompt_id: greedy continuation token ids}``.
    :param width: tree width of the lookahead proposal (the env's ``width``).
    """

    name = "lookahead"

    def __init__(self, depths: Sequence[int], verify_sizes: Sequence[int], feature_names: Sequence[str], env: Any,
                 references: Mapping[str, list[int]], width: int = 1):
        super().__init__(depths, verify_sizes, feature_names)
        self.env = env
        self.references = references
        self.width = int(width)
        self.verify_size = self.default_verify_size()
        self.excluded_seconds = 0.0
        engine = env.unwrapped.engine
        if engine.config.temperature != 0 and not engine.config.keyed:
            raise ValueError(
                f"the lookahead needs temperature 0 or keyed sampling (the output must be known in advance); got "
                f"temperature={engine.config.temperature}. Set env.keyed=true, or drop lookahead from --policies."
            )

    def accept_length(self) -> int:
        """Draft tokens the target would accept this round from the deepest tree the grid allows."""
        base = self.env.unwrapped
        engine = base.engine
        reference = self.references.get(base.request.prompt.id)
        if reference is None:
            raise ValueError(f"the lookahead has no reference continuation for prompt {base.request.prompt.id!r}; "
                             "plain decoding (none) must run on a request before the lookahead.")
        depth = min(max(self.depths), engine.remaining - 1)
        if depth <= 0 or engine.drafter is None:
            return 0
        tree = engine.drafter.propose(engine.ids, depth, self.width, engine.params, None)
        engine.drafter.commit(engine.ids, [])  # nothing of the lookahead stays in the draft's cache
        ahead = reference[len(engine.output_ids):]
        node, length = -1, 0
        while length < len(ahead):
            children = [i for i, p in enumerate(tree.parents) if p == node and tree.tokens[i] == ahead[length]]
            if not children:
                break
            node, length = children[0], length + 1
        return length

    def act(self, observation: np.ndarray) -> tuple[int, int]:
        t0 = time.perf_counter()
        k = self.accept_length()
        depth = self.snap_depth(k) if k > 0 else min(self.depths)
        self.excluded_seconds += time.perf_counter() - t0
        return depth, self.verify_size
