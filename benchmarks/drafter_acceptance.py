"""Per drafter and K = 1..8: acceptance per draft position, draft cost, speedup over plain decoding and HF anchors.

draftrl's engine (``SpeculativeDecoder``), greedy chains (width 1) of a fixed depth K, float32, on
the held-out prompts (``load_prompts(split="heldout")``, ``--limit-per-group`` per language x task).
Every (drafter, K), plain decoding (``none``: depth 0 on the same engine) and the Hugging Face
anchors (``draftrl.eval.round.anchors``: stock ``generate``, ``hf``, and its prompt lookup,
``hf-lookup:G`` for each of ``--anchor-gammas``) run interleaved per prompt (see ``_bench.py``).
One line per (group, drafter, K); groups are ``all`` (the mixed workload), each task, each language.

- ``speedup_vs_none``: tokens per wall second over plain decoding's (median over ``--repeats``);
  ``vs_hf`` and ``vs_hf_lookup`` the same over ``hf`` and over the prompt lookup with the best
  throughput in that group (its gamma is ``hf_lookup``); ``cpu_speedup_vs_none`` in the thread's
  CPU time (one thread on a CPU: what load from other processes cannot skew).
- ``acceptance_length``, ``accept_pos``, ``accepted_at_least``: mean tokens emitted per drafting
  round (bonus token included), the conditional acceptance at positions 1..K and the share of
  rounds accepting at least i (vLLM's terms; ``draftrl.decoding.counts``).
  ``tokens_per_round`` is the mean over every round, those where the drafter proposed nothing too.
- ``draft_cost``: one draft token in units of one target step, both measured in the timed runs: the
  median over rounds of the drafter's ``propose`` time / tokens it proposed, over the median time of
  plain decoding's one-token target forwards on the same prompts (the prompt's forward left out).
  A round's draft time includes catching up on the tokens accepted since the last one (an EAGLE-3
  head feeds them through its layer), as it does when decoding.

Drafters (``--drafters``, default ``eagle3`` (the head draftrl ships, or ``--head``), ``ngram:1:3:latest``
(the serving default), ``sam:2`` (lookup on a 2-token match, else the head) and ``layerskip:28`` (28 of 30
layers: the only depth where SmolLM2-135M's truncated model agrees with the full one often enough to say
anything; see ``depth_by_language.py``)). With
``--out``, ``drafter_acceptance.png``: acceptance per position at the largest K, and acceptance
length over K, per drafter, on the mixed workload.

    python benchmarks/drafter_acceptance.py --out runs/bench/drafter_acceptance
    python benchmarks/drafter_acceptance.py --quick
    speedup_vs_none=1.131x  vs_hf=1.204x  vs_hf_lookup=0.831x  cpu_speedup_vs_none=1.211x  acceptance_length=2.5  ...
    ...  draft_cost=0.001248  accept_pos=0.38/1.00/1.00/1.00  ...  drafter=ngram:1:3:latest  K=4  group=all  ...
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from _bench import (
    Bench,
    Timings,
    anchor_method,
    common_flags,
    engine_method,
    first_mismatch,
    interleave,
    median,
    parse_args,
    requests,
)

from draftrl.decoding.counts import AcceptanceCounts
from draftrl.drafters.eagle3 import Eagle3Drafter
from draftrl.drafters.registry import build_drafter, check_drafter_spec
from draftrl.eval.round.anchors import HF, anchors_for
from draftrl.models import load_model
from draftrl.prompts import LANGUAGES, TASKS

PLOT = "drafter_acceptance.png"


def label(spec: str) -> str:
    """A drafter's printed name: ``eagle3:`` + the head folder's name (``eagle3`` alone: the shipped
    head), other specs as given."""
    kind, _, path = spec.partition(":")
    return f"eagle3:{Path(path).name}" if kind == "eagle3" and path else spec


def counts(t: Timings, name: str, items: list[int], depth: int) -> AcceptanceCounts:
    """Acceptance over ``items``' rounds (greedy: every repeat plays the same rounds, the first is counted)."""
    total = AcceptanceCounts(depth)
    for i in items:
        for result in t.runs[(name, i)][0].detail:
            total.observe_round(result)
    return total


def draft_cost(t: Timings, name: str, items: list[int], step_seconds: float) -> float | None:
    """Median over rounds (every repeat) of draft seconds per proposed token, in target steps."""
    per_token = [r.draft_seconds / r.num_proposed for i in items for run in t.runs[(name, i)] for r in run.detail
                 if r.num_proposed]
    return median(per_token) / step_seconds if per_token else None


def slash(values: list[float | None]) -> str:
    """``0.71/0.55/-``: one entry per position, '-' where no round got there."""
    return "/".join("-" if v is None else f"{v:.2f}" for v in values)


def report(bench: Bench, t: Timings, group: str, items: list[int], specs: list[str], depths: list[int],
           lookups: list[str], where: dict) -> dict[str, dict[int, dict]]:
    """Print the group's line per (drafter, K); returns its acceptance summaries, draft costs and speedups."""
    none, hf = t.throughput("none", items), t.throughput(HF, items)
    lookup = max(lookups, key=lambda name: t.throughput(name, items))  # the anchor: the best prompt-lookup gamma
    step = median([r.verify_seconds for i in items for run in t.runs[("none", i)] for r in run.detail
                   if not r.prompt_fed])
    cpu = bench.machine["device"] == "cpu" and torch.get_num_threads() == 1
    saved: dict[str, dict[int, dict]] = {}
    for spec in specs:
        for k in depths:
            name = f"{spec}@{k}"
            c, rate, cost = counts(t, name, items, k), t.throughput(name, items), draft_cost(t, name, items, step)
            bad = sum(first_mismatch(t.tokens("none", i), t.tokens(name, i)) is not None for i in items)
            cpu_ratio = t.throughput(name, items, "cpu") / t.throughput("none", items, "cpu")
            ratios = {"speedup_vs_none": rate / none, "vs_hf": rate / hf,
                      "vs_hf_lookup": rate / t.throughput(lookup, items)}
            bench.row({**ratios, **({"cpu_speedup_vs_none": cpu_ratio} if cpu else {})},
                      {"acceptance_length": c.acceptance_length, "tokens_per_round": t.tokens_per_round(name, items),
                       "draft_cost": cost, "accept_pos": slash(c.acceptance_per_position),
                       "accepted_at_least": slash(c.accepted_at_least), "tok_s": rate,
                       "greedy_mismatches": f"{bad}/{len(items)}"},
                      drafter=label(spec), K=k, group=group, hf_lookup=lookup, prompts=len(items), **where)
            saved.setdefault(spec, {})[k] = {**c.summary(), "draft_cost": cost, "speedup_vs_none": rate / none}
    if group == "all":
        for anchor in [HF, *lookups]:
            bench.row({"vs_none": t.throughput(anchor, items) / none},
                      {"tok_s": t.throughput(anchor, items), "tokens_per_forward": t.tokens_per_round(anchor, items)},
                      anchor=anchor, group=group, prompts=len(items), **where)
        bench.row({}, {"tok_s": none, "one_token_step_ms": step * 1e3}, method="none", group=group,
                  prompts=len(items), **where)
    return saved


def plot(path: Path, summary: dict[str, dict[int, AcceptanceCounts]], title: str) -> None:
    """Left: acceptance per position at each drafter's largest K; right: acceptance length over K."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6), layout="constrained")
    for name, by_depth in summary.items():
        deepest = by_depth[max(by_depth)].acceptance_per_position
        left.plot(range(1, len(deepest) + 1), [float("nan") if a is None else a for a in deepest], "o-", label=name)
        right.plot(list(by_depth), [c.acceptance_length or float("nan") for c in by_depth.values()], "o-", label=name)
    left.set(xlabel="draft position i", ylabel="P(accept i | accepted 1..i-1)", ylim=(0, 1.02),
             title="acceptance per position (largest K)")
    right.set(xlabel="K (draft depth)", ylabel="acceptance length (tokens / round)", ylim=(0.95, None),
              title="acceptance length, bonus token included")
    for ax in (left, right):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    left.legend(fontsize=7)
    fig.suptitle(title, fontsize=8)
    fig.savefig(path, dpi=130)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[common_flags()])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--head", default=None, help="EAGLE-3 head folder (speculators format) of the default "
                                                     "drafters eagle3 and sam:2 (default: the head draftrl ships)")
    parser.add_argument("--drafters", default=None,
                        help="comma-separated drafter specs "
                             "(default: eagle3[:HEAD],ngram:1:3:latest,sam:2[:HEAD],layerskip:28)")
    parser.add_argument("--depths", default="1,2,3,4,5,6,7,8", help="draft depths K (plain decoding is always timed)")
    parser.add_argument("--languages", default=",".join(LANGUAGES))
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--limit-per-group", type=int, default=1, help="held-out prompts per (language, task)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--anchor-gammas", default="1,2,4,8", help="HF prompt-lookup gammas timed as anchors")
    parser.add_argument("--repeats", type=int, default=3)
    args = parse_args(parser, quick=dict(depths="1,4", languages="en,zh", tasks="code_edit,chat", max_new_tokens=12,
                                         anchor_gammas="4", repeats=2))
    head = f":{args.head}" if args.head else ""  # none: the head draftrl ships for the target
    specs = (args.drafters.split(",") if args.drafters else
             [f"eagle3{head}", "ngram:1:3:latest", f"sam:2{head}", "layerskip:28"])
    depths = [int(k) for k in args.depths.split(",")]
    gammas = tuple(int(g) for g in args.anchor_gammas.split(","))
    if min(depths) < 1 or min(gammas) < 1:
        parser.error(f"--depths {args.depths} and --anchor-gammas {args.anchor_gammas} must all be >= 1 "
                     "(plain decoding and plain generate are always timed)")
    try:
        for spec in specs:
            check_drafter_spec(spec)
    except ValueError as err:
        parser.error(str(err))
    if "none" in specs:
        parser.error("--drafters lists none: plain decoding is always timed; leave it out")
    bench = Bench(args, __file__, owned=(PLOT,), device=args.device)

    loaded = load_model(args.model, dtype="float32", device=args.device)  # after Bench: the kernel probe uses --threads
    model, eos = loaded.model, loaded.eos_token_ids
    reqs = requests(loaded.tokenizer, args.languages.split(","), args.tasks.split(","), args.limit_per_group,
                    args.max_new_tokens)
    anchors = anchors_for(gammas)
    # one drafter per spec, shared by its depths: each request resets it, and requests run one at a time
    try:
        drafters = {spec: build_drafter(spec, loaded, device=args.device) for spec in specs}
    except (FileNotFoundError, ValueError) as err:  # a head folder that is missing or does not fit the target
        raise SystemExit(f"{bench.name}: {err}") from None
    try:
        methods = {"none": engine_method(model, None, eos, 0, keep_rounds=True)}
        methods |= {a.label: anchor_method(model, a, eos, args.device) for a in anchors}
        for spec, drafter in drafters.items():
            for k in depths:
                methods[f"{spec}@{k}"] = engine_method(model, drafter, eos, k, keep_rounds=True)
        bench.note(f"{len(reqs)} prompts x {len(methods)} methods x {args.repeats} repeats, interleaved")
        t = interleave(methods, reqs, args.repeats, args.device)
    finally:
        for drafter in drafters.values():
            if isinstance(drafter, Eagle3Drafter):
                drafter.close()  # its hooks on the target

    groups = {"all": list(range(len(reqs)))}
    for key, names in (("task", TASKS), ("language", LANGUAGES)):
        groups |= {n: items for n in names if (items := [i for i, r in enumerate(reqs) if getattr(r, key) == n])}
    where = dict(max_new_tokens=args.max_new_tokens, repeats=args.repeats, dtype="float32", model=loaded.name)
    lookups = [a.label for a in anchors if a.gamma]
    saved = {group: report(bench, t, group, items, specs, depths, lookups, where) for group, items in groups.items()}
    if bench.out:
        plot(bench.path(PLOT), {label(spec): {k: counts(t, f"{spec}@{k}", groups["all"], k) for k in depths}
                                for spec in specs},
             f"{loaded.name}: {len(reqs)} held-out prompts, {args.max_new_tokens} new tokens, greedy chains")
    bench.save(acceptance=saved)


if __name__ == "__main__":
    main()
