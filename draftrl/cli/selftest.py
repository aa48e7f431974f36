"""``draftrl selftest``: run the source articles' test vectors through the real sampler code.

Each vector fixes a target distribution p (and a draft distribution q or deterministic proposals),
samples many verifications with the sampler the engine runs, and checks that every emitted-token
frequency is within 4 standard errors of p (``draftrl.decoding.selftest``). ``--method
resample-from-p`` runs the known-wrong correction and must fail.

Example::

    draftrl selftest --trials 200000 --seed 0
    draftrl selftest --method resample-from-p --json     # exits 1: the negative control fails
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from draftrl.config import SELFTEST_SAMPLERS

_LABELS = "ABCDEFGH"


def format_report(report: dict[str, Any]) -> str:
    """The human-readable table printed without --json."""
    from draftrl.decoding.selftest import Z_TOLERANCE

    lines = [
        f"draftrl selftest  method={report['method']}  trials={report['trials']}  seed={report['seed']}",
        f"pass = {report['criterion']}",
    ]
    for v in report["vectors"]:
        lines.append("")
        lines.append(f"{v['name']}  [{v['kind']}]  {'PASS' if v['passed'] else 'FAIL'}   {v['note']}")
        lines.append(f"  {'event':<8}{'expected':>10}{'observed':>10}{'stderr':>10}{'z':>8}")
        cells = [(_LABELS[i], e, o, s, z) for i, (e, o, s, z) in
                 enumerate(zip(v["expected"], v["observed"], v["stderr"], v["z"]))]
        a = v["agree"]
        cells.append(("agree", a["expected"], a["observed"], a["stderr"], a["z"]))
        for label, e, o, s, z in cells:
            flag = "" if abs(z) <= Z_TOLERANCE else "  <-- off"
            lines.append(f"  {label:<8}{e:>10.5f}{o:>10.5f}{s:>10.5f}{z:>8.2f}{flag}")
    num_passed = sum(v["passed"] for v in report["vectors"])
    verdict = "PASS" if report["passed"] else "FAIL"
    lines.append("")
    lines.append(f"{verdict}: {num_passed}/{len(report['vectors'])} vectors passed in {report['seconds']:.2f} s")
    return "\n".join(lines)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "selftest",
        help="check the rejection sampler against known test vectors (exits 1 on failure)",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    parser.add_argument("--trials", type=int, default=200_000, help="trials per vector (default: 200000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the torch generator (default: 0)")
    parser.add_argument(
        "--method",
        choices=SELFTEST_SAMPLERS,
        default="correct",
        help="verification rule; resample-from-p is the known-wrong negative control and must fail",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from draftrl.decoding.selftest import run_selftest
    from draftrl.io import plain

    report = run_selftest(trials=args.trials, seed=args.seed, method=args.method)
    print(json.dumps(plain(report), indent=2) if args.json else format_report(report))
    return 0 if report["passed"] else 1
