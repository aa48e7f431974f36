"""The one policy grammar of ``draftrl eval --policies``, on both engines.

``--engine hf`` (draftrl's exact engine, one request at a time: ``draftrl.eval.policies``) and
``--engine vllm`` (inside vLLM under load: ``draftrl.eval.serve_policies``) read the same names:

==========================  =======  =======  ====================================================
name                        hf       vllm     what it is
==========================  =======  =======  ====================================================
``none`` (alias ``ar``)     yes      yes      no speculation: the reference of every speedup
``fixed:D[:V[:W]]``         yes      D[:V]    depth D every round/step; V the verify size (hf,
                                              0 = all) or the batch's budget (vllm, none = no
                                              limit); W the tree width (hf only)
``heuristic``               yes      yes      Hugging Face's +2 / -1 draft length (vllm: per request)
``ppo:DIR``                 yes      yes      a policy written by ``draftrl train`` for that engine's env
``best-grid``               yes      -        the best fixed setting of ``--grid DIR/grid.json``
``threshold``, ``bandit``   yes      -        ConfidenceThreshold, UCBBandit
``lookahead``               yes      -        temperature 0: drafts what the target will accept
``ngram:K``                 -        yes      vLLM's own prompt lookup, K tokens
``eagle3:K``                -        yes      vLLM's own EAGLE-3, K tokens, with the head folder
                                              ``env.head`` (``--head DIR``)
``ngram:S-E:K,...``,        -        yes      the same stock methods with vLLM's Dynamic SD
``eagle3:S-E:K,...``                          table: K per running-batch-size range, looked up
                                              by vLLM's scheduler every step (route (a): no
                                              draftrl code in the engine)
``class:MODULE.Class:K``    -        yes      vLLM with another ``custom_class`` proposer
``dsd[:S-E:K,...]``         -        yes      vLLM's Dynamic SD: K per running-batch-size range
``head:K[:S][:bB]``         -        yes      draftrl's proposer running the EAGLE-3 head
                                              ``env.head`` itself, depth K every step; S a
                                              per-level stop: ``tT`` (HF's confidence threshold
                                              T) or ``cT`` (EAGLE-2's chain probability T); B
                                              the largest step (decoding requests) the head
                                              drafts in, n-gram lookup above it
``sam:N:K[:S][:bB]``        -        yes      as ``head``, per request n-gram lookup when its
                                              match has >= N tokens
==========================  =======  =======  ====================================================

A name one engine cannot run is refused with one line naming the names it accepts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

#: The reference every speedup divides by, and its alias.
REFERENCE = "none"
ALIASES = {"ar": REFERENCE}
#: Each kind's form on the command line.
FORMS: dict[str, str] = {
    "none": "none", "fixed": "fixed:D[:V[:W]]", "heuristic": "heuristic", "ppo": "ppo:DIR",
    "best-grid": "best-grid", "threshold": "threshold", "bandit": "bandit", "lookahead": "lookahead",
    "ngram": "ngram:K|S-E:K,...", "eagle3": "eagle3:K|S-E:K,... (with --head DIR)", "class": "class:MODULE.Class:K",
    "dsd": "dsd[:S-E:K,...]", "head": "head:K[:tT|:cT][:bB] (with --head DIR)",
    "sam": "sam:N:K[:tT|:cT][:bB] (with --head DIR)",
}
#: The kinds each engine runs.
ENGINE_KINDS: dict[str, tuple[str, ...]] = {
    "hf": ("none", "fixed", "heuristic", "ppo", "best-grid", "threshold", "bandit", "lookahead"),
    "vllm": ("none", "fixed", "heuristic", "ppo", "ngram", "eagle3", "class", "dsd", "head", "sam"),
}
#: The deepest draft of a vLLM engine with draftrl's proposer (its ``num_speculative_tokens``).
VLLM_MAX_DEPTH = 8
#: Dynamic SD schedule used by ``dsd`` without a table: (batch start, batch end, K).
DEFAULT_DSD: tuple[tuple[int, int, int], ...] = ((1, 1, 6), (2, 4, 4), (5, 8, 2), (9, 1024, 1))


@dataclass(frozen=True)
class PolicySpec:
    """One entry of ``--policies``, parsed."""

    kind: str
    label: str
    """the name used in results.json, the report and wandb"""
    depth: int = 0
    """fixed: D; ngram / eagle3 / class: K"""
    verify_size: int | None = None
    """fixed: V (hf: verify size, 0 = all; vllm: the batch's budget); None = the engine's default"""
    width: int = 1
    """fixed: the tree width W (hf only)"""
    dsd: tuple[tuple[int, int, int], ...] = ()
    """dsd, and ngram / eagle3 with a table: (batch start, batch end, K) rows"""
    path: str | None = None
    """ppo: the run directory (or its policy.zip); class: MODULE.Class"""
    min_match: int | None = None
    """sam: N, the shortest n-gram match that drafts by lookup"""
    stop: str | None = None
    """head, sam: the proposer's per-level stop rule (``confidence:T`` or ``cumulative:T``)"""
    head_max_batch: int | None = None
    """head, sam: the largest step (decoding requests) the head drafts in (None: every step)"""
    text: str = ""
    """the entry as written, with the alias resolved (``ppo:runs/x``, ``none`` for ``ar``)"""


def accepted_names(engine: str) -> str:
    """``"none, fixed:D[:V[:W]], ..."``: the names ``engine`` runs, for errors and ``--help``."""
    return ", ".join(FORMS[k] for k in ENGINE_KINDS[engine])


def _bad(item: str, why: str, engine: str) -> ValueError:
    return ValueError(f"policy {item!r} {why}; --engine {engine} accepts {accepted_names(engine)}.")


#: Kinds that take a Dynamic SD table (``KIND:S-E:K,...``).
TABLE_KINDS = ("dsd", "ngram", "eagle3")


def _table_entry(part: str) -> bool:
    """Whether ``part`` looks like one ``S-E:K`` row of a Dynamic SD table."""
    return part[:1].isdigit() and "-" in part.partition(":")[0]


def split_policies(text: str) -> list[str]:
    """Split a comma-separated policy list where a Dynamic SD table keeps its own commas:
    ``"none,dsd:1-1:6,2-4:2,eagle3:1-1:3,2-16:1"`` -> ``["none", "dsd:1-1:6,2-4:2", "eagle3:1-1:3,2-16:1"]``."""
    out: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        kind, _, arg = out[-1].partition(":") if out else ("", "", "")
        if kind in TABLE_KINDS and _table_entry(arg) and _table_entry(part):
            out[-1] += "," + part
        elif part:
            out.append(part)
    return out


def parse_dsd(text: str, item: str, engine: str = "vllm") -> tuple[tuple[int, int, int], ...]:
    """``"1-1:6,2-4:4"`` -> ((1, 1, 6), (2, 4, 4)), sorted; the ranges must start at batch size 1
    and not overlap (vLLM's own rules for ``num_speculative_tokens_per_batch_size``, checked here so
    a bad table fails before an engine loads)."""
    table = []
    for part in text.split(","):
        ranges, _, k = part.partition(":")
        start, _, end = ranges.partition("-")
        if not (start.isdigit() and end.isdigit() and k.isdigit()):
            raise _bad(item, "needs entries START-END:K, e.g. dsd:1-1:6,2-4:4,5-16:1", engine)
        table.append((int(start), int(end), int(k)))
    table.sort()
    if table[0][0] != 1:
        raise _bad(item, "must start at batch size 1", engine)
    for (_, previous_end, _), (start, end, _) in zip([(0, 0, 0), *table], table):
        if start > end or start <= previous_end:
            raise _bad(item, f"has range {start}-{end} that is empty or overlaps the one before", engine)
    return tuple(table)


def dsd_label(table: tuple[tuple[int, int, int], ...]) -> str:
    """The policy name of a Dynamic SD table: ``dsd:1-1:6,2-4:4,...``."""
    return "dsd:" + ",".join(f"{s}-{e}:{k}" for s, e, k in table)


def _parse_one(item: str, engine: str) -> PolicySpec:
    spec = _parse_kind(item, engine)
    return dataclasses.replace(spec, text=spec.kind + item[item.index(":"):] if ":" in item else spec.kind)


def _parse_kind(item: str, engine: str) -> PolicySpec:
    kind, _, arg = item.partition(":")
    kind = ALIASES.get(kind.strip().lower(), kind.strip().lower())
    if kind not in FORMS:
        raise _bad(item, "is not a policy", engine)
    if kind not in ENGINE_KINDS[engine]:
        other = next(e for e in ENGINE_KINDS if e != engine)
        raise _bad(item, f"runs on --engine {other} only", engine)
    if kind in ("none", "heuristic", "best-grid", "threshold", "bandit", "lookahead") and arg:
        raise _bad(item, "takes no argument", engine)
    if kind == "fixed":
        parts = arg.split(":") if arg else []
        longest = 3 if engine == "hf" else 2
        if not 1 <= len(parts) <= longest or not all(p.isdigit() for p in parts):
            raise _bad(item, f"must look like {'fixed:D, fixed:D:V or fixed:D:V:W' if engine == 'hf' else 'fixed:D or fixed:D:B'}"
                             " with integers", engine)
        values = [int(p) for p in parts]
        if engine == "vllm" and values[0] > VLLM_MAX_DEPTH:
            raise _bad(item, f"drafts deeper than vLLM's proposer ({VLLM_MAX_DEPTH})", engine)
        if len(values) > 2 and values[2] < 1:
            raise _bad(item, "needs a width W >= 1", engine)
        return PolicySpec(kind, item, values[0], values[1] if len(values) > 1 else None,
                          values[2] if len(values) > 2 else 1)
    if kind in ("ngram", "eagle3"):
        if _table_entry(arg):  # vLLM's Dynamic SD table on the stock method: K is its deepest row
            table = parse_dsd(arg, item, engine)
            deepest = max(k for _, _, k in table)
            if not 1 <= deepest <= 16:
                raise _bad(item, "needs a table whose deepest K is 1..16 (vLLM's num_speculative_tokens)", engine)
            return PolicySpec(kind, item, deepest, dsd=table)
        if not arg.isdigit() or not 1 <= int(arg) <= 16:
            raise _bad(item, f"must look like {kind}:K with 1 <= K <= 16, or {kind}:S-E:K,... (a Dynamic SD "
                             "table)", engine)
        return PolicySpec(kind, item, int(arg))
    if kind in ("head", "sam"):
        parts = arg.split(":") if arg else []
        ints = 2 if kind == "sam" else 1
        batch = parts.pop() if len(parts) > ints and parts[-1][:1] == "b" else None
        stop = _stop(parts[ints]) if len(parts) == ints + 1 else None
        if len(parts) not in (ints, ints + 1) or not all(p.isdigit() for p in parts[:ints]) \
                or not 1 <= int(parts[ints - 1]) <= VLLM_MAX_DEPTH or (len(parts) > ints and stop is None) \
                or (batch is not None and not (batch[1:].isdigit() and int(batch[1:]) >= 1)):
            raise _bad(item, f"must look like {FORMS[kind].split()[0]} with integers, 1 <= K <= {VLLM_MAX_DEPTH}, "
                             "0 < T < 1 and B >= 1", engine)
        return PolicySpec(kind, item, int(parts[ints - 1]), min_match=int(parts[0]) if kind == "sam" else None,
                          stop=stop, head_max_batch=int(batch[1:]) if batch else None)
    if kind == "class":
        path, _, k = arg.rpartition(":")
        if "." not in path or not k.isdigit() or not 1 <= int(k) <= 16:
            raise _bad(item, "must look like class:MODULE.Class:K with 1 <= K <= 16", engine)
        return PolicySpec(kind, item, int(k), path=path)
    if kind == "dsd":
        return PolicySpec(kind, item, dsd=parse_dsd(arg, item, engine) if arg else DEFAULT_DSD)
    if kind == "ppo":
        if not arg:
            raise _bad(item, "needs a path (ppo:DIR written by draftrl train)", engine)
        return PolicySpec(kind, kind, path=arg)
    return PolicySpec(kind, kind)


def _stop(text: str) -> str | None:
    """``"t0.4"`` -> ``"confidence:0.4"``, ``"c0.3"`` -> ``"cumulative:0.3"``; None if malformed."""
    kinds = {"t": "confidence", "c": "cumulative"}
    try:
        value = float(text[1:])
    except ValueError:
        return None
    return f"{kinds[text[0]]}:{value:g}" if text[:1] in kinds and 0.0 < value < 1.0 else None


def parse_policies(items: str | list[str] | tuple[str, ...], engine: str = "hf") -> list[PolicySpec]:
    """Parse ``"none,fixed:4,dsd:1-1:6,2-4:2,ppo:runs/x"`` (or a list) for ``engine`` (hf or vllm);
    ``none`` is always first (the reference), added when missing. Several PPO policies are labelled
    after their directories (``ppo[size]``).

    :raises ValueError: one line naming the bad entry and every name ``engine`` accepts.
    """
    if engine not in ENGINE_KINDS:
        raise ValueError(f"engine {engine!r} is unknown; use one of {', '.join(ENGINE_KINDS)}.")
    if isinstance(items, str):
        items = split_policies(items)
    specs = [_parse_one(item.strip(), engine) for item in items if item.strip()]
    ppo = [s for s in specs if s.kind == "ppo"]
    if len(ppo) > 1:
        renamed = {id(s): f"ppo[{policy_dir(s.path).name}]" for s in ppo}
        specs = [dataclasses.replace(s, label=renamed[id(s)]) if id(s) in renamed else s for s in specs]
    labels = [s.label for s in specs]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise ValueError(f"policies {dup} are listed twice; list each once.")
    if REFERENCE not in labels:
        specs.insert(0, PolicySpec(REFERENCE, REFERENCE, text=REFERENCE))
    return sorted(specs, key=lambda s: s.kind != REFERENCE)


def policy_dir(path: str) -> Path:
    """The run directory of ``ppo:PATH`` (PATH may name its policy.zip)."""
    p = Path(path)
    return p.parent if p.suffix == ".zip" else p
