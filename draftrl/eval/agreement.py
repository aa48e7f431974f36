"""Greedy agreement with plain decoding, by the target's dtype: identity in float32, a rate below it.

At temperature 0 the evaluation compares every setting's (cell's, policy's) tokens with plain
decoding's (depth 0) on the same request. What it may demand depends on the target's dtype
(``env.dtype``):

- **float32**: bitwise identity. A difference raises
  :class:`~draftrl.eval.exactness.GreedyMismatch` at once, as it always has.
- **bfloat16 / float16**: a verification forward over several tokens reduces in another order
  than plain decoding's one-token forwards, so where the target's top two logits lie within
  rounding of each other the two runs may take different branches, and everything after differs.
  Bitwise identity is then no guarantee of speculative decoding (the guarantee is per token,
  checked in the engine by ``draftrl.decoding.argmax_check``). Agreement is reported as a rate:
  the share of comparisons identical and the share of plain decoding's tokens reproduced before
  the first divergence. Each first divergence records its position, the two disputed tokens
  ``a`` (plain decoding's) and ``b`` (the setting's), and the target's margin there,
  ``logit[a] - logit[b]`` and the top-2 margin, from one extra plain forward of the target over
  prompt + the common prefix (run only at a divergence, outside any timing; logits read in
  float32).

**Resolution and tolerance.** ``ulp(x) = eps * 2**floor(log2 |x|)`` is the spacing of the dtype's
numbers at ``|x|`` (``eps = torch.finfo(dtype).eps``: 2**-7 for bfloat16, 2**-10 for float16).
A divergence is a **near-tie** when ``|logit[a] - logit[b]| <= near_tie_ulps * ulp(max(|logit[a]|,
|logit[b]|))``: the margin is within what two reduction orders can move the disputed logits
apart. Otherwise it is a **violation**: the target prefers one token by more than rounding can
explain, so one of the two runs did not emit the target's choice. A violation raises
:class:`AgreementViolation` (a ``GreedyMismatch``) after the command has written its partial
results. ``eval.near_tie_ulps`` sets the multiple; its default per dtype,
:data:`NEAR_TIE_ULPS`, comes from the margins measured at real divergences (docs/design.md,
"Exactness by dtype").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from draftrl.eval.exactness import GreedyMismatch, check_identity

#: Target dtypes whose greedy output is compared with plain decoding as a rate, near-ties allowed.
LOW_PRECISION: tuple[str, ...] = ("bfloat16", "float16")
#: Default ``eval.near_tie_ulps`` per dtype (docs/design.md, "Exactness by dtype", has the measurements).
NEAR_TIE_ULPS: dict[str, float] = {"bfloat16": 8.0, "float16": 16.0}
#: How many divergences a verdict keeps in full (the counts cover all of them).
MAX_DIVERGENCES = 50


def logit_ulp(dtype: str, magnitude: float) -> float:
    """The spacing of ``dtype``'s numbers at ``|magnitude|``: ``eps * 2**floor(log2 |magnitude|)``
    with ``eps = torch.finfo(dtype).eps`` (the spacing at 1; at the smallest normal number for 0)."""
    import torch

    info = torch.finfo(getattr(torch, dtype))
    scale = max(abs(float(magnitude)), float(info.tiny))
    return float(info.eps) * 2.0 ** math.floor(math.log2(scale))


def default_near_tie_ulps(dtype: str) -> float | None:
    """:data:`NEAR_TIE_ULPS` for a low-precision dtype; None for float32 (bitwise identity)."""
    return NEAR_TIE_ULPS.get(dtype)


def divergence_margin(model, ids: list[int], reference_token: int, output_token: int) -> dict:
    """The target's logits at the position after ``ids``, read in float32, from one plain forward.

    :param model: the target (``transformers`` causal LM), in the dtype being checked.
    :param ids: prompt + the tokens both runs emitted before they diverged.
    :return: ``logit_reference``, ``logit_output``, ``margin`` (their difference), ``top2_margin``
        (the row's largest minus its second largest logit) and ``argmax`` (the row's top token).
    """
    import torch

    from draftrl.models.kv import last_logits_only

    device = next(model.parameters()).device
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids], device=device), use_cache=False,
                       **last_logits_only(model)).logits[0, -1].float()
    top = logits.topk(2)
    a, b = float(logits[reference_token]), float(logits[output_token])
    return {"logit_reference": a, "logit_output": b, "margin": a - b,
            "top2_margin": float(top.values[0] - top.values[1]), "argmax": int(top.indices[0])}


class AgreementViolation(GreedyMismatch):
    """A greedy divergence from plain decoding whose target margin exceeds the near-tie tolerance.

    A :class:`~draftrl.eval.exactness.GreedyMismatch`, so every command that stops on a greedy
    mismatch stops on it too (exit 3); ``evidence`` is the divergence record."""

    def __init__(self, record: dict):
        RuntimeError.__init__(self, violation_message(record))
        self.evidence = record


def violation_message(d: dict) -> str:
    return (f"greedy divergence beyond rounding: {d['setting']} on prompt {d['prompt_id']} leaves plain decoding at "
            f"output position {d['position']} (plain decoding emits {d['reference_token']}, it emits "
            f"{d['output_token']}); the target's logit margin there is {d['margin']:+.4f} = "
            f"{d['margin_ulps']:.1f} ulps of {d['dtype']} at |logit| {d['magnitude']:.3g}, above the near-tie "
            f"tolerance eval.near_tie_ulps={d['near_tie_ulps']:g} ({d['tolerance']:.4f}): one of the runs did not emit "
            "the target's choice")


@dataclass
class _Counts:
    comparisons: int = 0
    identical: int = 0
    reference_tokens: int = 0
    tokens_before_divergence: int = 0

    def add(self, reference_length: int, before: int) -> None:
        self.comparisons += 1
        self.identical += before == reference_length
        self.reference_tokens += reference_length
        self.tokens_before_divergence += before

    def rates(self) -> dict:
        return {"comparisons": self.comparisons, "identical": self.identical,
                "reference_tokens": self.reference_tokens, "tokens_before_divergence": self.tokens_before_divergence,
                "agreement_rate": self.identical / self.comparisons if self.comparisons else None,
                "token_agreement": (self.tokens_before_divergence / self.reference_tokens
                                    if self.reference_tokens else None)}


@dataclass
class GreedyAgreement:
    """Compares settings' greedy outputs with plain decoding's under the rule of ``dtype``.

    :param model: the target (for the margin forward at a divergence).
    :param dtype: the target's dtype (``env.dtype``).
    :param near_tie_ulps: the tolerance in ulps (None: :data:`NEAR_TIE_ULPS` of the dtype); read
        in low precision only.
    :param raise_at_once: raise a violation at the comparison that finds it (the evaluation, whose
        caller writes partial results); False: record it, and the caller raises
        (:func:`raise_first_violation`) after writing (the grid).
    :param tokenizer: decodes the disputed tokens in the evidence.
    """

    model: object
    dtype: str
    near_tie_ulps: float | None = None
    raise_at_once: bool = True
    tokenizer: object = None
    divergences: list[dict] = field(default_factory=list)
    _counts: dict[str, _Counts] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.near_tie_ulps is None:
            self.near_tie_ulps = default_near_tie_ulps(self.dtype)

    @property
    def bitwise(self) -> bool:
        """float32 (any dtype outside :data:`LOW_PRECISION`): identity is demanded, bit for bit."""
        return self.dtype not in LOW_PRECISION

    def compare(self, setting: str, prompt_id: str, prompt_ids: list[int], reference: list[int],
                output: list[int], what: str | None = None) -> dict | None:
        """Compare one setting's output with plain decoding's on one request.

        :param setting: the cell or policy name (what the rates are grouped by).
        :param what: how the evidence names it (default: ``setting``).
        :return: the divergence record, or None when the outputs are identical.
        :raises GreedyMismatch: float32, on any difference; low precision, on a violation when
            ``raise_at_once`` (or on outputs that differ only in length: no disputed token to weigh).
        """
        reference, output = list(reference), list(output)
        what = what or setting
        counts = self._counts.setdefault(setting, _Counts())
        if self.bitwise:
            check_identity(what, prompt_id, reference, output, self.tokenizer)
            counts.add(len(reference), len(reference))
            return None
        n = min(len(reference), len(output))
        at = next((i for i in range(n) if reference[i] != output[i]), n)
        if at == n:
            # equal up to the shorter one: identical, or one stopped early with no token disputed
            check_identity(what, prompt_id, reference, output, self.tokenizer)
            counts.add(len(reference), len(reference))
            return None
        counts.add(len(reference), at)
        a, b = reference[at], output[at]
        record = {"setting": setting, "what": what, "prompt_id": prompt_id, "position": at,
                  "reference_token": a, "output_token": b, "dtype": self.dtype,
                  **divergence_margin(self.model, list(prompt_ids) + reference[:at], a, b)}
        magnitude = max(abs(record["logit_reference"]), abs(record["logit_output"]))
        ulp = logit_ulp(self.dtype, magnitude)
        record.update(magnitude=magnitude, resolution=ulp, margin_ulps=abs(record["margin"]) / ulp,
                      near_tie_ulps=self.near_tie_ulps, tolerance=self.near_tie_ulps * ulp)
        record["near_tie"] = abs(record["margin"]) <= record["tolerance"]
        if self.tokenizer is not None:
            record["reference_piece"] = self.tokenizer.decode([a])
            record["output_piece"] = self.tokenizer.decode([b])
        self.divergences.append(record)
        if not record["near_tie"] and self.raise_at_once:
            raise AgreementViolation(record)
        return record

    def verdict(self) -> dict:
        """The rates, the tolerance and every divergence (the first :data:`MAX_DIVERGENCES` in full)."""
        total = _Counts()
        for c in self._counts.values():
            total.comparisons += c.comparisons
            total.identical += c.identical
            total.reference_tokens += c.reference_tokens
            total.tokens_before_divergence += c.tokens_before_divergence
        near = [d for d in self.divergences if d["near_tie"]]
        violations = [d for d in self.divergences if not d["near_tie"]]
        out = {"checked": True, "dtype": self.dtype,
               "mode": "bitwise" if self.bitwise else "near-tie",
               "passed": not violations, **total.rates(),
               "per_setting": {name: c.rates() for name, c in self._counts.items()}}
        if not self.bitwise:
            out.update({
                "near_tie_ulps": self.near_tie_ulps,
                "rule": f"a divergence is a near-tie when |logit[a] - logit[b]| <= {self.near_tie_ulps:g} ulps of "
                        f"{self.dtype} at max(|logit[a]|, |logit[b]|) (eval.near_tie_ulps)",
                "num_divergences": len(self.divergences), "num_near_ties": len(near),
                "num_violations": len(violations),
                "max_near_tie_margin_ulps": max((d["margin_ulps"] for d in near), default=None),
                "divergences": (violations + near)[:MAX_DIVERGENCES],
            })
        return out


def merge_verdicts(verdicts: list[dict]) -> dict:
    """One :meth:`GreedyAgreement.verdict` from the verdicts of disjoint request shards (Ray workers,
    each comparing its own requests against its own plain decoding): counts add up, rates are
    recomputed from them, divergences are pooled, and it passes only when every shard passed."""
    checked = [v for v in verdicts if v.get("checked")]
    if not checked:
        return verdicts[0]

    def total(parts: list[dict]) -> dict:
        c = _Counts()
        for part in parts:
            c.comparisons += part["comparisons"]
            c.identical += part["identical"]
            c.reference_tokens += part["reference_tokens"]
            c.tokens_before_divergence += part["tokens_before_divergence"]
        return c.rates()

    settings = list(dict.fromkeys(name for v in checked for name in v["per_setting"]))
    out = {**checked[0], **total(checked), "passed": all(v["passed"] for v in checked),
           "per_setting": {n: total([v["per_setting"][n] for v in checked if n in v["per_setting"]]) for n in settings}}
    if "requests" in out:
        out["requests"] = sum(v["requests"] for v in checked)
    if out["mode"] != "bitwise":
        pooled = [d for v in checked for d in v["divergences"]]
        for key in ("num_divergences", "num_near_ties", "num_violations"):
            out[key] = sum(v[key] for v in checked)
        out["max_near_tie_margin_ulps"] = max((v["max_near_tie_margin_ulps"] for v in checked
                                               if v["max_near_tie_margin_ulps"] is not None), default=None)
        out["divergences"] = ([d for d in pooled if not d["near_tie"]] + [d for d in pooled if d["near_tie"]])[
            :MAX_DIVERGENCES]
    return out


def raise_first_violation(verdict: dict) -> None:
    """Raise the first violation a :meth:`GreedyAgreement.verdict` recorded (after its caller wrote it)."""
    for d in verdict.get("divergences") or []:
        if not d["near_tie"]:
            raise AgreementViolation(d)


def verdict_lines(verdict: dict, markdown: bool = False) -> list[str]:
    """The verdict in a few lines (CLI output; ``markdown`` for report.md): agreement, then each
    divergence's position, disputed tokens and margin, near-ties and violations apart."""
    if not verdict.get("checked"):
        return []
    if verdict.get("mode") == "bitwise":
        return [f"greedy identity with plain decoding ({verdict.get('dtype', 'float32')}, bitwise): "
                f"{'passed' if verdict.get('passed') else 'FAILED'} on {verdict.get('comparisons', '-')} comparisons"]
    n, k = verdict["comparisons"], verdict["identical"]
    head = (f"greedy agreement with plain decoding ({verdict['dtype']}): {k}/{n} identical "
            f"({_pct(verdict['agreement_rate'])}), {_pct(verdict['token_agreement'])} of plain decoding's tokens "
            f"before the first divergence; {verdict['num_divergences']} divergence(s): {verdict['num_near_ties']} "
            f"near-tie(s), {verdict['num_violations']} violation(s) (tolerance {verdict['near_tie_ulps']:g} ulps "
            f"of {verdict['dtype']})")
    lines = [head]
    divergences = verdict.get("divergences") or []
    if not divergences:
        return lines
    columns = ["setting", "prompt", "position", "plain -> speculative", "margin logit[a]-logit[b]", "ulps",
               "top-2 margin", "tolerance", "verdict"]
    rows = [[d["setting"], d["prompt_id"], str(d["position"]),
             f"{d['reference_token']} {d.get('reference_piece', '')!r} -> {d['output_token']} "
             f"{d.get('output_piece', '')!r}" if "reference_piece" in d
             else f"{d['reference_token']} -> {d['output_token']}",
             f"{d['margin']:+.4f}", f"{d['margin_ulps']:.1f}", f"{d['top2_margin']:.4f}", f"{d['tolerance']:.4f}",
             "near-tie" if d["near_tie"] else "VIOLATION"] for d in divergences]
    if markdown:
        lines += ["", "| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    else:
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(columns, widths))]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    return lines


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"
