"""A temperature mix in the round track: one sampling class at a time, then the mix.

The grid and the evaluation run each class of ``env.temperature_mix`` as a single-class workload
(:func:`class_config`) on the same requests and seeds, then combine: a cell's or a policy's ratio
over the mix is ``sum_c weight_c * ratio_c`` (:func:`mix_cells`, :func:`mix_policies`). At T > 0 the
evaluation also plays the temperature-0 grid's choice (``t0-grid``, :func:`class_specs`).
"""

from __future__ import annotations

import dataclasses

from draftrl.eval.round.config import EvalConfig

#: The mix table's columns: a policy's ratios that are weight-averaged over the classes.
MIX_KEYS = ("speedup_vs_none", "speedup_vs_best_fixed", "speedup_vs_t0_grid", "speedup_vs_hf", "speedup_vs_hf_lookup",
            "speedup_vs_hf_assisted")
#: The policy that plays, at a class T > 0, the setting the temperature-0 grid chose.
T0_GRID = "t0-grid"
CLASSES_DIR = "classes"


def class_dir(label: str) -> str:
    """A class label as a folder or file name part (``T1:k20`` -> ``T1_k20``)."""
    return label.replace(":", "_")


def class_grid(grid: dict | None, label: str) -> dict | None:
    """The grid result ``best-grid`` plays at class ``label``: the class's own search in a mixed
    ``grid.json`` (its ``best`` and anchors), else the whole grid (searched at one sampling)."""
    if grid is None or label not in (grid.get("classes") or {}):
        return grid
    return {**grid, **grid["classes"][label]}


def t0_best(grid: dict | None) -> dict | None:
    """The best fixed setting the temperature-0 grid chose: a mixed grid's greedy class, or a
    single-class grid searched at temperature 0; None if the grid searched no greedy class."""
    if grid is None:
        return None
    for c in (grid.get("classes") or {}).values():
        if c["sampling"]["temperature"] == 0:
            return c["best"]
    env = (grid.get("config") or {}).get("env") or {}
    if "classes" not in grid and not env.get("temperature_mix") and env.get("temperature", 0) == 0:
        return grid.get("best")
    return None


def class_specs(specs: list, sampling, grid: dict | None, keyed: bool = False) -> list:
    """The policies of one class: lookahead at temperature 0, or at any temperature with keyed
    sampling (``env.keyed``: plain decoding's keyed continuation is every policy's output, so the bound
    reads it as it reads the greedy one; otherwise the output is not known in advance); and at T > 0,
    right after ``best-grid``, ``t0-grid``: the temperature-0 grid's choice, unless it is the class's own
    best (the same setting: ``best-grid`` stands for it, timed once, so that timing noise does not read
    as a difference)."""
    from draftrl.eval.policy_names import PolicyName

    out = [s for s in specs if s.kind != "lookahead" or sampling.temperature == 0 or keyed]
    best = t0_best(grid)
    if sampling.temperature > 0 and best is not None and any(s.kind == "best-grid" for s in specs):
        d, v, w = int(best["depth"]), int(best["verify_size"]), int(best["width"])
        own = (class_grid(grid, sampling.label) or {}).get("best") or {}
        if (d, v, w) == (own.get("depth"), own.get("verify_size"), own.get("width")):
            return out
        text = f"fixed:{d}" + (f":{v}" if v else "") + (f":w{w}" if w > 1 else "")
        at = next(i for i, s in enumerate(out) if s.kind == "best-grid") + 1
        out.insert(at, PolicyName(kind="fixed", label=T0_GRID, depth=d, verify_size=v or None, width=w, text=text))
    return out


def t0_grid_note(grid: dict | None, sampling, labels: list[str]) -> str | None:
    """What ``t0-grid`` is at a class: its setting, or that ``best-grid`` stands for it."""
    best = t0_best(grid)
    if best is None or sampling.temperature == 0:
        return None if best is None else f"the temperature-0 grid's choice is `best-grid` here ({best['name']})"
    if T0_GRID in labels:
        return f"`t0-grid` = the temperature-0 grid's choice, {best['name']}"
    return f"the temperature-0 grid chose this class's own best ({best['name']}): `best-grid` stands for `t0-grid`"


def mix_policies(classes: dict[str, dict]) -> dict[str, dict]:
    """Every policy's ratios over the mix: for each of :data:`MIX_KEYS`, ``sum_c weight_c * ratio_c``
    over the classes (weights sum to 1) when every class has it, else None; ``per_class`` beside it.
    ``t0-grid`` where it was not timed is ``best-grid`` there (the same setting, timed once)."""
    names: list[str] = []
    for c in classes.values():  # every class's order, a policy some class lacks after its predecessor there
        order = list(c["policies"])
        for i, n in enumerate(order):
            if n not in names:
                names.insert(names.index(order[i - 1]) + 1 if i and order[i - 1] in names else len(names), n)
    out = {}
    for name in names:
        row: dict = {"per_class": {}}
        for key in MIX_KEYS:
            values = {}
            for label, c in classes.items():
                p = c["policies"].get(name)
                if p is None and name == T0_GRID:  # the greedy class, or one whose own best is T=0's choice
                    p = c["policies"].get("best-grid")
                values[label] = None if p is None else _ratio(p, key, c["policies"])
            row["per_class"][key] = values
            complete = all(v is not None for v in values.values())
            row[key] = sum(classes[label]["weight"] * v for label, v in values.items()) if complete else None
        out[name] = row
    return out


def _ratio(p: dict, key: str, policies: dict) -> float | None:
    if key == "speedup_vs_best_fixed":
        return (p.get("ci_vs_best_fixed") or {}).get("ratio")
    if key == "speedup_vs_t0_grid":
        ref = policies.get(T0_GRID) or (policies.get("best-grid") if T0_GRID not in policies else None)
        return p["tokens_per_second"] / ref["tokens_per_second"] if ref and ref.get("tokens_per_second") else None
    return p.get(key)


def class_config(config: EvalConfig, sampling) -> EvalConfig:
    """``config`` with every request sampled by one class of the mix (a
    :class:`~draftrl.config.workload.SamplingClass`): the single-class workload the grid and the
    evaluation time that class on."""
    env = dataclasses.replace(config.env, temperature=sampling.temperature, top_k=sampling.top_k,
                              top_p=sampling.top_p, temperature_mix=None)
    return dataclasses.replace(config, env=env)


def mix_cells(classes: dict[str, dict], weights: dict[str, float]) -> dict[str, dict]:
    """The mix's cells: every cell timed at every class, its speedup over plain decoding the
    weight-averaged per-class speedup (``sum_c w_c * speedup_c``; weights sum to 1), with the
    per-class speedups beside it (``per_class``)."""
    names = set.intersection(*(set(c["cells"]) for c in classes.values()))
    out = {}
    for name in sorted(names, key=lambda n: list(next(iter(classes.values()))["cells"]).index(n)):
        first = next(iter(classes.values()))["cells"][name]
        per = {label: c["cells"][name]["speedup_vs_none"] for label, c in classes.items()}
        out[name] = {"depth": first["depth"], "verify_size": first["verify_size"], "width": first["width"],
                     "speedup_vs_none": sum(weights[label] * v for label, v in per.items()), "per_class": per}
    return out


def best_mix_cell(cells: dict[str, dict]) -> dict:
    name = max(cells, key=lambda n: cells[n]["speedup_vs_none"])
    c = cells[name]
    return {"name": name, "depth": c["depth"], "verify_size": c["verify_size"], "width": c["width"],
            "speedup_vs_none": c["speedup_vs_none"], "per_class": c["per_class"]}
