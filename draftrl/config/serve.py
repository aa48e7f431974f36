"""Settings of the serving environment ``draftrl/ServeVLLM-v1`` (and of ``draftrl eval --engine vllm``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from draftrl.config.env import REWARD_MODES
from draftrl.config.workload import WorkloadConfig

ARRIVALS = ("fixed", "poisson", "burst")
#: The drafter of draftrl's vLLM proposer unless ``env.drafter`` (or a proposer config) names
#: another: suffix n-grams of 3..1 tokens, the chain continuing the LATEST earlier occurrence (fewer
#: steps and fewer wasted drafts than the earliest, which vLLM's ``ngram`` takes). Matches of 4
#: tokens would save another 0.3% of the steps but shift the match-length features trained
#: policies read.
SERVING_DRAFTER = "ngram:1:3:latest"
#: Drafter kinds that run inside vLLM's proposer: lookup on token ids, or an EAGLE-3 head the
#: proposer runs itself (``draftrl.decoding.vllm.head_proposer``).
SERVING_DRAFTER_KINDS = ("ngram", "eagle3", "sam")


@dataclass
class ServeConfig(WorkloadConfig):
    """Workload (:class:`WorkloadConfig`: the same keys and defaults as ``EnvConfig``'s), arrivals,
    engine, action grid and reward of one serving episode."""

    # ---- workload: WorkloadConfig's fields (prompts, split, target, max_new_tokens, temperature, ...), and
    limit_per_group: int | None = 1
    """prompts per (language, task) group; 1 = the 16-request mixed workload (an episode serves them all)"""
    num_requests: int | None = None
    """requests per episode, drawn from the selection; None = every selected prompt once"""
    # ---- arrivals
    arrival: str = "fixed"
    """fixed: keep `concurrency` requests in flight; poisson: `rate` requests/s; burst: `burst_size` every
    `burst_interval` s"""
    concurrency: int = 4
    rate: float = 4.0
    """poisson arrivals per second of engine time"""
    burst_size: int = 8
    burst_interval: float = 2.0
    """seconds of engine time between bursts"""
    # ---- engine
    max_num_seqs: int = 16
    """the engine's most concurrent sequences (more requests wait in its queue)"""
    max_model_len: int = 1024
    kv_cache_gib: int = 1
    """VLLM_CPU_KVCACHE_SPACE in GiB"""
    threads: int = 1
    gpu_memory_utilization: float | None = None
    """the share of the GPU's memory each engine takes (vLLM's ``gpu_memory_utilization``); null: vLLM's
    0.9. With ``max_engines`` engines held at once, keep their sum below 1"""
    enforce_eager: bool | None = None
    """null: CUDA graphs on a GPU (what production vLLM runs), eager on CPU; true: eager everywhere.
    An EAGLE-3 head in draftrl's proposer (drafter eagle3 or sam:N) always runs eager"""
    tensor_parallel_size: int = 1
    """GPUs each engine splits the target over (vLLM's tensor parallelism): recordings, plain and vLLM's own
    speculation (ngram, eagle3) and custom_class policies; draftrl's stepped proposer needs 1
    (``draftrl.decoding.vllm.engine.check_parallelism``)"""
    draft_tensor_parallel_size: int | None = None
    """a stock eagle3 head's tensor parallelism: 1 or tensor_parallel_size; null: the target's"""
    pipeline_parallel_size: int = 1
    """vLLM's pipeline parallelism: recordings only (no speculation); vLLM composes speculation with
    tensor parallelism alone"""
    max_engines: int = 1
    """vLLM engines a comparison holds at once (each speculative config is its own engine; each holds
    its weights and KV cache): 1 builds one, runs its policies, frees it, builds the next"""
    drafter: str = SERVING_DRAFTER
    """what draftrl's proposer drafts with (a drafter spec, ``--drafter``): ngram[:MIN:MAX[:earliest|latest]],
    eagle3[:DIR] or sam:N[:DIR] (DIR an EAGLE-3 head folder or hub id; none: the head draftrl ships for the
    target), which vllm-eagle3:K also loads; a policy's own ``@DRAFTER`` wins"""
    rule: str = "match"
    """each request's own depth before the cap and budget, the built-in rule draftrl's proposer asks
    (``draftrl.decoding.vllm.control.rule_controller``): match | heuristic;
    confidence:T | cumulative:T where the proposer runs a head (its per-level stop), any of those
    but heuristic with ``|batch:B`` (the head drafts only in steps of at most B requests);
    hindsight in ServeReplay-v1 only (drafts only what will be accepted: a ceiling, not a policy).
    ``draftrl eval`` sets it from each policy's name (heuristic, stop:K:tT, stop:K:cT, ...:bB)"""
    # ---- action grid
    depths: tuple[int, ...] = (0, 1, 2, 3, 4, 6, 8)
    """depth caps; 0 = no speculation"""
    budgets: tuple[int, ...] = (0, 2, 4, 8, 16, 32, 64, 128)
    """draft tokens the batch may verify per step; 0 = no speculation; >= depth x running = no limit"""
    # ---- observation and reward
    ema_decay: float = 0.8
    reward: str = "ratio"
    rho: float = 0.0
    rho_rate: float = 0.1

    def __post_init__(self) -> None:
        super().__post_init__()
        self.depths = tuple(int(d) for d in self.depths)
        self.budgets = tuple(int(b) for b in self.budgets)
        if self.drafter.partition(":")[0] not in SERVING_DRAFTER_KINDS:
            raise ValueError(f"{self.section}.drafter={self.drafter!r} cannot run inside vLLM's proposer; use "
                             "ngram[:MIN:MAX[:earliest|latest]], eagle3[:DIR] or sam:N[:DIR] (none: the policy none).")
        if self.arrival not in ARRIVALS:
            raise ValueError(f"{self.section}.arrival={self.arrival!r} is unknown; use one of {', '.join(ARRIVALS)}.")
        for name in ("concurrency", "max_num_seqs", "burst_size", "max_engines"):
            if getattr(self, name) < 1:
                raise ValueError(f"{self.section}.{name}={getattr(self, name)} must be >= 1.")
        if self.rate <= 0 or self.burst_interval <= 0:
            raise ValueError(f"{self.section}.rate={self.rate} and burst_interval={self.burst_interval} must be > 0.")
        for name in ("depths", "budgets"):
            values = getattr(self, name)
            if not values or min(values) < 0 or len(set(values)) != len(values):
                raise ValueError(f"{self.section}.{name}={list(values)} must be distinct integers >= 0.")
        if 0 not in self.depths:
            raise ValueError(f"{self.section}.depths={list(self.depths)} must contain 0 "
                             "(no speculation is always an action).")
        if 0 not in self.budgets:
            raise ValueError(f"{self.section}.budgets={list(self.budgets)} must contain 0 "
                             "(no speculation is always an action).")
        if self.reward not in REWARD_MODES:
            raise ValueError(f"{self.section}.reward={self.reward!r} is unknown; use one of {', '.join(REWARD_MODES)}.")
        memory = self.gpu_memory_utilization
        if memory is not None and not 0.0 < memory <= 1.0:
            raise ValueError(f"{self.section}.gpu_memory_utilization={memory} must be in (0, 1] "
                             "(the share of the GPU's "
                             "memory one engine takes; null = vLLM's 0.9).")
        if memory is not None and memory * self.max_engines > 1.0:
            raise ValueError(f"{self.section}.gpu_memory_utilization={memory} x max_engines={self.max_engines} exceeds "
                             f"the whole GPU; lower gpu_memory_utilization to {1.0 / self.max_engines:.2f} or less, or "
                             "set max_engines=1 (one engine at a time).")
        if self.num_requests is not None and self.num_requests < 1:
            raise ValueError(f"{self.section}.num_requests={self.num_requests} must be >= 1 or null.")

    @property
    def max_depth(self) -> int:
        return max(self.depths)

    @classmethod
    def moved_key(cls, data: dict[str, Any], key: str, prefix: str) -> str | None:
        """Where a key of an earlier release went, for the error (``draftrl.config.from_dict``)."""
        if key != "head":
            return None
        return (f"{prefix}head is gone: the head is part of the drafter spec; set {prefix}drafter: eagle3:DIR (every "
                "policy on draftrl's proposer, and vllm-eagle3:K, draft with it) or name it per policy "
                "(vllm-eagle3:K@eagle3:DIR, fixed:K@eagle3:DIR)")


#: Top-level keys the serving commands read besides the ``env`` section (the ServeConfig field of each).
TOP_LEVEL_KEYS = ("threads", "seed")


def load_serve_config(path: str | None = None, overrides: list[str] | None = None, **defaults: Any) -> ServeConfig:
    """The ``ServeConfig`` of ``draftrl eval --engine vllm`` and ``draftrl collect --engine vllm``.

    ``defaults`` (ServeConfig fields, the command's), then the YAML file at ``path`` (its ``env``
    section, and top-level ``threads`` and ``seed``; other sections belong to other commands), then
    ``--set`` items: ``env.KEY=VALUE`` (the same keys as on ``--engine hf``, e.g.
    ``env.temperature=1``, ``env.target=...``), ``threads=N``, ``seed=N``.
    """
    import yaml

    from draftrl.config import from_dict, read_env_file

    data: dict[str, Any] = dict(defaults)
    if path is not None:
        loaded = read_env_file(path)
        data.update(loaded.get("env") or {})
        data.update({key: loaded[key] for key in TOP_LEVEL_KEYS if key in loaded})
    for item in overrides or []:
        key, sep, raw = (part.strip() for part in item.partition("="))
        if sep and key.startswith("env.") and key.count(".") == 1:
            data[key[len("env."):]] = yaml.safe_load(raw)
        elif sep and key in TOP_LEVEL_KEYS:
            data[key] = yaml.safe_load(raw)
        else:
            raise ValueError(f"--set {item!r} is not a serving key; use env.KEY=VALUE (ServeConfig fields, e.g. "
                             "env.max_new_tokens=48), threads=N or seed=N.")
    return from_dict(ServeConfig, data, prefix="env.")
