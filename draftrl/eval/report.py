"""``report.md`` from a results dict, either engine's (``render_report``, ``render_serving_report``):
ratios first, context last (STYLE.md, benchmarks)."""

from __future__ import annotations


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _ms(v) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}"


def _f(v, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def policy_rows(results: dict, full: bool = False) -> list[list[str]]:
    """One row per policy: the columns of :data:`POLICY_COLUMNS` (the terminal tables of ``eval``
    and ``demo``), or with ``full`` those of :data:`REPORT_COLUMNS` (report.md)."""
    from draftrl.eval.bootstrap import format_ci

    rows = []
    for name, p in results["policies"].items():
        row = [
            name,
            _x(p.get("speedup_vs_none")),
            _x(p.get("speedup_vs_hf")),
            _x(p.get("speedup_vs_hf_lookup")),
            format_ci(p.get("ci_vs_best_fixed")),
            _f(p["tokens_per_second"]),
            _f(p["mean_tokens_per_round"], ".2f"),
            _ms(p["itl_p50"]),
        ]
        if full:
            row += [_f(p["time_to_first_token_mean"] * 1e3, ".0f"), _ms(p["itl_p95"]), _ms(p["itl_p99"]),
                    _f(p["peak_memory_bytes"] / 2**20, ".1f")]
        rows.append(row)
    return rows


POLICY_COLUMNS = ["policy", "speedup vs AR", "vs HF generate", "vs HF lookup", "vs best fixed [95% CI]", "tokens/s",
                  "tokens/round", "ITL p50 ms"]
REPORT_COLUMNS = POLICY_COLUMNS + ["TTFT ms", "ITL p95 ms", "ITL p99 ms", "peak mem +MiB"]


def _names(values) -> str:
    return ", ".join(values) if values else "all"


def _table(columns: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _group_table(results: dict, group: str) -> str:
    names = list(results["policies"])
    keys = sorted({k for p in results["policies"].values() for k in p.get(group, {})})
    rows = []
    for key in keys:
        row = [key]
        for name in names:
            sub = results["policies"][name].get(group, {}).get(key)
            row.append("-" if sub is None else f"{_x(sub.get('speedup_vs_none'))} ({sub['tokens_per_second']:.1f}/s)")
        rows.append(row)
    return _table([group.replace("per_", "")] + names, rows)


def anchor_lines(results: dict) -> list[str]:
    """The anchors' table (stock HF generate, HF prompt lookup per gamma) and what the columns mean."""
    anchors = results.get("anchors")
    if not anchors:
        return ["No anchors were timed (`eval.anchors: false`).", ""]
    plain = results["policies"].get("none", {}).get("tokens_per_second")
    rows = []
    for label, a in anchors["methods"].items():
        best = " (best)" if label == anchors.get("best_lookup") else ""
        rows.append([f"`{label}`{best}", _f(a["tokens_per_second"]),
                     _x(plain / a["tokens_per_second"] if plain and a["tokens_per_second"] else None),
                     _f(a.get("tokens_per_forward"), ".2f"), a.get("identical_to_none", "-")])
    temperature = (results.get("exactness") or {}).get("temperature") or 0
    how = "greedy" if temperature == 0 else (f"sampled at temperature {temperature:g} with the same top-k, top-p "
                                             "and a seed per request")
    return [
        f"`vs HF generate` and `vs HF lookup` are throughput ratios over stock Hugging Face `generate` ({how}, "
        "stock `nn.Linear` kernels) and over its prompt lookup at the best gamma timed here, on the same requests "
        "in the same interleaved run. `vs best fixed` is the ratio over the grid's best fixed setting with a "
        "paired bootstrap 95% interval over requests; \"not resolved\" means the interval covers 1.0, i.e. "
        "these requests cannot tell the two apart.",
        "",
        _table(["anchor", "tokens/s", "draftrl plain (none) vs anchor", "tokens/forward", "same tokens as none"], rows),
        "",
    ]


def exactness_lines(ex: dict) -> list[str]:
    lines = [f"**Verdict: {'PASSED' if ex['passed'] else 'FAILED'}** (temperature {ex['temperature']:g}, "
             f"sampler `{ex['sampler']}`)", ""]
    gi = ex.get("greedy_identity", {})
    if gi.get("checked") and gi.get("mode") == "near-tie":
        lines += agreement_lines(gi, "Greedy agreement with plain decoding (held-out split)")
    elif gi.get("checked"):
        lines.append(f"- Greedy token identity with plain decoding: {'passed' if gi.get('passed') else 'FAILED'} on "
                     f"{gi.get('requests')} requests x {len(gi.get('policies', []))} policies.")
    else:
        lines.append(f"- Greedy token identity: not applicable ({gi.get('why', '')}).")
    grid = ex.get("grid_greedy_identity") or {}
    if grid.get("mode") == "near-tie":
        lines += agreement_lines(grid, "Greedy agreement of the grid's cells with plain decoding (tune split)")
    hf = ex.get("hf_reference", {})
    if hf.get("checked") and hf.get("num_divergences"):
        lines += agreement_lines(hf, "Plain decoding vs Hugging Face `generate(do_sample=False)`")
    elif hf.get("checked"):
        lines.append(f"- Plain decoding vs Hugging Face `generate(do_sample=False)`: "
                     f"passed on {hf['checked']} requests.")
    mon = ex.get("monitor", {})
    if mon.get("enabled") is False:
        lines.append("- Streaming monitor: off (`--no-monitor`).")
    elif mon and all(v["passed"] for v in mon.values()) and ex["temperature"] > 0 and any(
            v.get("verdict") == "inconclusive" for v in mon.values()):
        for name, v in mon.items():
            lines.append(f"- Monitor on `{name}`: {v.get('verdict', 'passed')} ({v.get('verdict_reason', '')}).")
    elif mon and all(v["passed"] for v in mon.values()):
        tokens = sum(v["num_tokens"] for v in mon.values())
        informative = sum(v["num_informative"] for v in mon.values())
        lines.append(f"- Streaming monitor: passed on all {len(mon)} policies ({tokens} tokens, {informative} "
                     f"informative, i.e. with p(x) < 1).")
    else:
        for name, v in mon.items():
            lines.append(f"- Monitor on `{name}`: {'passed' if v['passed'] else 'FAILED'} "
                         f"({v['num_tokens']} tokens, {v['num_informative']} informative, "
                         f"{v['num_drafted_positions']} at drafted positions).")
    ov = ex.get("monitor_overhead", {})
    if ov.get("fraction") is not None:
        lines.append(f"- Monitor overhead: {ov['fraction'] * 100:.3f}% of the run's time "
                     f"(target < {ov['target'] * 100:.0f}%). {ov.get('note', '')}".rstrip())
    power = ex.get("power")
    if power:
        s = power["setting"]
        lines += ["", f"Monitor power on the real model (drafter `{s['drafter']}`, temperature {s['temperature']:g}, "
                  f"depth {s['depth']}, tasks {', '.join(s['tasks'])}): emitted tokens until each statistic fired.", ""]
        samplers = [k for k in power if k != "setting"]
        stats = list(next(iter(power[k] for k in samplers))["detected_at"])
        rows = []
        for sampler in samplers:
            r = power[sampler]
            rows.append([f"`{sampler}`", str(r["tokens"]), *[str(r["detected_at"][k] or "never") for k in stats],
                         "-" if r.get("monitor_overhead") is None else f"{r['monitor_overhead'] * 100:.2f}%"])
        lines.append(_table(["sampler", "tokens run"] + stats + ["monitor overhead"], rows))
    if ex.get("failure"):
        lines += ["", "```", ex["failure"]["message"], "```"]
    return lines


def agreement_lines(verdict: dict, title: str) -> list[str]:
    """A low-precision greedy verdict (``draftrl.eval.agreement``) as a bullet, a per-setting line and
    the divergences' table (position, disputed tokens, the target's margin, near-tie or violation)."""
    from draftrl.eval.agreement import verdict_lines

    head, *table = verdict_lines(verdict, markdown=True)
    per = verdict.get("per_setting") or {}
    rates = ", ".join(f"`{name}` {c['identical']}/{c['comparisons']} ({_f(100 * (c['token_agreement'] or 0), '.0f')}% "
                      "of tokens)" for name, c in per.items())
    summary = head.split(": ", 1)[1]  # after "greedy agreement with plain decoding (DTYPE)"
    lines = [f"- {title}, {verdict['dtype']}: {'passed' if verdict.get('passed') else 'FAILED'}. {summary}."]
    if rates:
        lines.append("  Per setting (identical requests, share of plain decoding's tokens before the first "
                     "divergence): "
                     f"{rates}.")
    return lines + table + ([""] if table else [])


def render_report(results: dict, files: dict[str, str]) -> str:
    """The markdown report of an evaluation."""
    cfg = results["config"]
    env = cfg["env"]
    hw = results.get("hardware", {})
    best = results.get("best_grid")
    lines = [
        "# draftrl evaluation",
        "",
        f"Held-out split, {len(results['prompts'])} requests, every policy on the same requests, interleaved per "
        f"request ({results['repeats']} pass{'es' if results['repeats'] > 1 else ''}; median-time pass kept). "
        f"Speedups are throughput ratios over plain decoding (`none`) measured in the same run.",
        "",
        _table(REPORT_COLUMNS, policy_rows(results, full=True)),
        "",
    ]
    lines += anchor_lines(results)
    if best:
        lines += [f"`best-grid` = depth {best['depth']}, verify size {best['verify_size'] or 'all'}, width "
                  f"{best['width']} (tune split: {_x(best['speedup_vs_none'])}).", ""]
    lines += ["## Exactness", "", *exactness_lines(results["exactness"]), ""]
    lines += ["## Per language", "", _group_table(results, "per_language"), "",
              "## Per task", "", _group_table(results, "per_task"), ""]
    lines += ["## Acceptance", "", "Mean tokens per round counts the bonus token (plain decoding = 1.00). "
              "Per-position conditional acceptance: P(position i accepted | 1..i-1 accepted, i verified).", ""]
    rows = []
    for name, p in results["policies"].items():
        rate = p["acceptance_by_position"]["rate"][:8]
        rows.append([name, f"{p['mean_tokens_per_round']:.2f}", " ".join("-" if r is None else f"{r:.2f}" for r in rate)
                     or "-", " ".join(f"{k}:{v}" for k, v in p["depth_histogram"].items())])
    lines += [_table(["policy", "tokens/round", "acceptance by position 1..8", "depth: rounds"], rows), ""]
    plots = [(k, v) for k, v in files.items() if v.endswith(".png")]
    if plots:
        lines += ["## Plots", ""] + [f"![{k}]({v})" for k, v in plots] + [""]
    lines += [
        "## Context",
        "",
        f"target `{env['target']}`, drafter `{env['drafter']}`, temperature {env['temperature']:g}, "
        f"languages {_names(env['languages'])}, tasks {_names(env['tasks'])}, "
        f"max_new_tokens {env['max_new_tokens'] or 'per prompt'}; hardware: {hw.get('gpu') or hw.get('cpu')}, "
        f"{hw.get('threads')} torch threads, torch {hw.get('torch')}, few-token kernels "
        f"{(results.get('kernels') or {}).get('layout', 'stock')} "
        f"({(results.get('kernels') or {}).get('source', '-')}). "
        f"Wall time {results.get('wall_seconds', 0):.0f} s. "
        "Absolute tokens/s depend on the machine and its load; compare the ratios. Peak memory is the largest "
        "increase over a request's start (process RSS on CPU, the CUDA allocator's peak on GPU).",
        "",
    ]
    return "\n".join(lines)


def _per_sampling_table(policies: dict) -> list[str]:
    """On a temperature mix: tokens / request latency per sampling class, each policy's and its ratio to
    ``none``'s on the same requests (``per_sampling`` rows); nothing without a mix."""
    if not any(p.get("per_sampling") for p in policies.values()):
        return []
    classes = sorted({c for p in policies.values() for c in p.get("per_sampling", {})})
    reference = policies.get("none", {}).get("per_sampling", {})
    lines = ["Per sampling class: tokens / request latency (x none's on the same requests)", "",
             "| policy | " + " | ".join(f"{c} ({reference.get(c, {}).get('num_requests', '?')} req)" for c in classes)
             + " |", "|---|" + "---|" * len(classes)]
    for name, p in policies.items():
        cells = []
        for c in classes:
            row, ref = p.get("per_sampling", {}).get(c), reference.get(c)
            if row is None:
                cells.append("-")
                continue
            ratio = row["tokens_per_second"] / ref["tokens_per_second"] if ref and ref["tokens_per_second"] else None
            cells.append(f"{row['tokens_per_second']:.1f}" + (f" ({ratio:.2f}x)" if ratio is not None else ""))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines + [""]


def render_serving_report(results: dict) -> str:
    """``report.md`` of ``draftrl eval --engine vllm``: a markdown table per load, ratios first."""
    lines = ["# Serving evaluation (vLLM)", ""]
    hw = results.get("hardware", {})
    for section in ("concurrency", "rates"):
        for key, entry in results.get(section, {}).items():
            lines += [f"## {section} = {key}", "",
                      "| policy | speedup vs none | tokens/s | tokens/step | acceptance | acceptance length (vLLM) "
                      "| TTFT p50 s | ITL p50 ms | ITL p95 ms | ITL p99 ms |",
                      "|---|---|---|---|---|---|---|---|---|---|"]
            for name, p in entry["policies"].items():
                fmt = lambda v, m=1.0, f="{:.2f}": "-" if v is None else f.format(v * m)  # noqa: E731
                vllm_counts = p.get("spec_decoding") or {}
                lines.append(f"| {name} | {fmt(p['speedup_vs_none'])}x | {p['tokens_per_second']:.1f} | "
                             f"{p['mean_tokens_per_step']:.2f} | {fmt(p['acceptance'])} | "
                             f"{fmt(vllm_counts.get('acceptance_length'))} | "
                             f"{fmt(p['time_to_first_token_p50'])} | {fmt(p['itl_p50'], 1e3, '{:.1f}')} | "
                             f"{fmt(p['itl_p95'], 1e3, '{:.1f}')} | {fmt(p['itl_p99'], 1e3, '{:.1f}')} |")
            lines.append("")
            lines += _per_sampling_table(entry["policies"])
    ex = results["exactness"]
    hows = []
    if ex["greedy_identity"]["checked"]:
        hows.append(f"greedy identity, reference {ex['greedy_identity']['reference']}")
    if ex["monitor"]["policies"]:
        hows.append("monitor on the sampled streams: " + ", ".join(
            f"{name} {v['verdict']}" + (f" on {v['num_informative']} tokens" if "num_informative" in v else "")
            for name, v in ex["monitor"]["policies"].items()))
    sampling = ex.get("sampling") or []
    what = f"mix {', '.join(sampling)}" if len(sampling) > 1 else f"temperature {ex['temperature']}"
    lines.append(f"Exactness: {'PASSED' if ex['passed'] else 'FAILED'} ({what}, {ex['dtype']}, {'; '.join(hows)}).")
    lines.append(f"Hardware: {hw.get('cpu')} ({hw.get('cpu_count')} cores). Timings are wall clock on that machine.")
    return "\n".join(lines) + "\n"


MIX_COLUMNS = ["policy", "speedup vs AR", "vs best fixed", "vs T=0 grid's choice", "vs HF generate", "vs HF lookup"]


def mix_columns(results: dict) -> list[str]:
    """:data:`MIX_COLUMNS`, plus ``vs HF assisted`` where HF assisted generation was timed (a draft model)."""
    assisted = any(p.get("speedup_vs_hf_assisted") is not None for p in results["mix"]["policies"].values())
    return MIX_COLUMNS + (["vs HF assisted"] if assisted else [])


def mix_rows(results: dict) -> list[list[str]]:
    """One row per policy of a temperature mix, the columns of :func:`mix_columns`: each ratio
    weight-averaged over the classes (``results["mix"]["policies"]``; "-" where some class lacks the
    policy or the reference)."""
    keys = ["speedup_vs_none", "speedup_vs_best_fixed", "speedup_vs_t0_grid", "speedup_vs_hf", "speedup_vs_hf_lookup",
            "speedup_vs_hf_assisted"][: len(mix_columns(results)) - 1]
    return [[name, *[_x(p.get(k)) for k in keys]] for name, p in results["mix"]["policies"].items()]


def class_title(label: str, c: dict) -> str:
    s = c["sampling"]
    return (f"{label}: temperature {s['temperature']:g}, top-k {s['top_k'] or 'off'}, top-p {s['top_p']:g}, "
            f"weight {c['weight']:.2f}")


def render_mix_report(results: dict) -> str:
    """The markdown report of an evaluation over a temperature mix: the mix table (each ratio the
    weight-averaged per-class ratio), then per class its table, anchors and exactness verdict (each
    class's full report, plots included, is in ``classes/<label>/report.md``)."""
    cfg = results["config"]
    env = cfg["env"]
    hw = results.get("hardware", {})
    classes = results["classes"]
    lines = [
        "# draftrl evaluation: temperature mix",
        "",
        f"Held-out split, {len(results['prompts'])} requests, every request at every sampling class "
        f"({', '.join(classes)}) with the same seeds; within a class every policy runs on the same requests, "
        "interleaved per request. Speedups are throughput ratios over plain decoding (`none`) at the same class.",
        "",
        "## Mix",
        "",
        "Each ratio is the weight-averaged ratio of the classes: "
        + " + ".join(f"{c['weight']:.2f} x {label}" for label, c in classes.items())
        + ". `vs T=0 grid's choice`: over the fixed setting the temperature-0 grid chose (`t0-grid`), played at "
          "every class; `vs best fixed`: over each class's own best fixed setting (`best-grid`). `-`: some class "
          "lacks the policy (`lookahead` runs at temperature 0 only; its ratios are in that class's table).",
        "",
        _table(mix_columns(results), mix_rows(results)),
        "",
    ]
    for label, c in classes.items():
        best = c.get("best_grid")
        lines += [f"## {class_title(label, c)}", "", _table(REPORT_COLUMNS, policy_rows(c, full=True)), ""]
        if best:
            lines += [f"`best-grid` = depth {best['depth']}, verify size {best['verify_size'] or 'all'}, width "
                      f"{best['width']} (tune split: {_x(best['speedup_vs_none'])}).", ""]
        if c.get("t0_grid"):
            lines += [f"{c['t0_grid'][0].upper()}{c['t0_grid'][1:]}.", ""]
        lines += anchor_lines(c)
        lines += [f"### Exactness at {label}", "", *exactness_lines(c["exactness"]), "",
                  f"Full report and plots: `classes/{label.replace(':', '_')}/report.md`.", ""]
    ex = results["exactness"]
    lines += [
        f"**Exactness over the mix: {'PASSED' if ex['passed'] else 'FAILED'}** (greedy identity at temperature 0, "
        "the streaming monitor at every class above 0).",
        "",
        "## Context",
        "",
        f"target `{env['target']}`, drafter `{env['drafter']}`, languages {_names(env['languages'])}, tasks "
        f"{_names(env['tasks'])}, max_new_tokens {env['max_new_tokens'] or 'per prompt'}; hardware: "
        f"{hw.get('gpu') or hw.get('cpu')}, {hw.get('threads')} torch threads. Wall time "
        f"{results.get('wall_seconds', 0):.0f} s. Classes are timed one after the other: compare ratios within a "
        "class; the mix's ratios combine them.",
        "",
    ]
    return "\n".join(lines)
