"""Settings of the serving environment ``draftrl/ServeVLLM-v0`` (and of ``draftrl eval --engine vllm``)."""

from __future__ import annotations

from dataclasses import dataclass

from draftrl.config.env import REWARD_MODES, EnvConfig

ARRIVALS = ("fixed", "poisson", "burst")


@dataclass
class ServeConfig:
    """Workload, arrivals, engine, action grid and reward of one serving episode."""

    # ---- workload (the prompt filters of EnvConfig)
    prompts: str | None = None
    """JSONL prompt file; None = the shipped set"""
    languages: tuple[str, ...] | None = None
    tasks: tuple[str, ...] | None = None
    split: str | None = "tune"
    limit_per_group: int | None = 1
    """prompts per (language, task) group; 1 = the 16-request mixed workload"""
    num_requests: int | None = None
    """requests per episode, drawn from the selection; None = every selected prompt once"""
    shuffle: bool = True
    """seeded random request order per episode; False = file order"""
    chat_template: bool = True
    max_new_tokens: int | None = None
    """tokens per request; None = the prompt's suggestion capped at max_new_tokens_cap"""
    max_new_tokens_cap: int = 96
    # ---- arrivals
    arrival: str = "fixed"
    """fixed: keep `concurrency` requests in flight; poisson: `rate` requests/s; burst: `burst_size` every `burst_interval` s"""
    concurrency: int = 4
    rate: float = 4.0
    """poisson arrivals per second of engine time"""
    burst_size: int = 8
    burst_interval: float = 2.0
    """seconds of engine time between bursts"""
    # ---- engine
    model: str = "smollm2-135m"
    dtype: str = "float32"
    max_num_seqs: int = 16
    """the engine's most concurrent sequences (more requests wait in its queue)"""
    max_model_len: int = 1024
    kv_cache_gib: int = 1
    """VLLM_CPU_KVCACHE_SPACE in GiB"""
    threads: int = 1
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    """seed of the first reset() when none is passed"""
    rule: str = "match"
    """each request's own depth before the cap and budget: match | heuristic (see the proposer);
    hindsight in ServeReplay-v0 only (drafts only what will be accepted: a ceiling, not a policy)"""
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
        self.depths = tuple(int(d) for d in self.depths)
        self.budgets = tuple(int(b) for b in self.budgets)
        if self.arrival not in ARRIVALS:
            raise ValueError(f"ServeConfig.arrival={self.arrival!r} is unknown; use one of {', '.join(ARRIVALS)}.")
        for name in ("concurrency", "max_num_seqs", "burst_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"ServeConfig.{name}={getattr(self, name)} must be >= 1.")
        if self.rate <= 0 or self.burst_interval <= 0:
            raise ValueError(f"ServeConfig.rate={self.rate} and burst_interval={self.burst_interval} must be > 0.")
        for name in ("depths", "budgets"):
            values = getattr(self, name)
            if not values or min(values) < 0 or len(set(values)) != len(values):
                raise ValueError(f"ServeConfig.{name}={list(values)} must be distinct integers >= 0.")
        if 0 not in self.depths:
            raise ValueError(f"ServeConfig.depths={list(self.depths)} must contain 0 (no speculation is always an action).")
        if 0 not in self.budgets:
            raise ValueError(f"ServeConfig.budgets={list(self.budgets)} must contain 0 (no speculation is always an action).")
        if self.reward not in REWARD_MODES:
            raise ValueError(f"ServeConfig.reward={self.reward!r} is unknown; use one of {', '.join(REWARD_MODES)}.")
        if self.num_requests is not None and self.num_requests < 1:
            raise ValueError(f"ServeConfig.num_requests={self.num_requests} must be >= 1 or null.")

    @property
    def max_depth(self) -> int:
        return max(self.depths)

    def workload_config(self) -> EnvConfig:
        """The EnvConfig whose prompt filters and budgets select this workload."""
        return EnvConfig(prompts=self.prompts, languages=self.languages, tasks=self.tasks, split=self.split,
                         limit_per_group=self.limit_per_group, shuffle=self.shuffle, chat_template=self.chat_template,
                         max_new_tokens=self.max_new_tokens, max_new_tokens_cap=self.max_new_tokens_cap,
                         target=self.model)
