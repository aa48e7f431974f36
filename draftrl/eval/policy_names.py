"""The one policy grammar of ``draftrl eval --policies``, on both engines.

A policy name says what **decides** (how deep to draft, how much to verify); a drafter spec
(``draftrl.drafters.registry``: ``ngram[:MIN:MAX[:earliest|latest]]``, ``eagle3[:DIR]``,
``sam:N[:DIR]``, ...) says what **drafts**. A policy drafts with the run's drafter (``env.drafter``,
``--drafter``) unless it names its own after ``@``: ``fixed:4@eagle3`` is depth 4 every step with
the EAGLE-3 head, ``stop:6:t0.6@sam:2:DIR`` a per-level stop with SAM's mix and the head in DIR.
vLLM's own methods, which run no draftrl code in the engine, say so with their prefix (``vllm-``).

``--engine hf`` (draftrl's exact engine, one request at a time: ``draftrl.eval.round.policies``) and
``--engine vllm`` (inside vLLM under load: ``draftrl.eval.serve.policies``) read the same names:

==============================  ====  ====  ==================================================
name                            hf    vllm  what it is
==============================  ====  ====  ==================================================
``none`` (alias ``ar``)         yes   yes   no speculation: the reference of every speedup
``fixed:D[:V]``                 yes   yes   depth D every round/step; V the most drafted tokens
                                            one step verifies (hf: the request's V best tree
                                            nodes; vllm: the batch's V best draft positions);
                                            no V: no limit. ``fixed:D:0`` is refused
``fixed:D[:V]:wW``              yes   -     a tree W wide
``fixed:D[:V]:bB``              -     yes   with a head drafter: the head drafts only in steps
                                            of at most B decoding requests, n-gram lookup above
``heuristic``                   yes   yes   Hugging Face's +2 / -1 draft length (vllm: per request)
``ppo:DIR``                     yes   yes   a policy written by ``draftrl train`` for that engine's env
``best-grid``                   yes   -     the best fixed setting of ``--grid DIR/grid.json``
``threshold``, ``bandit``       yes   -     ConfidenceThreshold, UCBBandit
``lookahead``                   yes   -     temperature 0: drafts what the target will accept
``dsd[:S-E:K,...]``             -     yes   Dynamic SD: K per running-batch-size range, as the
                                            depth cap of draftrl's proposer
``stop:K:tT``, ``stop:K:cT``    -     yes   at most K levels, each request stopping inside the
(``:bB`` as for ``fixed``)                  proposer at its head's first draft below T (``t``:
                                            HF's confidence threshold) or where the chain's
                                            probability falls below T (``c``: EAGLE-2's); needs
                                            a head drafter (``eagle3``, ``sam``)
``vllm-ngram:K``,               -     yes   vLLM's own prompt lookup, K tokens, or K per
``vllm-ngram:S-E:K,...``                    running-batch-size range (vLLM's Dynamic SD table,
                                            read by vLLM's scheduler every step)
``vllm-eagle3:K``,              -     yes   vLLM's own EAGLE-3 the same way, with the head of
``vllm-eagle3:S-E:K,...``                   ``@eagle3:DIR`` / ``@sam:N:DIR``, else of the run's
                                            drafter, else the one draftrl ships for the target
``vllm-class:MODULE.Class:K``   -     yes   vLLM with another ``custom_class`` proposer
==============================  ====  ====  ==================================================

``@DRAFTER`` goes on every name but ``none``, ``vllm-ngram`` and ``vllm-class`` (which run no
draftrl drafter). A name one engine cannot run is refused with one line naming the names it
accepts; a name of an earlier release (:data:`RENAMED`: ``ngram:K``, ``eagle3:K``,
``class:...``, ``head:K...``, ``sam:N:K...``) with one line naming its replacement.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

#: The reference every speedup divides by, and its alias.
REFERENCE = "none"
ALIASES = {"ar": REFERENCE}
#: Each kind's form on the command line (``fixed``'s last part is ``:wW`` on hf, ``:bB`` on vllm:
#: :data:`ENGINE_FORMS`).
FORMS: dict[str, str] = {
    "none": "none", "fixed": "fixed:D[:V][:wW|:bB]", "heuristic": "heuristic", "ppo": "ppo:DIR",
    "best-grid": "best-grid", "threshold": "threshold", "bandit": "bandit", "lookahead": "lookahead",
    "dsd": "dsd[:S-E:K,...]", "stop": "stop:K:tT[:bB]|stop:K:cT[:bB]",
    "vllm-ngram": "vllm-ngram:K|vllm-ngram:S-E:K,...", "vllm-eagle3": "vllm-eagle3:K|vllm-eagle3:S-E:K,...",
    "vllm-class": "vllm-class:MODULE.Class:K",
}
#: Where an engine's form of a kind differs from :data:`FORMS`.
ENGINE_FORMS: dict[str, dict[str, str]] = {"hf": {"fixed": "fixed:D[:V][:wW]"}, "vllm": {"fixed": "fixed:D[:V][:bB]"}}
#: The kinds each engine runs.
ENGINE_KINDS: dict[str, tuple[str, ...]] = {
    "hf": ("none", "fixed", "heuristic", "ppo", "best-grid", "threshold", "bandit", "lookahead"),
    "vllm": ("none", "fixed", "heuristic", "ppo", "dsd", "stop", "vllm-ngram", "vllm-eagle3", "vllm-class"),
}
#: Kinds that draft with no draftrl drafter, hence take no ``@DRAFTER``.
NO_DRAFTER = ("none", "vllm-ngram", "vllm-class")
#: The deepest draft of a vLLM engine with draftrl's proposer (its ``num_speculative_tokens``).
VLLM_MAX_DEPTH = 8
#: Dynamic SD schedule used by ``dsd`` without a table: (batch start, batch end, K).
DEFAULT_DSD: tuple[tuple[int, int, int], ...] = ((1, 1, 6), (2, 4, 4), (5, 8, 2), (9, 1024, 1))


@dataclass(frozen=True)
class PolicyName:
    """One entry of ``--policies``, parsed: what decides, named (a value, not a config section)."""

    kind: str
    label: str
    """the name used in results.json, the report and wandb"""
    depth: int = 0
    """fixed: D; stop, vllm-ngram, vllm-eagle3, vllm-class: K"""
    verify_size: int | None = None
    """fixed: V, the most drafted tokens one step verifies (hf: the request's best tree nodes;
    vllm: the batch's best draft positions, its budget); None = no limit"""
    width: int = 1
    """fixed: the tree width W (hf only)"""
    dsd: tuple[tuple[int, int, int], ...] = ()
    """dsd, and vllm-ngram / vllm-eagle3 with a table: (batch start, batch end, K) rows"""
    path: str | None = None
    """ppo: the run directory (or its policy.zip); vllm-class: MODULE.Class"""
    stop: str | None = None
    """stop: the proposer's per-level stop rule (``confidence:T`` or ``cumulative:T``)"""
    head_max_batch: int | None = None
    """fixed, stop with ``:bB``: the largest step (decoding requests) the head drafts in (None: every step)"""
    drafter: str | None = None
    """``@DRAFTER``: the drafter spec this policy drafts with; None = the run's (``env.drafter``)"""
    text: str = ""
    """the entry as written, with the alias resolved (``ppo:runs/x``, ``none`` for ``ar``)"""


def accepted_names(engine: str) -> str:
    """``"none, fixed:D[:V][:wW], ..."``: the names ``engine`` runs, for errors and ``--help``."""
    return ", ".join(ENGINE_FORMS[engine].get(k, FORMS[k]) for k in ENGINE_KINDS[engine])


def _bad(item: str, why: str, engine: str) -> ValueError:
    return ValueError(f"policy {item!r} {why}; --engine {engine} accepts {accepted_names(engine)} "
                      "(each but none, vllm-ngram and vllm-class also as NAME@DRAFTER).")


#: Kinds that take a Dynamic SD table (``KIND:S-E:K,...``); ``ngram`` and ``eagle3`` are their
#: earlier names, kept whole so that the refusal names the whole table.
TABLE_KINDS = ("dsd", "vllm-ngram", "vllm-eagle3", "ngram", "eagle3")


def _table_entry(part: str) -> bool:
    """Whether ``part`` looks like one ``S-E:K`` row of a Dynamic SD table."""
    return part[:1].isdigit() and "-" in part.partition(":")[0]


def split_policies(text: str) -> list[str]:
    """Split a comma-separated policy list where a Dynamic SD table keeps its own commas:
    ``"none,dsd:1-1:6,2-4:2,vllm-eagle3:1-1:3,2-16:1"`` ->
    ``["none", "dsd:1-1:6,2-4:2", "vllm-eagle3:1-1:3,2-16:1"]``."""
    out: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        kind, _, arg = out[-1].partition(":") if out else ("", "", "")
        if kind.lower() in TABLE_KINDS and "@" not in arg and _table_entry(arg) and _table_entry(part):
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


def _head_rule(parts: list[str], drafter: str) -> str | None:
    """The new name of an earlier head rule's ``K[:tT|:cT][:bB]`` parts drafted by ``drafter``."""
    batch = parts.pop() if len(parts) > 1 and parts[-1][:1] == "b" else None
    if not parts or not parts[0].isdigit() or len(parts) > 2 or (len(parts) == 2 and parts[1][:1] not in ("t", "c")):
        return None
    name = f"stop:{parts[0]}:{parts[1]}" if len(parts) == 2 else f"fixed:{parts[0]}"
    return f"{name}{':' + batch if batch else ''}@{drafter}"


def _stock(kind: str, arg: str) -> str | None:
    return f"vllm-{kind}:{arg}" if arg.isdigit() or _table_entry(arg) else None


#: Policy kinds of earlier releases: ``(old name's arguments) -> its replacement`` (None: no
#: replacement can be spelled from them), and what the replacement is.
RENAMED = {
    "ngram": (lambda arg: _stock("ngram", arg), "vLLM's own prompt lookup; draftrl's n-gram drafter is the drafter "
                                                 "spec ngram[:MIN:MAX]"),
    "eagle3": (lambda arg: _stock("eagle3", arg), "vLLM's own EAGLE-3; another head than the shipped one: "
                                                   "vllm-eagle3:K@eagle3:DIR"),
    "class": (lambda arg: f"vllm-class:{arg}" if arg else None, "vLLM with another custom_class proposer"),
    "head": (lambda arg: _head_rule(arg.split(":"), "eagle3"), "the head is the drafter eagle3[:DIR]; another head "
                                                                "than the shipped one: @eagle3:DIR"),
    "sam": (lambda arg: _head_rule(arg.split(":")[1:], f"sam:{arg.split(':')[0]}") if arg[:1].isdigit() else None,
            "SAM is the drafter sam:N[:DIR]; another head than the shipped one: @sam:N:DIR"),
}


def _renamed(name: str, kind: str, arg: str) -> ValueError | None:
    """One line naming the replacement of an earlier release's ``name``, or of a drafter spec
    written where a policy goes; None when ``kind`` is neither."""
    if kind in RENAMED:
        new, what = RENAMED[kind]
        replacement = new(arg)
        if replacement is not None:
            return ValueError(f"policy {name!r} is renamed: write {replacement} ({what}).")
    from draftrl.drafters.registry import DRAFTERS

    if kind in DRAFTERS:
        return ValueError(f"{name!r} is a drafter spec, not a policy: draft with it through --drafter {name} (every "
                          f"policy) or POLICY@{name} (one policy, e.g. fixed:4@{name}).")
    return None


def _parse_one(item: str, engine: str) -> PolicyName:
    name, at, drafter = (part.strip() for part in item.partition("@"))
    spec = _parse_kind(name, engine)
    text = spec.kind + name[name.index(":"):] if ":" in name else spec.kind
    if not at:
        return dataclasses.replace(spec, text=text)
    if not drafter:
        raise _bad(item, "names no drafter after @ (write NAME@DRAFTER, e.g. fixed:4@eagle3)", engine)
    if spec.kind in NO_DRAFTER:
        raise _bad(item, f"runs no draftrl drafter; drop @{drafter}", engine)
    if spec.kind == "vllm-eagle3" and drafter.partition(":")[0] not in ("eagle3", "sam"):
        raise _bad(item, f"loads an EAGLE-3 head, which @{drafter} does not name; write @eagle3[:DIR]", engine)
    return dataclasses.replace(spec, label=f"{spec.label}@{drafter}", text=f"{text}@{drafter}", drafter=drafter)


def _fixed(item: str, arg: str, engine: str) -> PolicyName:
    """``fixed:D[:V][:wW]`` (hf) / ``fixed:D[:V][:bB]`` (vllm)."""
    parts = arg.split(":") if arg else []
    form = ENGINE_FORMS[engine]["fixed"]
    suffix = parts.pop() if len(parts) > 1 and parts[-1][:1] in ("w", "b") else None
    if len(parts) == 3 and all(p.isdigit() for p in parts) and suffix is None:  # the earlier fixed:D:V:W
        limit = f":{parts[1]}" if parts[1] != "0" else ""
        note = ")." if limit else "; no V verifies every drafted node)."
        raise ValueError(f"policy {item!r} is renamed: write fixed:{parts[0]}{limit}:w{parts[2]} (the tree width is "
                         f"the suffix :wW, on --engine hf{note}")
    if not 1 <= len(parts) <= 2 or not all(p.isdigit() for p in parts):
        raise _bad(item, f"must look like {form} with integers", engine)
    if len(parts) == 2 and int(parts[1]) == 0:
        raise ValueError(f"policy {item!r}: V is the most drafted tokens one step verifies, so 0 verifies none; write "
                         f"fixed:{parts[0]} (no limit) or fixed:0 (no speculation).")
    letter = "w" if engine == "hf" else "b"
    if suffix is not None and suffix[0] != letter:
        other, what = ("vllm", "the head's load limit") if suffix[0] == "b" else ("hf", "the tree width")
        raise _bad(item, f"has :{suffix} ({what}), which runs on --engine {other} only", engine)
    if suffix is not None and not (suffix[1:].isdigit() and int(suffix[1:]) >= 1):
        raise _bad(item, f"must look like {form} with integers, W >= 1 and B >= 1", engine)
    depth = int(parts[0])
    if engine == "vllm" and depth > VLLM_MAX_DEPTH:
        raise _bad(item, f"drafts deeper than vLLM's proposer ({VLLM_MAX_DEPTH})", engine)
    extra = {} if suffix is None else {"width" if letter == "w" else "head_max_batch": int(suffix[1:])}
    return PolicyName("fixed", item, depth, int(parts[1]) if len(parts) == 2 else None, **extra)


def _parse_kind(item: str, engine: str) -> PolicyName:
    kind, _, arg = item.partition(":")
    kind = ALIASES.get(kind.strip().lower(), kind.strip().lower())
    if kind not in FORMS:
        renamed = _renamed(item, kind, arg)
        if renamed is not None:
            raise renamed
        raise _bad(item, "is not a policy", engine)
    if kind not in ENGINE_KINDS[engine]:
        other = next(e for e in ENGINE_KINDS if e != engine)
        raise _bad(item, f"runs on --engine {other} only", engine)
    if kind in ("none", "heuristic", "best-grid", "threshold", "bandit", "lookahead") and arg:
        raise _bad(item, "takes no argument", engine)
    if kind == "fixed":
        return _fixed(item, arg, engine)
    if kind in ("vllm-ngram", "vllm-eagle3"):
        if _table_entry(arg):  # vLLM's Dynamic SD table on the stock method: K is its deepest row
            table = parse_dsd(arg, item, engine)
            deepest = max(k for _, _, k in table)
            if not 1 <= deepest <= 16:
                raise _bad(item, "needs a table whose deepest K is 1..16 (vLLM's num_speculative_tokens)", engine)
            return PolicyName(kind, item, deepest, dsd=table)
        if not arg.isdigit() or not 1 <= int(arg) <= 16:
            raise _bad(item, f"must look like {kind}:K with 1 <= K <= 16, or {kind}:S-E:K,... (a Dynamic SD "
                             "table)", engine)
        return PolicyName(kind, item, int(arg))
    if kind == "stop":
        parts = arg.split(":") if arg else []
        batch = parts.pop() if len(parts) > 2 and parts[-1][:1] == "b" else None
        stop = _stop(parts[1]) if len(parts) == 2 else None
        if stop is None or not parts[0].isdigit() or not 1 <= int(parts[0]) <= VLLM_MAX_DEPTH \
                or (batch is not None and not (batch[1:].isdigit() and int(batch[1:]) >= 1)):
            raise _bad(item, f"must look like stop:K:tT or stop:K:cT (then optionally :bB) with 1 <= K <= "
                             f"{VLLM_MAX_DEPTH}, 0 < T < 1 and B >= 1", engine)
        return PolicyName(kind, item, int(parts[0]), stop=stop, head_max_batch=int(batch[1:]) if batch else None)
    if kind == "vllm-class":
        path, _, k = arg.rpartition(":")
        if "." not in path or not k.isdigit() or not 1 <= int(k) <= 16:
            raise _bad(item, "must look like vllm-class:MODULE.Class:K with 1 <= K <= 16", engine)
        return PolicyName(kind, item, int(k), path=path)
    if kind == "dsd":
        return PolicyName(kind, item, dsd=parse_dsd(arg, item, engine) if arg else DEFAULT_DSD)
    if kind == "ppo":
        if not arg:
            raise _bad(item, "needs a path (ppo:DIR written by draftrl train)", engine)
        return PolicyName(kind, kind, path=arg)
    return PolicyName(kind, kind)


def _stop(text: str) -> str | None:
    """``"t0.4"`` -> ``"confidence:0.4"``, ``"c0.3"`` -> ``"cumulative:0.3"``; None if malformed."""
    kinds = {"t": "confidence", "c": "cumulative"}
    try:
        value = float(text[1:])
    except ValueError:
        return None
    return f"{kinds[text[0]]}:{value:g}" if text[:1] in kinds and 0.0 < value < 1.0 else None


def parse_policies(items: str | list[str] | tuple[str, ...], engine: str = "hf") -> list[PolicyName]:
    """Parse ``"none,fixed:4,dsd:1-1:6,2-4:2,fixed:2@eagle3,ppo:runs/x"`` (or a list) for ``engine``
    (hf or vllm); ``none`` is always first (the reference), added when missing. Several PPO policies
    are labelled after their directories (``ppo[size]``).

    :raises ValueError: one line naming the bad entry and every name ``engine`` accepts, or the
        replacement of a name of an earlier release.
    """
    if engine not in ENGINE_KINDS:
        raise ValueError(f"engine {engine!r} is unknown; use one of {', '.join(ENGINE_KINDS)}.")
    if isinstance(items, str):
        items = split_policies(items)
    specs = [_parse_one(item.strip(), engine) for item in items if item.strip()]
    ppo = [s for s in specs if s.kind == "ppo"]
    if len(ppo) > 1:
        renamed = {id(s): f"ppo[{policy_dir(s.path).name}]" + (f"@{s.drafter}" if s.drafter else "") for s in ppo}
        specs = [dataclasses.replace(s, label=renamed[id(s)]) if id(s) in renamed else s for s in specs]
    labels = [s.label for s in specs]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise ValueError(f"policies {dup} are listed twice; list each once.")
    if REFERENCE not in labels:
        specs.insert(0, PolicyName(REFERENCE, REFERENCE, text=REFERENCE))
    return sorted(specs, key=lambda s: s.kind != REFERENCE)


def policy_dir(path: str) -> Path:
    """The run directory of ``ppo:PATH`` (PATH may name its policy.zip)."""
    p = Path(path)
    return p.parent if p.suffix == ".zip" else p
