"""``draftrl calibrate``: measure what a round costs on this machine and write a cost table.

Target: one forward over ``V`` tokens (1 = a plain step; a round verifying n draft nodes feeds
n + 1) after a few context lengths, through ``SpeculativeDecoder.verify_forward`` (the engine's
own code path, chain mask). Drafter: its per-round work (``features()``) and one tree level at
each width. Sampler: the acceptance walk and statistics per emitted token. Every cell is
measured ``--repeats`` times in a freshly shuffled order per repeat (interleaved, so a load
spike spreads over all cells), the device is synchronised before each clock reading, and the
table keeps medians. Prints g(V) = cost(V) / cost(1) per context length.

    draftrl calibrate --json --out costs.json
"""

from __future__ import annotations

import argparse
import json
import sys

DEFAULT_NUM_TOKENS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
DEFAULT_CONTEXTS = (128, 512, 1024)
DEFAULT_WIDTHS = (1, 2, 4, 8)


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} must be comma-separated integers, e.g. 1,2,4,8") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r} must hold positive integers")
    return tuple(sorted(set(values)))


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("calibrate", help="measure verify / draft / sample costs and write a cost table")
    p.add_argument("--target", default="smollm2-135m", help="target model: smollm2-135m, a local path or hub id")
    p.add_argument("--drafter", default="ngram", help="ngram[:MIN:MAX] | layerskip:N | none | draft model path")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    p.add_argument("--num-tokens", type=_ints, default=DEFAULT_NUM_TOKENS,
                   help="tokens per target forward to measure (1 = plain step is always added)")
    p.add_argument("--contexts", type=_ints, default=DEFAULT_CONTEXTS, help="context lengths (tokens in the cache)")
    p.add_argument("--widths", type=_ints, default=DEFAULT_WIDTHS, help="draft tree widths")
    p.add_argument("--levels", type=int, default=4, help="draft levels timed per width")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats per cell (median kept)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads: use the count your envs run with (default 1: on a shared CPU one thread "
                        "is far steadier; 0 = torch's default)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling transform timed by the sample cost")
    p.add_argument("--seed", type=int, default=0, help="seed of the measurement order")
    p.add_argument("--json", action="store_true", help="print the cost table as JSON on stdout")
    p.add_argument("--out", default=None, help="write the cost table JSON here")
    p.add_argument("--engine", choices=["hf", "vllm"], default="hf",
                   help="vllm: step seconds of an in-process vLLM engine vs sequences and tokens verified "
                        "(draftrl.decoding.vllm.calibrate; --target, --dtype, --threads apply)")
    p.add_argument("--batch-sizes", type=_ints, default=(1, 2, 4, 8, 16), help="vllm: running sequences")
    p.add_argument("--depths", type=_ints, default=(0, 1, 2, 4, 8), help="vllm: draft tokens per sequence")
    p.add_argument("--steps", type=int, default=8, help="vllm: timed steps per (batch size, depth)")
    p.set_defaults(func=run)


def _token_stream(tokenizer, length: int) -> list[int]:
    """Real text tokens (the shipped prompts, chat-wrapped, back to back), at least ``length`` of them."""
    from draftrl.envs.workload import encode
    from draftrl.prompts import load_prompts

    stream: list[int] = []
    for prompt in load_prompts():
        stream += encode(tokenizer, prompt.prompt, chat_template=getattr(tokenizer, "chat_template", None) is not None)
        if len(stream) >= length:
            break
    while len(stream) < length:
        stream += stream
    return stream[:length]


def _chain(tokens: list[int]):
    from draftrl.decoding.tree import DraftTree

    tree = DraftTree()
    for i, token in enumerate(tokens):
        tree.add(token, i - 1, -float(i))
    return tree


def measure_verify(model, stream: list[int], num_tokens, contexts, repeats: int, rng) -> tuple:
    """(seconds [C, N] medians, relative noise) of one target forward per (context, tokens)."""
    import numpy as np

    from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder

    engines = {}
    for ctx in contexts:  # the cache holds ctx tokens; the root is token ctx
        engine = SpeculativeDecoder(model, None, EngineConfig(max_new_tokens=1))
        engine.start(stream[: ctx + 1])
        engines[ctx] = engine
    trees = {n: _chain(stream[-(n - 1):] if n > 1 else []) for n in num_tokens}
    samples = {(c, n): [] for c in contexts for n in num_tokens}
    cells = list(samples)
    for warm in cells[:: max(1, len(cells) // 4)]:
        engines[warm[0]].verify_forward(trees[warm[1]])
        engines[warm[0]].rewind(len(engines[warm[0]].ids))
    for _ in range(repeats):
        for k in rng.permutation(len(cells)):
            ctx, n = cells[k]
            engine = engines[ctx]
            t0 = engine.clock()
            engine.verify_forward(trees[n])
            samples[ctx, n].append(engine.clock() - t0)
            engine.rewind(len(engine.ids))  # drop the verified entries again
    seconds = np.array([[np.median(samples[c, n]) for n in num_tokens] for c in contexts])
    spread = [np.median(np.abs(np.array(s) - np.median(s))) / np.median(s) for s in samples.values()]
    return seconds, float(np.median(spread))


def synchronised_clock(device: str):
    """perf_counter after synchronising ``device`` (GPU work is counted where it happens)."""
    import time

    import torch

    if not device.startswith("cuda"):
        return time.perf_counter

    def clock() -> float:
        torch.cuda.synchronize(torch.device(device))
        return time.perf_counter()

    return clock


def measure_draft(drafter, ids: list[int], widths, levels: int, repeats: int, rng, clock) -> tuple:
    """(per-round base seconds, per-level seconds [W]) of ``drafter`` after ``ids``."""
    import numpy as np

    from draftrl.decoding.sampling import SamplingParams

    if drafter is None:
        return 0.0, np.zeros(len(widths))
    drafter.reset(ids)
    drafter.features(ids)  # fill a model drafter's cache once (not a per-round cost)
    base, per_level = [], {w: [[] for _ in range(levels)] for w in widths}
    for _ in range(repeats):
        for k in rng.permutation(len(widths)):
            width = widths[k]
            drafter.rewind(len(ids))  # forget the root: features() catches up one token, as after a round
            t0 = clock()
            drafter.features(ids)
            base.append(clock() - t0)
            builder = drafter.begin(ids, width, SamplingParams(), None)
            for level in range(levels):
                t0 = clock()
                builder.step()
                per_level[width][level].append(clock() - t0)
            drafter.commit(ids, [])
    level_seconds = [float(np.mean([np.median(s) for s in per_level[w]])) for w in widths]
    return float(np.median(base)), np.array(level_seconds)


def measure_sample(vocab: int, params, repeats: int, device: str, clock) -> tuple[float, float]:
    """(base, per-token) seconds of ``accept_tree`` on chains whose every node is accepted
    (logits on ``device``, as the engine's are)."""
    import numpy as np
    import torch

    from draftrl.decoding.acceptance import accept_tree
    from draftrl.decoding.sampling import generator_for

    generator = torch.Generator().manual_seed(0)  # makes the logits, on the CPU
    draws = generator_for(device, 0)  # accept_tree draws on the logits' device, as the engine does
    xs, ys = [], []
    for n in (0, 1, 3, 7):
        tokens = list(range(1, n + 1))
        tree = _chain(tokens)
        logits = torch.randn(1 + n, vocab, generator=generator)
        for row, token in enumerate(tokens + [0]):
            logits[row, token] += 50.0  # the next chain token (or the bonus token 0) wins
        logits = logits.to(device)
        accept_tree(tree, logits, params, draws)
        for _ in range(repeats):
            t0 = clock()
            accept_tree(tree, logits, params, draws)
            xs.append(n + 1)
            ys.append(clock() - t0)
    slope, intercept = np.polyfit(np.array(xs, dtype=float), np.array(ys), 1)
    return float(max(intercept, 0.0)), float(max(slope, 0.0))


def calibrate(args: argparse.Namespace, progress=None):
    """Measure and return a :class:`~draftrl.envs.costs.CostTable`."""
    import time

    import numpy as np
    import torch

    from draftrl.decoding.factory import build_drafter
    from draftrl.decoding.sampling import SamplingParams
    from draftrl.envs.costs import CostTable, hardware_info
    from draftrl.envs.engines import shared_model

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.repeats < 1 or args.levels < 1:
        raise ValueError(f"--repeats={args.repeats} and --levels={args.levels} must be >= 1")
    started = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    target = shared_model(args.target, args.dtype, args.device)
    drafter = build_drafter(args.drafter, target, dtype=args.dtype, device=args.device)
    num_tokens = tuple(sorted(set(args.num_tokens) | {1}))
    contexts = tuple(args.contexts)
    stream = _token_stream(target.tokenizer, max(contexts) + max(num_tokens) + 1)
    with torch.inference_mode():
        seconds, noise = measure_verify(target.model, stream, num_tokens, contexts, args.repeats, rng)
        if progress:
            progress(f"verify done in {time.perf_counter() - started:.0f}s")
        mid = contexts[len(contexts) // 2]
        clock = synchronised_clock(args.device)
        base, levels = measure_draft(drafter, stream[:mid], args.widths, args.levels, args.repeats, rng, clock)
        sample_base, sample_token = measure_sample(
            target.model.config.vocab_size, SamplingParams(temperature=args.temperature), max(3, args.repeats),
            args.device, clock,
        )
    meta = {
        "hardware": hardware_info(args.device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "target": args.target,
        "drafter": args.drafter,
        "device": args.device,
        "dtype": args.dtype,
        "repeats": args.repeats,
        "calibrate_seconds": round(time.perf_counter() - started, 1),
    }
    return CostTable(
        num_tokens=num_tokens,
        context_lens=contexts,
        verify_seconds=seconds,
        draft_widths=args.widths,
        draft_level_seconds=levels,
        draft_base_seconds=base,
        sample_base_seconds=sample_base,
        sample_token_seconds=sample_token,
        noise=noise,
        meta=meta,
    )


def g_lines(table) -> list[str]:
    """One printed line per context length: g(V) = cost(V) / cost(1)."""
    from draftrl.envs.costs import hardware_name

    hw = f"{hardware_name(table.meta.get('hardware', {}))}  threads={table.meta.get('threads')}"
    lines = []
    for c, row in zip(table.context_lens, table.verify_seconds):
        cells = "  ".join(f"g({int(n)})={s / row[0]:.2f}" for n, s in zip(table.num_tokens, row))
        lines.append(f"{cells}  context={int(c)}  step_ms={row[0] * 1e3:.1f}  hardware={hw}")
    widths = "  ".join(
        f"c(W={int(w)})={s / table.verify_seconds[0][0]:.3f}" for w, s in zip(table.draft_widths, table.draft_level_seconds)
    )
    lines.append(f"{widths}  draft_base={table.draft_base_seconds / table.verify_seconds[0][0]:.3f}  "
                 f"(draft seconds per level / plain step)  noise={table.noise:.3f}  hardware={hw}")
    return lines


def run_vllm(args: argparse.Namespace) -> int:
    from draftrl.decoding.vllm.calibrate import calibrate as calibrate_vllm
    from draftrl.decoding.vllm.engine import VLLMEngineConfig, shared_engine
    from draftrl.io import write_json

    engine = shared_engine(VLLMEngineConfig(model=args.target, method="draftrl", num_speculative_tokens=max(args.depths),
                                            dtype=args.dtype, max_num_seqs=max(args.batch_sizes), threads=args.threads))
    result = calibrate_vllm(engine, batch_sizes=args.batch_sizes, depths=args.depths, steps=args.steps,
                            progress=lambda msg: print(f"[calibrate] {msg}", file=sys.stderr))
    if args.out:
        write_json(args.out, result)
    f = result["fit"]
    print(f"step_seconds = {f['base'] * 1e3:.2f} ms + {f['per_seq'] * 1e3:.2f} ms x seqs + "
          f"{f['per_token'] * 1e3:.3f} ms x tokens_verified  (residual sd {f['residual_std'] * 1e3:.2f} ms)")
    if args.json:
        print(json.dumps(result))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.engine == "vllm":
        return run_vllm(args)
    table = calibrate(args, progress=lambda msg: print(f"[calibrate] {msg}", file=sys.stderr))
    if args.out:
        table.save(args.out)
    out = sys.stderr if args.json else sys.stdout
    for line in g_lines(table):
        print(line, file=out)
    if args.json:
        data = table.to_dict()
        data["g"] = {str(int(c)): (row / row[0]).round(4).tolist() for c, row in zip(table.context_lens, table.verify_seconds)}
        print(json.dumps(data))
    return 0
