"""Kernels chosen by measurement: which linear-layer layout a model's 1..k-token forwards use here.

Why: the hot path of speculative decoding on CPU is a forward over a few new tokens (one for a
plain step, d + 1 to verify a depth-d chain). Which BLAS kernel is fastest for such a product
depends on the CPU and its BLAS: on a 2-core AMD EPYC (Zen 4) the transposed layout of
:mod:`draftrl.models.fast_linear` made a 1-token SmolLM2-135M forward 1.4x faster, on a 2-core
Intel Xeon with AMX it made it 2.1x slower. So nothing is hard-coded: at load a short probe
times a real forward of ``k`` tokens after a ``PROBE_CONTEXT``-token KV cache for every
``k`` in ``PROBE_ROWS`` with each candidate layout (interleaved, shuffled per repeat, medians),
and each row count gets the layout that measured fastest (``fast_linear`` only when it beats
stock ``nn.Linear`` by more than ``MARGIN``: a tie keeps the stock kernel). Row counts beyond
the probe use stock ``nn.Linear``.

The result is cached per machine / model / dtype / torch threads in
``<cache>/kernels/`` (``DRAFTRL_CACHE``), so only the first load on a machine pays the probe
(a few seconds). Candidates are float32-exact layouts of the same product (summation order
differs, so logits agree to float rounding; ``tests/models/test_kernels.py``).

Overrides, strongest first: the ``kernels`` argument of :func:`~draftrl.models.load_model` (the
``model.kernels`` config key / ``--kernels`` flag), then the ``DRAFTRL_KERNELS`` environment
variable, then ``auto``:

- ``auto``: probe (or reuse the cached probe) and apply its choice;
- ``stock``: plain ``nn.Linear`` everywhere (what ``transformers`` does);
- ``fast_linear``: the transposed layout for 1..``fast_linear.MAX_ROWS`` rows, as measured on
  one AMD EPYC (the layout draftrl used to hard-code).

bfloat16 is not a candidate: it changes the model's numbers (not only the summation order), so
it is the user's choice of ``dtype``, never the probe's. Loading with ``dtype="bfloat16"`` runs
the same probe in bfloat16; :func:`cpu_has_bf16` says whether this CPU has native bfloat16
instructions (AVX512-BF16 or AMX), recorded in every plan.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import random
import re
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from draftrl.config import KERNELS  # the accepted values of ``kernels`` (defined with the config vocabularies)
from draftrl.models.fast_linear import MAX_ROWS, MIN_ROWS, apply_fast_linear, fast_rows, remove_fast_linear
from draftrl.models.registry import cache_root

#: Environment variable read when no ``kernels`` value is given.
KERNELS_ENV = "DRAFTRL_KERNELS"
#: Row counts (tokens x batch) the probe times: a plain step and verification of up to 7 drafts.
PROBE_ROWS: tuple[int, ...] = tuple(range(1, 9))
#: Tokens in the KV cache during the probe (a short chat prompt plus some output).
PROBE_CONTEXT = 200
#: Interleaved passes over every row count, both layouts back to back; medians are kept. 8 row
#: counts x 2 layouts x 5 passes = 80 forwards: 10 s for SmolLM2-135M on one Zen 4 core at load
#: 1.6. Three passes were too few: a plan probed while another process loaded models on the other core
#: timed the padded 1-row layout at 1.33x stock, where 15 paired blocks (benchmarks/verify_cost.py)
#: and three later probes measured 0.74-0.93x; decoding ran on the slower kernel from then on.
PROBE_REPEATS = 5
#: Fewer passes (at least one) when they would take longer than this: a loaded machine shortens the probe.
PROBE_BUDGET_SECONDS = 15.0
#: ``fast_linear`` must be this much faster than stock (relative) to be chosen.
MARGIN = 0.03
#: Above this 1-minute load average per CPU the machine is too busy to measure wall time: a
#: multi-thread probe is skipped, stock kernels are used and nothing is cached (the next load
#: measures again). Seen on a 2-core box at load 9: one 2-thread forward took 1-50 s instead of
#: 45 ms. A one-thread probe reads CPU time (:func:`probe_clock`) and runs at any load.
BUSY_LOAD_PER_CPU = 2.0
#: Bumped when the probe's method changes, so older cached plans are ignored (2: CPU-time clock
#: with one torch thread; 3: the two layouts of a row count timed back to back, 5 passes).
PROBE_VERSION = 3
#: CPU flags that decide which kernels are fast (part of the cache key).
_CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")
_PLAN_ATTR = "_draftrl_kernel_plan"
#: Recorded with a probed plan's key but not part of it: how long the probe took and the load.
_CONDITIONS = ("probe_seconds", "load_average")


@dataclass
class KernelPlan:
    """Which layout ``model``'s few-token forwards use, and why."""

    kernels: str
    """what was asked: auto, stock or fast_linear"""
    fast_rows: tuple[int, ...]
    """row counts computed in the transposed (fast_linear) layout; all others use nn.Linear"""
    source: str
    """probe (measured now), cache (measured earlier on this machine), forced, device (not a
    CPU), or busy (load too high for a several-thread, wall-clock probe: stock kernels, nothing cached)"""
    key: dict = field(default_factory=dict)
    """machine / model / dtype / threads the plan holds for (a probed plan adds probe_seconds, load_average)"""
    seconds: dict[str, dict[str, float]] = field(default_factory=dict)
    """probe medians: layout -> rows -> seconds per forward (empty unless probed)"""
    path: str | None = None
    """the cache file"""

    @property
    def layout(self) -> str:
        """One word for tables: stock, fast_linear, or mixed (fast_linear for some row counts)."""
        if not self.fast_rows:
            return "stock"
        full = tuple(range(MIN_ROWS, MAX_ROWS + 1))
        return "fast_linear" if self.fast_rows == full else f"fast_linear@{','.join(map(str, self.fast_rows))}"

    def to_dict(self) -> dict:
        out = asdict(self)
        out["layout"] = self.layout
        return out


def resolve_kernels(kernels: str | None) -> str:
    """``kernels`` if given, else ``$DRAFTRL_KERNELS``, else ``auto``; refuses unknown values."""
    value = kernels if kernels is not None else (os.environ.get(KERNELS_ENV) or "auto")
    if value not in KERNELS:
        where = "kernels" if kernels is not None else KERNELS_ENV
        raise ValueError(f"{where}={value!r} is not a kernel choice; use one of {', '.join(KERNELS)}")
    return value


def cpu_flags() -> set[str]:
    """The CPU's feature flags from ``/proc/cpuinfo`` (empty where it cannot be read)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_has_bf16() -> bool:
    """Whether the CPU has native bfloat16 arithmetic (AVX512-BF16 or AMX-BF16)."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def _cpu_name() -> str:
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def plan_key(model: nn.Module, name: str, threads: int | None = None) -> dict:
    """What a probe's result depends on: CPU model and flags, torch, model shape, dtype, threads."""
    config = getattr(model, "config", None)
    shape = {k: getattr(config, k, None) for k in ("model_type", "hidden_size", "intermediate_size",
                                                   "num_hidden_layers", "num_attention_heads",
                                                   "num_key_value_heads", "vocab_size")}
    return {
        "cpu": _cpu_name(),
        "cpu_flags": sorted(set(_CPU_FLAGS) & cpu_flags()),
        "torch": torch.__version__,
        "model": name,
        "model_shape": shape,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "threads": int(threads if threads is not None else torch.get_num_threads()),
        "probe_version": PROBE_VERSION,
    }


def plan_path(key: dict) -> Path:
    """``<cache>/kernels/<model>-<dtype>-t<threads>-<hash of the whole key>.json``."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", key["model"]).strip("_")[-60:] or "model"
    return cache_root() / "kernels" / f"{slug}-{key['dtype']}-t{key['threads']}-{digest}.json"


@torch.inference_mode()
def probe(model: nn.Module, rows: tuple[int, ...] = PROBE_ROWS, *, context: int = PROBE_CONTEXT,
          repeats: int = PROBE_REPEATS, budget_seconds: float = PROBE_BUDGET_SECONDS,
          seed: int = 0) -> dict[str, dict[int, float]]:
    """Median seconds of one ``k``-token forward after ``context`` cached tokens, per layout and ``k``.

    Layouts are switched on the same model object (class swap, no copy). Every pass visits the
    row counts in a shuffled order and times both layouts of a row count back to back (in a
    random order), so a burst of load or memory traffic from another process hits the two
    layouts being compared alike; the clock is :func:`probe_clock`'s. After
    one untimed forward per layout, passes run until ``repeats`` are done or the next pass would
    end past ``budget_seconds`` (at least one pass always runs: on a heavily loaded machine the
    probe is shorter, not longer). Leaves the model in the stock layout.
    """
    from transformers import DynamicCache

    vocab = int(getattr(model.config, "vocab_size", 1000))
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    ids = torch.randint(0, vocab, (1, context + max(rows)), generator=gen).to(device)
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    cache = DynamicCache()
    remove_fast_linear(model)
    model(input_ids=ids[:, :context], **{cache_arg: cache}, use_cache=True)
    layouts = {"stock": (), "fast_linear": rows}
    order = list(rows)
    times: dict[tuple[str, int], list[float]] = {(layout, k): [] for layout in layouts for k in rows}
    rng = random.Random(seed)

    clock = probe_clock(device, torch.get_num_threads())

    def forward(layout: str, k: int) -> float:
        remove_fast_linear(model)
        apply_fast_linear(model, layouts[layout])
        positions = torch.arange(context, context + k, device=device)[None]
        t0 = clock()
        model(input_ids=ids[:, context:context + k], position_ids=positions, **{cache_arg: cache}, use_cache=True)
        seconds = clock() - t0
        cache.crop(-k)
        return seconds

    for layout in layouts:  # untimed: lazy initialisation, allocator, kernel selection
        forward(layout, max(rows))
    started = time.perf_counter()
    for done in range(repeats):
        if done and (time.perf_counter() - started) * (done + 1) / done > budget_seconds:
            break
        rng.shuffle(order)
        for k in order:
            for layout in rng.sample(list(layouts), len(layouts)):
                times[layout, k].append(forward(layout, k))
    remove_fast_linear(model)
    return {layout: {k: statistics.median(times[layout, k]) for k in rows} for layout in layouts}


def probe_clock(device: torch.device, threads: int) -> Callable[[], float]:
    """The probe's clock: the calling thread's CPU time when torch computes on this one CPU thread,
    else wall time.

    Why: the probe compares kernels, not machines. With one torch thread every operation runs
    on the calling thread, so its CPU time is the kernel's cost whether or not other processes
    share the core; wall time on a shared 2-core box also counts their time slices. Measured at
    load 3.5: the 1-token stock forward read 291 and 246 ms on the wall clock in two probes,
    136 and 130 ms in thread CPU time, and the wall-clock probes chose different layouts.
    With several threads the work is spread over a pool that one thread's clock cannot see.
    """
    if device.type == "cpu" and threads == 1:
        return time.thread_time
    return time.perf_counter


def choose_fast_rows(seconds: dict[str, dict[int, float]], margin: float = MARGIN) -> tuple[int, ...]:
    """Row counts where ``fast_linear`` beat ``stock`` by more than ``margin`` (relative)."""
    return tuple(sorted(k for k, fast in seconds["fast_linear"].items()
                        if fast < (1.0 - margin) * seconds["stock"][k]))


def apply_kernels(model: nn.Module, name: str, kernels: str | None = None, *, use_cache: bool = True,
                  probe_rows: tuple[int, ...] = PROBE_ROWS, probe_repeats: int = PROBE_REPEATS) -> KernelPlan:
    """Choose and apply ``model``'s few-token layout (see the module docstring); returns the plan,
    which is also kept on the model (:func:`kernel_plan`).

    :param name: the model's name or path (part of the cache key).
    :param kernels: ``auto``, ``stock`` or ``fast_linear``; None reads ``$DRAFTRL_KERNELS`` (default auto).
    :param use_cache: reuse / write the cached probe result; False always probes and writes nothing.
    :raises ValueError: an unknown ``kernels`` value.
    """
    choice = resolve_kernels(kernels)
    device = next(model.parameters()).device
    remove_fast_linear(model)
    if device.type != "cpu":
        plan = KernelPlan(choice, (), "device")
    elif choice == "stock":
        plan = KernelPlan(choice, (), "forced")
    elif choice == "fast_linear":
        plan = KernelPlan(choice, tuple(range(MIN_ROWS, MAX_ROWS + 1)), "forced")
    else:
        key = plan_key(model, name)
        path = plan_path(key)
        plan = _read_plan(path, key) if use_cache else None
        load = _load_average()
        busy = load is not None and load > BUSY_LOAD_PER_CPU * (os.cpu_count() or 1)
        if plan is None and busy and probe_clock(device, key["threads"]) is time.perf_counter:
            plan = KernelPlan(choice, (), "busy", dict(key, load_average=load))
        elif plan is None:
            started = time.perf_counter()
            seconds = probe(model, probe_rows, repeats=probe_repeats)
            key_and_conditions = dict(key, probe_seconds=round(time.perf_counter() - started, 2), load_average=load)
            plan = KernelPlan(choice, choose_fast_rows(seconds), "probe", key_and_conditions,
                              {layout: {str(k): v for k, v in per.items()} for layout, per in seconds.items()},
                              str(path) if use_cache else None)
            if use_cache:
                from draftrl.io import write_json

                write_json(path, plan.to_dict())
                remove_superseded_plans(key)
    apply_fast_linear(model, plan.fast_rows)
    setattr(model, _PLAN_ATTR, plan)
    return plan


def remove_superseded_plans(key: dict) -> list[Path]:
    """Delete cached plans that differ from ``key`` only by an older ``probe_version``.

    Why: no version of this code reads them again (a plan is reused only for its exact key), so
    each probe change would otherwise leave one dead file per model, dtype and thread count.
    Plans for another CPU, torch build or model stay: another environment may still use them.
    :return: the deleted paths.
    """
    folder = plan_path(key).parent
    same = {k: v for k, v in key.items() if k != "probe_version"}
    removed = []
    for path in folder.glob("*.json"):
        try:
            stored = json.loads(path.read_text()).get("key")
        except (OSError, ValueError, AttributeError):
            continue
        if not isinstance(stored, dict) or not isinstance(stored.get("probe_version"), int):
            continue
        rest = {k: v for k, v in stored.items() if k not in _CONDITIONS and k != "probe_version"}
        if rest == same and stored["probe_version"] < key["probe_version"]:
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def _read_plan(path: Path, key: dict) -> KernelPlan | None:
    """The cached plan at ``path`` if it is readable and was made for exactly ``key``."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    stored = data.get("key") if isinstance(data, dict) else None
    if not isinstance(stored, dict) or {k: v for k, v in stored.items() if k not in _CONDITIONS} != key:
        return None
    return KernelPlan("auto", tuple(int(r) for r in data.get("fast_rows", ())), "cache", stored,
                      data.get("seconds", {}), str(path))


def _load_average() -> float | None:
    """The 1-minute load average when the probe ran (a loaded machine makes a noisier choice)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def kernel_plan(model: nn.Module) -> KernelPlan | None:
    """The plan :func:`apply_kernels` applied to ``model`` (None if it never ran on it)."""
    return getattr(model, _PLAN_ATTR, None)


@contextmanager
def stock_kernels(model: nn.Module) -> Iterator[None]:
    """Run ``model`` with stock ``nn.Linear`` inside the block (what a plain ``transformers`` user
    has), then restore its layout: the anchors of every speed table are timed this way."""
    rows = fast_rows(model)
    remove_fast_linear(model)
    try:
        yield
    finally:
        apply_fast_linear(model, rows)
