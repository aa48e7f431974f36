"""Evaluation: grid search over fixed settings, policy comparison, exactness checks, reports.

- :func:`run_grid` (``draftrl grid``): depth x verify_size x width on the tune split, wall clock,
  interleaved, median of repeats -> ``grid.json``, heatmap, ``sweep.yaml``, wandb runs.
- :func:`run_eval` (``draftrl eval``): policies on the held-out split, interleaved per request,
  with the exactness monitor and greedy token identity -> ``results.json``, ``report.md``, plots.
- :func:`monitor_power`: tokens each monitor statistic needs to catch a wrong sampler.

Heavy imports (torch, transformers, matplotlib, wandb) happen inside the functions.
"""

from draftrl.eval.config import EvalConfig, GridConfig, PolicyEvalConfig

__all__ = ["EvalConfig", "GridConfig", "PolicyEvalConfig", "run_grid", "run_eval", "monitor_power"]


def __getattr__(name: str):
    if name == "run_grid":
        from draftrl.eval.grid import run_grid

        return run_grid
    if name == "run_eval":
        from draftrl.eval.evaluate import run_eval

        return run_eval
    if name == "monitor_power":
        from draftrl.eval.exactness import monitor_power

        return monitor_power
    raise AttributeError(name)
