"""Verification cost curve: g(k) = cost(forward over k new tokens) / cost(1-token forward), KV cache warm.

g(k) is what a speculative round pays to verify k tokens, in units of one plain decoding step; the
cost model in docs (S = E / (g(gamma) + c*gamma)) and the RL reward both depend on it. Measured
for ``fast_linear`` off and on (see ``draftrl/models/fast_linear.py``), interleaved in random
order in small blocks so machine noise hits both alike; medians of per-block ratios.

    python benchmarks/verify_cost.py                       # smollm2-135m, 200-token context, 1 thread
    python benchmarks/verify_cost.py --clock cpu           # steadier on a shared machine
    python benchmarks/verify_cost.py --quick               # k 1,2,4,8, 3 repeats

One line per k: ratios first (g_off, g_on and ``on_vs_off`` = time(on) / time(off) at that k),
context last; then the one-token forward in milliseconds.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
from _bench import Bench, common_flags, parse_args
from transformers import DynamicCache

from draftrl.models import apply_fast_linear, fast_linear, load_model, remove_fast_linear
from draftrl.models.kv import cache_argument

TEXT = (
    "Speculative decoding lets a small draft model propose several tokens that the large target model "
    "then checks in a single forward pass. When the draft agrees with the target, many tokens are "
    "emitted for the price of one target step; when it does not, the round stops at the first "
    "rejection and the target supplies the correction, so the output distribution is unchanged. "
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[common_flags()])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--context", type=int, default=200, help="tokens already in the KV cache")
    parser.add_argument("--ks", default="1,2,3,4,6,8,12,16,24,32", help="comma-separated k values (1 is added)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall", help="cpu: process time, ignores waiting")
    parser.add_argument("--max-rows", type=int, default=fast_linear.MAX_ROWS, help="fast_linear.MAX_ROWS to try")
    parser.add_argument("--seed", type=int, default=0)
    args = parse_args(parser, quick=dict(ks="1,2,4,8", repeats=3))
    bench = Bench(args, __file__)
    fast_linear.MAX_ROWS = args.max_rows
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    ks = sorted({1, *(int(k) for k in args.ks.split(","))})
    loaded = load_model(args.model, kernels="stock")
    model = loaded.model
    ids = loaded.tokenizer(TEXT * (1 + (args.context + max(ks)) // 50), return_tensors="pt")["input_ids"]
    context, new = ids[:, : args.context], ids[:, args.context :]  # [1, context], [1, >= max(ks)]
    assert new.shape[1] >= max(ks)
    cache = DynamicCache(config=model.config)
    # Per repeat and k, one block of four forwards in random order: {off, on} x {1, k} tokens.
    # Ratios are taken inside a block, so load from other processes that drifts over seconds
    # cancels out; g and on_vs_off are medians of these per-block ratios.
    ratios: dict[tuple[str, int], list[float]] = {(name, k): [] for name in ("g_off", "g_on", "on_vs_off") for k in ks}
    one_token: dict[bool, list[float]] = {False: [], True: []}
    rng = random.Random(args.seed)
    with torch.inference_mode():
        model(input_ids=context, **{cache_argument(model): cache})
        for repeat in range(args.repeats + 1):  # repeat 0 is the warm-up
            for k in rng.sample(ks, len(ks)):
                block = sorted({(on, n) for on in (False, True) for n in (1, k)})
                order = rng.sample(block, len(block))
                seconds = {(on, n): _time_forward(model, cache, new[:, :n], on, clock) for on, n in order}
                if not repeat:
                    continue
                ratios[("g_off", k)].append(seconds[(False, k)] / seconds[(False, 1)])
                ratios[("g_on", k)].append(seconds[(True, k)] / seconds[(True, 1)])
                ratios[("on_vs_off", k)].append(seconds[(True, k)] / seconds[(False, k)])
                for on in (False, True):
                    one_token[on].append(seconds[(on, 1)])
    med = {key: statistics.median(values) for key, values in ratios.items()}
    where = dict(context=args.context, model=loaded.name, clock=args.clock, repeats=args.repeats,
                 max_rows=args.max_rows)
    for k in ks:
        bench.row({"g_off": med[("g_off", k)], "g_on": med[("g_on", k)], "on_vs_off": med[("on_vs_off", k)]},
                  k=k, **where)
    ms_off, ms_on = (statistics.median(one_token[on]) * 1e3 for on in (False, True))
    bench.row({}, {"one_token_ms_off": ms_off, "one_token_ms_on": ms_on}, **where)
    bench.save()


def _time_forward(model: torch.nn.Module, cache: DynamicCache, tokens: torch.Tensor, on: bool, clock) -> float:
    """Seconds for one forward of ``tokens`` [1, n] after the cached context; the cache is restored."""
    (apply_fast_linear if on else remove_fast_linear)(model)
    start = clock()
    model(input_ids=tokens, **{cache_argument(model): cache})
    elapsed = clock() - start
    cache.crop(-tokens.shape[1])  # back to the context (transformers 5: crop takes a negative count)
    return elapsed


if __name__ == "__main__":
    main()
