"""Shared plumbing for the decoding benchmarks: prompts, an interleaved timer, and the context line.

Every comparison on a shared, noisy CPU must be *interleaved*: for each repeat and each prompt,
all methods run back to back in a fresh random order, so a burst of load from another process
hits every method alike. A method's time on a prompt is the median over repeats; its throughput
is sum(tokens) / sum(median seconds) over prompts, and ratios between methods are taken on those.

Each run also records the calling thread's CPU time. With one torch thread on a CPU every
operation runs on that thread, so CPU-time ratios (``clock="cpu"``) are what other processes on a
shared box cannot skew (their time slices stop this thread's CPU clock, not the wall clock);
wall time stays the measure that counts (DESIGN.md), the CPU ratio says how much of a wall-clock
difference is load.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from draftrl.decoding.clock import device_clock
from draftrl.envs.workload import encode
from draftrl.prompts import load_prompts
from draftrl.signals.costs import hardware_info, hardware_name


@dataclass
class Request:
    id: str
    language: str
    task: str
    ids: list[int]
    """prompt token ids, chat template applied"""
    max_new_tokens: int


@dataclass
class Run:
    """One timed request of one method."""

    tokens: list[int]
    seconds: float
    rounds: int
    """what the script counts per request: speculative rounds, or target forwards (prefill included)"""
    cpu_seconds: float = 0.0
    """the calling thread's CPU time (meaningful with one torch thread on a CPU)"""


@dataclass
class Timings:
    runs: dict[tuple[str, int], list[Run]] = field(default_factory=dict)

    def median_seconds(self, method: str, item: int, clock: str = "wall") -> float:
        """Median over repeats of the wall seconds, or of the thread's CPU seconds (``clock="cpu"``)."""
        return statistics.median(r.cpu_seconds if clock == "cpu" else r.seconds for r in self.runs[(method, item)])

    def tokens(self, method: str, item: int) -> list[int]:
        return self.runs[(method, item)][0].tokens

    def throughput(self, method: str, items: list[int], clock: str = "wall") -> float:
        """tokens / second over ``items``: total tokens over the sum of per-request median times."""
        num = sum(len(self.tokens(method, i)) for i in items)
        return num / sum(self.median_seconds(method, i, clock) for i in items)

    def tokens_per_round(self, method: str, items: list[int]) -> float:
        num = sum(len(self.tokens(method, i)) for i in items)
        return num / max(1, sum(self.runs[(method, i)][0].rounds for i in items))


def requests(tokenizer, languages, tasks, num_prompts: int, max_new_tokens: int | None, split: str = "heldout"):
    """``num_prompts`` prompts per (language, task), chat template applied, with their budgets."""
    out = []
    for p in load_prompts(languages=languages, tasks=tasks, split=split, limit_per_group=num_prompts):
        ids = encode(tokenizer, p.prompt, chat_template=bool(getattr(tokenizer, "chat_template", None)))
        out.append(Request(p.id, p.language, p.task, ids, max_new_tokens or p.max_new_tokens))
    return out


def add_grid_args(parser: argparse.ArgumentParser, max_new_tokens: int) -> None:
    """The options the drafter-grid benchmarks share (``depth_by_language``, ``tree_grid``)."""
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--languages", default="en,it,zh,es")
    parser.add_argument("--task", default="chat", choices=["chat", "summarize"], help="natural-language task")
    parser.add_argument("--drafters", default="ngram,layerskip:28")
    parser.add_argument("--depths", default="1,2,4,8")
    parser.add_argument("--num-prompts", type=int, default=1, help="per group")
    parser.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default; 1 on a loaded CPU)")


def load_grid(args: argparse.Namespace, code: bool = True):
    """For :func:`add_grid_args`' options: set the threads, load the model; returns
    ``(loaded, eos ids, requests, groups)`` (see :func:`grouped_requests`)."""
    from draftrl.models import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model(args.model, device=args.device)
    reqs, groups = grouped_requests(loaded.tokenizer, args.languages.split(","), args.task, args.num_prompts,
                                    args.max_new_tokens, code=code)
    return loaded, loaded.eos_token_ids, reqs, groups


def grouped_requests(tokenizer, languages: list[str], task: str, num_prompts: int, max_new_tokens: int | None,
                     code: bool = True) -> tuple[list[Request], dict[str, list[int]]]:
    """``task`` prompts per language plus a ``code`` group (English code_edit: Python snippets);
    returns the requests and group name -> request indices, with ``all`` last."""
    reqs = requests(tokenizer, languages, task, num_prompts, max_new_tokens)
    groups = {lang: [i for i, r in enumerate(reqs) if r.language == lang] for lang in languages}
    if code:
        extra = requests(tokenizer, "en", "code_edit", num_prompts, max_new_tokens)
        groups["code"] = list(range(len(reqs), len(reqs) + len(extra)))
        reqs += extra
    groups["all"] = list(range(len(reqs)))
    return reqs, groups




def interleave(
    methods: dict[str, Callable[[Request], tuple[list[int], int]]],
    reqs: list[Request],
    repeats: int,
    device: str = "cpu",
    seed: int = 0,
    progress: bool = True,
) -> Timings:
    """Run every method on every request ``repeats`` times, round-robin in a random order per
    (repeat, request), after one untimed warm-up pass over the first request.

    A method maps a request to (generated tokens, rounds or forwards, as the script counts)."""
    rng = random.Random(seed)
    names = list(methods)
    warm = replace(reqs[0], max_new_tokens=min(8, reqs[0].max_new_tokens))
    for name in names:  # warm-up, a short request each: allocator, kernels, lazy imports
        methods[name](warm)
    timings = Timings({(name, i): [] for name in names for i in range(len(reqs))})
    for repeat in range(repeats):
        for i, req in enumerate(reqs):
            order = names[:]
            rng.shuffle(order)
            for name in order:
                start, cpu_start = device_clock(device), time.thread_time()
                tokens, rounds = methods[name](req)
                seconds, cpu_seconds = device_clock(device) - start, time.thread_time() - cpu_start
                timings.runs[(name, i)].append(Run(list(tokens), seconds, rounds, cpu_seconds))
        if progress:
            print(f"# repeat {repeat + 1}/{repeats} done", flush=True)
    return timings


def engine_method(model, drafter, eos: list[int], depth: int, verify_size: int | None = None, width: int = 1):
    """A method for :func:`interleave`: draftrl's engine with a fixed (depth, verify_size, width)
    schedule; returns (tokens, speculative rounds). ``drafter=None`` with depth 0 is plain decoding."""
    from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
    from draftrl.decoding.generate import fixed_schedule, generate

    config = EngineConfig(max_depth=max(depth, 1), max_width=max(width, 1), max_verify_size=max(verify_size or 1, 1))
    engine = SpeculativeDecoder(model, drafter, config, eos)

    def run(req: Request) -> tuple[list[int], int]:
        engine.config.max_new_tokens = req.max_new_tokens
        result = generate(engine, req.ids, fixed_schedule(depth, verify_size, width))
        return result.token_ids, result.num_rounds

    return run


def first_mismatch(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (length difference counts), or None if equal."""
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return k
    return None if len(a) == len(b) else min(len(a), len(b))


def context(device: str, model: str) -> str:
    """The trailing context of every printed line: model, hardware, threads."""
    info = hardware_info(device)
    return f"model={model}  device={device}  cpu={hardware_name(info)}  threads={info['threads']}  torch={info['torch']}"


__all__ = ["Request", "engine_method", "Run", "Timings", "context", "first_mismatch", "add_grid_args", "grouped_requests", "interleave", "load_grid",
           "requests"]
