"""The source articles' test vectors, run through the real sampler code (``draftrl selftest``).

Each vector fixes a target distribution p (and a draft distribution q or deterministic proposals),
runs many independent verifications batched over trials with the ``*_batch`` functions of
``draftrl.decoding.sampling`` (the same code ``verify_chain`` and the tree verifiers run every
round), and compares the frequencies of the emitted token with p. A vector passes when every
frequency, and the rate at which the emitted token is one of the draft's proposals ("agree"), is
within 4 standard errors of its expectation. ``method="resample-from-p"`` runs the known-wrong
correction (for sampled tree children: no residual update) and must fail.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from draftrl.config import SELFTEST_SAMPLERS
from draftrl.decoding import sampling
from draftrl.models.distribution import sample

#: Pass criterion: every checked frequency within this many standard errors of its expectation.
Z_TOLERANCE = 4.0
#: Trials run per batch, to bound memory for large --trials.
_CHUNK = 500_000


@dataclass(frozen=True)
class Vector:
    """One test vector. ``kind`` is "chain" (k=1), "node-deterministic" or "node-sampled"."""

    name: str
    kind: str
    p: tuple[float, ...]
    q: tuple[float, ...] | None = None
    """Draft distribution the proposals are sampled from; None with ``proposals`` for deterministic ones."""
    proposals: tuple[int, ...] = ()
    """Deterministic proposals: the chain's one draft token, or a node's children."""
    num_children: int = 0
    """node-sampled: children drawn i.i.d. from q per trial."""
    note: str = ""


VECTORS: tuple[Vector, ...] = (
    Vector("three-symbols", "chain", (0.5, 0.3, 0.2), q=(0.2, 0.5, 0.3),
           note="seed article: correct gives p; resample-from-p gives (0.35, 0.39, 0.26)"),
    Vector("four-tokens", "chain", (0.5, 0.1, 0.1, 0.3), q=(0.2, 0.4, 0.3, 0.1),
           note="seed article: alpha 0.5, residual (0.6, 0, 0, 0.4)"),
    Vector("one-hot-draft", "chain", (0.5, 0.3, 0.2), proposals=(1,),
           note="deterministic proposal B: accept with p(B), else sample p without B"),
    Vector("p-equals-q", "chain", (0.5, 0.3, 0.2), q=(0.5, 0.3, 0.2),
           note="Z = 0: always accepted, residual never built"),
    Vector("q-zero-where-p-positive", "chain", (0.5, 0.3, 0.2), q=(0.6, 0.4, 0.0),
           note="C is never proposed and must come from the residual"),
    Vector("tree-node-deterministic", "node-deterministic", (0.5, 0.1, 0.1, 0.3), proposals=(1, 2),
           note="top-2 children of q: sample y ~ p, descend iff y is a child"),
    Vector("tree-node-sampled", "node-sampled", (0.5, 0.1, 0.1, 0.3), q=(0.2, 0.4, 0.3, 0.1), num_children=3,
           note="3 children i.i.d. from q, recursive rejection sampling"),
)


def check_frequencies(counts: list[int], expected: list[float], trials: int, z: float = Z_TOLERANCE) -> dict[str, Any]:
    """Compare observed counts with expected probabilities, cell by cell.

    The standard error of a frequency with probability e over n trials is sqrt(e (1 - e) / n);
    a cell with e = 0 must be observed exactly 0 times.

    :return: observed, stderr, z (per cell; 0 where both are 0, inf where only e is 0), passed.
    """
    observed = [c / trials for c in counts]
    stderr = [math.sqrt(e * (1 - e) / trials) for e in expected]
    zs = [_z(o - e, s) for o, e, s in zip(observed, expected, stderr)]
    return {"observed": observed, "stderr": stderr, "z": zs, "passed": all(abs(v) <= z for v in zs)}


def _z(diff: float, stderr: float) -> float:
    if stderr > 0:
        return diff / stderr
    return 0.0 if abs(diff) < 1e-12 else math.copysign(math.inf, diff)


def _run_chunk(vec: Vector, trials: int, generator: Any, method: str) -> tuple[Any, Any, Any]:
    """One batch of trials: emitted tokens [n], agree [n] bool, agree_expected [n] float64."""
    vocab = len(vec.p)
    p = torch.tensor(vec.p, dtype=torch.float64).expand(trials, vocab)
    q = None if vec.q is None else torch.tensor(vec.q, dtype=torch.float64).expand(trials, vocab)
    if vec.kind == "chain":  # k = 1; the bonus position reuses p
        target = p.unsqueeze(1).expand(trials, 2, vocab)
        if q is None:
            draft, draft_probs = torch.full((trials, 1), vec.proposals[0], dtype=torch.long), None
        else:
            draft, draft_probs = sample(q, generator).unsqueeze(-1), q.unsqueeze(1)
        num_accepted, next_token, _ = sampling.verify_chain_batch(target, draft, draft_probs, generator, method)
        token = torch.where(num_accepted >= 1, draft[:, 0], next_token)
        children = draft
        agree_expected = sampling.chain_agree_expected_batch(target, draft, draft_probs)[:, 0]
    elif vec.kind == "node-deterministic":
        children = torch.tensor(vec.proposals, dtype=torch.long).expand(trials, -1)
        _, token = sampling.verify_node_deterministic_batch(p, children, generator)
        agree_expected = torch.full((trials,), sampling.agree_expected_deterministic(p[0], children[0]))
    else:
        children = sample(q.unsqueeze(1).expand(trials, vec.num_children, vocab), generator)
        node_method = "correct" if method == "correct" else "no-residual-update"
        _, token, agree_expected = sampling.verify_node_sampled_batch(p, children, q, generator, node_method)
    agree = (token.unsqueeze(-1) == children).any(dim=-1)
    return token, agree, agree_expected.double()


def run_vector(vec: Vector, trials: int, generator: Any, method: str = "correct") -> dict[str, Any]:
    """Run one vector for ``trials`` trials and check it; returns the JSON record of the vector."""
    counts = torch.zeros(len(vec.p), dtype=torch.long)
    agree = agree_expected = agree_var = 0.0
    for first in range(0, trials, _CHUNK):
        token, hit, expect = _run_chunk(vec, min(_CHUNK, trials - first), generator, method)
        counts += torch.bincount(token, minlength=len(vec.p))
        agree += float(hit.sum())
        agree_expected += float(expect.sum())
        agree_var += float((expect * (1 - expect)).sum())
    expected = list(vec.p)
    result = check_frequencies(counts.tolist(), expected, trials)
    # agree - agree_expected is a sum of independent zero-mean terms with variance ae (1 - ae)
    stderr = math.sqrt(agree_var) / trials
    z = _z((agree - agree_expected) / trials, stderr)
    agree_check = {
        "expected": agree_expected / trials,
        "observed": agree / trials,
        "stderr": stderr,
        "z": z,
        "passed": abs(z) <= Z_TOLERANCE,
    }
    return {
        "name": vec.name,
        "kind": vec.kind,
        "note": vec.note,
        "p": list(vec.p),
        "q": None if vec.q is None else list(vec.q),
        "proposals": list(vec.proposals),
        "num_children": vec.num_children,
        "trials": trials,
        "expected": expected,
        "observed": result["observed"],
        "stderr": result["stderr"],
        "z": result["z"],
        "agree": agree_check,
        "passed": result["passed"] and agree_check["passed"],
    }


def run_selftest(trials: int = 200_000, seed: int = 0, method: str = "correct") -> dict[str, Any]:
    """Run every vector in :data:`VECTORS`; returns {"vectors": [...], "passed": bool, ...}."""
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise ValueError(f"trials={trials!r} must be a positive integer; e.g. --trials 200000.")
    if method not in SELFTEST_SAMPLERS:
        raise ValueError(f"method={method!r} is not one of {', '.join(SELFTEST_SAMPLERS)}; use --method correct.")
    generator = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    # trials x V tensors with V <= 4: one intra-op thread avoids thread start-up and contention costs
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        vectors = [run_vector(vec, trials, generator, method) for vec in VECTORS]
    finally:
        torch.set_num_threads(threads)
    return {
        "vectors": vectors,
        "passed": all(v["passed"] for v in vectors),
        "method": method,
        "trials": trials,
        "seed": seed,
        "criterion": f"every frequency within {Z_TOLERANCE:g} standard errors of its expectation",
        "seconds": time.perf_counter() - start,
    }
