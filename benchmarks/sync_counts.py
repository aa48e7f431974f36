"""Host syncs per speculative round, and what the per-token exactness statistics cost (issue 40).

On a GPU each read of a device value by the host and each upload of host data waits for the
device's queue: tens of microseconds, where a round of an 8B target costs a few milliseconds. For
each temperature, width (1 = chain) and depth this prints the syncs of one env step (the draft
features a policy reads, then the round), counted by ``draftrl.decoding.syncs.SyncCounter`` (on CUDA
also what ``torch.cuda.set_sync_debug_mode`` reports, ``cuda_syncs``), and the round's time with the
statistics on and off (``EngineConfig.token_stats``, what ``--no-monitor`` turns off), interleaved.
The counts do not depend on the depth; ``time_off_vs_on`` below 1 is what the statistics cost.

    python benchmarks/sync_counts.py --quick
    python benchmarks/sync_counts.py --drafter self --widths 1,2      # the target drafts for itself
    python benchmarks/sync_counts.py --target DIR --drafter DIR2 --device cuda --dtype bfloat16

One line per (temperature, width, depth): the ratio first, then reads and uploads per round (mean
and max), the CUDA-reported syncs, milliseconds per round with the statistics on and off, context last.
"""

from __future__ import annotations

import argparse

from _bench import Bench, common_flags, median, parse_args, requests, rotations

from draftrl.config.env import EnvConfig
from draftrl.decoding.build import build_engine
from draftrl.decoding.syncs import round_syncs
from draftrl.models import load_model


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[common_flags()])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--drafter", default="ngram",
                        help="a drafter spec (draftrl.drafters.registry): ngram, self, a path")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--temperatures", default="0,1", help="comma-separated")
    parser.add_argument("--widths", default="1,2", help="comma-separated tree widths (1 = chain)")
    parser.add_argument("--depths", default="1,2,4,8", help="comma-separated")
    parser.add_argument("--rounds", type=int, default=8, help="rounds per request (counted, then timed)")
    parser.add_argument("--repeats", type=int, default=3, help="timed requests per arm, interleaved")
    parser.add_argument("--seed", type=int, default=0)
    args = parse_args(parser, quick=dict(depths="1,4", widths="1", rounds=4, repeats=1))
    bench = Bench(args, __file__, device=args.device)
    target = load_model(args.target, dtype=args.dtype, device=args.device)
    measure(bench, target, target=args.target, drafter=args.drafter, device=args.device, dtype=args.dtype,
            temperatures=[float(t) for t in args.temperatures.split(",")], widths=_ints(args.widths),
            depths=_ints(args.depths), rounds=args.rounds, repeats=args.repeats, seed=args.seed)
    bench.save()


def measure(bench: Bench, loaded, *, target: str, drafter: str, device: str, dtype: str, temperatures: list[float],
            widths: list[int], depths: list[int], rounds: int, repeats: int, seed: int = 0,
            kernels: str | None = None) -> list[dict]:
    """One row per (temperature, width, depth) on ``bench`` (see the module docstring); returns the rows.

    :param loaded: the target, a ``LoadedModel`` (``gpu_check.py`` passes one built in memory)
    :param target: its spec, as an ``EnvConfig`` names it (a draft model is loaded by its spec once per process)
    :param kernels: ``EnvConfig.kernels`` (the key under which a draft model is shared)
    """
    prompt = requests(loaded.tokenizer, ["en"], ["code_edit"], 1, None)[0].ids  # repeats its input: n-gram drafts
    max_new_tokens = rounds * (max(depths) + 1) + 1
    first = len(bench.rows)
    for temperature in temperatures:
        env = EnvConfig(target=target, drafter=drafter, device=device, dtype=dtype, kernels=kernels,
                        temperature=temperature, draft_sampling=temperature > 0)
        engine, _ = build_engine(env, loaded, max_new_tokens=max_new_tokens, seed=seed, token_stats=True)
        for width in widths:
            for depth in depths:
                engine.config.token_stats = True
                engine.start(prompt, seed=seed)
                counts = []
                for _ in range(rounds):
                    counter, result = round_syncs(engine, depth, None, width)
                    counts.append(counter)
                    if result.finished:
                        break
                seconds: dict[str, list[float]] = {"on": [], "off": []}
                tokens = num_rounds = 0
                for order in rotations(["on", "off"], repeats, seed):
                    for arm in order:
                        engine.config.token_stats = arm == "on"
                        engine.start(prompt, seed=seed)
                        t0, done = engine.clock(), 0
                        while done < rounds and not engine.finished:  # env steps: features, then the round
                            engine.features()
                            result = engine.round(depth, None, width)
                            done += 1
                            if arm == "on":
                                tokens, num_rounds = tokens + result.num_emitted, num_rounds + 1
                        seconds[arm].append((engine.clock() - t0) / done)
                on, off = median(seconds["on"]), median(seconds["off"])
                cuda = [c.cuda_syncs for c in counts if c.cuda_syncs is not None]
                bench.row(
                    {"time_off_vs_on": off / on},
                    {"reads_per_round": sum(c.device_to_host for c in counts) / len(counts),
                     "reads_max": max(c.device_to_host for c in counts),
                     "uploads_per_round": sum(c.uploads for c in counts) / len(counts),
                     "uploads_max": max(c.uploads for c in counts),
                     "cuda_syncs_per_round": sum(cuda) / len(cuda) if cuda else None,
                     "cuda_syncs_max": max(cuda) if cuda else None,
                     "round_ms_on": 1e3 * on, "round_ms_off": 1e3 * off,
                     "tokens_per_round": tokens / max(1, num_rounds)},
                    temperature=temperature, width=width, depth=depth, drafter=drafter, target=target,
                    device=device, dtype=dtype, repeats=repeats)
    return bench.rows[first:]


if __name__ == "__main__":
    main()
