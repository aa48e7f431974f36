"""Held-out speedup over the best fixed setting against training positions, greedy and on a temperature mix.

Records tune traces once (the demo's env, depths 0-6, with ``--drafter``, ``--languages`` x 4 tasks; ``--per-group``
tune prompts per (language, task) at ``--max-new-tokens``, one greedy recording and ``--continuations`` K
sampled ones per prompt at each T > 0 of the mix ``MIX``) and held-out traces the same way (``--heldout-per-group``),
both beside one cost table (a quick calibration unless ``--cost-table``). Each point trains ``ppo_size`` on the
first m prompts of every group (nested subsets of one recording, so the points differ only in data), PPO steps
scaled with the positions trained on (``--steps-per-position``, at least ``--min-steps``), and evaluates on the
held-out traces with the same cost table, as ``draftrl train``'s final evaluation does: the policy, every fixed
setting and the lookahead bound, on the same episodes. ``greedy`` trains and evaluates at T = 0 (the traces'
greedy recordings); ``mix`` on every class, each episode drawing its own.

One line per point, ratios first: ``ppo_vs_best_fixed`` (replayed throughput over the best fixed setting's on
the held-out episodes), ``lookahead_vs_best_fixed`` (the headroom), per-class ratios on the mix, then ``se`` (the
paired standard error of the policy's ratio over episodes), ``captured`` (the policy's share of the headroom), the
positions and PPO steps. With ``--out`` a PNG of the curve.

    python benchmarks/learning_curve.py --out runs/learning_curve          # 10-15 min on 2 shared cores
    python benchmarks/learning_curve.py --points 1,2,4 --out runs/lc4      # the README's curve (~20 min)
    python benchmarks/learning_curve.py --quick
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
from _bench import Bench, common_flags, parse_args

MIX = {0.0: 0.3, 0.7: 0.4, 1.0: 0.3}


def first_per_group(traces, m: int) -> list[int]:
    """Indices of the first ``m`` prompts of every (language, task) group, in trace order."""
    seen: Counter = Counter()
    keep = []
    for i, p in enumerate(traces.prompts):
        if seen[(p.language, p.task)] < m:
            keep.append(i)
            seen[(p.language, p.task)] += 1
    return keep


def positions(traces, greedy: bool) -> int:
    """Positions a regime trains on: the greedy recordings' only, or every recording's."""
    lengths = np.diff(traces.cu_num_positions)
    if not greedy:
        return int(lengths.sum())
    classes = [i for i, c in enumerate(traces.classes) if c.greedy]
    return int(lengths[np.isin(traces.recording_class, classes)].sum())


def record(env, out: Path, k: int, table) -> Path:
    from draftrl.decoding.build import build_engine
    from draftrl.replay.traces import collect

    engine, tokenizer = build_engine(env)
    return collect(env, engine, tokenizer, num_continuations=k).save(out, cost_table=table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[common_flags()])
    parser.add_argument("--points", default="1,2", help="tune prompts per (language, task) group, one per point "
                        "(1,2,4,8,16 reaches the whole tune split)")
    parser.add_argument("--per-group", type=int, default=None, help="tune prompts recorded per group "
                        "(default: the largest point; the shipped set has 16)")
    parser.add_argument("--heldout-per-group", type=int, default=1, help="held-out prompts per group (16 in all)")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--continuations", type=int, default=1, help="K sampled recordings per prompt at each T > 0")
    parser.add_argument("--regimes", default="greedy,mix", help="greedy: T = 0 only; mix: " + str(MIX))
    parser.add_argument("--drafter", default="ngram", help="ngram records 2-3x faster than the demo's sam:2 (whose "
                        "EAGLE-3 head drafts every level at every position)")
    parser.add_argument("--languages", default="en,zh")
    parser.add_argument("--tasks", default="code_edit,summarize,qa_context,chat")
    parser.add_argument("--steps-per-position", type=float, default=10.0, help="PPO steps per training position")
    parser.add_argument("--min-steps", type=int, default=20_000, help="PPO steps at least (the demo's default)")
    parser.add_argument("--eval-passes", type=int, default=3, help="passes over the held-out prompts (mix: each "
                        "episode draws its class)")
    parser.add_argument("--normalize-obs", default="true", choices=["true", "false"], help="PPO's VecNormalize")
    parser.add_argument("--cost-table", default=None, help="cost table from draftrl calibrate (default: a quick one)")
    parser.add_argument("--traces", default=None, help="DIR holding tune/ and heldout/ traces of an earlier run "
                        "(default: record them into --out, or a temporary folder)")
    args = parse_args(parser, quick=dict(points="1", languages="en", tasks="code_edit,chat", max_new_tokens=12,
                                         continuations=1, min_steps=512, steps_per_position=1.0, eval_passes=1))
    bench = Bench(args, __file__, owned=("learning_curve.png", "tune", "heldout", "runs"))

    from draftrl.config.commands import CalibrationConfig
    from draftrl.eval.round.demo import DemoConfig, DemoTrainConfig, train_config
    from draftrl.replay.calibrate import calibrate
    from draftrl.replay.traces import Traces
    from draftrl.signals.costs import CostTable
    from draftrl.train.ppo_size import train

    points = [int(m) for m in args.points.split(",")]
    work = bench.out or Path(tempfile.mkdtemp(prefix="learning_curve_"))
    demo = DemoConfig()
    env = dataclasses.replace(demo.env, drafter=args.drafter, languages=tuple(args.languages.split(",")),
                              tasks=tuple(args.tasks.split(",")), max_new_tokens=args.max_new_tokens,
                              temperature_mix=MIX, monitor=False)
    trace_root = Path(args.traces) if args.traces else work
    if args.traces is None:
        if args.cost_table:
            table = CostTable.load(args.cost_table)
        else:
            start = time.perf_counter()
            table = calibrate(CalibrationConfig(num_tokens=(1, 2, 3, 5, 7), contexts=(128, 512), widths=(1,), levels=2,
                                                repeats=1), dataclasses.replace(env, temperature_mix=None))
            bench.note(f"quick calibration in {time.perf_counter() - start:.0f}s")
        for split, per_group in (("tune", args.per_group or max(points)), ("heldout", args.heldout_per_group)):
            start = time.perf_counter()
            path = record(dataclasses.replace(env, split=split, limit_per_group=per_group), work / split,
                          args.continuations, table)
            seconds = time.perf_counter() - start
            n = positions(Traces.load(path), greedy=False)
            bench.note(f"collected {split}: {n} positions in {seconds:.0f}s ({n / seconds:.1f} positions/s)")
    tune, heldout = Traces.load(trace_root / "tune"), trace_root / "heldout"
    num_heldout = len(Traces.load(heldout))

    curve: dict[str, list[tuple[int, float, float]]] = {}
    for regime in args.regimes.split(","):
        greedy = regime == "greedy"
        for m in points:
            part = tune.select(first_per_group(tune, m))
            num_positions = positions(part, greedy)
            run = work / "runs" / f"{regime}_m{m}"
            part_dir = part.save(run / "traces", cost_table=CostTable.load(trace_root / "tune" / "cost_table.json"))
            steps = max(args.min_steps, int(args.steps_per_position * num_positions))
            demo.env = dataclasses.replace(env, temperature_mix=None if greedy else MIX)
            demo.train = DemoTrainConfig(recipes=("ppo_size",), total_timesteps=steps,
                                         eval_episodes=num_heldout * (1 if greedy else args.eval_passes))
            cfg = train_config(demo, "ppo_size", part_dir)
            cfg.env = dataclasses.replace(cfg.env, eval={**cfg.env.eval, "traces": str(heldout)})
            cfg.baselines = ["lookahead"]
            cfg.ppo = dataclasses.replace(cfg.ppo, normalize_obs=args.normalize_obs == "true")
            start = time.perf_counter()
            evaluation = train(cfg, run / "policy")["evaluation"]
            rows = evaluation["table"]
            ppo, look = rows["ppo"]["ratio_to_best_fixed"], rows["lookahead"]["ratio_to_best_fixed"]
            per_class = {f"ppo_vs_best_fixed_{label}": part_["table"]["ppo"]["ratio_to_best_fixed"]
                         for label, part_ in (evaluation.get("per_sampling") or {}).items()}
            bench.row({"ppo_vs_best_fixed": ppo, "lookahead_vs_best_fixed": look, **per_class},
                      {"se": rows["ppo"].get("se", 0.0) / rows[evaluation["best_fixed"]]["throughput"],
                       "captured": evaluation.get("lookahead_gain_captured"), "positions": num_positions,
                       "ppo_steps": steps, "train_s": time.perf_counter() - start},
                      regime=regime, prompts=len(part), drafter=args.drafter, best_fixed=evaluation["best_fixed"],
                      heldout_episodes=cfg.eval_episodes, max_new_tokens=args.max_new_tokens,
                      continuations=args.continuations, normalize_obs=args.normalize_obs)
            curve.setdefault(regime, []).append((num_positions, ppo, look))
    if bench.out is not None:
        plot(curve, bench.path("learning_curve.png"))
    bench.save(curve={k: [list(p) for p in v] for k, v in curve.items()})


def plot(curve: dict[str, list[tuple[int, float, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for regime, pts in curve.items():
        x = [p[0] for p in pts]
        line, = ax.plot(x, [p[1] for p in pts], marker="o", label=f"ppo ({regime})")
        ax.plot(x, [p[2] for p in pts], ls="--", color=line.get_color(), label=f"lookahead ({regime})")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("training positions")
    ax.set_ylabel("held-out throughput / best fixed")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
