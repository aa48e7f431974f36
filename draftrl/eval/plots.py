"""PNG plots of the grid and the evaluation (matplotlib, headless ``Agg`` backend).

- :func:`grid_heatmap`: speedup over plain decoding for every (depth, verify_size), one panel
  per width; the best cell is boxed.
- :func:`policy_trajectory`: the depth and verify size each adaptive policy chose, round by
  round, along one generation, over the tokens each round emitted.
- :func:`acceptance_histograms`: the distribution of tokens per round (acceptance length,
  bonus token included) of every policy.
- :func:`pit_histogram`: the exactness monitor's probability-integral-transform histogram
  (uniform under exactness) with the +-2 sigma band of a uniform multinomial.
- :func:`speedup_bars`: every policy's speedup over the best fixed setting with its paired
  bootstrap 95% interval (``ci_vs_best_fixed``), a line at 1.0.
- :func:`load_sweep`: throughput and p95 inter-token latency against the Poisson arrival rate,
  one line per serving policy (vLLM solid, the replay dashed).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def grid_heatmap(grid: dict, path: str | Path, title: str | None = None) -> Path:
    """Heatmap of ``grid["cells"][*]["speedup_vs_none"]`` (a ``grid.json`` dict)."""
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.patches import Rectangle

    plt = _plt()
    cells = grid["cells"]
    depths = sorted({c["depth"] for c in cells.values()})
    widths = sorted({c["width"] for c in cells.values() if c["depth"] > 0}) or [1]
    sizes = sorted({c["verify_size"] for c in cells.values()}, key=lambda v: (v == 0, v))  # "all" last
    values = [c["speedup_vs_none"] for c in cells.values() if c["speedup_vs_none"] is not None]
    lo, hi = min(values + [0.99]), max(values + [1.01])
    norm = TwoSlopeNorm(vcenter=1.0, vmin=min(lo, 0.999), vmax=max(hi, 1.001))
    best = grid.get("best", {}).get("name")

    fig, axes = plt.subplots(1, len(widths), figsize=(1.2 + 0.9 * len(depths) * len(widths) + 1.0 * len(widths),
                                                       1.6 + 0.55 * len(sizes)), squeeze=False)
    for ax, width in zip(axes[0], widths):
        mat = np.full((len(sizes), len(depths)), np.nan)
        names = {}
        for name, c in cells.items():
            if c["depth"] == 0:
                rows = range(len(sizes))  # plain decoding has no verify size: fill its column
            elif c["width"] == width:
                rows = [sizes.index(c["verify_size"])]
            else:
                continue
            for r in rows:
                mat[r, depths.index(c["depth"])] = c["speedup_vs_none"] if c["speedup_vs_none"] is not None else np.nan
                names[r, depths.index(c["depth"])] = name
        im = ax.imshow(np.ma.masked_invalid(mat), cmap="RdYlGn", norm=norm, aspect="auto")
        for (r, k), name in names.items():
            v = mat[r, k]
            if np.isfinite(v):
                ax.text(k, r, f"{v:.2f}x", ha="center", va="center", fontsize=9,
                        color="black", fontweight="bold" if name == best else "normal")
            if name == best and depths[k] > 0:
                ax.add_patch(Rectangle((k - 0.5, r - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=2.5))
        ax.set_xticks(range(len(depths)), [str(d) for d in depths])
        ax.set_yticks(range(len(sizes)), ["all" if v == 0 else str(v) for v in sizes])
        ax.set_xlabel("draft depth (0 = plain decoding)")
        ax.set_ylabel("verify size")
        ax.set_title(f"speedup vs plain decoding, width {width}" if len(widths) > 1 else "speedup vs plain decoding",
                     fontsize=10)
    fig.colorbar(im, ax=axes[0].tolist(), label="speedup vs plain decoding (x)", shrink=0.9)
    drafter = grid.get("config", {}).get("env", {}).get("drafter", "?")
    hw = grid.get("hardware", {})
    spreads = [c["noise"] for c in cells.values() if c.get("noise") is not None]
    noise = f" (timing spread between repeats ~{np.median(spreads):.0%})" if spreads else ""
    caption = title or (f"{grid.get('split', 'tune')} split, {len(grid.get('prompts', []))} prompts, median of "
                        f"{grid.get('repeats', '?')} interleaved repeats{noise}; drafter {drafter}; "
                        f"{hw.get('gpu') or hw.get('cpu') or ''}, {hw.get('threads', '?')} threads. Box = best cell.")
    import textwrap

    chars = int(fig.get_figwidth() * 15)
    axes[0][0].annotate(textwrap.fill(caption, chars), xy=(0, 0), xycoords="axes fraction", xytext=(-30, -40),
                        textcoords="offset points", fontsize=7, ha="left", va="top")
    path = Path(path)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def policy_trajectory(traces: dict[str, dict], path: str | Path, prompt_id: str = "") -> Path:
    """``traces``: {policy: {"depth": [R], "verify_size": [R], "tokens": [R]}} for one request.

    One panel per policy over the output position: the depth it chose each round (line), the
    draft tokens that round got accepted (bars), and the verify size when it varies (dashed).
    """
    from matplotlib.ticker import MaxNLocator

    plt = _plt()
    n = max(1, len(traces))
    fig, axes = plt.subplots(n, 1, figsize=(9, 0.6 + 1.35 * n), sharex=True, squeeze=False)
    top = max([max(tr["depth"], default=0) for tr in traces.values()] + [1])
    for ax, (name, tr) in zip(axes[:, 0], traces.items()):
        tokens = np.asarray(tr["tokens"], dtype=float)
        depth = np.asarray(tr["depth"], dtype=float)
        x = np.concatenate([[0], np.cumsum(tokens)])  # round r covers output positions x[r]..x[r+1]
        ax.bar(x[:-1], tokens - 1, width=tokens, align="edge", color="tab:green", alpha=0.35, edgecolor="white",
               label="accepted draft tokens")
        ax.step(x, np.append(depth, depth[-1:]), where="post", color="tab:blue", linewidth=1.6, label="depth chosen")
        sizes = np.asarray(tr.get("verify_size", []), dtype=float)
        if sizes.size and np.any(sizes != sizes[0]):
            ax.step(x, np.append(sizes, sizes[-1:]), where="post", color="tab:orange", linestyle="--",
                    linewidth=1.2, label="verify size")
        ax.set_ylim(-0.3, top + 0.8)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=4))
        ax.set_ylabel(name, rotation=0, ha="right", va="center", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0, 0].legend(fontsize=7, ncol=3, loc="upper right")
    axes[-1, 0].set_xlabel("output token position")
    axes[0, 0].set_title(f"depth chosen along one generation{f' ({prompt_id})' if prompt_id else ''}; "
                         "verify size = all drafted unless drawn", fontsize=10)
    path = Path(path)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def acceptance_histograms(histograms: dict[str, dict], path: str | Path) -> Path:
    """``histograms``: {policy: {tokens per round (str or int): rounds}} as in results.json."""
    plt = _plt()
    n = len(histograms)
    cols = min(4, n)
    rows = (n + cols - 1) // cols
    top = max([int(k) for h in histograms.values() for k in h] + [1])
    fig, axes = plt.subplots(rows, cols, figsize=(3.0 * cols, 2.3 * rows), squeeze=False, sharey=True)
    for ax in axes.flat[n:]:
        ax.axis("off")
    for ax, (name, hist) in zip(axes.flat, histograms.items()):
        counts = np.zeros(top + 1)
        for k, v in hist.items():
            counts[int(k)] = v
        total = counts.sum()
        share = counts / total if total else counts
        ax.bar(np.arange(top + 1), share, color="tab:blue", width=0.8)
        mean = float((np.arange(top + 1) * counts).sum() / total) if total else 0.0
        ax.axvline(mean, color="tab:red", linewidth=1)
        ax.set_title(f"{name}\nmean {mean:.2f} tokens/round", fontsize=8)
        ax.set_xticks(range(1, top + 1, max(1, top // 6)))
        ax.set_xlim(0.4, top + 0.6)
    for ax in axes[:, 0]:
        ax.set_ylabel("share of rounds")
    for ax in axes[-1]:
        ax.set_xlabel("tokens per round")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def pit_histogram(counts_by_name: dict[str, list[int]], path: str | Path, note: str = "") -> Path:
    """PIT histograms (``ExactnessMonitor.report()["pit_histogram"]``), one panel per stream, each
    with the +-2 sigma band of a uniform multinomial of its size."""
    plt = _plt()
    shown = {k: np.asarray(v, dtype=float) for k, v in counts_by_name.items() if np.sum(v) > 0}
    n = max(1, len(shown))
    fig, axes = plt.subplots(1, n, figsize=(0.5 + 3.6 * n, 3.2), squeeze=False, sharey=True)
    if not shown:
        ax = axes[0, 0]
        ax.text(0.5, 0.5, "no informative tokens\n(temperature 0: p(x) = 1 for every emitted token;\n"
                "greedy exactness is checked by token identity)", ha="center", va="center", transform=ax.transAxes,
                fontsize=9)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 2)
    for ax, (name, counts) in zip(axes[0], shown.items()):
        total, bins = counts.sum(), counts.size
        p = 1.0 / bins
        band = 2 * np.sqrt(total * p * (1 - p)) / (total * p)  # +-2 sigma of one bin's density
        ax.bar((np.arange(bins) + 0.5) / bins, counts / total * bins, width=1.0 / bins, color="tab:blue",
               edgecolor="white")
        ax.axhspan(1 - band, 1 + band, color="grey", alpha=0.25, zorder=0)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xlim(0, 1)
        ax.set_title(f"{name}\n{int(total)} informative tokens", fontsize=8)
        ax.set_xlabel("PIT value u")
    axes[0, 0].set_ylabel("density (1 = uniform;\ngrey: +-2 sigma)")
    fig.suptitle("exactness monitor: randomised PIT histograms" + (f" ({note})" if note else ""), fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def speedup_bars(results: dict, path: str | Path) -> Path | None:
    """Bars of ``results["policies"][*]["ci_vs_best_fixed"]["ratio"]`` with the interval
    ``[low, high]`` drawn as whiskers (a ``results.json`` dict); green above 1.0, red below, grey
    where the interval covers 1.0 ("not resolved"). None when no policy was compared with a best
    fixed setting (no ``--grid``)."""
    rows = [(name, p["ci_vs_best_fixed"]) for name, p in results["policies"].items()
            if (p.get("ci_vs_best_fixed") or {}).get("ratio") is not None]
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 0.9 + 0.42 * len(rows)))
    y = np.arange(len(rows))[::-1]  # the first policy on top
    ratios = np.array([ci["ratio"] for _, ci in rows])
    low = np.array([ci.get("low", ci["ratio"]) if not ci.get("reference") else ci["ratio"] for _, ci in rows])
    high = np.array([ci.get("high", ci["ratio"]) if not ci.get("reference") else ci["ratio"] for _, ci in rows])
    colors = ["tab:blue" if ci.get("reference") else
              "tab:grey" if ci.get("verdict") == "not resolved" else
              "tab:green" if ci["ratio"] > 1 else "tab:red" for _, ci in rows]
    ax.barh(y, ratios - 1.0, left=1.0, color=colors, alpha=0.7, height=0.6)
    ax.errorbar(ratios, y, xerr=[ratios - low, high - ratios], fmt="o", color="black", capsize=4, markersize=3)
    ax.axvline(1.0, color="black", linewidth=1)
    for yi, (name, ci) in zip(y, rows):
        note = "reference" if ci.get("reference") else f"[{ci['low']:.2f}, {ci['high']:.2f}] {ci.get('verdict', '')}"
        ax.annotate(f"{ci['ratio']:.2f}x {note}", xy=(max(high.max(), 1.0), yi), xytext=(6, 0),
                    textcoords="offset points", va="center", fontsize=7)
    ax.set_yticks(y, [name for name, _ in rows], fontsize=8)
    span = max(high.max(), 1.0) - min(low.min(), 1.0)
    ax.set_xlim(min(low.min(), 1.0) - 0.05 * span - 0.01, max(high.max(), 1.0) + 0.45 * span + 0.05)
    best = (results.get("best_grid") or {}).get("name", "best fixed")
    num = len(results.get("prompts", []))
    ax.set_xlabel(f"speedup over the best fixed setting ({best}), paired bootstrap 95% interval over {num} requests")
    ax.set_title("held-out speedup over grid search's best fixed setting; grey: not resolved", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def load_sweep(real: dict, replay: dict | None, labels: list[str], path: str | Path) -> Path | None:
    """Throughput and p95 ITL per Poisson rate of ``draftrl.eval.serve.compare.run_eval`` results
    (``real``: vLLM, solid; ``replay``: the replay, dashed, optional); None when no rate was run."""
    from draftrl.signals.costs import hardware_info, hardware_name

    rates = sorted(real.get("rates", {}), key=float)
    if not rates:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    runs = [(real, "-", "o", "vLLM")] + ([(replay, "--", "x", "replay")] if replay else [])
    for label, color in zip(labels, itertools.cycle(plt.rcParams["axes.prop_cycle"].by_key()["color"])):
        for results, style, marker, where in runs:
            rows = [results["rates"][r]["policies"].get(label) for r in rates]
            if any(row is None for row in rows):
                continue
            x = [float(r) for r in rates]
            axes[0].plot(x, [row["tokens_per_second"] for row in rows], style, marker=marker, color=color,
                         label=f"{label} ({where})")
            axes[1].plot(x, [(row["itl_p95"] or 0) * 1e3 for row in rows], style, marker=marker, color=color)
    for ax, what, unit in ((axes[0], "throughput", "tokens/s"), (axes[1], "p95 inter-token latency", "ms")):
        ax.set(xlabel="arrival rate (requests/s)", ylabel=unit, title=what, xscale="log")  # rates span decades
        ax.set_xticks([float(r) for r in rates], [f"{float(r):g}" for r in rates])  # the measured rates
        ax.minorticks_off()
    axes[0].legend(fontsize=6)
    fig.suptitle(f"{hardware_name(hardware_info())}: vLLM (solid)" + (" vs replay (dashed)" if replay else ""))
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
