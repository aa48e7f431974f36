"""Exactness-monitor power: tokens until each statistic catches each wrong sampler.

Streams come from the simulated samplers in ``tests/decoding/test_monitor.py`` (the same ones
the tests check), p over 50 tokens, chain depth 4. Detection points do not depend on how the
stream is cut into rounds (tested), so each stream is fed in one piece; the per-round cost is
timed separately on 3-token rounds. One line per (sampler, statistic); "any" is the monitor as
a whole. Exact samplers should never be detected (their lines count false alarms). A tool, not
a benchmark: the numbers to quote when changing the monitor (``tests/decoding/test_monitor.py``
checks that wrong samplers are caught and exact ones are not).

    python tools/monitor_power.py --seeds 20 --max-tokens 20000
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

import numpy as np

from draftrl.decoding.monitor import TESTS, ExactnessMonitor, ExactnessViolation, MonitorConfig

ROOT = Path(__file__).resolve().parents[1]


def load_simulator():
    spec = importlib.util.spec_from_file_location("test_monitor", ROOT / "tests" / "decoding" / "test_monitor.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def detection_points(stream, config: MonitorConfig) -> dict[str, float]:
    """Emitted-token count at which each test failed (inf if never)."""
    monitor = ExactnessMonitor(config)
    try:
        monitor.update(stream)
    except ExactnessViolation:
        pass
    tests = monitor.report()["tests"]
    points = {name: float(tests[name].get("failed_at_tokens") or np.inf) for name in TESTS}
    points["any"] = min(points.values())
    return points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=20000)
    parser.add_argument("--alpha", type=float, default=1e-3)
    args = parser.parse_args()
    sim = load_simulator()

    # cost of one update on a 3-token round (the monitor's share of a decoding round)
    stream = sim.simulate_stream("exact", 30000, np.random.default_rng(0))
    rounds = [stream.slice(i, i + 3) for i in range(0, len(stream), 3)]
    monitor = ExactnessMonitor(MonitorConfig(alpha=args.alpha))
    for r in rounds[:500]:  # warm-up
        monitor.update(r)
    start = time.perf_counter()
    for r in rounds[500:]:
        monitor.update(r)
    seconds = (time.perf_counter() - start) / len(rounds[500:])
    print(f"monitor_us_per_round={seconds * 1e6:.1f}  us_per_token={seconds * 1e6 / 3:.1f}  round=3 tokens")

    for sampler in sim.SAMPLERS:
        points = {name: [] for name in (*TESTS, "any")}
        for seed in range(args.seeds):
            stream = sim.simulate_stream(sampler, args.max_tokens, np.random.default_rng(1000 + seed))
            for name, at in detection_points(stream, MonitorConfig(alpha=args.alpha, seed=seed)).items():
                points[name].append(at)
        for name, values in points.items():
            values = np.array(values)
            detected = int(np.isfinite(values).sum())
            median = np.median(values)
            med = f"{median:.0f}" if np.isfinite(median) else f">{args.max_tokens}"
            worst = f"{values.max():.0f}" if detected == len(values) else f">{args.max_tokens}"
            print(
                f"median_tokens_to_detect={med:>7}  max={worst:>7}  detected={detected}/{len(values)}  "
                f"sampler={sampler}  statistic={name}  alpha={args.alpha:g}  vocab={sim.VOCAB}  depth={sim.DEPTH}"
            )


if __name__ == "__main__":
    main()
