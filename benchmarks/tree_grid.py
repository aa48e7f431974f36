"""Tree grid: speedup over plain decoding across depth x verify_size, n-gram trie and layer-skip, per language and code.

Every cell (depth, V) gets the smallest width in 1..``--max-width`` with depth * width >= V, so
that the tree can hold V nodes (cells no width can fill are skipped). Width 1 is a chain: its V
best nodes are its first V levels. Cells with width > 1 are trees verified in one target forward
under a tree mask. All cells, for both drafters, and plain decoding (depth 0 on the same engine)
run interleaved per prompt in one process (see ``_bench.py``), greedy.

Prints one line per cell (pooled over prompts, with per-group speedups), the best cell per group
and drafter, and ``tree_vs_chain``: the best tree cell's throughput over the best chain cell's,
measured side by side. With ``--out``, writes ``tree_grid.png``, a heatmap of speedup over
(depth, V), one row per drafter and one column per group. Layer-skip uses 28 of 30 layers (see
``depth_by_language.py`` for why).

    python benchmarks/tree_grid.py --out runs/bench/tree_grid
    python benchmarks/tree_grid.py --quick
"""

from __future__ import annotations

import argparse

import numpy as np
from _bench import Bench, add_grid_args, common_flags, engine_method, first_mismatch, interleave, load_grid, parse_args

from draftrl.drafters.registry import build_drafter


def cells(depths: list[int], sizes: list[int], max_width: int) -> list[tuple[int, int, int]]:
    """(depth, verify_size, width) for every fillable cell, width the smallest that fills V."""
    out = []
    for d in depths:
        for v in sizes:
            width = next((w for w in range(1, max_width + 1) if d * w >= v), None)
            if width is not None:
                out.append((d, v, width))
    return out


def heatmap(path: str, speedup: dict, widths: dict, drafters: list[str], groups: list[str], depths: list[int],
            sizes: list[int], title: str) -> None:
    """speedup[(drafter, group, depth, V)] as one annotated panel per (drafter, group); widths[(depth, V)]."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(drafters), len(groups), figsize=(2.3 * len(groups) + 1.2, 2.3 * len(drafters) + 0.9),
                             squeeze=False, layout="constrained")
    values = [v for v in speedup.values() if np.isfinite(v)]
    vmax = max(2.0, max(values))
    norm = matplotlib.colors.TwoSlopeNorm(vmin=min(0.2, min(values)), vcenter=1.0, vmax=vmax)
    for r, spec in enumerate(drafters):
        for c, group in enumerate(groups):
            ax = axes[r][c]
            grid = np.full((len(depths), len(sizes)), np.nan)
            for (s, g, d, v), x in speedup.items():
                if s == spec and g == group:
                    grid[depths.index(d), sizes.index(v)] = x
            image = ax.imshow(grid, cmap="RdBu", norm=norm, origin="lower", aspect="auto")
            for i in range(len(depths)):
                for j in range(len(sizes)):
                    if np.isfinite(grid[i, j]):
                        w = widths[(depths[i], sizes[j])]
                        ax.text(j, i, f"{grid[i, j]:.2f}" + (f"\nw{w}" if w > 1 else ""), ha="center", va="center",
                                fontsize=6.5)
            ax.set_xticks(range(len(sizes)), sizes, fontsize=7)
            ax.set_yticks(range(len(depths)), depths, fontsize=7)
            ax.set_title(f"{spec} / {group}", fontsize=8)
            if r == len(drafters) - 1:
                ax.set_xlabel("verify_size V", fontsize=7)
            if c == 0:
                ax.set_ylabel("depth", fontsize=7)
    fig.colorbar(image, ax=axes, shrink=0.8, aspect=30, label="speedup vs autoregressive")
    fig.suptitle(title, fontsize=8)
    fig.savefig(path, dpi=130)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[common_flags()])
    add_grid_args(parser, max_new_tokens=32)
    parser.add_argument("--verify-sizes", default="1,2,4,8,16,32")
    parser.add_argument("--max-width", type=int, default=4)
    args = parse_args(parser, quick=dict(depths="1,2,4", verify_sizes="1,2,4,8", max_new_tokens=16, repeats=1))
    bench = Bench(args, __file__, owned=("tree_grid.png",), device=args.device)

    loaded, eos, reqs, groups = load_grid(args)
    depths = [int(d) for d in args.depths.split(",")]
    sizes = [int(v) for v in args.verify_sizes.split(",")]
    drafters = args.drafters.split(",")
    grid = cells(depths, sizes, args.max_width)

    methods = {"ar": engine_method(loaded.model, None, eos, 0)}
    for spec in drafters:
        for d, v, w in grid:
            methods[(spec, d, v, w)] = engine_method(loaded.model, build_drafter(spec, loaded, device=args.device),
                                                     eos, d, v, w)
    bench.note(f"{len(reqs)} prompts x {len(methods)} methods x {args.repeats} repeats, interleaved")
    t = interleave(methods, reqs, args.repeats, args.device)

    where = dict(task=args.task, max_new_tokens=args.max_new_tokens, repeats=args.repeats, model=loaded.name)
    speedup = {}
    for spec in drafters:
        for d, v, w in grid:
            for group, items in groups.items():
                speedup[(spec, group, d, v)] = t.throughput((spec, d, v, w), items) / t.throughput("ar", items)
    for spec in drafters:
        for d, v, w in grid:
            m, items = (spec, d, v, w), groups["all"]
            bad = sum(first_mismatch(t.tokens("ar", i), t.tokens(m, i)) is not None for i in items)
            per_group = {f"speedup_{g}": speedup[(spec, g, d, v)] for g in groups if g != "all"}
            bench.row({"speedup_vs_autoregressive": speedup[(spec, "all", d, v)], **per_group},
                      {"mean_tokens_per_round": t.tokens_per_round(m, items), "tok_s": t.throughput(m, items),
                       "greedy_mismatches": f"{bad}/{len(items)}"},
                      drafter=spec, depth=d, verify_size=v, width=w, **where)
    bench.note("best cell per group and drafter; tree_vs_chain = best width>1 cell / best width-1 cell")
    for spec in drafters:
        for group, items in groups.items():
            def best(cands):
                return max(cands, key=lambda c: speedup[(spec, group, c[0], c[1])], default=None)

            top, chain, tree = best(grid), best([c for c in grid if c[2] == 1]), best([c for c in grid if c[2] > 1])
            d, v, w = top
            ratio = (speedup[(spec, group, tree[0], tree[1])] / speedup[(spec, group, chain[0], chain[1])]
                     if tree and chain else None)
            bench.row({"speedup_vs_autoregressive": speedup[(spec, group, d, v)], "tree_vs_chain": ratio},
                      {"mean_tokens_per_round": t.tokens_per_round((spec, d, v, w), items)},
                      drafter=spec, depth=d, verify_size=v, width=w, best_chain=f"d{chain[0]}/V{chain[1]}",
                      best_tree="d{}/V{}/w{}".format(*tree) if tree else "-", group=group, **where)
    if bench.out:
        title = (f"greedy speedup vs autoregressive (same engine, depth 0); "
                 f"wN = tree width (smallest that fills V), else a chain\n"
                 f"{loaded.name}  cpu={bench.machine['cpu']}  threads={bench.machine['threads']}  "
                 f"max_new_tokens={args.max_new_tokens}  repeats={args.repeats}")
        heatmap(bench.path("tree_grid.png"), speedup, {(d, v): w for d, v, w in grid}, drafters, list(groups), depths,
                sizes, title)
    bench.save()


if __name__ == "__main__":
    main()
