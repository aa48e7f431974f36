"""Grid and evaluation per sampling class of a temperature mix (issue 45 items 4 and 5).

Unit tests (seconds) on synthetic grid.json / results.json dicts: the mix's arithmetic (every ratio
the weight-averaged per-class ratio), the policies of each class (``t0-grid`` at T > 0, lookahead
at 0 only), the pluggable ranking of the grid's cells, the report and CLI tables. The real-model
test (slow) runs ``draftrl grid`` and ``draftrl eval`` on SmolLM2 over a two-class mix.
"""

from __future__ import annotations

import copy
import json

import pytest
from eval_helpers import CONFIGS, assert_png, fake_results, with_intervals

from draftrl.eval.round.classes import (
    T0_GRID,
    best_mix_cell,
    class_grid,
    class_specs,
    mix_cells,
    mix_policies,
    t0_best,
    t0_grid_note,
)
from draftrl.eval.round.grid import Cell
from draftrl.eval.round.ranking import LiveRanking, RankingSource, ranked_cells


def cells(speedups: dict[str, float]) -> dict:
    out = {}
    for name, s in speedups.items():
        d = int(name.split("_")[0][1:])
        out[name] = {"depth": d, "verify_size": 0, "width": 1, "speedup_vs_none": s, "tokens_per_second": 10 * s}
    return out


def test_mix_cells_are_the_weighted_per_class_speedups() -> None:
    classes = {"T0": {"cells": cells({"d0_v0_w1": 1.0, "d2_v0_w1": 1.4, "d4_v0_w1": 1.6})},
               "T0.7": {"cells": cells({"d0_v0_w1": 1.0, "d2_v0_w1": 1.1, "d4_v0_w1": 0.8})}}
    mixed = mix_cells(classes, {"T0": 0.3, "T0.7": 0.7})
    assert list(mixed) == ["d0_v0_w1", "d2_v0_w1", "d4_v0_w1"]
    assert mixed["d2_v0_w1"]["speedup_vs_none"] == pytest.approx(0.3 * 1.4 + 0.7 * 1.1)  # 1.19
    assert mixed["d4_v0_w1"]["speedup_vs_none"] == pytest.approx(0.3 * 1.6 + 0.7 * 0.8)  # 1.04
    assert mixed["d0_v0_w1"]["speedup_vs_none"] == pytest.approx(1.0)
    assert mixed["d4_v0_w1"]["per_class"] == {"T0": 1.6, "T0.7": 0.8}
    best = best_mix_cell(mixed)  # greedy alone would pick depth 4; the mix picks depth 2
    assert best["name"] == "d2_v0_w1" and best["per_class"] == {"T0": 1.4, "T0.7": 1.1}


class Scripted(RankingSource):
    name = "scripted"

    def rank(self, config, cells, *, target=None):
        return {"d1_v0_w1": 1.0, "d2_v0_w1": 3.0, "d4_v0_w1": 2.0, "d6_v0_w1": 0.5}


def test_a_ranking_source_picks_the_cells_timed_live() -> None:
    grid = [Cell(0), Cell(1), Cell(2), Cell(4), Cell(6)]
    timed, ranked = ranked_cells(None, grid, Scripted(), 2)
    assert [c.name for c in timed] == ["d0_v0_w1", "d2_v0_w1", "d4_v0_w1"]  # plain decoding always, then the top 2
    assert ranked["source"] == "scripted" and ranked["top_cells"] == 2
    assert ranked_cells(None, grid, LiveRanking(), 2) == (grid, None)  # live: every cell is timed
    assert ranked_cells(None, grid, None, None) == (grid, None)


def class_results(temperature: float, weight: float, scale: dict[str, float], t0_grid: bool = False,
                  lookahead: bool = False) -> dict:
    """One class of a mixed results.json: the fake results with its policies' throughputs scaled."""
    results, _ = fake_results()
    results = with_intervals(copy.deepcopy(results))
    if t0_grid:
        results["policies"][T0_GRID] = dict(results["policies"]["heuristic"], spec="fixed:2")
    if lookahead:
        results["policies"]["lookahead"] = dict(results["policies"]["ppo"], spec="lookahead")
    for name, p in results["policies"].items():
        p["tokens_per_second"] *= scale.get(name, 1.0)
        p["speedup_vs_none"] = p["tokens_per_second"] / results["policies"]["none"]["tokens_per_second"]
        p["ci_vs_best_fixed"] = dict(p["ci_vs_best_fixed"], ratio=p["tokens_per_second"]
                                     / results["policies"]["best-grid"]["tokens_per_second"])
    results["exactness"]["temperature"] = temperature
    results["anchors"] = {"methods": {"hf": {"tokens_per_second": 9.0, "tokens_per_forward": 1.0}},
                          "best_lookup": None}
    return {"sampling": {"temperature": temperature, "top_k": 0, "top_p": 1.0}, "weight": weight, **results}


def mixed_results() -> dict:
    t0 = class_results(0.0, 0.25, {"ppo": 1.2}, lookahead=True)
    t7 = class_results(0.7, 0.75, {"ppo": 0.9, "heuristic": 0.95}, t0_grid=True)
    results, _ = fake_results()
    classes = {"T0": t0, "T0.7": t7}
    return {**results, "classes": classes, "mix": {"weights": {"T0": 0.25, "T0.7": 0.75},
                                                   "policies": mix_policies(classes)},
            "exactness": {"passed": True, "temperature": [0.0, 0.7], "monitor_overhead": {"fraction": 0.01},
                          "greedy_identity": {"checked": False}}}


def test_mix_policies_weight_every_ratio() -> None:
    results = mixed_results()
    t0, t7 = results["classes"]["T0"]["policies"], results["classes"]["T0.7"]["policies"]
    mix = results["mix"]["policies"]
    for name in ("none", "best-grid", "heuristic", "ppo"):
        assert mix[name]["speedup_vs_none"] == pytest.approx(
            0.25 * t0[name]["speedup_vs_none"] + 0.75 * t7[name]["speedup_vs_none"])
        assert mix[name]["speedup_vs_best_fixed"] == pytest.approx(
            0.25 * t0[name]["ci_vs_best_fixed"]["ratio"] + 0.75 * t7[name]["ci_vs_best_fixed"]["ratio"])
        assert mix[name]["speedup_vs_hf"] == pytest.approx(
            0.25 * t0[name]["speedup_vs_hf"] + 0.75 * t7[name]["speedup_vs_hf"])
    # hand arithmetic: ppo is 13 tok/s before scaling, none 10: 0.25 * 1.56 + 0.75 * 1.17 = 1.2675
    assert mix["ppo"]["speedup_vs_none"] == pytest.approx(0.25 * 13 * 1.2 / 10 + 0.75 * 13 * 0.9 / 10)
    assert mix["ppo"]["speedup_vs_none"] == pytest.approx(1.2675)
    # t0-grid at the greedy class is best-grid there (the same setting, timed once)
    assert mix[T0_GRID]["per_class"]["speedup_vs_none"]["T0"] == pytest.approx(t0["best-grid"]["speedup_vs_none"])
    assert mix[T0_GRID]["speedup_vs_none"] == pytest.approx(
        0.25 * t0["best-grid"]["speedup_vs_none"] + 0.75 * t7[T0_GRID]["speedup_vs_none"])
    assert mix["ppo"]["per_class"]["speedup_vs_t0_grid"]["T0.7"] == pytest.approx(
        t7["ppo"]["tokens_per_second"] / t7[T0_GRID]["tokens_per_second"])
    assert list(mix) == ["none", "heuristic", "ppo", "best-grid", T0_GRID, "lookahead"]  # t0-grid after best-grid
    # the lookahead bound exists at temperature 0 only: no mix value, its class value kept
    assert mix["lookahead"]["speedup_vs_none"] is None
    assert mix["lookahead"]["per_class"]["speedup_vs_none"]["T0"] == pytest.approx(t0["lookahead"]["speedup_vs_none"])


def grid_json() -> dict:
    return {"config": {"env": {"temperature": 0.0, "temperature_mix": [{"temperature": 0.0}, {"temperature": 0.7}]}},
            "best": {"name": "d2_v0_w1", "depth": 2, "verify_size": 0, "width": 1},
            "classes": {"T0": {"sampling": {"temperature": 0.0}, "best": {"name": "d4_v2_w1", "depth": 4,
                                                                           "verify_size": 2, "width": 1},
                               "anchors": {"best_lookup": "hf-lookup:4"}},
                        "T0.7": {"sampling": {"temperature": 0.7}, "best": {"name": "d1_v0_w1", "depth": 1,
                                                                            "verify_size": 0, "width": 1},
                                 "anchors": {"best_lookup": "hf-lookup:2"}}}}


def test_each_class_plays_its_own_best_and_the_t0_grids_choice() -> None:
    from draftrl.config.workload import SamplingClass
    from draftrl.eval.policy_names import parse_policies

    grid = grid_json()
    assert class_grid(grid, "T0.7")["best"]["depth"] == 1 and class_grid(grid, "T0")["best"]["depth"] == 4
    assert class_grid(grid, "T0.7")["anchors"]["best_lookup"] == "hf-lookup:2"
    assert t0_best(grid)["name"] == "d4_v2_w1"
    assert class_grid(grid, "T1")["best"]["name"] == "d2_v0_w1"  # a class the grid did not search: the mix's best
    single = {"config": {"env": {"temperature": 0.0}}, "best": {"depth": 3}}
    assert class_grid(single, "T0.7") is single and t0_best(single)["depth"] == 3
    assert t0_best({"config": {"env": {"temperature": 0.7}}, "best": {"depth": 3}}) is None

    specs = parse_policies(["none", "best-grid", "heuristic", "lookahead"])
    hot = class_specs(specs, SamplingClass(0.7), grid)
    assert [s.label for s in hot] == ["none", "best-grid", T0_GRID, "heuristic"]
    t0 = hot[2]
    assert (t0.kind, t0.depth, t0.verify_size, t0.width, t0.text) == ("fixed", 4, 2, 1, "fixed:4:2")
    assert [s.label for s in class_specs(specs, SamplingClass(0.0), grid)] == ["none", "best-grid", "heuristic",
                                                                               "lookahead"]
    assert T0_GRID not in [s.label for s in class_specs(parse_policies(["none", "heuristic"]), SamplingClass(0.7),
                                                        grid)]
    # the temperature-0 grid chose the class's own best: best-grid stands for it (timed once)
    grid["classes"]["T0.7"]["best"] = dict(grid["classes"]["T0"]["best"])
    assert [s.label for s in class_specs(specs, SamplingClass(0.7), grid)] == ["none", "best-grid", "heuristic"]
    assert "stands for `t0-grid`" in t0_grid_note(grid, SamplingClass(0.7), ["none", "best-grid"])


def test_one_sampling_per_timing_pass(tmp_path) -> None:
    """measure_cells and a sweep cell time one sampling: a mix is refused before any model loads (the
    engine would silently sample with the scalar temperature), naming what to do instead."""
    from draftrl.config import load_config
    from draftrl.eval.round.config import EvalConfig
    from draftrl.eval.round.grid import measure_cells, run_cell

    config = load_config(EvalConfig, CONFIGS / "eval_tiny_cpu.yaml", ["env.temperature_mix={0: 0.5, 0.7: 0.5}"])
    with pytest.raises(ValueError, match="class_config"):
        measure_cells(config, [Cell(0)])
    with pytest.raises(ValueError, match="one sweep per class"):
        run_cell(config, tmp_path, Cell(2))


def test_the_mix_report_and_cli_tables(capsys) -> None:
    from draftrl.cli.eval import print_mix_table, print_policy_table
    from draftrl.eval.report import render_mix_report

    results = mixed_results()
    text = render_mix_report(results)
    assert "## Mix" in text and "0.25 x T0 + 0.75 x T0.7" in text
    assert "## T0: temperature 0, top-k off, top-p 1, weight 0.25" in text and "## T0.7: temperature 0.7" in text
    assert "| ppo | 1.27x |" in text  # the weighted speedup over plain decoding
    assert "sampled at temperature 0.7" in text  # the anchors' line at the hot class
    print_mix_table(results)
    print_policy_table(results["classes"]["T0.7"], "at T0.7")
    out = capsys.readouterr().out
    assert "temperature mix (0.25 x T0 + 0.75 x T0.7)" in out and T0_GRID in out
    from draftrl.cli.demo import print_summary

    results["exactness"]["hf_reference"] = {"checked": 0}
    print_summary({"results_dict": results, "steps": {"eval": {"seconds": 60.0}}, "wall_seconds": 60.0,
                   "out": "runs/demo", "report": "runs/demo/eval/report.md", "results": "results.json"})
    out = capsys.readouterr().out
    assert "held-out requests at T0.7 (weight 0.75)" in out and "temperature mix" in out
    assert "over the classes of the mix" in out


# --------------------------------------------------------------------------- real model (slow)
OVERRIDES = [
    "env.languages=[en]",  # 2 prompts per split (code_edit, chat)
    "env.max_new_tokens=12",
    "env.temperature_mix={0: 0.4, 0.7: 0.6}",
    "grid.depths=[0,2]",
    "grid.repeats=1",
    "eval.greedy_reference=1",
    "eval.anchor_gammas=[2]",
    "threads=1",
]


@pytest.mark.slow
def test_grid_and_eval_per_class_on_the_real_model(smollm2, tmp_path, monkeypatch) -> None:
    """``draftrl grid`` then ``draftrl eval`` over the mix {0: 0.4, 0.7: 0.6}: a grid per class and the
    mix (the weighted arithmetic), heatmaps per class; per-class tables on the same requests and
    seeds, t0-grid at 0.7, lookahead at 0 only, the sampled anchors at 0.7 with their seeds, exactness
    at both classes (greedy identity at 0, the monitor over every policy at 0.7), the mix's rows."""
    from draftrl.config import load_config
    from draftrl.eval.round.compare import run_eval
    from draftrl.eval.round.config import EvalConfig
    from draftrl.eval.round.grid import run_grid

    monkeypatch.setenv("WANDB_MODE", "disabled")
    config = load_config(EvalConfig, CONFIGS / "eval_tiny_cpu.yaml", OVERRIDES)
    assert [c.label for c in config.env.sampling_classes] == ["T0", "T0.7"]
    run_grid(config, tmp_path / "grid", target=smollm2)
    grid = json.loads((tmp_path / "grid" / "grid.json").read_text())
    assert set(grid["classes"]) == {"T0", "T0.7"} and grid["best"] == grid["mix"]["best"]
    for label, c in grid["classes"].items():
        assert set(c["cells"]) == {"d0_v0_w1", "d2_v0_w1"} and c["prompts"] == grid["classes"]["T0"]["prompts"]
        assert {"hf", "hf-lookup:2"} <= set(c["anchors"]["methods"])
        assert_png(tmp_path / "grid" / f"grid_heatmap_{label}.png")
    assert grid["classes"]["T0"]["exactness"]["greedy_identity"]["checked"]
    assert set(grid["classes"]["T0.7"]["exactness"]["monitor"]) == {"d0_v0_w1", "d2_v0_w1"}
    mixed = grid["mix"]["cells"]["d2_v0_w1"]
    assert mixed["speedup_vs_none"] == pytest.approx(
        0.4 * grid["classes"]["T0"]["cells"]["d2_v0_w1"]["speedup_vs_none"]
        + 0.6 * grid["classes"]["T0.7"]["cells"]["d2_v0_w1"]["speedup_vs_none"])
    assert_png(tmp_path / "grid" / "grid_heatmap.png")

    results = run_eval(config, tmp_path / "eval", policies=["none", "best-grid", "heuristic", "lookahead"],
                       grid_path=tmp_path / "grid" / "grid.json", target=smollm2)
    saved = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert set(saved["classes"]) == {"T0", "T0.7"}
    t0, t7 = saved["classes"]["T0"], saved["classes"]["T0.7"]
    assert t0["prompts"] == t7["prompts"] and t0["seed"] == t7["seed"]  # paired: the same requests and seeds
    assert list(t0["policies"]) == ["none", "best-grid", "heuristic", "lookahead"]
    if grid["classes"]["T0"]["best"]["name"] != grid["classes"]["T0.7"]["best"]["name"]:
        assert list(t7["policies"]) == ["none", "best-grid", T0_GRID, "heuristic"]
        assert t7["policies"][T0_GRID]["spec"].startswith(f"fixed:{grid['classes']['T0']['best']['depth']}")
    else:  # the same setting: best-grid stands for t0-grid
        assert list(t7["policies"]) == ["none", "best-grid", "heuristic"] and "stands for" in t7["t0_grid"]
    assert t7["best_grid"]["name"] == grid["classes"]["T0.7"]["best"]["name"]
    for c in (t0, t7):
        for p in c["policies"].values():
            assert p["num_requests"] == len(c["prompts"])
    assert {"hf", "hf-lookup:2"} <= set(t7["anchors"]["methods"]) and set(t7["anchor_seeds"]) == set(t7["prompts"])
    assert t0["exactness"]["greedy_identity"]["checked"] and t0["exactness"]["greedy_identity"]["passed"]
    assert set(t7["exactness"]["monitor"]) == set(t7["policies"]) and t7["exactness"]["passed"]
    assert saved["exactness"]["passed"]
    mix = saved["mix"]["policies"]
    assert mix["heuristic"]["speedup_vs_none"] == pytest.approx(
        0.4 * t0["policies"]["heuristic"]["speedup_vs_none"] + 0.6 * t7["policies"]["heuristic"]["speedup_vs_none"])
    assert mix["lookahead"]["speedup_vs_none"] is None
    report = (tmp_path / "eval" / "report.md").read_text()
    assert "## Mix" in report and "## T0.7: temperature 0.7" in report
    assert (tmp_path / "eval" / "classes" / "T0.7" / "report.md").is_file()
    assert results["mix"] == saved["mix"]


def test_replay_ranking_scores_cells_on_greedy_traces() -> None:
    """On synthetic traces with a cost table, every chain cell that verifies every node scores its
    replayed speedup over plain decoding (the drafter-choice table's fixed arms, which equal what
    TraceReplay-v0 charges: tests/eval/round/test_headroom.py); the top cells and every cell the replay
    cannot play (a verify size, another width) are timed live; at T > 0 nothing is scored."""
    import dataclasses

    from choice_traces import costs, synthetic

    from draftrl.eval.round.config import EvalConfig, GridConfig
    from draftrl.eval.round.grid import grid_cells
    from draftrl.eval.round.headroom import headroom
    from draftrl.eval.round.ranking import ReplayRanking
    from draftrl.replay.round_table import round_table

    traces, table = synthetic(1, 1), costs(1e-4)
    config = EvalConfig(grid=GridConfig(depths=(0, 1, 2, 4), verify_sizes=(0, 2), widths=(1,)))
    cells = grid_cells(config.grid)
    ranking = ReplayRanking(traces, table)
    scores = ranking.rank(config, cells)
    room = headroom(round_table({"x": traces}, {"x": table}, (1, 2, 4)))
    assert scores == pytest.approx({f"d{d}_v0_w1": room.speedup(f"fixed:x:{d}") for d in (1, 2, 4)})
    timed, ranked = ranked_cells(config, cells, ranking, 1)
    best = max(scores, key=scores.get)
    assert [c.name for c in timed] == [c.name for c in cells if c.depth == 0 or c.verify_size or c.name == best]
    assert ranked["source"] == "replay" and ranked["why"] is None and ranked["timed"] == [c.name for c in timed]
    hot = dataclasses.replace(config, env=dataclasses.replace(config.env, temperature=0.7))
    timed, ranked = ranked_cells(hot, cells, ranking, 1)
    assert timed == cells and ranked["scores"] == {} and "temperature 0 only" in ranked["why"]
    from draftrl.eval.round.grid import run_grid

    with pytest.raises(ValueError, match="grid.traces"):  # before any model loads
        run_grid(EvalConfig(grid=GridConfig(replay_rank=True)), "/nonexistent/never-written")
    other = dataclasses.replace(config, env=dataclasses.replace(config.env, drafter="sam:2"))
    with pytest.raises(ValueError, match="collected with drafter='ngram'"):
        ranking.rank(other, cells)


class FakeRun:
    """What the wandb loggers call on a run: ``log`` and ``summary.update``."""

    def __init__(self) -> None:
        self.logged: dict = {}
        self.summary: dict = {}

    def log(self, values: dict) -> None:
        self.logged.update(values)


def test_wandb_keys_per_class_and_for_the_mix(tmp_path) -> None:
    from draftrl.eval.wandb_log import log_eval_mix, log_grid_mix

    results = mixed_results()
    run = FakeRun()
    log_eval_mix(run, results, tmp_path)
    mix = results["mix"]["policies"]
    assert run.summary["mix/policy/ppo/speedup_vs_none"] == pytest.approx(mix["ppo"]["speedup_vs_none"])
    assert run.summary["mix/policy/t0-grid/speedup_vs_t0_grid"] == pytest.approx(1.0)
    assert run.summary["mix/weight/T0_7"] == 0.75
    t7 = results["classes"]["T0.7"]["policies"]["ppo"]
    assert run.summary["class/T0_7/policy/ppo/speedup_vs_none"] == pytest.approx(t7["speedup_vs_none"])
    assert run.summary["class/T0_7/policy/ppo/speedup_vs_best_fixed"] == pytest.approx(t7["ci_vs_best_fixed"]["ratio"])
    assert {"compare/mix", "class/T0/compare/policies", "class/T0_7/compare/policies"} <= set(run.logged)

    grid = {"config": {"env": {"drafter": "ngram"}}, "files": {"heatmap": "grid_heatmap.png"},
            "exactness": {"passed": True},
            "classes": {label: {"weight": w, "prompts": ["a"], "exactness": {"passed": True},
                                "cells": {n: {**c, "mean_tokens_per_round": 1.5} for n, c in cs.items()},
                                "best": {"name": "d2_v0_w1", "depth": 2, "verify_size": 0, "width": 1}}
                        for label, w, cs in (("T0", 0.3, cells({"d0_v0_w1": 1.0, "d2_v0_w1": 1.4})),
                                             ("T0.7", 0.7, cells({"d0_v0_w1": 1.0, "d2_v0_w1": 1.1})))}}
    grid["mix"] = {"cells": mix_cells(grid["classes"], {"T0": 0.3, "T0.7": 0.7})}
    grid["mix"]["best"] = best_mix_cell(grid["mix"]["cells"])
    run = FakeRun()
    log_grid_mix(run, grid, tmp_path)
    assert run.summary["best/name"] == "d2_v0_w1" and run.summary["best/speedup_vs_none"] == pytest.approx(1.19)
    assert run.summary["best/T0_7/speedup_vs_none"] == pytest.approx(1.1)
    assert run.summary["class/T0_7/best/name"] == "d2_v0_w1" and "class/T0/grid/cells" in run.logged
    assert "grid/mix" in run.logged


def test_every_policy_is_compared_with_hf_assisted_where_it_was_timed() -> None:
    """With a draft model as the drafter the anchors include ``hf-assisted``: every policy gets
    ``speedup_vs_hf_assisted`` (total tokens over total seconds, paired interval over requests); at
    T > 0 no 'same tokens as none' is counted (the anchors sample from HF's own generator)."""
    import numpy as np

    from draftrl.eval.records import RequestRun
    from draftrl.eval.round.anchors import AnchorRun
    from draftrl.eval.round.compare import add_anchors

    def run(policy, prompt, seconds):
        return RequestRun(policy=policy, prompt_id=prompt, language="en", task="chat", repeat=0,
                          token_ids=list(range(20)), num_prompt_tokens=10, prefill_seconds=0.1, total_seconds=seconds,
                          round_seconds=np.full(20, (seconds - 0.1) / 20), round_tokens=np.ones(20, int),
                          round_accepted=np.zeros(20, int), round_depth=np.zeros(20, int),
                          round_verify_size=np.zeros(20, int), round_verified_depth=np.zeros(20, int),
                          round_num_verified=np.zeros(20, int))

    prompts = ["a", "b", "c"]
    runs = [run("none", p, 2.0) for p in prompts] + [run("fixed:2", p, 1.6) for p in prompts]
    anchors = [AnchorRun(label, p, "en", "chat", 0, list(range(20)), s, 20)
               for p in prompts for label, s in (("hf", 2.2), ("hf-assisted", 1.8))]
    for temperature in (0.0, 0.7):
        results = {"policies": {"none": {}, "fixed:2": {}}, "exactness": {"temperature": temperature}}
        add_anchors(results, runs, anchors, {p: list(range(20)) for p in prompts}, best_fixed=None)
        assert results["policies"]["fixed:2"]["speedup_vs_hf_assisted"] == pytest.approx(1.8 / 1.6)
        assert results["policies"]["none"]["ci_vs_hf_assisted"]["ratio"] == pytest.approx(1.8 / 2.0)
        same = results["anchors"]["methods"]["hf-assisted"].get("identical_to_none")
        assert same == ("3/3" if temperature == 0 else None)
